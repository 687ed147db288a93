"""Typed SDMA packet builders for the AMD copy queue (pure: each returns a list of 32-bit words).

Layouts from `sdma_v6_0_0_pkt_open.h` (gfx1100's SDMA 6.0) and the SDMA 4.x headers (gfx942's SDMA 4.4.2);
constants and their sources are in regs.py, the packet set in ../shared/AMD-METAL-FACTS.md section 1.5.
The SDMA ring pointer counts bytes, not dwords; every packet here is a whole number of dwords.
"""
from __future__ import annotations

from rawgrad.drivers.amd import regs
from rawgrad.drivers.amd.regs import CompareFunc, GfxFamily, SDMAOp

__all__ = ["copy_linear", "fence", "nop", "pad_to", "poll_regmem", "sdma_header", "timestamp", "trap"]

U32 = 0xFFFFFFFF


def sdma_header(op: SDMAOp | int, sub_op: int = 0, extra: int = 0) -> int:
    """An SDMA packet header: op bits 7:0, sub_op bits 15:8, packet fields in `extra` (bits 31:16)."""
    if not 0 <= sub_op <= regs.SDMA_SUB_OP_MASK or extra & 0xFFFF:
        raise ValueError(f"SDMA header sub_op={sub_op:#x} extra={extra:#x}")
    return int(op) | (sub_op << regs.SDMA_SUB_OP_SHIFT) | extra


def _addr(addr: int, what: str, align: int = 1) -> tuple[int, int]:
    if not 0 <= addr < 1 << 64:
        raise ValueError(f"{what} {addr:#x} is not a 64-bit address")
    if addr % align:
        raise ValueError(f"{what} {addr:#x} is not {align}-byte aligned")
    return addr & U32, addr >> 32


def copy_linear(fam: GfxFamily, dst: int, src: int, nbytes: int) -> list[int]:
    """COPY_LINEAR packets (7 dwords each) copying `nbytes` from `src` to `dst`, split at the engine's maximum
    count (1 GiB on SDMA 6, 4 MiB on SDMA 4.x). Any byte alignment and size is allowed."""
    if nbytes < 1:
        raise ValueError(f"SDMA copy of {nbytes} bytes")
    _addr(src, "COPY_LINEAR source")
    _addr(dst, "COPY_LINEAR destination")
    if src + nbytes > 1 << 64 or dst + nbytes > 1 << 64:
        raise ValueError("SDMA copy runs past the end of the address space")
    words: list[int] = []
    done = 0
    while done < nbytes:
        n = min(fam.sdma_copy_max_bytes, nbytes - done)
        s, d = src + done, dst + done
        words += [sdma_header(SDMAOp.COPY, regs.SDMA_SUBOP_COPY_LINEAR), n - 1, 0, s & U32, s >> 32, d & U32,
                  d >> 32]
        done += n
    return words


def fence(fam: GfxFamily, addr: int, value: int) -> list[int]:
    """FENCE (4 dwords): write the 32-bit `value` to `addr` after the copies before it (uncached MTYPE on
    SDMA 5+, so the host sees it)."""
    lo, hi = _addr(addr, "FENCE address", 4)
    if not 0 <= value <= U32:
        raise ValueError(f"FENCE value {value:#x} is wider than 32 bits")
    mtype = regs.SDMA_FENCE_MTYPE_UC << regs.SDMA_FENCE_MTYPE_SHIFT if fam.sdma_fence_mtype else 0
    return [sdma_header(SDMAOp.FENCE, 0, mtype), lo, hi, value]


def trap(int_context: int) -> list[int]:
    """TRAP (2 dwords): raise an interrupt carrying `int_context` (the KFD event id on the signal path)."""
    if not 0 <= int_context <= regs.SDMA_TRAP_INT_CONTEXT_MASK:
        raise ValueError(f"TRAP int_context {int_context:#x} does not fit 28 bits")
    return [sdma_header(SDMAOp.TRAP), int_context]


def poll_regmem(addr: int, reference: int, func: CompareFunc = CompareFunc.GE, *, mask: int = U32,
                interval: int = regs.SDMA_POLL_INTERVAL_DEFAULT,
                retry: int = regs.SDMA_POLL_RETRY_FOREVER) -> list[int]:
    """POLL_REGMEM on memory (6 dwords): stall the SDMA queue until (mem32[addr] & mask) func reference."""
    lo, hi = _addr(addr, "POLL_REGMEM address", 4)
    if not 0 <= reference <= U32 or not 0 <= mask <= U32:
        raise ValueError(f"POLL_REGMEM reference {reference:#x} / mask {mask:#x}: the engine compares "
                         "32 bits")
    if not 0 <= interval <= regs.SDMA_POLL_INTERVAL_MASK or not 0 <= retry <= regs.SDMA_POLL_RETRY_MASK:
        raise ValueError(f"POLL_REGMEM interval {interval} / retry {retry} out of range")
    extra = (int(func) << regs.SDMA_POLL_FUNC_SHIFT) | regs.SDMA_POLL_MEM_POLL
    return [sdma_header(SDMAOp.POLL_REGMEM, 0, extra), lo, hi, reference, mask,
            interval | (retry << regs.SDMA_POLL_RETRY_SHIFT)]


def timestamp(addr: int) -> list[int]:
    """TIMESTAMP GET_GLOBAL (3 dwords): write the 64-bit global clock (10-ns ticks) to `addr`."""
    lo, hi = _addr(addr, "TIMESTAMP address", 8)
    return [sdma_header(SDMAOp.TIMESTAMP, regs.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL), lo, hi]


def nop(dwords: int) -> list[int]:
    """`dwords` dwords of SDMA NOP: one NOP header whose count field covers the rest."""
    if not 1 <= dwords <= regs.SDMA_NOP_COUNT_MASK + 1:
        raise ValueError(f"SDMA NOP of {dwords} dwords")
    return [sdma_header(SDMAOp.NOP, 0, (dwords - 1) << regs.SDMA_NOP_COUNT_SHIFT)] + [0] * (dwords - 1)


def pad_to(words: list[int], align: int = regs.SDMA_IB_ALIGN_DWORDS) -> list[int]:
    """`words` followed by NOPs up to a multiple of `align` dwords (SDMA IBs end on 8-dword boundaries)."""
    short = -len(words) % align
    return words + (nop(short) if short else [])
