"""TinyJit: capture a function's kernels once, replay them as prebuilt command queues, save them to disk."""
from rawgrad.jit.jit import JitError, TinyJit

__all__ = ["JitError", "TinyJit"]
