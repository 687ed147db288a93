"""Every environment knob rawgrad reads, in one place (read at use, so tests can change them)."""
from __future__ import annotations

import os


def getenv_int(name: str, default: int = 0) -> int:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from e


def DEBUG() -> int:  # noqa: N802 - the variable's name
    """DEBUG=2 prints each kernel with its shape and time; DEBUG=4 also prints the generated code."""
    return getenv_int("DEBUG")


def NOOPT() -> bool:  # noqa: N802
    """NOOPT=1 turns off kernel optimizations (CPU register tiles, GPU vector loads/stores), for debugging
    codegen."""
    return getenv_int("NOOPT") != 0


def DEV() -> str | None:  # noqa: N802
    """DEV=CPU / DEV=NV picks the default device; unset means auto-detect."""
    return os.environ.get("DEV") or None


def MAX_LOADED_KERNELS() -> int:  # noqa: N802
    """How many compiled kernels stay loaded for eager reuse (RAWGRAD_MAX_LOADED_KERNELS, default 4096); the
    least recently used beyond it are unloaded once nothing (a TinyJit capture, a graph) still holds them."""
    return max(1, getenv_int("RAWGRAD_MAX_LOADED_KERNELS", 4096))


def CACHE_DIR() -> str:  # noqa: N802
    """Where compiled kernels are cached (RAWGRAD_CACHE_DIR; empty disables the disk cache)."""
    return os.environ.get("RAWGRAD_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "rawgrad"))


def REFERENCE() -> bool:  # noqa: N802
    """REFERENCE=1 realizes through the numpy reference interpreter instead of compiled kernels."""
    return getenv_int("REFERENCE") != 0


def PROFILE() -> bool:  # noqa: N802
    """PROFILE=1 brackets every kernel (eager and inside TinyJit replays) with device timestamps and
    writes a Chrome trace at exit (see rawgrad.hcq.profile)."""
    return getenv_int("PROFILE") != 0


def PROFILE_OUT() -> str:  # noqa: N802
    """Where PROFILE=1 writes its Chrome trace at exit (a .png beside it too when matplotlib is there)."""
    return os.environ.get("PROFILE_OUT") or os.path.join(".", "rawgrad_profile.json")


def NV_MOCK() -> bool:  # noqa: N802
    """NV_MOCK=1 makes the NV device run on the mock kernel driver + mock GPU (rawgrad.drivers.nv.mock)
    instead of /dev/nvidiactl. Only ever used when asked for: auto-detection never picks the mock."""
    return getenv_int("NV_MOCK") != 0


def NV_MOCK_PROFILE() -> str:  # noqa: N802
    """Which mock GPU NV_MOCK=1 emulates: "h100" (Hopper, QMD V04; the default) or "ampere" (GA102, V03)."""
    return (os.environ.get("NV_MOCK_PROFILE") or "h100").lower()


def JIT_VERIFY() -> int:  # noqa: N802
    """JIT_VERIFY=N runs every N-th TinyJit call (counting all calls; replays only) eagerly as well, from
    the same state and random counter, and raises JitError if its outputs or the state it writes differ
    from the replay's (a slow check for what the guards cannot see; 0 or unset: off)."""
    n = getenv_int("JIT_VERIFY")
    if n < 0:
        raise ValueError(f"JIT_VERIFY must be >= 0, got {n}")
    return n
