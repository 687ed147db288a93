"""Every method offset, bit field and enumerated value pushbuf.py uses, pinned to NVIDIA's own headers.

The expected values below are plain data copied from NVIDIA's MIT-licensed class headers and reference
manuals (numbers only; no code). Each table names the header path, repository and stored commit it came
from, so the check stays permanent without network access. Bit fields are ``(hi, lo)`` as the headers
write ``hi:lo``; GP entry fields are given over the 64-bit entry (a GP_ENTRY1 field ``h:l`` is
``h+32:l+32`` here). Where pushbuf.py uses one constant for several classes (the NVC56F_* host methods for
C56F and C86F, NVC7C0_* for every compute class, NVC7B5_* for every copy class) the table holds each
class's own value and the test checks all of them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import pytest

from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv import pushbuf as pb

# --- sources -------------------------------------------------------------------------------------------
# [C56F]  NVIDIA/open-gpu-kernel-modules kernel-open/nvidia-uvm/clc56f.h            (1739a20efc4a)
# [C86F]  NVIDIA/open-gpu-kernel-modules kernel-open/nvidia-uvm/clc86f.h            (41595798880)
#         (the SDK copy src/common/sdk/nvidia/inc/class/clc86f.h, 448d5cc65624, agrees line for line)
# [PBDMA] NVIDIA/open-gpu-doc Host-Fifo/volta/gv100/dev_pbdma.ref.txt              (60b67c31fcad)
# [UMODE] NVIDIA/open-gpu-doc Host-Fifo/volta/gv100/dev_usermode.ref.txt           (60b67c31fcad)
# [C361]  NVIDIA/open-gpu-kernel-modules src/common/sdk/nvidia/inc/class/clc361.h   (1739a20efc4a)
# [SUBCH] NVIDIA/open-gpu-kernel-modules src/common/sdk/nvidia/inc/class/cla06fsubch.h (63c05c676fa9)
# [C6C0]  NVIDIA/open-gpu-kernel-modules src/common/sdk/nvidia/inc/class/clc6c0.h   (1739a20efc4a)
# [C7C0]  NVIDIA/open-gpu-kernel-modules src/common/sdk/nvidia/inc/class/clc7c0.h   (1739a20efc4a)
# [C9C0]  NVIDIA/open-gpu-doc classes/compute/clc9c0.h                              (5d957df17879)
# [CBC0]  NVIDIA/open-gpu-doc classes/compute/clcbc0.h                              (5d957df17879)
# [C6B5]  NVIDIA/open-gpu-kernel-modules kernel-open/nvidia-uvm/clc6b5.h            (1739a20efc4a)
# [C7B5]  NVIDIA/open-gpu-kernel-modules kernel-open/nvidia-uvm/clc7b5.h            (1739a20efc4a)
# [C8B5]  NVIDIA/open-gpu-doc classes/dma-copy/clc8b5.h                             (c8607fe576b5)

Field = tuple[int, int]

# Pushbuffer method header: [C56F] NVC56F_DMA_* ("dma method formats").
METHOD_HEADER_FIELDS: dict[str, Field] = {
    "METHOD_ADDRESS": (11, 0),  # NVC56F_DMA_METHOD_ADDRESS (dword address)
    "METHOD_SUBCHANNEL": (15, 13),  # NVC56F_DMA_METHOD_SUBCHANNEL
    "METHOD_COUNT": (28, 16),  # NVC56F_DMA_METHOD_COUNT, also NVC56F_DMA_IMMD_DATA 28:16
    "METHOD_SEC_OP": (31, 29),  # NVC56F_DMA_SEC_OP
}
SEC_OP: dict[str, int] = {  # [C56F] NVC56F_DMA_SEC_OP_*
    "GRP0_USE_TERT": 0,
    "INC_METHOD": 1,
    "GRP2_USE_TERT": 2,
    "NON_INC_METHOD": 3,
    "IMMD_DATA_METHOD": 4,
    "ONE_INC": 5,
    "RESERVED": 6,  # NVC56F_DMA_SEC_OP_RESERVED6
    "END_PB_SEGMENT": 7,
}

SUBCHANNELS: dict[str, int] = {  # [SUBCH]
    "SUBCH_COMPUTE": 1,  # NVA06F_SUBCHANNEL_COMPUTE
    "SUBCH_COPY": 4,  # NVA06F_SUBCHANNEL_COPY_ENGINE
}

# Host (GPFIFO class) methods: pushbuf name -> {class: offset}; [C56F] NVC56F_*, [C86F] NVC86F_*.
# NON_STALL_INTERRUPT is not in clc86f.h; its [PBDMA] NV_UDMA_NON_STALL_INT is 0x20 as in clc56f.h.
HOST_METHODS: dict[str, dict[int, int]] = {
    "NVC56F_SET_OBJECT": {0xC56F: 0x0000, 0xC86F: 0x0000},
    "NVC56F_NON_STALL_INTERRUPT": {0xC56F: 0x0020},
    "NVC56F_MEM_OP_A": {0xC56F: 0x0028, 0xC86F: 0x0028},
    "NVC56F_MEM_OP_B": {0xC56F: 0x002C, 0xC86F: 0x002C},
    "NVC56F_MEM_OP_C": {0xC56F: 0x0030, 0xC86F: 0x0030},
    "NVC56F_MEM_OP_D": {0xC56F: 0x0034, 0xC86F: 0x0034},
    "NVC56F_SEM_ADDR_LO": {0xC56F: 0x005C, 0xC86F: 0x005C},
    "NVC56F_SEM_ADDR_HI": {0xC56F: 0x0060, 0xC86F: 0x0060},
    "NVC56F_SEM_PAYLOAD_LO": {0xC56F: 0x0064, 0xC86F: 0x0064},
    "NVC56F_SEM_PAYLOAD_HI": {0xC56F: 0x0068, 0xC86F: 0x0068},
    "NVC56F_SEM_EXECUTE": {0xC56F: 0x006C, 0xC86F: 0x006C},
    "NVC56F_WFI": {0xC56F: 0x0078, 0xC86F: 0x0078},
}
HOST_FIELDS: dict[str, Field] = {  # same in [C56F], [C86F] and [PBDMA] NV_UDMA_SEM_EXECUTE_*
    "SET_OBJECT_NVCLASS": (15, 0),  # NVC56F_SET_OBJECT_NVCLASS
    "SET_OBJECT_ENGINE": (20, 16),  # NVC56F_SET_OBJECT_ENGINE
    "MEM_OP_C_MEMBAR_TYPE": (2, 0),  # NVC56F_MEM_OP_C_MEMBAR_TYPE
    "MEM_OP_D_OPERATION": (31, 27),  # NVC56F_MEM_OP_D_OPERATION
    "SEM_EXECUTE_OPERATION": (2, 0),  # NVC56F_SEM_EXECUTE_OPERATION
    "SEM_EXECUTE_ACQUIRE_SWITCH_TSG": (12, 12),  # NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG
    "SEM_EXECUTE_RELEASE_WFI": (20, 20),  # NVC56F_SEM_EXECUTE_RELEASE_WFI
    "SEM_EXECUTE_PAYLOAD_SIZE": (24, 24),  # NVC56F_SEM_EXECUTE_PAYLOAD_SIZE
    "SEM_EXECUTE_RELEASE_TIMESTAMP": (25, 25),  # NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP
    "SEM_EXECUTE_REDUCTION": (30, 27),  # NVC56F_SEM_EXECUTE_REDUCTION
    "SEM_EXECUTE_REDUCTION_FORMAT": (31, 31),  # NVC56F_SEM_EXECUTE_REDUCTION_FORMAT
}
WFI_SCOPE: Field = (0, 0)  # NVC56F_WFI_SCOPE / NVC86F_WFI_SCOPE
HOST_VALUES: dict[str, int] = {
    "WFI_SCOPE_ALL": 1,  # NVC56F_WFI_SCOPE_ALL / NVC86F_WFI_SCOPE_ALL
    "MEM_OP_C_MEMBAR_TYPE_SYS_MEMBAR": 0,  # NVC56F_MEM_OP_C_MEMBAR_TYPE_SYS_MEMBAR (C86F same)
    "MEM_OP_D_OPERATION_MEMBAR": 5,  # NVC56F_MEM_OP_D_OPERATION_MEMBAR (C86F same)
}
SEM_EXECUTE_ENABLE = {  # value written for True: [C56F] / [PBDMA]
    "release_wfi": 1,  # NVC56F_SEM_EXECUTE_RELEASE_WFI_EN (DIS is 0)
    "payload_64bit": 1,  # NVC56F_SEM_EXECUTE_PAYLOAD_SIZE_64BIT (32BIT is 0)
    "release_timestamp": 1,  # NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP_EN
    "acquire_switch_tsg": 1,  # NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG_EN
}
SEM_OP: dict[str, int] = {  # [C56F] NVC56F_SEM_EXECUTE_OPERATION_*, [PBDMA] NV_UDMA_SEM_EXECUTE_OPERATION_*
    "ACQUIRE": 0,
    "RELEASE": 1,
    "ACQ_STRICT_GEQ": 2,
    "ACQ_CIRC_GEQ": 3,
    "ACQ_AND": 4,
    "ACQ_NOR": 5,
    "REDUCTION": 6,
}
SEM_ADDR_HI_OFFSET: dict[int, Field] = {
    0xC56F: (7, 0),  # [C56F] NVC56F_SEM_ADDR_HI_OFFSET
    0xC86F: (24, 0),  # [C86F] NVC86F_SEM_ADDR_HI_OFFSET
}
# [PBDMA] SEM_EXECUTE: "if the PAYLOAD_SIZE is 64BIT, the semaphore address is required to be 8-byte
# aligned.  If RELEASE_TIMESTAMP is EN while the operation is a RELEASE ..., 16-byte aligned."
SEM_ALIGN_TIMESTAMP, SEM_ALIGN_64BIT, SEM_ALIGN_32BIT = 16, 8, 4

# GP entry over the 64-bit entry: [C56F]/[C86F] NVC5xF_GP_ENTRY0/1_*, [PBDMA] NV_PPBDMA_GP_ENTRY0/1_*.
GP_ENTRY_FIELDS: dict[str, Field] = {
    "GP_ENTRY_FETCH": (0, 0),  # GP_ENTRY0_FETCH 0:0
    "GP_ENTRY_GET": (31, 2),  # GP_ENTRY0_GET 31:2
    "GP_ENTRY_GET_HI": (39, 32),  # GP_ENTRY1_GET_HI 7:0
    "GP_ENTRY_OPCODE": (39, 32),  # GP_ENTRY1_OPCODE 7:0
    "GP_ENTRY_LEVEL": (41, 41),  # GP_ENTRY1_LEVEL 9:9
    "GP_ENTRY_LENGTH": (62, 42),  # GP_ENTRY1_LENGTH 30:10
    "GP_ENTRY_SYNC": (63, 63),  # GP_ENTRY1_SYNC 31:31
}
GP_ENTRY_SIZE = 8  # NVC56F_GP_ENTRY__SIZE, NVC86F_GP_ENTRY__SIZE, NV_PPBDMA_GP_ENTRY__SIZE
GP_LEVEL_SUBROUTINE = 1  # GP_ENTRY1_LEVEL_SUBROUTINE (MAIN 0)
GP_SYNC_WAIT = 1  # GP_ENTRY1_SYNC_WAIT (PROCEED 0)
GP_PUSHBUFFER_VA_BITS = 40  # [PBDMA] "38-bit dword-address (which would make a 40-bit byte-address)"

# USERD: [C56F] Nvc56fControl / [C86F] Nvc86fControl ("GPGet ... 0088-008b", "GPPut ... 008c-008f";
# the struct ends with Ignored05[0x5c] after 0x90, 0x200 bytes in all).
USERD = {"USERD_GP_GET": 0x88, "USERD_GP_PUT": 0x8C, "USERD_BYTES": 0x200}

# Usermode: [C361] NVC361_*; [UMODE] NV_USERMODE_* (0x810000 based, "64KB aligned and 64KB in size").
USERMODE = {
    "USERMODE_MAP_BYTES": 65536,  # NVC361_NV_USERMODE__SIZE
    "USERMODE_TIME_0": 0x80,  # NVC361_TIME_0; NV_USERMODE_TIME_0 0x00810080, NSEC 31:5
    "USERMODE_TIME_1": 0x84,  # NVC361_TIME_1; NV_USERMODE_TIME_1 0x00810084, NSEC 28:0
    "USERMODE_NOTIFY_CHANNEL_PENDING": 0x90,  # NVC361_NOTIFY_CHANNEL_PENDING; NV_USERMODE_... 0x00810090
}

# Compute methods: pushbuf name -> offset, the same in [C6C0] NVC6C0_*, [C7C0] NVC7C0_*, [C9C0] NVC9C0_*
# and [CBC0] NVCBC0_* (each checked in its header; SET_OBJECT / NO_OPERATION / WAIT_FOR_IDLE not re-read
# in [C9C0]).
COMPUTE_METHODS: dict[str, int] = {
    "NVC7C0_SET_OBJECT": 0x0000,
    "NVC7C0_NO_OPERATION": 0x0100,
    "NVC7C0_WAIT_FOR_IDLE": 0x0110,
    "NVC7C0_INVALIDATE_SKED_CACHES": 0x0298,
    "NVC7C0_SET_SHADER_SHARED_MEMORY_WINDOW_A": 0x02A0,
    "NVC7C0_SET_SHADER_SHARED_MEMORY_WINDOW_B": 0x02A4,
    "NVC7C0_SEND_PCAS_A": 0x02B4,
    "NVC7C0_SEND_SIGNALING_PCAS2_B": 0x02C0,
    "NVC7C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A": 0x02E4,
    "NVC7C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_B": 0x02E8,
    "NVC7C0_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C": 0x02EC,
    "NVC7C0_SET_SHADER_LOCAL_MEMORY_A": 0x0790,
    "NVC7C0_SET_SHADER_LOCAL_MEMORY_B": 0x0794,
    "NVC7C0_SET_SHADER_LOCAL_MEMORY_WINDOW_A": 0x07B0,
    "NVC7C0_SET_SHADER_LOCAL_MEMORY_WINDOW_B": 0x07B4,
    "NVC7C0_INVALIDATE_SHADER_CACHES_NO_WFI": 0x1698,
}
COMPUTE_FIELDS: dict[str, Field] = {  # same in [C6C0], [C7C0], [C9C0], [CBC0]
    "INVALIDATE_SHADER_CACHES_INSTRUCTION": (0, 0),  # ..._INVALIDATE_SHADER_CACHES_NO_WFI_INSTRUCTION
    "INVALIDATE_SHADER_CACHES_GLOBAL_DATA": (4, 4),  # ..._INVALIDATE_SHADER_CACHES_NO_WFI_GLOBAL_DATA
    "INVALIDATE_SHADER_CACHES_CONSTANT": (12, 12),  # ..._INVALIDATE_SHADER_CACHES_NO_WFI_CONSTANT
    # ..._SET_SHADER_SHARED_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER and
    # ..._SET_SHADER_LOCAL_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER (16:0 in all four, Hopper included)
    "WINDOW_UPPER": (16, 0),
    "NON_THROTTLED_A_UPPER": (7, 0),  # ..._SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A_SIZE_UPPER
    "NON_THROTTLED_C_MAX_SM_COUNT": (8, 0),  # ..._SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_C_MAX_SM_COUNT
}
INVALIDATE_SHADER_CACHES_TRUE = 1  # ..._NO_WFI_INSTRUCTION_TRUE / _GLOBAL_DATA_TRUE / _CONSTANT_TRUE
SHADER_LOCAL_MEMORY_A_ADDRESS_UPPER: dict[int, Field] = {  # ..._SET_SHADER_LOCAL_MEMORY_A_ADDRESS_UPPER
    0xC6C0: (16, 0),  # [C6C0]
    0xC7C0: (16, 0),  # [C7C0]
    0xC9C0: (16, 0),  # [C9C0]
    0xCBC0: (24, 0),  # [CBC0]
}

# Copy engine methods: pushbuf name -> {class: offset}; [C6B5] NVC6B5_*, [C7B5] NVC7B5_*, [C8B5] NVC8B5_*.
# AMPERE_DMA_COPY_A has no SET_SEMAPHORE_PAYLOAD_UPPER (its control struct has Reserved03[0x2] at 0x24C).
COPY_METHODS: dict[str, dict[int, int]] = {
    "NVC7B5_NOP": {0xC6B5: 0x0100, 0xC7B5: 0x0100, 0xC8B5: 0x0100},
    "NVC7B5_SET_SEMAPHORE_A": {0xC6B5: 0x0240, 0xC7B5: 0x0240, 0xC8B5: 0x0240},
    "NVC7B5_SET_SEMAPHORE_B": {0xC6B5: 0x0244, 0xC7B5: 0x0244, 0xC8B5: 0x0244},
    "NVC7B5_SET_SEMAPHORE_PAYLOAD": {0xC6B5: 0x0248, 0xC7B5: 0x0248, 0xC8B5: 0x0248},
    "NVC7B5_SET_SEMAPHORE_PAYLOAD_UPPER": {0xC7B5: 0x024C, 0xC8B5: 0x024C},
    "NVC7B5_LAUNCH_DMA": {0xC6B5: 0x0300, 0xC7B5: 0x0300, 0xC8B5: 0x0300},
    "NVC7B5_OFFSET_IN_UPPER": {0xC6B5: 0x0400, 0xC7B5: 0x0400, 0xC8B5: 0x0400},
    "NVC7B5_OFFSET_IN_LOWER": {0xC6B5: 0x0404, 0xC7B5: 0x0404, 0xC8B5: 0x0404},
    "NVC7B5_OFFSET_OUT_UPPER": {0xC6B5: 0x0408, 0xC7B5: 0x0408, 0xC8B5: 0x0408},
    "NVC7B5_OFFSET_OUT_LOWER": {0xC6B5: 0x040C, 0xC7B5: 0x040C, 0xC8B5: 0x040C},
    "NVC7B5_PITCH_IN": {0xC6B5: 0x0410, 0xC7B5: 0x0410, 0xC8B5: 0x0410},
    "NVC7B5_PITCH_OUT": {0xC6B5: 0x0414, 0xC7B5: 0x0414, 0xC8B5: 0x0414},
    "NVC7B5_LINE_LENGTH_IN": {0xC6B5: 0x0418, 0xC7B5: 0x0418, 0xC8B5: 0x0418},
    "NVC7B5_LINE_COUNT": {0xC6B5: 0x041C, 0xC7B5: 0x041C, 0xC8B5: 0x041C},
}
LAUNCH_DMA_FIELDS: dict[str, Field] = {  # ..._LAUNCH_DMA_*, same in [C6B5], [C7B5], [C8B5] unless noted
    "LAUNCH_DMA_DATA_TRANSFER_TYPE": (1, 0),
    "LAUNCH_DMA_FLUSH_ENABLE": (2, 2),
    "LAUNCH_DMA_SEMAPHORE_TYPE": (4, 3),
    "LAUNCH_DMA_INTERRUPT_TYPE": (6, 5),
    "LAUNCH_DMA_SRC_MEMORY_LAYOUT": (7, 7),
    "LAUNCH_DMA_DST_MEMORY_LAYOUT": (8, 8),
    "LAUNCH_DMA_MULTI_LINE_ENABLE": (9, 9),
    "LAUNCH_DMA_SRC_TYPE": (12, 12),
    "LAUNCH_DMA_DST_TYPE": (13, 13),
    "LAUNCH_DMA_FLUSH_TYPE": (25, 25),
    "LAUNCH_DMA_SEMAPHORE_PAYLOAD_SIZE": (27, 27),  # [C7B5], [C8B5] only (absent from clc6b5.h)
}
DATA_TRANSFER: dict[str, int] = {"NONE": 0, "PIPELINED": 1, "NON_PIPELINED": 2}  # ..._DATA_TRANSFER_TYPE_*
COPY_SEMAPHORE: dict[str, int] = {  # ..._LAUNCH_DMA_SEMAPHORE_TYPE_*
    "NONE": 0,
    "RELEASE_ONE_WORD": 1,  # RELEASE_ONE_WORD_SEMAPHORE
    "RELEASE_FOUR_WORD": 2,  # RELEASE_FOUR_WORD_SEMAPHORE
}
LAUNCH_DMA_PITCH = 1  # ..._SRC/DST_MEMORY_LAYOUT_PITCH (BLOCKLINEAR 0)
LAUNCH_DMA_TWO_WORD_PAYLOAD = 1  # ..._SEMAPHORE_PAYLOAD_SIZE_TWO_WORD (ONE_WORD 0)
LINE_LENGTH_IN_BITS = 32  # ..._LINE_LENGTH_IN_VALUE 31:0
# ..._SET_SEMAPHORE_A_UPPER, ..._OFFSET_IN_UPPER_UPPER and ..._OFFSET_OUT_UPPER_UPPER (equal in each class)
COPY_UPPER: dict[int, Field] = {
    0xC6B5: (16, 0),  # [C6B5]
    0xC7B5: (16, 0),  # [C7B5]
    0xC8B5: (24, 0),  # [C8B5]
}

CLASS_IDS = {  # the class IDs pushbuf.py keys its per-class tables by: #define <NAME> in each header
    "AMPERE_CHANNEL_GPFIFO_A": 0xC56F,
    "HOPPER_CHANNEL_GPFIFO_A": 0xC86F,
    "AMPERE_COMPUTE_A": 0xC6C0,
    "AMPERE_COMPUTE_B": 0xC7C0,
    "ADA_COMPUTE_A": 0xC9C0,
    "HOPPER_COMPUTE_A": 0xCBC0,
    "AMPERE_DMA_COPY_A": 0xC6B5,
    "AMPERE_DMA_COPY_B": 0xC7B5,
    "HOPPER_DMA_COPY_A": 0xC8B5,
}

# pushbuf.py constants that are rawgrad's own choices, not header facts (kept out of the tables on purpose).
NOT_FROM_HEADERS = {
    "SUBCH_HOST",  # any subchannel reaches host methods; 0 by convention
    "HOST_METHOD_LIMIT",  # host methods end below 0x100, where every engine class starts (NO_OPERATION/NOP)
    "SHARED_MEMORY_WINDOW",
    "LOCAL_MEMORY_WINDOW",
    "COPY_MAX_CHUNK",
    "GP_MAX_PUSHBUFFER_VA",  # derived; checked against GP_PUSHBUFFER_VA_BITS below
    "SHADER_LOCAL_MEMORY_UPPER_DEFAULT",  # checked through SHADER_LOCAL_MEMORY_A_ADDRESS_UPPER
}


def _bits(f: pb.BitField) -> Field:
    return (f.hi, f.lo)


def _put(value: int, field: Field) -> int:
    hi, lo = field
    assert 0 <= value < 1 << (hi - lo + 1)
    return value << lo


def test_method_header_layout_and_sec_ops() -> None:
    for name, field in METHOD_HEADER_FIELDS.items():
        assert _bits(getattr(pb, name)) == field, name
    assert {m.name: m.value for m in pb.SecOp} == SEC_OP
    word = pb.MethodHeader(pb.SecOp.INC_METHOD, 1, 0x2B4, 3).encode()
    assert word == (
        _put(SEC_OP["INC_METHOD"], METHOD_HEADER_FIELDS["METHOD_SEC_OP"])
        | _put(3, METHOD_HEADER_FIELDS["METHOD_COUNT"])
        | _put(1, METHOD_HEADER_FIELDS["METHOD_SUBCHANNEL"])
        | _put(0x2B4 // 4, METHOD_HEADER_FIELDS["METHOD_ADDRESS"])
    )


def test_subchannels() -> None:
    for name, value in SUBCHANNELS.items():
        assert getattr(pb, name) == value, name


@pytest.mark.parametrize("name", sorted(HOST_METHODS))
def test_host_method_offsets(name: str) -> None:
    for cls, offset in HOST_METHODS[name].items():
        assert getattr(pb, name) == offset, f"{name} vs class {cls:#x}"
        assert offset < pb.HOST_METHOD_LIMIT


def test_host_fields_values_and_sem_ops() -> None:
    for name, field in HOST_FIELDS.items():
        assert _bits(getattr(pb, name)) == field, name
    for name, value in HOST_VALUES.items():
        assert getattr(pb, name) == value, name
    assert {m.name: m.value for m in pb.SemOp} == SEM_OP
    ex = pb.SemExecute(pb.SemOp.RELEASE, True, True, True, True).encode()
    assert ex == (
        _put(SEM_OP["RELEASE"], HOST_FIELDS["SEM_EXECUTE_OPERATION"])
        | _put(SEM_EXECUTE_ENABLE["acquire_switch_tsg"], HOST_FIELDS["SEM_EXECUTE_ACQUIRE_SWITCH_TSG"])
        | _put(SEM_EXECUTE_ENABLE["release_wfi"], HOST_FIELDS["SEM_EXECUTE_RELEASE_WFI"])
        | _put(SEM_EXECUTE_ENABLE["payload_64bit"], HOST_FIELDS["SEM_EXECUTE_PAYLOAD_SIZE"])
        | _put(SEM_EXECUTE_ENABLE["release_timestamp"], HOST_FIELDS["SEM_EXECUTE_RELEASE_TIMESTAMP"])
    )
    assert pb.SemExecute(pb.SemOp.ACQUIRE, payload_64bit=False).encode() == 0
    # WFI method data and the MEM_OP membar sequence
    wfi = pb.memory_barrier(pb.PushBuffer()).words
    assert wfi[1] == _put(HOST_VALUES["WFI_SCOPE_ALL"], WFI_SCOPE)
    membar_c = _put(HOST_VALUES["MEM_OP_C_MEMBAR_TYPE_SYS_MEMBAR"], HOST_FIELDS["MEM_OP_C_MEMBAR_TYPE"])
    membar_d = _put(HOST_VALUES["MEM_OP_D_OPERATION_MEMBAR"], HOST_FIELDS["MEM_OP_D_OPERATION"])
    assert wfi[-2:] == [membar_c, membar_d]


def test_host_classes_sem_addr_hi_width() -> None:
    assert {cls: _bits(h.sem_addr_hi) for cls, h in pb.HOST_CLASSES.items()} == SEM_ADDR_HI_OFFSET
    for cls, host in pb.HOST_CLASSES.items():
        assert host.cls == cls


def test_host_semaphore_alignment_follows_dev_pbdma() -> None:
    host = pb.HOST_CLASSES[CLASS_IDS["HOPPER_CHANNEL_GPFIFO_A"]]
    for kw, align in (
        ({"timestamp": True}, SEM_ALIGN_TIMESTAMP),
        ({"timestamp": False}, SEM_ALIGN_64BIT),
        ({"timestamp": False, "payload_64bit": False}, SEM_ALIGN_32BIT),
    ):
        pb.sem_release(pb.PushBuffer(), host, 0x1000 + align, 1, **kw)
        with pytest.raises(ValueError):
            pb.sem_release(pb.PushBuffer(), host, 0x1000 + align // 2, 1, **kw)


def test_gp_entry_layout() -> None:
    for name, field in GP_ENTRY_FIELDS.items():
        assert _bits(getattr(pb, name)) == field, name
    assert pb.GP_ENTRY_BYTES == GP_ENTRY_SIZE
    assert pb.GP_MAX_PUSHBUFFER_VA == 1 << GP_PUSHBUFFER_VA_BITS
    va = 0xAB_1234_5678
    entry = pb.GPEntry(va, 0x1234, subroutine=True, sync_wait=True).encode()
    assert entry == (
        _put((va & 0xFFFFFFFF) >> 2, GP_ENTRY_FIELDS["GP_ENTRY_GET"])
        | _put(va >> 32, GP_ENTRY_FIELDS["GP_ENTRY_GET_HI"])
        | _put(GP_LEVEL_SUBROUTINE, GP_ENTRY_FIELDS["GP_ENTRY_LEVEL"])
        | _put(0x1234, GP_ENTRY_FIELDS["GP_ENTRY_LENGTH"])
        | _put(GP_SYNC_WAIT, GP_ENTRY_FIELDS["GP_ENTRY_SYNC"])
    )


def test_userd_and_usermode_offsets() -> None:
    for name, value in {**USERD, **USERMODE}.items():
        assert getattr(pb, name) == value, name


@pytest.mark.parametrize("name", sorted(COMPUTE_METHODS))
def test_compute_method_offsets(name: str) -> None:
    assert getattr(pb, name) == COMPUTE_METHODS[name]


def test_compute_fields() -> None:
    for name, field in COMPUTE_FIELDS.items():
        assert _bits(getattr(pb, name)) == field, name
    word = pb.invalidate_shader_caches(pb.PushBuffer()).words[1]
    assert word == sum(
        _put(INVALIDATE_SHADER_CACHES_TRUE, COMPUTE_FIELDS[n])
        for n in (
            "INVALIDATE_SHADER_CACHES_INSTRUCTION",
            "INVALIDATE_SHADER_CACHES_GLOBAL_DATA",
            "INVALIDATE_SHADER_CACHES_CONSTANT",
        )
    )


@pytest.mark.parametrize("cls", sorted(SHADER_LOCAL_MEMORY_A_ADDRESS_UPPER))
def test_shader_local_memory_upper_width(cls: int) -> None:
    got = pb.SHADER_LOCAL_MEMORY_UPPER.get(cls, pb.SHADER_LOCAL_MEMORY_UPPER_DEFAULT)
    assert _bits(got) == SHADER_LOCAL_MEMORY_A_ADDRESS_UPPER[cls]


@pytest.mark.parametrize("name", sorted(COPY_METHODS))
def test_copy_method_offsets(name: str) -> None:
    for cls, offset in COPY_METHODS[name].items():
        assert getattr(pb, name) == offset, f"{name} vs class {cls:#x}"


def test_copy_fields_values_and_classes() -> None:
    for name, field in LAUNCH_DMA_FIELDS.items():
        assert _bits(getattr(pb, name)) == field, name
    assert {m.name: m.value for m in pb.DataTransfer} == DATA_TRANSFER
    assert {m.name: m.value for m in pb.CopySemaphore} == COPY_SEMAPHORE
    assert {cls: _bits(c.upper) for cls, c in pb.COPY_CLASSES.items()} == COPY_UPPER
    has_upper = {cls: cls in COPY_METHODS["NVC7B5_SET_SEMAPHORE_PAYLOAD_UPPER"] for cls in COPY_UPPER}
    assert {cls: c.has_payload_upper for cls, c in pb.COPY_CLASSES.items()} == has_upper
    for cls, c in pb.COPY_CLASSES.items():
        assert c.cls == cls
    assert pb.COPY_MAX_CHUNK < 1 << LINE_LENGTH_IN_BITS
    launch = pb.LaunchDma(
        pb.DataTransfer.NON_PIPELINED, pb.CopySemaphore.RELEASE_FOUR_WORD, flush=True, payload_64bit=True
    ).encode()
    assert launch == (
        _put(DATA_TRANSFER["NON_PIPELINED"], LAUNCH_DMA_FIELDS["LAUNCH_DMA_DATA_TRANSFER_TYPE"])
        | _put(1, LAUNCH_DMA_FIELDS["LAUNCH_DMA_FLUSH_ENABLE"])
        | _put(COPY_SEMAPHORE["RELEASE_FOUR_WORD"], LAUNCH_DMA_FIELDS["LAUNCH_DMA_SEMAPHORE_TYPE"])
        | _put(LAUNCH_DMA_PITCH, LAUNCH_DMA_FIELDS["LAUNCH_DMA_SRC_MEMORY_LAYOUT"])
        | _put(LAUNCH_DMA_PITCH, LAUNCH_DMA_FIELDS["LAUNCH_DMA_DST_MEMORY_LAYOUT"])
        | _put(LAUNCH_DMA_TWO_WORD_PAYLOAD, LAUNCH_DMA_FIELDS["LAUNCH_DMA_SEMAPHORE_PAYLOAD_SIZE"])
    )


def test_class_ids_used_as_keys() -> None:
    for name, value in CLASS_IDS.items():
        assert getattr(abi, name) == value, name
    assert set(pb.HOST_CLASSES) == set(SEM_ADDR_HI_OFFSET)
    assert set(pb.COPY_CLASSES) == set(COPY_UPPER)


def test_every_pushbuf_constant_is_pinned() -> None:
    """A constant added to pushbuf.py must get its official value here (or be listed as our own choice)."""
    tables: list[Iterable[str]] = [
        METHOD_HEADER_FIELDS, SUBCHANNELS, HOST_METHODS, HOST_FIELDS, HOST_VALUES, GP_ENTRY_FIELDS, USERD,
        USERMODE, COMPUTE_METHODS, COMPUTE_FIELDS, COPY_METHODS, LAUNCH_DMA_FIELDS, NOT_FROM_HEADERS,
        {"GP_ENTRY_BYTES", "HOST_CLASSES", "COPY_CLASSES", "SHADER_LOCAL_MEMORY_UPPER"},
        {"SecOp", "SemOp", "DataTransfer", "CopySemaphore"},
    ]
    pinned = {name for table in tables for name in table}
    defined = {
        name
        for name, value in vars(pb).items()
        if (name.isupper() and not name.startswith("_"))
        or (isinstance(value, type) and issubclass(value, enum.IntEnum) and value.__module__ == pb.__name__)
    }
    assert defined - pinned == set(), "pin these to their header values in this file"
    assert pinned - defined == set(), "these are pinned here but no longer in pushbuf.py"
