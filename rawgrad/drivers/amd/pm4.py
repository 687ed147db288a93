"""Typed PM4 packet builders for the AMD compute queue (pure: each returns a list of 32-bit words).

Layouts and constants come from regs.py (Linux nvd.h / soc15d.h, the gc offset headers; sources named there).
Every builder checks its arguments against the field widths, so a value that would be truncated into a
neighbouring field raises a ValueError naming the field instead of producing a wrong packet.

`encode_dispatch` writes one complete kernel launch from a loaded `AMDCodeObject` (compiler/amdgpu_code.py):
the RSRC words are the descriptor's, the kernarg pointer goes into the user SGPRs the descriptor's code
properties place it in, the LDS allocation comes from the descriptor, and the launch is checked against the
metadata's max flat workgroup size. The driver passes addresses and sizes only, so it cannot get these wrong.
The sequence follows ../shared/AMD-METAL-FACTS.md section 1.4 (ACQUIRE_MEM, program registers, resources,
user data, thread counts, DISPATCH_DIRECT, CS_PARTIAL_FLUSH).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rawgrad.compiler.amdgpu_code import (
    KCP_ENABLE_SGPR_DISPATCH_ID,
    KCP_ENABLE_SGPR_DISPATCH_PTR,
    KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT,
    KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR,
    KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER,
    KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE,
    KCP_ENABLE_SGPR_QUEUE_PTR,
    AMDCodeObject,
    KernelDescriptor,
)
from rawgrad.drivers.amd import regs
from rawgrad.drivers.amd.regs import CompareFunc, DataSel, GfxFamily, IntSel, PM4Op

__all__ = ["DispatchPackets", "acquire_mem", "dispatch_direct", "encode_dispatch", "event_write", "hdp_flush",
           "header", "indirect_buffer", "kernarg_user_sgpr", "lds_granules", "nop", "release_mem",
           "set_sh_reg", "signal", "timestamp", "wait_reg_mem"]

U32 = 0xFFFFFFFF
# user SGPRs the CP can load, in the order AMDGPUUsage "Initial Kernel Execution State" gives them, with sizes
USER_SGPR_ORDER = ((KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER, 4, "private segment buffer"),
                   (KCP_ENABLE_SGPR_DISPATCH_PTR, 2, "dispatch ptr"),
                   (KCP_ENABLE_SGPR_QUEUE_PTR, 2, "queue ptr"),
                   (KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR, 2, "kernarg segment ptr"),
                   (KCP_ENABLE_SGPR_DISPATCH_ID, 2, "dispatch id"),
                   (KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT, 2, "flat scratch init"),
                   (KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE, 1, "private segment size"))
# a PM4 dispatch has no HSA dispatch packet or queue object to point at, and rawgrad kernels use none of these
UNSUPPORTED_USER_SGPRS = KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER | KCP_ENABLE_SGPR_DISPATCH_PTR | \
    KCP_ENABLE_SGPR_QUEUE_PTR | KCP_ENABLE_SGPR_DISPATCH_ID | KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT | \
    KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE
MAX_DIM = U32  # DISPATCH_DIRECT dimensions are 32-bit workgroup counts


def _fits(value: int, bits: int, what: str) -> int:
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{what}={value:#x} does not fit in {bits} bits")
    return value


def _aligned(addr: int, align: int, what: str) -> int:
    _fits(addr, 64, what)
    if addr % align:
        raise ValueError(f"{what}={addr:#x} is not {align}-byte aligned")
    return addr


def header(op: PM4Op | int, payload_dwords: int) -> int:
    """The type-3 header of a packet with `payload_dwords` dwords after it (PACKET3(op, payload - 1))."""
    if not 1 <= payload_dwords <= regs.PACKET3_MAX_PAYLOAD:
        raise ValueError(f"PM4 packet payload of {payload_dwords} dwords (1..{regs.PACKET3_MAX_PAYLOAD})")
    return _type3(int(op), payload_dwords - 1)


def _type3(op: int, count: int) -> int:
    return (regs.PACKET_TYPE3 << regs.PACKET_TYPE_SHIFT) | (count << regs.PACKET3_COUNT_SHIFT) | \
        (op << regs.PACKET3_OPCODE_SHIFT)


def nop(dwords: int) -> list[int]:
    """Exactly `dwords` dwords of NOP (ring/IB padding): a header-only NOP for one, else a NOP with a body."""
    if dwords < 1:
        raise ValueError(f"NOP of {dwords} dwords")
    if dwords == 1:
        return [_type3(PM4Op.NOP, regs.NOP_ONE_DWORD_COUNT)]
    return [header(PM4Op.NOP, dwords - 1)] + [0] * (dwords - 1)


def set_sh_reg(reg: int, *values: int) -> list[int]:
    """SET_SH_REG: consecutive SH registers from `reg` (a dword register address in [0x2C00, 0x3000))."""
    if not values:
        raise ValueError("SET_SH_REG with no values")
    if not (regs.SET_SH_REG_START <= reg and reg + len(values) <= regs.SET_SH_REG_END):
        raise ValueError(f"register {reg:#x}..+{len(values)} is outside the SH range "
                         f"[{regs.SET_SH_REG_START:#x}, {regs.SET_SH_REG_END:#x})")
    for i, v in enumerate(values):
        _fits(v, 32, regs.register_name(reg + i))
    return [header(PM4Op.SET_SH_REG, 1 + len(values)), reg - regs.SET_SH_REG_START, *values]


def dispatch_direct(grid: tuple[int, int, int], initiator: int) -> list[int]:
    """DISPATCH_DIRECT: workgroup counts x, y, z (not work-items) and COMPUTE_DISPATCH_INITIATOR."""
    for d, n in zip("xyz", grid):
        if not 1 <= n <= MAX_DIM:
            raise ValueError(f"DISPATCH_DIRECT grid {d}={n}: workgroup counts are 1..2**32-1")
    return [header(PM4Op.DISPATCH_DIRECT, 4), *grid, _fits(initiator, 32, "DISPATCH_INITIATOR")]


def release_mem(fam: GfxFamily, *, addr: int = 0, data_sel: DataSel = DataSel.NONE, value: int = 0,
                int_sel: IntSel = IntSel.NONE, ctxid: int = 0, writeback: bool = True,
                event: int = regs.CACHE_FLUSH_AND_INV_TS_EVENT,
                event_index: int = regs.EVENT_INDEX_END_OF_PIPE) -> list[int]:
    """RELEASE_MEM (8 dwords): at end of pipe, optionally write back/invalidate caches (`writeback`), then
    write `value` (32 or 64 bits) or the 64-bit GPU clock to `addr`, then optionally interrupt with
    `ctxid`."""
    if data_sel != DataSel.NONE:
        need = 4 if data_sel == DataSel.VALUE32 else 8
        _aligned(addr, need, "RELEASE_MEM address")
    _fits(value, 32 if data_sel == DataSel.VALUE32 else 64, "RELEASE_MEM value")
    _fits(event, 6, "RELEASE_MEM event")
    _fits(event_index, 4, "RELEASE_MEM event index")
    cache = fam.release_writeback if writeback else 0
    dw1 = event | (event_index << regs.RELEASE_MEM_EVENT_INDEX_SHIFT) | cache
    dw2 = (int(data_sel) << regs.RELEASE_MEM_DATA_SEL_SHIFT) | \
        (int(int_sel) << regs.RELEASE_MEM_INT_SEL_SHIFT)
    return [header(PM4Op.RELEASE_MEM, 7), dw1, dw2, addr & U32, addr >> 32, value & U32, value >> 32,
            _fits(ctxid, 32, "RELEASE_MEM ctxid")]


def signal(fam: GfxFamily, addr: int, value: int, *, interrupt_ctxid: int | None = None) -> list[int]:
    """Write a 32-bit signal value after all earlier work, caches written back (facts section 1.4); with
    `interrupt_ctxid`, interrupt once the write lands (wakes KFD WAIT_EVENTS for that event id)."""
    int_sel = IntSel.NONE if interrupt_ctxid is None else IntSel.INTERRUPT_AFTER_WRITE
    return release_mem(fam, addr=addr, data_sel=DataSel.VALUE32, value=value, int_sel=int_sel,
                       ctxid=interrupt_ctxid or 0)


def timestamp(fam: GfxFamily, addr: int) -> list[int]:
    """Write the 64-bit GPU clock (10-ns ticks) to `addr` once earlier work has drained: a data-less
    RELEASE_MEM (drain), the clock write, then an ACQUIRE_MEM (facts section 1.4)."""
    return [*release_mem(fam, writeback=False), *release_mem(fam, addr=addr, data_sel=DataSel.GPU_CLOCK,
                                                             writeback=False), *acquire_mem(fam)]


def wait_reg_mem(addr: int, reference: int, func: CompareFunc = CompareFunc.GE, *, mask: int = U32,
                 interval: int = regs.WAIT_POLL_INTERVAL_DEFAULT) -> list[int]:
    """WAIT_REG_MEM on memory (7 dwords): stall the queue until (mem32[addr] & mask) func reference.
    The compare is 32 bits wide on AMD: a reference of 2**32 or more is refused (timelines must wrap)."""
    _aligned(addr, 4, "WAIT_REG_MEM address")
    if not 0 <= reference <= U32:
        raise ValueError(f"WAIT_REG_MEM reference {reference:#x}: the CP compares 32 bits, values must be "
                         "< 2**32")
    dw1 = (int(func) << regs.WAIT_REG_MEM_FUNCTION_SHIFT) | \
        (regs.WAIT_MEM_SPACE_MEMORY << regs.WAIT_REG_MEM_MEM_SPACE_SHIFT) | \
        (regs.WAIT_OPERATION_WAIT << regs.WAIT_REG_MEM_OPERATION_SHIFT)
    return [header(PM4Op.WAIT_REG_MEM, 6), dw1, addr & U32, addr >> 32, reference, _fits(mask, 32, "mask"),
            _fits(interval, 16, "poll interval")]


def hdp_flush(req_reg: int, done_reg: int, ref_mask: int) -> list[int]:
    """WAIT_REG_MEM in register space, operation 1 (7 dwords): write `ref_mask` to the NBIO HDP flush request
    register, then wait until the done register shows those bits (facts section 1.4, memory_barrier). The
    register numbers depend on the NBIO version; the device supplies them (dword register offsets)."""
    _fits(req_reg, 32, "HDP flush request register")
    _fits(done_reg, 32, "HDP flush done register")
    dw1 = (int(CompareFunc.EQ) << regs.WAIT_REG_MEM_FUNCTION_SHIFT) | \
        (regs.WAIT_MEM_SPACE_REGISTER << regs.WAIT_REG_MEM_MEM_SPACE_SHIFT) | \
        (regs.WAIT_OPERATION_WRITE_WAIT << regs.WAIT_REG_MEM_OPERATION_SHIFT)
    ref = _fits(ref_mask, 32, "HDP flush mask")
    return [header(PM4Op.WAIT_REG_MEM, 6), dw1, req_reg, done_reg, ref, ref, regs.WAIT_HDP_POLL_INTERVAL]


def acquire_mem(fam: GfxFamily) -> list[int]:
    """ACQUIRE_MEM over the whole address space: invalidate instruction, scalar, L0/L1 and L2 caches (and
    write L2 back) before later work reads memory others wrote. gfx11 uses GCR_CNTL, gfx9 CP_COHER_CNTL."""
    size, base = regs.ACQUIRE_COHER_SIZE_ALL, 0
    if fam.gcr_dialect:
        return [header(PM4Op.ACQUIRE_MEM, 7), 0, size & U32, (size >> 32) & 0xFFFFFF, base, base,
                regs.ACQUIRE_POLL_INTERVAL, regs.GFX11_ACQUIRE_ALL]
    return [header(PM4Op.ACQUIRE_MEM, 6), regs.GFX9_ACQUIRE_ALL, size & U32, (size >> 32) & 0xFF, base, base,
            regs.ACQUIRE_POLL_INTERVAL]


def event_write(event: int, index: int) -> list[int]:
    """EVENT_WRITE (2 dwords), e.g. CS_PARTIAL_FLUSH with index 4 so the next dispatch waits for this one."""
    return [header(PM4Op.EVENT_WRITE, 1), _fits(event, 6, "event") | (_fits(index, 4, "event index")
                                                                         << regs.EVENT_INDEX_SHIFT)]


def indirect_buffer(addr: int, dwords: int) -> list[int]:
    """INDIRECT_BUFFER (4 dwords): run `dwords` dwords of PM4 at `addr`, then come back (size | VALID)."""
    _aligned(addr, regs.INDIRECT_BUFFER_ADDR_ALIGN, "INDIRECT_BUFFER address")
    if not 1 <= dwords <= regs.INDIRECT_BUFFER_SIZE_MASK:
        raise ValueError(f"INDIRECT_BUFFER of {dwords} dwords (1..{regs.INDIRECT_BUFFER_SIZE_MASK})")
    return [header(PM4Op.INDIRECT_BUFFER, 3), addr & U32, addr >> 32, dwords | regs.INDIRECT_BUFFER_VALID]


# ------------------------------------------------------------------------------------------------ dispatch
def lds_granules(nbytes: int) -> int:
    """RSRC2 LDS_SIZE for `nbytes` of LDS per workgroup (512-byte granules)."""
    g = -(-nbytes // regs.LDS_GRANULE_BYTES)
    if g > regs.RSRC2_LDS_SIZE_MASK:
        raise ValueError(f"LDS of {nbytes} bytes exceeds the RSRC2 LDS_SIZE field")
    return g


def kernarg_user_sgpr(kd: KernelDescriptor) -> int | None:
    """Index of the first of the two user SGPRs (= COMPUTE_USER_DATA_n) the CP loads the kernarg pointer into,
    from the descriptor's code properties (None: a kernel without arguments asks for no kernarg pointer);
    refuses user SGPRs a PM4 dispatch cannot provide."""
    props = kd.kernel_code_properties
    asked = [name for bit, _, name in USER_SGPR_ORDER if props & bit & UNSUPPORTED_USER_SGPRS]
    if asked:
        raise ValueError(f"kernel descriptor asks for the {', '.join(asked)} user SGPRs, which a PM4 "
                         "dispatch does not set up")
    if not props & KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR:
        return None
    index = 0
    for bit, size, _ in USER_SGPR_ORDER:
        if bit == KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR:
            break
        if props & bit:
            index += size
    if kd.user_sgpr_count < index + 2:
        raise ValueError(f"RSRC2 USER_SGPR_COUNT {kd.user_sgpr_count} leaves no room for the kernarg pointer "
                         f"in s{index}:s{index + 1}")
    return index


@dataclass(frozen=True)
class DispatchPackets:
    """The words of one dispatch and where its patchable fields sit in them (indices into `words`)."""

    words: list[int]
    kernarg_lo: int  # COMPUTE_USER_DATA_n: kernarg VA bits 31:0; bits 63:32 follow
    local: tuple[int, int, int]  # NUM_THREAD_X/Y/Z
    grid: tuple[int, int, int]  # DISPATCH_DIRECT x/y/z workgroup counts
    patch: dict[str, int] = field(default_factory=dict)


def encode_dispatch(co: AMDCodeObject, image_va: int, kernarg_va: int, grid: tuple[int, int, int],
                    local: tuple[int, int, int], *, fam: GfxFamily | None = None, tmpring_size: int = 0,
                    scratch_va: int = 0, acquire: bool = True, serialize: bool = True) -> DispatchPackets:
    """One complete launch of the kernel of `co`, whose loaded image sits at `image_va` (the loader's layout:
    code at image_va + entry_offset, descriptor at image_va + kd_offset).

    The descriptor decides RSRC1/2/3 (copied verbatim, LDS granules ORed into RSRC2), which user SGPRs hold
    the kernarg pointer, and wave32; the metadata bounds the workgroup size. `tmpring_size`/`scratch_va` are
    the device's scratch setup, required when the kernel has a private segment. `acquire` starts with an
    ACQUIRE_MEM (caches invalidated before the kernel reads), `serialize` ends with CS_PARTIAL_FLUSH so the
    next packet waits for this kernel (facts section 1.4)."""
    fam = fam or regs.family(co.arch)
    if co.arch != fam.arch:
        raise ValueError(f"{co.name}: code object for {co.arch}, packets for {fam.arch}")
    kd, meta = co.descriptor, co.metadata
    code_va = image_va + co.entry_offset
    _aligned(code_va, regs.PGM_ALIGN, f"{co.name}: code address (image_va + entry offset)")
    if co.kd_offset + kd.kernel_code_entry_byte_offset != co.entry_offset:
        raise ValueError(f"{co.name}: descriptor's code entry offset does not reach the kernel entry")
    _aligned(kernarg_va, regs.KERNARG_SEGMENT_ALIGN, f"{co.name}: kernarg address")
    if kd.wave32 and not fam.has_cs_w32:
        raise ValueError(f"{co.name}: wave32 code on {fam.arch}, which has no CS_W32_EN")
    for d, n in zip("xyz", local):
        if not 1 <= n <= regs.NUM_THREAD_FULL_MASK:
            raise ValueError(f"{co.name}: local size {d}={n}")
    threads = local[0] * local[1] * local[2]
    if threads > meta.max_flat_workgroup_size:
        raise ValueError(f"{co.name}: local size {local} = {threads} work-items exceeds the kernel's "
                         f".max_flat_workgroup_size {meta.max_flat_workgroup_size}")
    if kd.private_segment_fixed_size and not tmpring_size:
        raise ValueError(f"{co.name}: needs {kd.private_segment_fixed_size} bytes of scratch per work-item "
                         "but no TMPRING_SIZE was given")
    # A kernel without arguments loads no kernarg pointer: USER_DATA_0/1 are still written (the CP loads only
    # USER_SGPR_COUNT of them, so the words are inert) so that every dispatch has the same patchable shape.
    user = kernarg_user_sgpr(kd) or 0
    rsrc2 = kd.compute_pgm_rsrc2 | (lds_granules(kd.group_segment_fixed_size) << regs.RSRC2_LDS_SIZE_SHIFT)
    initiator = regs.INITIATOR_COMPUTE_SHADER_EN | regs.INITIATOR_FORCE_START_AT_000 | \
        (regs.INITIATOR_CS_W32_EN if kd.wave32 else 0)
    words: list[int] = acquire_mem(fam) if acquire else []
    at: dict[str, int] = {}

    def put(name: str, packet: list[int]) -> None:
        at[name] = len(words) + 2  # first value after the SET_SH_REG header and register offset
        words.extend(packet)

    put("pgm_lo", set_sh_reg(regs.COMPUTE_PGM_LO, (code_va >> regs.PGM_ADDR_SHIFT) & U32,
                             code_va >> (32 + regs.PGM_ADDR_SHIFT)))
    put("rsrc1", set_sh_reg(regs.COMPUTE_PGM_RSRC1, kd.compute_pgm_rsrc1, rsrc2))
    at["rsrc2"] = at["rsrc1"] + 1
    put("rsrc3", set_sh_reg(fam.compute_pgm_rsrc3, kd.compute_pgm_rsrc3))
    put("tmpring_size", set_sh_reg(regs.COMPUTE_TMPRING_SIZE, tmpring_size))
    if scratch_va:
        _aligned(scratch_va, regs.PGM_ALIGN, "scratch address")
        put("scratch_lo", set_sh_reg(regs.COMPUTE_DISPATCH_SCRATCH_BASE_LO,
                                     (scratch_va >> regs.PGM_ADDR_SHIFT) & U32,
                                     scratch_va >> (32 + regs.PGM_ADDR_SHIFT)))
    put("restart", set_sh_reg(regs.COMPUTE_RESTART_X, 0, 0, 0))
    put("kernarg_lo", set_sh_reg(regs.COMPUTE_USER_DATA_0 + user, kernarg_va & U32, kernarg_va >> 32))
    at["kernarg_hi"] = at["kernarg_lo"] + 1
    put("resource_limits", set_sh_reg(regs.COMPUTE_RESOURCE_LIMITS, 0))
    put("start", set_sh_reg(regs.COMPUTE_START_X, 0, 0, 0, *local))
    local_at = at["start"] + 3
    at["dispatch"] = len(words)
    words += dispatch_direct(grid, initiator)
    grid_at = at["dispatch"] + 1
    at["initiator"] = grid_at + 3
    if serialize:
        words += event_write(regs.CS_PARTIAL_FLUSH, regs.EVENT_INDEX_PARTIAL_FLUSH)
    return DispatchPackets(words, at["kernarg_lo"], (local_at, local_at + 1, local_at + 2),
                           (grid_at, grid_at + 1, grid_at + 2), at)
