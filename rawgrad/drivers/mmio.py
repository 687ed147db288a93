"""Native GPFIFO publish sequence (stores with store fences between them), built once with the in-process
LLVM toolchain.

Python cannot emit a store fence, and cffi cannot either. Submitting GPU work needs two of them:
the ring entry and any patched command words must reach memory before the GPU reads the new put
index, and the put index before the doorbell write that makes the GPU read it (NV-FACTS 4.5). A
Python-level fence plus three typed stores also costs most of a microsecond per submit, which is
the whole budget of a graph replay. So the sequence is one small native function over a context
made once per ring (a cffi call with few arguments is the cheap kind):

    ring[slot] = entry; wmb(); *put_word = (slot + 1) & mask; wmb(); *doorbell = token

``wmb()`` is what Linux uses for the same job (``arch/x86/include/asm/barrier.h``: ``sfence``;
``arch/arm64/include/asm/barrier.h``: ``dsb st``). Write-combined mappings (the doorbell page, BAR1
VRAM) are only ordered by these, not by plain program order.
"""

from __future__ import annotations

import functools
import platform
import threading
from collections.abc import Callable
from typing import Any

import cffi

__all__ = ["NativeMMIO", "native_mmio"]

# Linux wmb() per host CPU as an LLVM intrinsic call (an intrinsic, not inline assembly, so LLVM needs
# no assembly parser): x86 SFENCE; arm64 DSB with option ST (CRm 0b1110, full system, stores).
DSB_ST = 0b1110
_X86_WMB = ("declare void @llvm.x86.sse.sfence()", "call void @llvm.x86.sse.sfence()")
_ARM64_WMB = ("declare void @llvm.aarch64.dsb(i32)", f"call void @llvm.aarch64.dsb(i32 {DSB_ST})")
_WMB = {"x86_64": _X86_WMB, "amd64": _X86_WMB, "aarch64": _ARM64_WMB, "arm64": _ARM64_WMB}

PUBLISH_SYMBOL = "rawgrad_gpfifo_publish"

# struct gpfifo_context, as the native function reads it and cffi builds it.
_CONTEXT_CDEF = """
struct gpfifo_context {
    uint64_t ring;          /* address of the ring of 64-bit entries */
    uint64_t put_word;      /* address of the 32-bit put index the GPU reads */
    uint64_t doorbell;      /* address of the doorbell register */
    uint32_t token;         /* the value written to the doorbell */
    uint32_t mask;          /* entries - 1 (entries is a power of two) */
};
"""

_IR = """
{declare}

%gpfifo_context = type {{ i64, i64, i64, i32, i32 }}

define void @{publish}(ptr %ctx, i64 %slot, i64 %entry) nounwind {{
  %ring_f = getelementptr %gpfifo_context, ptr %ctx, i32 0, i32 0
  %put_f = getelementptr %gpfifo_context, ptr %ctx, i32 0, i32 1
  %bell_f = getelementptr %gpfifo_context, ptr %ctx, i32 0, i32 2
  %token_f = getelementptr %gpfifo_context, ptr %ctx, i32 0, i32 3
  %mask_f = getelementptr %gpfifo_context, ptr %ctx, i32 0, i32 4
  %ring = load i64, ptr %ring_f
  %put_addr = load i64, ptr %put_f
  %bell = load i64, ptr %bell_f
  %token = load i32, ptr %token_f
  %mask = load i32, ptr %mask_f
  %slot_off = shl i64 %slot, 3
  %slot_addr = add i64 %ring, %slot_off
  %slot_p = inttoptr i64 %slot_addr to ptr
  store volatile i64 %entry, ptr %slot_p, align 8
  {wmb}
  %slot32 = trunc i64 %slot to i32
  %next = add i32 %slot32, 1
  %put = and i32 %next, %mask
  %put_p = inttoptr i64 %put_addr to ptr
  store volatile i32 %put, ptr %put_p, align 4
  {wmb}
  %bell_p = inttoptr i64 %bell to ptr
  store volatile i32 %token, ptr %bell_p, align 4
  ret void
}}
"""


class NativeMMIO:
    """The native publish function, loaded into executable memory; callable from any thread."""

    def __init__(self) -> None:
        from rawgrad.compiler import elf
        from rawgrad.compiler.toolchain import host_compiler

        machine = platform.machine().lower()
        if machine not in _WMB:
            raise RuntimeError(f"no store-fence instruction known for host CPU {machine!r} "
                               f"(known: {', '.join(sorted(_WMB))})")
        declare, wmb = _WMB[machine]
        ir = _IR.format(publish=PUBLISH_SYMBOL, declare=declare, wmb=wmb)
        self.image = elf.load(host_compiler().compile(ir))
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CONTEXT_CDEF)
        self._publish: Any = self.ffi.cast("void (*)(struct gpfifo_context *, uint64_t, uint64_t)",
                                           self.image.symbol(PUBLISH_SYMBOL))

    def gpfifo_publisher(self, ring: int, entries: int, put_word: int, doorbell: int,
                         token: int) -> Callable[[int, int], None]:
        """`publish(slot, entry)`: the native sequence for one ring (see the module docstring)."""
        if entries < 1 or entries & (entries - 1):
            raise ValueError(f"GPFIFO entries {entries} must be a power of two")
        fields = {"ring": ring, "put_word": put_word, "doorbell": doorbell, "token": token,
                  "mask": entries - 1}
        ctx = self.ffi.new("struct gpfifo_context *", fields)
        # the partial keeps `ctx` alive as long as the publisher
        return functools.partial(self._publish, ctx)


_lock = threading.Lock()
_instance: NativeMMIO | None = None


def native_mmio() -> NativeMMIO:
    """The process-wide native functions (built on first use: one small LLVM compile, cached on disk)."""
    global _instance
    if _instance is None:
        with _lock:
            if _instance is None:
                _instance = NativeMMIO()
    return _instance
