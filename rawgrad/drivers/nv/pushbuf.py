"""Typed builders for NVIDIA command descriptors and the queue encoders built from them.

Everything here is pure: encoders append 32-bit words to a :class:`PushBuffer`; nothing touches a
device. Field positions come from NVIDIA's class headers (clc56f.h / clc86f.h host classes,
clc6b5.h / clc7b5.h / clc8b5.h copy classes, clc6c0.h / clc7c0.h / clc9c0.h / clcbc0.h compute classes,
clc361.h usermode; NVIDIA/open-gpu-kernel-modules and NVIDIA/open-gpu-doc) as summarised in NV-FACTS
sections 4 to 6; tests/nv/test_pushbuf_headers.py pins every value below to those headers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from rawgrad.drivers.nv import abi


@dataclass(frozen=True)
class BitField:
    """Bits ``hi:lo`` (inclusive) of a word."""

    hi: int
    lo: int

    @property
    def width(self) -> int:
        return self.hi - self.lo + 1

    def put(self, value: int, name: str = "field") -> int:
        if not 0 <= value < (1 << self.width):
            raise ValueError(f"{name}={value:#x} does not fit bits {self.hi}:{self.lo}")
        return value << self.lo

    def get(self, word: int) -> int:
        return (word >> self.lo) & ((1 << self.width) - 1)


def pack(**fields: tuple[BitField, int]) -> int:
    word = 0
    for name, (field, value) in fields.items():
        word |= field.put(int(value), name)
    return word


# ---------------------------------------------------------------------------------------------
# Method header (clc56f.h / dev_pbdma.ref NV_FIFO_DMA_*; NV-FACTS 4.4)
METHOD_ADDRESS = BitField(11, 0)  # NV_FIFO_DMA_METHOD_ADDRESS (dword index = byte offset / 4)
METHOD_SUBCHANNEL = BitField(15, 13)  # NV_FIFO_DMA_METHOD_SUBCHANNEL
METHOD_COUNT = BitField(28, 16)  # NV_FIFO_DMA_METHOD_COUNT / NV_FIFO_DMA_IMMD_DATA
METHOD_SEC_OP = BitField(31, 29)  # NV_FIFO_DMA_SEC_OP


class SecOp(IntEnum):
    """NV_FIFO_DMA_SEC_OP values."""

    GRP0_USE_TERT = 0
    INC_METHOD = 1
    GRP2_USE_TERT = 2
    NON_INC_METHOD = 3
    IMMD_DATA_METHOD = 4
    ONE_INC = 5
    RESERVED = 6
    END_PB_SEGMENT = 7


@dataclass(frozen=True)
class MethodHeader:
    """One pushbuffer method header; ``method`` is the byte offset of the method."""

    sec_op: SecOp
    subchannel: int
    method: int
    count: int  # data dwords that follow, or the 13-bit immediate for IMMD_DATA_METHOD

    def encode(self) -> int:
        if self.method % 4:
            raise ValueError(f"method offset {self.method:#x} is not dword aligned")
        return pack(
            sec_op=(METHOD_SEC_OP, self.sec_op),
            count=(METHOD_COUNT, self.count),
            subchannel=(METHOD_SUBCHANNEL, self.subchannel),
            method=(METHOD_ADDRESS, self.method // 4),
        )


# Subchannel convention (cla06fsubch.h; NV-FACTS 4.4)
SUBCH_HOST = 0  # host methods (< 0x100) are executed by the PBDMA on any subchannel; use 0
SUBCH_COMPUTE = 1  # cla06fsubch.h NVA06F_SUBCHANNEL_COMPUTE
SUBCH_COPY = 4  # cla06fsubch.h NVA06F_SUBCHANNEL_COPY_ENGINE

# ---------------------------------------------------------------------------------------------
# Host (channel class) methods, clc56f.h / clc86f.h
NVC56F_SET_OBJECT = 0x0000  # NVC56F_SET_OBJECT
SET_OBJECT_NVCLASS = BitField(15, 0)  # NVC56F_SET_OBJECT_NVCLASS
SET_OBJECT_ENGINE = BitField(20, 16)  # NVC56F_SET_OBJECT_ENGINE (we send 0; ENGINE_SW is 0x1f)
NVC56F_NON_STALL_INTERRUPT = 0x0020  # NVC56F_NON_STALL_INTERRUPT
NVC56F_MEM_OP_A = 0x0028  # NVC56F_MEM_OP_A
NVC56F_MEM_OP_B = 0x002C  # NVC56F_MEM_OP_B
NVC56F_MEM_OP_C = 0x0030  # NVC56F_MEM_OP_C
NVC56F_MEM_OP_D = 0x0034  # NVC56F_MEM_OP_D
MEM_OP_C_MEMBAR_TYPE = BitField(2, 0)  # NVC56F_MEM_OP_C_MEMBAR_TYPE
MEM_OP_C_MEMBAR_TYPE_SYS_MEMBAR = 0
MEM_OP_D_OPERATION = BitField(31, 27)  # NVC56F_MEM_OP_D_OPERATION
MEM_OP_D_OPERATION_MEMBAR = 5
NVC56F_SEM_ADDR_LO = 0x005C  # NVC56F_SEM_ADDR_LO (bits 31:2 of the VA)
NVC56F_SEM_ADDR_HI = 0x0060  # NVC56F_SEM_ADDR_HI
NVC56F_SEM_PAYLOAD_LO = 0x0064  # NVC56F_SEM_PAYLOAD_LO
NVC56F_SEM_PAYLOAD_HI = 0x0068  # NVC56F_SEM_PAYLOAD_HI
NVC56F_SEM_EXECUTE = 0x006C  # NVC56F_SEM_EXECUTE
NVC56F_WFI = 0x0078  # NVC56F_WFI
WFI_SCOPE_ALL = 1  # NVC56F_WFI_SCOPE_ALL
HOST_METHOD_LIMIT = 0x0100  # methods below this offset belong to the host (PBDMA)

SEM_EXECUTE_OPERATION = BitField(2, 0)  # NVC56F_SEM_EXECUTE_OPERATION
SEM_EXECUTE_ACQUIRE_SWITCH_TSG = BitField(12, 12)  # NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG
SEM_EXECUTE_RELEASE_WFI = BitField(20, 20)  # NVC56F_SEM_EXECUTE_RELEASE_WFI
SEM_EXECUTE_PAYLOAD_SIZE = BitField(24, 24)  # NVC56F_SEM_EXECUTE_PAYLOAD_SIZE (1 = 64-bit)
SEM_EXECUTE_RELEASE_TIMESTAMP = BitField(25, 25)  # NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP
SEM_EXECUTE_REDUCTION = BitField(30, 27)  # NVC56F_SEM_EXECUTE_REDUCTION
SEM_EXECUTE_REDUCTION_FORMAT = BitField(31, 31)  # NVC56F_SEM_EXECUTE_REDUCTION_FORMAT


class SemOp(IntEnum):
    """NVC56F_SEM_EXECUTE_OPERATION values."""

    ACQUIRE = 0
    RELEASE = 1
    ACQ_STRICT_GEQ = 2
    ACQ_CIRC_GEQ = 3
    ACQ_AND = 4
    ACQ_NOR = 5
    REDUCTION = 6


@dataclass(frozen=True)
class SemExecute:
    """The SEM_EXECUTE data word."""

    operation: SemOp
    payload_64bit: bool = True
    release_wfi: bool = False
    release_timestamp: bool = False
    acquire_switch_tsg: bool = False

    def encode(self) -> int:
        return pack(
            operation=(SEM_EXECUTE_OPERATION, self.operation),
            acquire_switch_tsg=(SEM_EXECUTE_ACQUIRE_SWITCH_TSG, self.acquire_switch_tsg),
            release_wfi=(SEM_EXECUTE_RELEASE_WFI, self.release_wfi),
            payload_size=(SEM_EXECUTE_PAYLOAD_SIZE, self.payload_64bit),
            release_timestamp=(SEM_EXECUTE_RELEASE_TIMESTAMP, self.release_timestamp),
        )


@dataclass(frozen=True)
class HostClass:
    """Per GPFIFO class facts the host encoders need."""

    cls: int
    sem_addr_hi: BitField  # width of SEM_ADDR_HI's OFFSET field

    @property
    def max_va_bits(self) -> int:
        return 32 + self.sem_addr_hi.width


HOST_CLASSES = {
    abi.AMPERE_CHANNEL_GPFIFO_A: HostClass(abi.AMPERE_CHANNEL_GPFIFO_A, BitField(7, 0)),  # clc56f.h 7:0
    abi.HOPPER_CHANNEL_GPFIFO_A: HostClass(abi.HOPPER_CHANNEL_GPFIFO_A, BitField(24, 0)),  # clc86f.h 24:0
}

# ---------------------------------------------------------------------------------------------
# GP entry (clc56f.h NVC56F_GP_ENTRY0/1_*; NV-FACTS 4.3). Fields are given over the 64-bit entry.
GP_ENTRY_FETCH = BitField(0, 0)  # NVC56F_GP_ENTRY0_FETCH (0 unconditional)
GP_ENTRY_GET = BitField(31, 2)  # NVC56F_GP_ENTRY0_GET (pushbuffer VA bits 31:2)
GP_ENTRY_GET_HI = BitField(39, 32)  # NVC56F_GP_ENTRY1_GET_HI (VA bits 39:32)
GP_ENTRY_OPCODE = BitField(39, 32)  # NVC56F_GP_ENTRY1_OPCODE (control entries, LENGTH == 0)
GP_ENTRY_LEVEL = BitField(41, 41)  # NVC56F_GP_ENTRY1_LEVEL (0 MAIN, 1 SUBROUTINE)
GP_ENTRY_LENGTH = BitField(62, 42)  # NVC56F_GP_ENTRY1_LENGTH (dwords)
GP_ENTRY_SYNC = BitField(63, 63)  # NVC56F_GP_ENTRY1_SYNC (1 WAIT)
GP_ENTRY_BYTES = 8
GP_MAX_PUSHBUFFER_VA = 1 << 40  # without a SET_PB_SEGMENT_EXTENDED_BASE control entry


@dataclass(frozen=True)
class GPEntry:
    """One GPFIFO entry pointing at a pushbuffer segment."""

    address: int
    length_dwords: int
    subroutine: bool = False
    sync_wait: bool = False

    def encode(self) -> int:
        if self.address % 4 or not 0 <= self.address < GP_MAX_PUSHBUFFER_VA:
            raise ValueError(f"pushbuffer VA {self.address:#x} must be 4-byte aligned and below 2^40")
        if self.length_dwords <= 0:
            raise ValueError("a GP entry needs a non-empty segment (length 0 is a control entry)")
        return pack(
            get=(GP_ENTRY_GET, (self.address & 0xFFFFFFFF) >> 2),
            get_hi=(GP_ENTRY_GET_HI, self.address >> 32),
            level=(GP_ENTRY_LEVEL, self.subroutine),
            length=(GP_ENTRY_LENGTH, self.length_dwords),
            sync=(GP_ENTRY_SYNC, self.sync_wait),
        )


# ---------------------------------------------------------------------------------------------
# USERD (HopperAControlGPFifo / AmpereAControlGPFifo; NV-FACTS 4.2)
USERD_GP_GET = 0x88  # clc86f.h HopperAControlGPFifo.GPGet
USERD_GP_PUT = 0x8C  # clc86f.h HopperAControlGPFifo.GPPut
USERD_BYTES = 512  # size of the USERD record
# Usermode MMIO (clc661.h / clc361.h NVC361_*; NV-FACTS 3.4)
USERMODE_MAP_BYTES = 0x10000
USERMODE_TIME_0 = 0x80  # NVC361_TIME_0 (ns, bits 31:5 valid)
USERMODE_TIME_1 = 0x84  # NVC361_TIME_1 (ns, high bits 28:0)
USERMODE_NOTIFY_CHANNEL_PENDING = 0x90  # NVC361_NOTIFY_CHANNEL_PENDING (doorbell)

# ---------------------------------------------------------------------------------------------
# Compute class methods (clc6c0.h / clc7c0.h / clc9c0.h / clcbc0.h; offsets identical; NV-FACTS 5.1)
NVC7C0_SET_OBJECT = 0x0000
NVC7C0_NO_OPERATION = 0x0100
NVC7C0_WAIT_FOR_IDLE = 0x0110
NVC7C0_INVALIDATE_SKED_CACHES = 0x0298
NVC7C0_SET_SHADER_SHARED_MEMORY_WINDOW_A = 0x02A0  # A: bits 48:32 (16:0)
NVC7C0_SET_SHADER_SHARED_MEMORY_WINDOW_B = 0x02A4  # B: bits 31:0
NVC7C0_SEND_PCAS_A = 0x02B4  # QMD VA >> 8
NVC7C0_SEND_SIGNALING_PCAS2_B = 0x02C0  # bits 3:0 PCAS_ACTION
NVC7C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A = 0x02E4
NVC7C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B = 0x02E8
NVC7C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C = 0x02EC
NVC7C0_SET_SHADER_LOCAL_MEMORY_A = 0x0790
NVC7C0_SET_SHADER_LOCAL_MEMORY_B = 0x0794
NVC7C0_SET_SHADER_LOCAL_MEMORY_WINDOW_A = 0x07B0
NVC7C0_SET_SHADER_LOCAL_MEMORY_WINDOW_B = 0x07B4
NVC7C0_INVALIDATE_SHADER_CACHES_NO_WFI = 0x1698
INVALIDATE_SHADER_CACHES_INSTRUCTION = BitField(0, 0)  # ..._NO_WFI_INSTRUCTION
INVALIDATE_SHADER_CACHES_GLOBAL_DATA = BitField(4, 4)  # ..._NO_WFI_GLOBAL_DATA
INVALIDATE_SHADER_CACHES_CONSTANT = BitField(12, 12)  # ..._NO_WFI_CONSTANT
WINDOW_UPPER = BitField(16, 0)  # SET_SHADER_*_WINDOW_A BASE_ADDRESS_UPPER (bits 48:32)
# Window placement (NV-FACTS 5.6): Hopper needs the shared window 4 GiB aligned;
# neither window may overlap a buffer VA.
SHARED_MEMORY_WINDOW = 0x7294_0000_0000
LOCAL_MEMORY_WINDOW = 0x7293_0000_0000

# ---------------------------------------------------------------------------------------------
# Copy engine (clc6b5.h / clc7b5.h / clc8b5.h; offsets identical; NV-FACTS 6.1)
NVC7B5_NOP = 0x0100
NVC7B5_SET_SEMAPHORE_A = 0x0240  # upper VA bits
NVC7B5_SET_SEMAPHORE_B = 0x0244  # lower VA bits
NVC7B5_SET_SEMAPHORE_PAYLOAD = 0x0248
NVC7B5_SET_SEMAPHORE_PAYLOAD_UPPER = 0x024C  # C7B5 and later only
NVC7B5_LAUNCH_DMA = 0x0300
NVC7B5_OFFSET_IN_UPPER = 0x0400
NVC7B5_OFFSET_IN_LOWER = 0x0404
NVC7B5_OFFSET_OUT_UPPER = 0x0408
NVC7B5_OFFSET_OUT_LOWER = 0x040C
NVC7B5_PITCH_IN = 0x0410
NVC7B5_PITCH_OUT = 0x0414
NVC7B5_LINE_LENGTH_IN = 0x0418
NVC7B5_LINE_COUNT = 0x041C

LAUNCH_DMA_DATA_TRANSFER_TYPE = BitField(1, 0)  # NONE 0, PIPELINED 1, NON_PIPELINED 2
LAUNCH_DMA_FLUSH_ENABLE = BitField(2, 2)
LAUNCH_DMA_SEMAPHORE_TYPE = BitField(4, 3)  # NONE 0, RELEASE_ONE_WORD 1, RELEASE_FOUR_WORD 2
LAUNCH_DMA_INTERRUPT_TYPE = BitField(6, 5)
LAUNCH_DMA_SRC_MEMORY_LAYOUT = BitField(7, 7)  # 1 PITCH
LAUNCH_DMA_DST_MEMORY_LAYOUT = BitField(8, 8)  # 1 PITCH
LAUNCH_DMA_MULTI_LINE_ENABLE = BitField(9, 9)
LAUNCH_DMA_SRC_TYPE = BitField(12, 12)  # 0 VIRTUAL
LAUNCH_DMA_DST_TYPE = BitField(13, 13)  # 0 VIRTUAL
LAUNCH_DMA_FLUSH_TYPE = BitField(25, 25)  # 0 SYS, 1 GL
LAUNCH_DMA_SEMAPHORE_PAYLOAD_SIZE = BitField(27, 27)  # C7B5+: 1 = 64-bit payload


class DataTransfer(IntEnum):
    NONE = 0
    PIPELINED = 1
    NON_PIPELINED = 2


class CopySemaphore(IntEnum):
    NONE = 0
    RELEASE_ONE_WORD = 1
    RELEASE_FOUR_WORD = 2


@dataclass(frozen=True)
class LaunchDma:
    """The copy engine LAUNCH_DMA data word (pitch layouts, virtual addresses)."""

    transfer: DataTransfer = DataTransfer.NON_PIPELINED
    semaphore: CopySemaphore = CopySemaphore.NONE
    flush: bool = False
    multi_line: bool = False
    payload_64bit: bool = False

    def encode(self) -> int:
        return pack(
            transfer=(LAUNCH_DMA_DATA_TRANSFER_TYPE, self.transfer),
            flush=(LAUNCH_DMA_FLUSH_ENABLE, self.flush),
            semaphore=(LAUNCH_DMA_SEMAPHORE_TYPE, self.semaphore),
            src_pitch=(LAUNCH_DMA_SRC_MEMORY_LAYOUT, self.transfer != DataTransfer.NONE),
            dst_pitch=(LAUNCH_DMA_DST_MEMORY_LAYOUT, self.transfer != DataTransfer.NONE),
            multi_line=(LAUNCH_DMA_MULTI_LINE_ENABLE, self.multi_line),
            payload_size=(LAUNCH_DMA_SEMAPHORE_PAYLOAD_SIZE, self.payload_64bit),
        )


@dataclass(frozen=True)
class CopyClass:
    """Per copy-class facts."""

    cls: int
    upper: BitField  # OFFSET_*_UPPER / SET_SEMAPHORE_A field
    has_payload_upper: bool


COPY_CLASSES = {
    abi.AMPERE_DMA_COPY_A: CopyClass(abi.AMPERE_DMA_COPY_A, BitField(16, 0), False),  # clc6b5.h
    abi.AMPERE_DMA_COPY_B: CopyClass(abi.AMPERE_DMA_COPY_B, BitField(16, 0), True),  # clc7b5.h
    abi.HOPPER_DMA_COPY_A: CopyClass(abi.HOPPER_DMA_COPY_A, BitField(24, 0), True),  # clc8b5.h
}
COPY_MAX_CHUNK = 1 << 31  # LINE_LENGTH_IN is 32 bits; stay well inside it (NV-FACTS 6.2)


# ---------------------------------------------------------------------------------------------
class PushBuffer:
    """A growing list of 32-bit pushbuffer words."""

    def __init__(self) -> None:
        self.words: list[int] = []

    def __len__(self) -> int:
        return len(self.words)

    def inc(self, subch: int, method: int, *data: int) -> PushBuffer:
        """Incrementing method: data[i] goes to method + 4*i."""
        self.words.append(MethodHeader(SecOp.INC_METHOD, subch, method, len(data)).encode())
        self.words.extend(d & 0xFFFFFFFF for d in data)
        return self

    def non_inc(self, subch: int, method: int, *data: int) -> PushBuffer:
        """Non-incrementing method: every data dword goes to the same method."""
        self.words.append(MethodHeader(SecOp.NON_INC_METHOD, subch, method, len(data)).encode())
        self.words.extend(d & 0xFFFFFFFF for d in data)
        return self

    def immd(self, subch: int, method: int, value: int) -> PushBuffer:
        """Immediate-data method (13-bit value in the header, no payload dword)."""
        self.words.append(MethodHeader(SecOp.IMMD_DATA_METHOD, subch, method, value).encode())
        return self

    def extend(self, other: PushBuffer) -> PushBuffer:
        self.words.extend(other.words)
        return self

    def to_bytes(self) -> bytes:
        return struct.pack(f"<{len(self.words)}I", *self.words)


def _split64(value: int) -> tuple[int, int]:
    return value >> 32, value & 0xFFFFFFFF


def set_object(pb: PushBuffer, subch: int, cls: int) -> PushBuffer:
    """Bind engine class ``cls`` to ``subch`` (SET_OBJECT)."""
    return pb.inc(
        subch, NVC56F_SET_OBJECT, pack(nvclass=(SET_OBJECT_NVCLASS, cls), engine=(SET_OBJECT_ENGINE, 0))
    )


def _host_sem(
    pb: PushBuffer, host: HostClass, addr: int, payload: int, execute: SemExecute, align: int
) -> PushBuffer:
    if addr % align:
        raise ValueError(f"semaphore VA {addr:#x} must be {align}-byte aligned for {execute}")
    hi, lo = _split64(addr)
    phi, plo = _split64(payload)
    return pb.inc(
        SUBCH_HOST,
        NVC56F_SEM_ADDR_LO,
        lo,
        host.sem_addr_hi.put(hi, "SEM_ADDR_HI"),
        plo,
        phi,
        execute.encode(),
    )


def sem_release(
    pb: PushBuffer,
    host: HostClass,
    addr: int,
    value: int,
    *,
    timestamp: bool = True,
    wfi: bool = True,
    payload_64bit: bool = True,
) -> PushBuffer:
    """Host semaphore release (optionally after WFI, optionally writing the timer at addr+8)."""
    ex = SemExecute(SemOp.RELEASE, payload_64bit=payload_64bit, release_wfi=wfi, release_timestamp=timestamp)
    # dev_pbdma.ref: 16-byte alignment with a timestamp, else the payload size (NV-FACTS 4.6)
    return _host_sem(pb, host, addr, value, ex, 16 if timestamp else (8 if payload_64bit else 4))


def sem_acquire(
    pb: PushBuffer,
    host: HostClass,
    addr: int,
    value: int,
    *,
    op: SemOp = SemOp.ACQ_CIRC_GEQ,
    payload_64bit: bool = True,
    switch_tsg: bool = False,
) -> PushBuffer:
    """Host semaphore acquire: the channel stalls until the comparison holds."""
    if op in (SemOp.RELEASE, SemOp.REDUCTION):
        raise ValueError(f"{op!r} is not an acquire operation")
    # No ACQUIRE_SWITCH_TSG by default: both our channels share one TSG (tinygrad's 0x01000003 form).
    ex = SemExecute(op, payload_64bit=payload_64bit, acquire_switch_tsg=switch_tsg)
    return _host_sem(pb, host, addr, value, ex, 8 if payload_64bit else 4)


def timestamp(pb: PushBuffer, host: HostClass, record_addr: int, value: int = 0) -> PushBuffer:
    """Write ``value`` at record_addr and the GPU timer (ns) at record_addr+8 (16-byte record)."""
    return sem_release(pb, host, record_addr, value, timestamp=True, wfi=True, payload_64bit=True)


def memory_barrier(pb: PushBuffer) -> PushBuffer:
    """Wait for idle, then a system-scope memory barrier (host MEM_OP MEMBAR SYS_MEMBAR)."""
    pb.inc(SUBCH_HOST, NVC56F_WFI, pack(scope=(BitField(0, 0), WFI_SCOPE_ALL)))
    return pb.inc(
        SUBCH_HOST,
        NVC56F_MEM_OP_A,
        0,
        0,
        pack(membar_type=(MEM_OP_C_MEMBAR_TYPE, MEM_OP_C_MEMBAR_TYPE_SYS_MEMBAR)),
        pack(operation=(MEM_OP_D_OPERATION, MEM_OP_D_OPERATION_MEMBAR)),
    )


def non_stall_interrupt(pb: PushBuffer) -> PushBuffer:
    return pb.inc(SUBCH_HOST, NVC56F_NON_STALL_INTERRUPT, 0)


def invalidate_shader_caches(pb: PushBuffer) -> PushBuffer:
    """Compute: invalidate instruction, global-data and constant caches (no WFI)."""
    return pb.inc(
        SUBCH_COMPUTE,
        NVC7C0_INVALIDATE_SHADER_CACHES_NO_WFI,
        pack(
            instruction=(INVALIDATE_SHADER_CACHES_INSTRUCTION, 1),
            global_data=(INVALIDATE_SHADER_CACHES_GLOBAL_DATA, 1),
            constant=(INVALIDATE_SHADER_CACHES_CONSTANT, 1),
        ),
    )


def compute_bootstrap(
    pb: PushBuffer,
    compute_cls: int,
    shared_window: int = SHARED_MEMORY_WINDOW,
    local_window: int = LOCAL_MEMORY_WINDOW,
) -> PushBuffer:
    """Bind the compute class on its subchannel and place the shared/local memory windows."""
    set_object(pb, SUBCH_COMPUTE, compute_cls)
    lhi, llo = _split64(local_window)
    pb.inc(SUBCH_COMPUTE, NVC7C0_SET_SHADER_LOCAL_MEMORY_WINDOW_A, WINDOW_UPPER.put(lhi, "local window"), llo)
    shi, slo = _split64(shared_window)
    return pb.inc(
        SUBCH_COMPUTE, NVC7C0_SET_SHADER_SHARED_MEMORY_WINDOW_A, WINDOW_UPPER.put(shi, "shared window"), slo
    )


SHADER_LOCAL_MEMORY_UPPER = {  # SET_SHADER_LOCAL_MEMORY_A ADDRESS_UPPER width (NV-FACTS 5.1)
    abi.HOPPER_COMPUTE_A: BitField(24, 0),  # clcbc0.h 24:0
}
SHADER_LOCAL_MEMORY_UPPER_DEFAULT = BitField(16, 0)  # clc6c0.h / clc7c0.h / clc9c0.h 16:0
NON_THROTTLED_A_UPPER = BitField(7, 0)  # SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A: bytes-per-TPC bits 39:32
NON_THROTTLED_C_MAX_SM_COUNT = BitField(8, 0)  # SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C MAX_SM_COUNT


def shader_local_memory(
    pb: PushBuffer, compute_cls: int, address: int, bytes_per_tpc: int, max_sm_count: int
) -> PushBuffer:
    """Point the compute engine at the shader-local-memory (SLM) backing buffer (NV-FACTS 2.2 step 35)."""
    hi, lo = _split64(address)
    upper = SHADER_LOCAL_MEMORY_UPPER.get(compute_cls, SHADER_LOCAL_MEMORY_UPPER_DEFAULT)
    pb.inc(SUBCH_COMPUTE, NVC7C0_SET_SHADER_LOCAL_MEMORY_A, upper.put(hi, "SLM address upper"), lo)
    thi, tlo = _split64(bytes_per_tpc)
    return pb.inc(
        SUBCH_COMPUTE,
        NVC7C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A,
        NON_THROTTLED_A_UPPER.put(thi, "SLM bytes per TPC upper"),
        tlo,
        NON_THROTTLED_C_MAX_SM_COUNT.put(max_sm_count, "SLM max SM count"),
    )


def ce_copy(pb: PushBuffer, copy: CopyClass, dst: int, src: int, nbytes: int) -> PushBuffer:
    """Linear copy of ``nbytes`` from VA ``src`` to VA ``dst`` on the copy engine (chunks < 2^31)."""
    if nbytes < 0:
        raise ValueError(f"copy size {nbytes} is negative")
    launch = LaunchDma(DataTransfer.NON_PIPELINED).encode()
    done = 0
    while done < nbytes:
        chunk = min(nbytes - done, COPY_MAX_CHUNK)
        shi, slo = _split64(src + done)
        dhi, dlo = _split64(dst + done)
        pb.inc(
            SUBCH_COPY,
            NVC7B5_OFFSET_IN_UPPER,
            copy.upper.put(shi, "OFFSET_IN_UPPER"),
            slo,
            copy.upper.put(dhi, "OFFSET_OUT_UPPER"),
            dlo,
        )
        pb.inc(SUBCH_COPY, NVC7B5_LINE_LENGTH_IN, chunk)
        pb.inc(SUBCH_COPY, NVC7B5_LAUNCH_DMA, launch)
        done += chunk
    return pb


def ce_sem_release(
    pb: PushBuffer, copy: CopyClass, addr: int, value: int, *, payload_64bit: bool = True
) -> PushBuffer:
    """Copy-engine semaphore release (four-word record: payload + timestamp) after a flush."""
    if addr % 16:
        raise ValueError(f"copy-engine four-word semaphore VA {addr:#x} must be 16-byte aligned")
    if payload_64bit and not copy.has_payload_upper:
        raise ValueError(f"{abi.CLASS_NAMES.get(copy.cls, hex(copy.cls))} has no 64-bit semaphore payload")
    hi, lo = _split64(addr)
    phi, plo = _split64(value)
    data = [copy.upper.put(hi, "SET_SEMAPHORE_A"), lo, plo] + ([phi] if payload_64bit else [])
    pb.inc(SUBCH_COPY, NVC7B5_SET_SEMAPHORE_A, *data)
    launch = LaunchDma(
        DataTransfer.NONE, CopySemaphore.RELEASE_FOUR_WORD, flush=True, payload_64bit=payload_64bit
    )
    return pb.inc(SUBCH_COPY, NVC7B5_LAUNCH_DMA, launch.encode())
