"""AMD register offsets and packet constants, per GPU family (gfx11 first, gfx9.4.3 for gfx942).

Sources, named again next to each group:
- PM4 packet headers, opcodes and fields: Linux `drivers/gpu/drm/amd/amdgpu/nvd.h` (gfx10/11) and `soc15d.h`
  (gfx9); the ACQUIRE_MEM GCR_CNTL bits are the `PACKET3_ACQUIRE_MEM_GCR_CNTL_*` macros of the same tree.
- Compute SH registers: `gc_11_0_0_offset.h` and `gc_9_4_3_offset.h` (offset + GC segment base), as computed
  in ../shared/AMD-METAL-FACTS.md section 1.4; they agree on both families except COMPUTE_PGM_RSRC3.
- SDMA packets: `sdma_v6_0_0_pkt_open.h` (SDMA 6.0, gfx1100) and the SDMA 4.x `*_sdma_pkt_open.h` headers
  (gfx942 uses SDMA 4.4.2); AMD-METAL-FACTS.md section 1.5.
- Timestamp clock: 100 MHz on both families (AMD-METAL-FACTS.md sections 1.4, 1.5; tinygrad's
  timestamp_divider=100). Rawgrad never relies on it beyond converting ticks to ns.

Everything here is data; pm4.py and sdma.py build packets from it and mock/cp.py decodes them with it, so a
wrong constant shows up as a builder/model disagreement only if the tests pin values to the headers (they do).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

# ------------------------------------------------------------------------------------ PM4 type-3 header
# nvd.h / soc15d.h: PACKET3(op, n) = (3 << 30) | (op & 0xFF) << 8 | (n & 0x3FFF) << 16, n = payload dwords - 1
PACKET_TYPE3 = 3
PACKET_TYPE_SHIFT = 30
PACKET_TYPE2 = 2  # CP_PACKET2 (0x80000000): a one-dword filler, accepted as padding by the CP
PACKET3_COUNT_SHIFT, PACKET3_COUNT_MASK = 16, 0x3FFF  # CP_PACKET_GET_COUNT
PACKET3_OPCODE_SHIFT, PACKET3_OPCODE_MASK = 8, 0xFF  # CP_PACKET3_GET_OPCODE
PACKET3_MAX_PAYLOAD = PACKET3_COUNT_MASK  # count 0x3FFF on a NOP means "header only" (NOP_ONE_DWORD_COUNT)
NOP_ONE_DWORD_COUNT = 0x3FFF  # amdgpu gfx_v11_0.c ring funcs: .nop = PACKET3(PACKET3_NOP, 0x3FFF), one dword


class PM4Op(IntEnum):
    """PM4 type-3 opcodes (nvd.h; the same numbers in soc15d.h for the ones gfx9 has)."""

    NOP = 0x10
    DISPATCH_DIRECT = 0x15
    ATOMIC_MEM = 0x1E
    PRED_EXEC = 0x23
    WRITE_DATA = 0x37
    WAIT_REG_MEM = 0x3C
    INDIRECT_BUFFER = 0x3F
    COPY_DATA = 0x40
    EVENT_WRITE = 0x46
    RELEASE_MEM = 0x49
    ACQUIRE_MEM = 0x58
    SET_SH_REG = 0x76
    SET_UCONFIG_REG = 0x79


# SET_SH_REG addresses registers relative to this dword address (nvd.h PACKET3_SET_SH_REG_START / _END)
SET_SH_REG_START = 0x2C00
SET_SH_REG_END = 0x3000
SET_UCONFIG_REG_START = 0xC000  # nvd.h PACKET3_SET_UCONFIG_REG_START

# WAIT_REG_MEM dword 1 (nvd.h WAIT_REG_MEM_FUNCTION / _MEM_SPACE / _OPERATION / _ENGINE)
WAIT_REG_MEM_FUNCTION_SHIFT, WAIT_REG_MEM_FUNCTION_MASK = 0, 0x7
WAIT_REG_MEM_MEM_SPACE_SHIFT = 4  # 0 register, 1 memory
WAIT_REG_MEM_OPERATION_SHIFT = 6  # 0 wait_reg_mem, 1 write register then wait (wr_wait_wr_reg)
WAIT_REG_MEM_ENGINE_SHIFT = 8  # 0 ME, 1 PFP
WAIT_MEM_SPACE_REGISTER, WAIT_MEM_SPACE_MEMORY = 0, 1
WAIT_OPERATION_WAIT, WAIT_OPERATION_WRITE_WAIT = 0, 1
WAIT_POLL_INTERVAL_DEFAULT = 4  # AMD-METAL-FACTS.md section 1.4 (tinygrad's wait)
WAIT_POLL_INTERVAL_MASK = 0xFFFF
WAIT_HDP_POLL_INTERVAL = 0x20  # amdgpu gfx_v11_0_ring_emit_hdp_flush: poll interval of the done register


class CompareFunc(IntEnum):
    """WAIT_REG_MEM FUNCTION and SDMA POLL_REGMEM func (nvd.h comment; the SDMA headers use the same
    codes)."""

    ALWAYS = 0
    LT = 1
    LE = 2
    EQ = 3
    NE = 4
    GE = 5
    GT = 6


COMPARE_SYMBOL = {CompareFunc.ALWAYS: "always", CompareFunc.LT: "<", CompareFunc.LE: "<=",
                  CompareFunc.EQ: "==", CompareFunc.NE: "!=", CompareFunc.GE: ">=", CompareFunc.GT: ">"}

# INDIRECT_BUFFER dword 3 (nvd.h INDIRECT_BUFFER_VALID; the size field is IB_SIZE bits 19:0 in dwords)
INDIRECT_BUFFER_VALID = 1 << 23
INDIRECT_BUFFER_SIZE_MASK = 0xFFFFF
INDIRECT_BUFFER_ADDR_ALIGN = 4  # IB_BASE_LO holds address bits 31:2

# EVENT_WRITE dword 1 (nvd.h EVENT_TYPE / EVENT_INDEX) and the events used (amdgpu vgt event numbers)
EVENT_TYPE_SHIFT, EVENT_TYPE_MASK = 0, 0x3F
EVENT_INDEX_SHIFT, EVENT_INDEX_MASK = 8, 0xF
CS_PARTIAL_FLUSH = 0x07  # serialize compute work (EVENT_INDEX 4, "*S_PARTIAL_FLUSH" in nvd.h)
EVENT_INDEX_PARTIAL_FLUSH = 4
CACHE_FLUSH_AND_INV_TS_EVENT = 0x14  # the end-of-pipe event RELEASE_MEM signals with (facts section 1.4)
EVENT_INDEX_END_OF_PIPE = 5  # event_index__mec_release_mem__end_of_pipe
EVENT_INDEX_SHADER_DONE = 6  # event_index__mec_release_mem__shader_done

# RELEASE_MEM (nvd.h PACKET3_RELEASE_MEM_*): dword 1 event/index/GCR/cache policy, dword 2 selects
RELEASE_MEM_EVENT_INDEX_SHIFT = 8
RELEASE_MEM_CACHE_POLICY_SHIFT = 25
RELEASE_MEM_DATA_SEL_SHIFT, RELEASE_MEM_DATA_SEL_MASK = 29, 0x7
RELEASE_MEM_INT_SEL_SHIFT, RELEASE_MEM_INT_SEL_MASK = 24, 0x7
RELEASE_MEM_DST_SEL_SHIFT = 16  # 0 memory controller, 1 TC/L2


class DataSel(IntEnum):
    """RELEASE_MEM DATA_SEL (nvd.h comment)."""

    NONE = 0
    VALUE32 = 1  # send low 32 bits of data
    VALUE64 = 2
    GPU_CLOCK = 3  # 64-bit GPU clock counter (100 MHz)
    SYSTEM_CLOCK = 4  # 64-bit system counter


class IntSel(IntEnum):
    """RELEASE_MEM INT_SEL (nvd.h comment)."""

    NONE = 0
    INTERRUPT_ONLY = 1
    INTERRUPT_AFTER_WRITE = 2  # wakes KFD WAIT_EVENTS with ctxid = event id (facts section 1.4)


# gfx10/11 RELEASE_MEM GCR bits in dword 1 (nvd.h PACKET3_RELEASE_MEM_GCR_*)
RELEASE_MEM_GCR_GLM_WB = 1 << 12
RELEASE_MEM_GCR_GLM_INV = 1 << 13
RELEASE_MEM_GCR_GLV_INV = 1 << 14
RELEASE_MEM_GCR_GL1_INV = 1 << 15
RELEASE_MEM_GCR_GL2_INV = 1 << 20
RELEASE_MEM_GCR_GL2_WB = 1 << 21
RELEASE_MEM_GCR_SEQ = 1 << 22
GFX11_RELEASE_WRITEBACK = (RELEASE_MEM_GCR_GLV_INV | RELEASE_MEM_GCR_GL1_INV | RELEASE_MEM_GCR_GL2_INV
                           | RELEASE_MEM_GCR_GLM_WB | RELEASE_MEM_GCR_GLM_INV | RELEASE_MEM_GCR_GL2_WB
                           | RELEASE_MEM_GCR_SEQ)

# gfx9 RELEASE_MEM cache actions in dword 1 (soc15d.h EOP_*_ACTION_EN)
EOP_TCL1_ACTION_EN = 1 << 16
EOP_TC_ACTION_EN = 1 << 17
EOP_TC_WB_ACTION_EN = 1 << 15
EOP_TC_NC_ACTION_EN = 1 << 19
EOP_TC_MD_ACTION_EN = 1 << 21
GFX9_RELEASE_WRITEBACK = EOP_TCL1_ACTION_EN | EOP_TC_ACTION_EN | EOP_TC_WB_ACTION_EN | EOP_TC_MD_ACTION_EN

# gfx10/11 ACQUIRE_MEM GCR_CNTL (the last dword; PACKET3_ACQUIRE_MEM_GCR_CNTL_* in the amdgpu tree)
GCR_GLI_INV = 1 << 0  # instruction cache, "ALL" (value 1 of the 2-bit field)
GCR_GLM_WB = 1 << 4
GCR_GLM_INV = 1 << 5
GCR_GLK_WB = 1 << 6
GCR_GLK_INV = 1 << 7
GCR_GLV_INV = 1 << 8
GCR_GL1_INV = 1 << 9
GCR_GL2_INV = 1 << 14
GCR_GL2_WB = 1 << 15
GFX11_ACQUIRE_ALL = (GCR_GLI_INV | GCR_GLM_WB | GCR_GLM_INV | GCR_GLK_WB | GCR_GLK_INV | GCR_GLV_INV
                     | GCR_GL1_INV | GCR_GL2_INV | GCR_GL2_WB)

# gfx9 ACQUIRE_MEM CP_COHER_CNTL (soc15d.h PACKET3_ACQUIRE_MEM_CP_COHER_CNTL_*)
COHER_TC_WB_ACTION_ENA = 1 << 18
COHER_TCL1_ACTION_ENA = 1 << 22
COHER_TC_ACTION_ENA = 1 << 23
COHER_SH_KCACHE_ACTION_ENA = 1 << 27
COHER_SH_ICACHE_ACTION_ENA = 1 << 29
GFX9_ACQUIRE_ALL = (COHER_SH_ICACHE_ACTION_ENA | COHER_SH_KCACHE_ACTION_ENA | COHER_TC_ACTION_ENA
                    | COHER_TCL1_ACTION_ENA | COHER_TC_WB_ACTION_ENA)
# the whole address space (amdgpu's emit_mem_sync writes size 0xffffffff / size_hi 0xffffff, base 0)
ACQUIRE_COHER_SIZE_ALL = (1 << 64) - 1
ACQUIRE_POLL_INTERVAL = 0x0A  # amdgpu emit_mem_sync POLL_INTERVAL

# ------------------------------------------------------------------------------------ compute SH registers
# dword register addresses (gc_11_0_0_offset.h / gc_9_4_3_offset.h offset + GC base; facts section 1.4 table)
COMPUTE_DISPATCH_INITIATOR = SET_SH_REG_START + 0x200
COMPUTE_START_X = SET_SH_REG_START + 0x204  # START_X/Y/Z then NUM_THREAD_X/Y/Z are consecutive
COMPUTE_NUM_THREAD_X = SET_SH_REG_START + 0x207
COMPUTE_NUM_THREAD_Y = SET_SH_REG_START + 0x208
COMPUTE_NUM_THREAD_Z = SET_SH_REG_START + 0x209
COMPUTE_PGM_LO = SET_SH_REG_START + 0x20C
COMPUTE_PGM_HI = SET_SH_REG_START + 0x20D
COMPUTE_DISPATCH_SCRATCH_BASE_LO = SET_SH_REG_START + 0x210
COMPUTE_DISPATCH_SCRATCH_BASE_HI = SET_SH_REG_START + 0x211
COMPUTE_PGM_RSRC1 = SET_SH_REG_START + 0x212
COMPUTE_PGM_RSRC2 = SET_SH_REG_START + 0x213
COMPUTE_RESOURCE_LIMITS = SET_SH_REG_START + 0x215
COMPUTE_TMPRING_SIZE = SET_SH_REG_START + 0x218
COMPUTE_RESTART_X = SET_SH_REG_START + 0x21B  # RESTART_X/Y/Z consecutive
GFX11_COMPUTE_PGM_RSRC3 = SET_SH_REG_START + 0x228  # absolute 0x2e28 in gc_11_0_0
GFX9_COMPUTE_PGM_RSRC3 = SET_SH_REG_START + 0x22D  # absolute 0x2e2d in gc_9_4_3
COMPUTE_USER_DATA_0 = SET_SH_REG_START + 0x240
NUM_USER_DATA_REGS = 16  # COMPUTE_USER_DATA_0..15

PGM_ADDR_SHIFT = 8  # COMPUTE_PGM_LO/HI and DISPATCH_SCRATCH_BASE hold address >> 8 (256-byte aligned code)
PGM_ALIGN = 1 << PGM_ADDR_SHIFT

# COMPUTE_DISPATCH_INITIATOR bits (facts section 1.4; gc_11_0_0_sh_mask.h)
INITIATOR_COMPUTE_SHADER_EN = 1 << 0
INITIATOR_FORCE_START_AT_000 = 1 << 2
INITIATOR_CS_W32_EN = 1 << 15  # gfx10+: run the dispatch as wave32

# COMPUTE_NUM_THREAD_*: NUM_THREAD_FULL bits 15:0 (work-items per workgroup in that dimension);
# NUM_THREAD_PARTIAL bits 31:16 is for partial workgroups, which rawgrad never uses
NUM_THREAD_FULL_MASK = 0xFFFF

# COMPUTE_PGM_RSRC1 PRIV (bit 20): tinygrad sets it on gfx11 as a CWSR firmware workaround (facts sections 1.4
# and 2.5); it changes nothing the descriptor describes, so the dispatch validator tolerates it
RSRC1_PRIV = 1 << 20
# COMPUTE_PGM_RSRC2 LDS_SIZE bits 23:15, in 512-byte granules on gfx9 and gfx11 (facts section 1.4; the KD
# leaves it 0: AMDGPUUsage says the CP takes LDS from the dispatch, so the driver ORs it in)
RSRC2_LDS_SIZE_SHIFT, RSRC2_LDS_SIZE_MASK = 15, 0x1FF
LDS_GRANULE_BYTES = 512

KERNARG_SEGMENT_ALIGN = 16  # HSA: the kernarg segment is 16-byte aligned (AMDGPUUsage, "Kernarg Segment")

# ------------------------------------------------------------------------------------ SDMA packets
# sdma_v6_0_0_pkt_open.h (and the SDMA 4.x headers, same opcodes): header op bits 7:0, sub_op bits 15:8


class SDMAOp(IntEnum):
    NOP = 0
    COPY = 1
    WRITE = 2
    INDIRECT = 4
    FENCE = 5
    TRAP = 6
    POLL_REGMEM = 8
    TIMESTAMP = 13
    GCR_REQ = 17


SDMA_OP_MASK = 0xFF
SDMA_SUB_OP_SHIFT, SDMA_SUB_OP_MASK = 8, 0xFF
SDMA_SUBOP_COPY_LINEAR = 0
SDMA_SUBOP_TIMESTAMP_GET_GLOBAL = 2
SDMA_NOP_COUNT_SHIFT, SDMA_NOP_COUNT_MASK = 16, 0x3FFF  # SDMA_PKT_NOP_HEADER_count: extra dwords after it
SDMA_FENCE_MTYPE_SHIFT = 16  # SDMA_PKT_FENCE_HEADER_mtype, bits 18:16 (gfx10+ SDMA only)
SDMA_FENCE_MTYPE_UC = 3  # uncached, so the host sees the fence (facts section 1.5)
SDMA_POLL_FUNC_SHIFT = 28  # SDMA_PKT_POLL_REGMEM_HEADER_func, bits 30:28
SDMA_POLL_MEM_POLL = 1 << 31  # SDMA_PKT_POLL_REGMEM_HEADER_mem_poll: poll memory, not a register
SDMA_POLL_HDP_FLUSH = 1 << 26
SDMA_POLL_INTERVAL_MASK = 0xFFFF  # DW5 interval bits 15:0
SDMA_POLL_RETRY_SHIFT, SDMA_POLL_RETRY_MASK = 16, 0xFFF  # DW5 retry_count bits 27:16 (0xfff: retry forever)
SDMA_POLL_INTERVAL_DEFAULT = 10
SDMA_POLL_RETRY_FOREVER = 0xFFF
SDMA_TRAP_INT_CONTEXT_MASK = 0x0FFFFFFF  # SDMA_PKT_TRAP_INT_CONTEXT_int_context, bits 27:0
SDMA_COPY_LINEAR_DWORDS = 7
SDMA_FENCE_DWORDS = 4
SDMA_TRAP_DWORDS = 2
SDMA_POLL_REGMEM_DWORDS = 6
SDMA_TIMESTAMP_DWORDS = 3
SDMA_IB_ALIGN_DWORDS = 8  # an SDMA indirect buffer must end on an 8-dword boundary (facts section 1.5)

GPU_CLOCK_HZ = 100_000_000  # RELEASE_MEM GPU clock and SDMA global timestamp: 10-ns ticks
NS_PER_TICK = 1_000_000_000 // GPU_CLOCK_HZ


@dataclass(frozen=True)
class GfxFamily:
    """What differs between the families rawgrad drives: the RSRC3 register, wave32 dispatch support, the
    ACQUIRE_MEM/RELEASE_MEM cache dialect, and the SDMA copy limit."""

    name: str
    arch: str
    gc_version: tuple[int, int, int]
    sdma_version: tuple[int, int, int]
    wave_size: int
    compute_pgm_rsrc3: int
    has_cs_w32: bool  # DISPATCH_INITIATOR CS_W32_EN exists (gfx10+)
    gcr_dialect: bool  # ACQUIRE_MEM GCR_CNTL + RELEASE_MEM GCR bits (gfx10+); False: CP_COHER_CNTL (gfx9)
    acquire_mem_dwords: int
    sdma_copy_max_bytes: int  # COPY_LINEAR count field width: bits 29:0 on SDMA 5+, 21:0 on SDMA 4.x
    sdma_fence_mtype: bool  # FENCE header carries MTYPE (SDMA 5+)

    @property
    def release_writeback(self) -> int:
        """RELEASE_MEM dword-1 cache bits that write back and invalidate so other agents see the data."""
        return GFX11_RELEASE_WRITEBACK if self.gcr_dialect else GFX9_RELEASE_WRITEBACK


# gfx11: ACQUIRE_MEM is header + 7 (coher_cntl, size lo/hi, base lo/hi, poll interval, GCR_CNTL) = 8 dwords
# (gfx_v11_0.c emit_mem_sync); gfx9: header + 6 (CP_COHER_CNTL, size lo/hi, base lo/hi, poll) = 7 (soc15d.h
# layout comment; gfx_v9_0.c emit_mem_sync writes PACKET3(ACQUIRE_MEM, 5)). SDMA copy limits:
# sdma_v6_0_0_pkt_open.h COUNT mask 0x3FFFFFFF (1 GiB), the SDMA 4.x headers 0x003FFFFF (4 MiB); the count
# field holds bytes - 1.
GFX11 = GfxFamily("gfx11", "gfx1100", (11, 0, 0), (6, 0, 0), 32, GFX11_COMPUTE_PGM_RSRC3, True, True, 8,
                  1 << 30, True)
GFX943 = GfxFamily("gfx9.4.3", "gfx942", (9, 4, 3), (4, 4, 2), 64, GFX9_COMPUTE_PGM_RSRC3, False, False, 7,
                   1 << 22, False)
FAMILIES = {f.arch: f for f in (GFX11, GFX943)}


def family(arch: str) -> GfxFamily:
    """The register family of a gfx target name ("gfx1100", "gfx942")."""
    try:
        return FAMILIES[arch]
    except KeyError:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(f"no AMD register family for {arch!r}; known: {known}") from None


SH_REGISTER_NAMES = {
    COMPUTE_DISPATCH_INITIATOR: "COMPUTE_DISPATCH_INITIATOR", COMPUTE_START_X: "COMPUTE_START_X",
    COMPUTE_START_X + 1: "COMPUTE_START_Y", COMPUTE_START_X + 2: "COMPUTE_START_Z",
    COMPUTE_NUM_THREAD_X: "COMPUTE_NUM_THREAD_X", COMPUTE_NUM_THREAD_Y: "COMPUTE_NUM_THREAD_Y",
    COMPUTE_NUM_THREAD_Z: "COMPUTE_NUM_THREAD_Z", COMPUTE_PGM_LO: "COMPUTE_PGM_LO",
    COMPUTE_PGM_HI: "COMPUTE_PGM_HI",
    COMPUTE_DISPATCH_SCRATCH_BASE_LO: "COMPUTE_DISPATCH_SCRATCH_BASE_LO",
    COMPUTE_DISPATCH_SCRATCH_BASE_HI: "COMPUTE_DISPATCH_SCRATCH_BASE_HI",
    COMPUTE_PGM_RSRC1: "COMPUTE_PGM_RSRC1", COMPUTE_PGM_RSRC2: "COMPUTE_PGM_RSRC2",
    COMPUTE_RESOURCE_LIMITS: "COMPUTE_RESOURCE_LIMITS", COMPUTE_TMPRING_SIZE: "COMPUTE_TMPRING_SIZE",
    COMPUTE_RESTART_X: "COMPUTE_RESTART_X", COMPUTE_RESTART_X + 1: "COMPUTE_RESTART_Y",
    COMPUTE_RESTART_X + 2: "COMPUTE_RESTART_Z",
    **{COMPUTE_USER_DATA_0 + i: f"COMPUTE_USER_DATA_{i}" for i in range(NUM_USER_DATA_REGS)},
}


def register_name(reg: int, fam: GfxFamily | None = None) -> str:
    """A register's name for messages (RSRC3 depends on the family)."""
    if fam is not None and reg == fam.compute_pgm_rsrc3:
        return "COMPUTE_PGM_RSRC3"
    return SH_REGISTER_NAMES.get(reg, f"register {reg:#06x}")
