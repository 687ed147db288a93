"""Mock GPU front end: GPFIFO -> pushbuffer methods -> host semaphores, copy engine, launch records.

The decoder below restates the encodings from the class headers on its own (it does not import the
encoders in ``pushbuf.py``), so a field slip in an encoder shows up as a fault here instead of being
mirrored. Work runs on one "GPU" thread, as on hardware: the CPU rings a doorbell and later polls memory.
"""

from __future__ import annotations

import re
import struct
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cffi
import numpy as np

from rawgrad.compiler import elf
from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv.mock.sass_check import BindingError, verify_image

if TYPE_CHECKING:
    from rawgrad.drivers.nv.mock.kernel import MemObject

_ffi = cffi.FFI()

# Xid-style codes written to the channel's error notifier (info32). NVIDIA Xid catalogue:
XID_PUSHBUFFER_ERROR = 32  # "Invalid or corrupted push buffer stream"
XID_MMU_FAULT = 31  # "GPU memory page fault"
XID_GR_EXCEPTION = 13  # "Graphics Engine Exception"
NOTIFIER_STATUS_ERROR = 0xFFFF  # mock choice; UNSURE which value RM stores (the driver checks != 0)

# --- decoder constants (clc56f.h / dev_pbdma.ref; NV-FACTS 4.3, 4.4, 4.6) ---
_GP_LENGTH_SHIFT, _GP_LENGTH_MASK = 42, (1 << 21) - 1  # NVC56F_GP_ENTRY1_LENGTH 30:10 of entry1
_GP_OPCODE_MASK = 0xFF  # NVC56F_GP_ENTRY1_OPCODE 7:0 of entry1
_GP_OPCODE_NOP = 0
_SEC_INC, _SEC_NONINC, _SEC_IMMD, _SEC_ONE_INC, _SEC_END = 1, 3, 4, 5, 7
_HOST_SEM_ADDR_LO, _HOST_SEM_ADDR_HI, _HOST_SEM_PAYLOAD_LO, _HOST_SEM_PAYLOAD_HI = 0x5C, 0x60, 0x64, 0x68
_HOST_SEM_EXECUTE, _HOST_WFI, _HOST_NON_STALL, _HOST_SET_REFERENCE = 0x6C, 0x78, 0x20, 0x50
_HOST_MEM_OP_A, _HOST_MEM_OP_D = 0x28, 0x34
_MEM_OP_OK = {
    5: "MEMBAR",
    9: "MMU_TLB_INVALIDATE",
    0xD: "L2_PEERMEM_INVALIDATE",
    0xE: "L2_SYSMEM_INVALIDATE",
    0x10: "L2_FLUSH_DIRTY",
}
_SEM_RELEASE_WFI_BIT = 20  # NVC56F_SEM_EXECUTE_RELEASE_WFI (NV-FACTS 4.6)
_SEM_ADDR_HI_BITS = {abi.AMPERE_CHANNEL_GPFIFO_A: 8, abi.HOPPER_CHANNEL_GPFIFO_A: 25}

_COMPUTE_METHODS = {
    0x100: "NO_OPERATION",
    0x110: "WAIT_FOR_IDLE",
    0x244: "INVALIDATE_TEXTURE_HEADER_CACHE_NO_WFI",
    0x298: "INVALIDATE_SKED_CACHES",
    0x2A0: "SET_SHADER_SHARED_MEMORY_WINDOW_A",
    0x2A4: "SET_SHADER_SHARED_MEMORY_WINDOW_B",
    0x2B4: "SEND_PCAS_A",
    0x2B8: "SEND_PCAS_B",
    0x2BC: "SEND_SIGNALING_PCAS_B",
    0x2C0: "SEND_SIGNALING_PCAS2_B",
    0x2E4: "SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A",
    0x2E8: "..._NON_THROTTLED_B",
    0x2EC: "..._NON_THROTTLED_C",
    0x310: "SET_SPA_VERSION",
    0x790: "SET_SHADER_LOCAL_MEMORY_A",
    0x794: "SET_SHADER_LOCAL_MEMORY_B",
    0x7B0: "SET_SHADER_LOCAL_MEMORY_WINDOW_A",
    0x7B4: "SET_SHADER_LOCAL_MEMORY_WINDOW_B",
    0x1424: "INVALIDATE_SAMPLER_CACHE_NO_WFI",
    0x1698: "INVALIDATE_SHADER_CACHES_NO_WFI",
    0x1B00: "SET_REPORT_SEMAPHORE_A",
    0x1B04: "SET_REPORT_SEMAPHORE_B",
    0x1B08: "SET_REPORT_SEMAPHORE_C",
    0x1B0C: "SET_REPORT_SEMAPHORE_D",
}
_COPY_METHODS = {
    0x100: "NOP",
    0x240: "SET_SEMAPHORE_A",
    0x244: "SET_SEMAPHORE_B",
    0x248: "SET_SEMAPHORE_PAYLOAD",
    0x24C: "SET_SEMAPHORE_PAYLOAD_UPPER",
    0x300: "LAUNCH_DMA",
    0x400: "OFFSET_IN_UPPER",
    0x404: "OFFSET_IN_LOWER",
    0x408: "OFFSET_OUT_UPPER",
    0x40C: "OFFSET_OUT_LOWER",
    0x410: "PITCH_IN",
    0x414: "PITCH_OUT",
    0x418: "LINE_LENGTH_IN",
    0x41C: "LINE_COUNT",
}
_COPY_UPPER_BITS = {abi.AMPERE_DMA_COPY_A: 17, abi.AMPERE_DMA_COPY_B: 17, abi.HOPPER_DMA_COPY_A: 25}
_COMPUTE_REPORT_UPPER_BITS = {abi.HOPPER_COMPUTE_A: 25}  # others: 8 (clc6c0.h SET_REPORT_SEMAPHORE_A 7:0)
_QMD_BYTES = {abi.HOPPER_COMPUTE_A: 384}  # QMD V04 (clcbc0qmd.h); Ampere/Ada V03 = 256

# --- QMD decoder (restated from NV-FACTS 5.4 / 5.5, independently of qmd.py): name -> (low bit, width) ---
# tests/nv/test_qmd_headers.py checks each entry against NVIDIA's clc9c0qmd.h (V03_00), clcbc0qmd.h (V04_00).
_V03 = {
    "major": (580, 4), "minor": (576, 4),
    "grid_x": (384, 32), "grid_y": (416, 16), "grid_z": (448, 16),
    "block_x": (592, 16), "block_y": (608, 16), "block_z": (624, 16),
    "registers": (648, 9), "shared": (544, 18), "sass": (1656, 8),
    "prog_lo": (1536, 32), "prog_hi": (1568, 17),
    "cb0_valid": (640, 1), "cb0_lo": (1024, 32), "cb0_hi": (1056, 17), "cb0_size16": (1075, 13),
    "dep_enable": (512, 1), "dep_action": (513, 3), "dep_ptr": (480, 32),
}
for _i, _base in enumerate((768, 896)):  # RELEASE0 / RELEASE1 records
    _V03.update({f"rel{_i}_enable": (_base + 55, 1), f"rel{_i}_lo": (_base, 32),
                 f"rel{_i}_hi": (_base + 32, 8), f"rel{_i}_p64": (_base + 61, 1),
                 f"rel{_i}_struct": (_base + 62, 2),
                 f"rel{_i}_pay_lo": (_base + 64, 32), f"rel{_i}_pay_hi": (_base + 96, 32)})
_V04 = {
    "major": (580, 4), "minor": (576, 4), "qmd_type": (23, 3),
    "grid_x": (1024, 32), "grid_y": (1056, 16), "grid_z": (1088, 16),
    "block_x": (1152, 16), "block_y": (1168, 16), "block_z": (1184, 16),
    "registers": (1200, 9), "shared": (584, 18), "sass": (536, 8),
    "prog_lo": (1216, 32), "prog_hi": (1248, 25),
    "cb0_valid": (416, 1), "cb0_lo6": (1536, 32), "cb0_hi6": (1568, 19), "cb0_size16": (1587, 13),
    "dep_enable": (368, 1), "dep_action": (369, 3), "dep_ptr": (448, 32),
}
for _i in range(3):  # RELEASE_*(i): config at 320 + 16i, semaphore record at 640 + 128i
    _c, _r = 320 + 16 * _i, 640 + 128 * _i
    _V04.update({f"rel{_i}_enable": (_c, 1), f"rel{_i}_struct": (_c + 1, 2), f"rel{_i}_p64": (_c + 12, 1),
                 f"rel{_i}_lo": (_r, 32), f"rel{_i}_hi": (_r + 32, 25),
                 f"rel{_i}_pay_lo": (_r + 64, 32), f"rel{_i}_pay_hi": (_r + 96, 32)})
_QMD_LAYOUTS = {4: (_V04, 3), 3: (_V03, 2)}  # major version -> (fields, release slots)

# Every other field the driver writes, keyed by its header name (``NAME(i)`` for indexed fields; open-gpu-doc
# clc9c0qmd.h NVC9C0_QMDV03_00_* and clcbc0qmd.h NVCBC0_QMDV04_00_*, NV-FACTS 5.4 / 5.5): name -> (low bit,
# width). tests/nv/test_nv_mock_catches.py checks these against the header facts in test_qmd_headers.py and
# that every field qmd.py's builders write is decoded here or in _V03 / _V04.
_MAX_BANKS = 8  # CONSTANT_BUFFER_*(i), i = 0..7 in both layouts
_V03_MORE: dict[str, tuple[int, int]] = {
    "QMD_GROUP_ID": (128, 6), "SM_GLOBAL_CACHING_ENABLE": (134, 1),
    "INVALIDATE_TEXTURE_HEADER_CACHE": (186, 1), "INVALIDATE_TEXTURE_SAMPLER_CACHE": (187, 1),
    "INVALIDATE_TEXTURE_DATA_CACHE": (188, 1), "INVALIDATE_SHADER_DATA_CACHE": (189, 1),
    "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": (256, 32), "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1632, 9),
    "PROGRAM_PREFETCH_SIZE": (1641, 9),
    "CWD_MEMBAR_TYPE": (368, 2), "API_VISIBLE_CALL_LIMIT": (378, 1), "SAMPLER_INDEX": (382, 1),
    "DEPENDENT_QMD0_PREFETCH": (516, 1),
    "MIN_SM_CONFIG_SHARED_MEM_SIZE": (562, 6), "MAX_SM_CONFIG_SHARED_MEM_SIZE": (569, 6),
    "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (657, 6),
    "SHADER_LOCAL_MEMORY_LOW_SIZE": (736, 24), "SHADER_LOCAL_MEMORY_HIGH_SIZE": (1600, 24),
    "BARRIER_COUNT": (763, 5),
}
for _i in range(_MAX_BANKS):
    _b = 1024 + 64 * _i
    _V03_MORE.update({f"CONSTANT_BUFFER_VALID({_i})": (640 + _i, 1),
                      f"CONSTANT_BUFFER_ADDR_LOWER({_i})": (_b, 32),
                      f"CONSTANT_BUFFER_ADDR_UPPER({_i})": (_b + 32, 17),
                      f"CONSTANT_BUFFER_INVALIDATE({_i})": (_b + 50, 1),
                      f"CONSTANT_BUFFER_SIZE_SHIFTED4({_i})": (_b + 51, 13)})
_V04_MORE: dict[str, tuple[int, int]] = {
    "QMD_GROUP_ID": (16, 6),
    "SHADER_LOCAL_MEMORY_LOW_SIZE": (512, 24), "SHADER_LOCAL_MEMORY_HIGH_SIZE": (544, 24),
    "API_VISIBLE_CALL_LIMIT": (568, 1), "SAMPLER_INDEX": (569, 1),
    "INVALIDATE_TEXTURE_HEADER_CACHE": (602, 1), "INVALIDATE_TEXTURE_SAMPLER_CACHE": (603, 1),
    "INVALIDATE_TEXTURE_DATA_CACHE": (604, 1), "INVALIDATE_SHADER_DATA_CACHE": (605, 1),
    "INVALIDATE_INSTRUCTION_CACHE": (606, 1), "INVALIDATE_SHADER_CONSTANT_CACHE": (607, 1),
    "MIN_SM_CONFIG_SHARED_MEM_SIZE": (608, 6), "MAX_SM_CONFIG_SHARED_MEM_SIZE": (614, 6),
    "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (620, 6),
    "CWD_MEMBAR_TYPE": (1136, 2), "BARRIER_COUNT": (1211, 5),
    "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": (1344, 32), "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1376, 17),
    "PROGRAM_PREFETCH_SIZE": (1393, 9), "PROGRAM_PREFETCH_TYPE": (1402, 2),
    "DEPENDENT_QMD_PREFETCH(0)": (372, 1),
}
for _i in range(3):
    _c = 320 + 16 * _i
    _V04_MORE.update({f"RELEASE_MEMBAR_TYPE({_i})": (_c + 3, 1),
                      f"RELEASE_REDUCTION_ENABLE({_i})": (_c + 4, 1)})
for _i in range(_MAX_BANKS):
    _b = 1536 + 64 * _i
    _V04_MORE.update({f"CONSTANT_BUFFER_VALID({_i})": (416 + 4 * _i, 1),
                      f"CONSTANT_BUFFER_PREFETCH({_i})": (417 + 4 * _i, 2),
                      f"CONSTANT_BUFFER_INVALIDATE({_i})": (419 + 4 * _i, 1),
                      f"CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6({_i})": (_b, 32),
                      f"CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6({_i})": (_b + 32, 19),
                      f"CONSTANT_BUFFER_SIZE_SHIFTED4({_i})": (_b + 51, 13)})
_QMD_MORE = {3: _V03_MORE, 4: _V04_MORE}
_QMD_TYPES_OK = (0, 2)  # V04 QMD_TYPE: NVK leaves 0, GRID_CTA is 2 (NV-FACTS 5.5)
_SCHEDULING_PCAS_ACTIONS = (2, 3, 9, 0xA, 0xB)  # PCAS actions that schedule the QMD (NV-FACTS 5.2)
_DEPENDENT_SCHEDULE = 1  # DEPENDENT_QMD0_ACTION_QMD_SCHEDULE
_MAX_CHAIN = 1 << 16  # dependent-QMD chain length before the mock calls it a loop
_SHARED_RESERVED = 0x400  # sm_80+: SHARED_MEMORY_SIZE counts the reserved KiB (NV-FACTS 5.6)
_MAX_REGISTERS = 255  # REGISTER_COUNT is 9 bits, but an SM thread addresses R0..R254 (+RZ)
_MAX_BLOCK_THREADS = 1024  # NV-FACTS 5.6 launch limits
_MAX_BLOCK = (1024, 1024, 64)  # NV-FACTS 5.6: block dims <= (1024, 1024, 64)
_MAX_GRID_X = 2**31 - 1  # NV-FACTS 5.6: grid <= (2^31-1, 65535, 65535); y/z are 16-bit fields anyway
# Register file: 64 K 32-bit registers per SM, allocated per warp in 256-register units (NV-FACTS 5.6's
# "max threads from registers" formula); a block that does not fit can never become resident.
_REGISTER_FILE = 65536
_REGISTER_ALLOC_UNIT = 256
_WARP = 32
# Named barriers per CTA: bar.sync ids 0..15 (PTX ISA "bar"), so BARRIER_COUNT > 16 is no valid request.
_MAX_BARRIERS = 16
_RELEASE_FOUR_WORDS = 0
_RELEASE_MEMBAR_FE_SYSMEMBAR = 1  # NVCBC0_QMDV04_00_RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR (NV-FACTS 5.5)
_CWD_MEMBAR_NONE, _CWD_MEMBAR_SYSMEMBAR, _CWD_MEMBAR_L1 = 0, 1, 3  # *_CWD_MEMBAR_TYPE_L1_* (NV-FACTS 5.4)
_PREFETCH_SHIFT = 8  # PROGRAM_PREFETCH_ADDR_*_SHIFTED = VA >> 8; PROGRAM_PREFETCH_SIZE in 256-byte units
_PREFETCH_TYPES_OK = (0, 1)  # V04 PROGRAM_PREFETCH_TYPE: PREFETCH_LAUNCH 0, PREFETCH_POST 1 (clcbc0qmd.h)
_BANK_SIZE_SHIFT, _BANK_V04_SHIFT = 4, 6  # CONSTANT_BUFFER_SIZE_SHIFTED4; V04 ADDR_*_SHIFTED6
_MAX_BANK_BYTES = 0x10000  # a constant bank is at most 64 KiB
# SM shared-memory carve-outs: the SM_CONFIG fields encode KiB/4 + 1 (NV-FACTS 5.4); the largest carve-out
# is 100 KiB on sm_86/sm_89, 164 KiB on sm_80 and 228 KiB on sm_90 (NV-FACTS 5.5; CUDA programming guide,
# compute capability table). A block may use at most 1 KiB less than the carve-out (the reserved KiB).
_KIB = 1024
_MAX_CARVEOUT_KIB = {0x800: 164, 0x806: 100, 0x809: 100, 0x900: 228}
_SM_CONFIG_UNIT_KIB = 4
# Local memory (NV-FACTS 5.6): per-thread bytes = EIATTR_MIN_STACK_SIZE + 0x240 (the stack starts 0x240 below
# the top of the 16 MiB local window), and the SLM buffer holds round_up(local x 32, 0x200) per warp for every
# warp of every SM of a TPC.
_LOCAL_ABOVE_STACK = 0x240
_LOCAL_ROUND = 32
_SLM_WARP_ROUND = 0x200
# Constant bank 0 (NV-FACTS 7.4): block dims at 0x00, grid dims at 0x0C; parameters from 0x160 (sm_8x) or
# 0x210 (sm_90).
_CB_BLOCK, _CB_GRID = 0x00, 0x0C
_PARAM_OFFSET_BY_SM_MAJOR = {8: 0x160, 9: 0x210}
_PTX_SECTION = ".rawgrad.ptx"
_TEXT_PREFIX = ".text."

# --- kernel image (ELF cubin) records the launch is checked against: restated from NV-FACTS 7.2, decoded
# here on their own (not with cubin.py's reader), so a slip in the driver's reader is not mirrored ---
_NV_INFO = ".nv.info"  # per-function records keyed by symbol index
_NV_INFO_PREFIX = ".nv.info."  # per-kernel records
_NV_SHARED_PREFIX = ".nv.shared."  # NOBITS, sh_size = static shared bytes
# ptxas 13.0 for sm_90 also emits `.nv.shared.reserved.0`, and then `.nv.shared.<k>` already counts the
# reserved KiB (a kernel with 72 bytes of shared memory gets a 0x448-byte section; sm_86 gets 0x48). Seen in
# this project's ptxas output; not in NV-FACTS.
_NV_SHARED_RESERVED_PREFIX = ".nv.shared.reserved."
_CONSTANT_BANK_RE = re.compile(r"\.nv\.constant(\d+)(?:\.(.+))?")
_INFO_RECORD = struct.Struct("<BBH")  # u8 format, u8 attribute, u16 value or payload length
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 0x01, 0x02, 0x03, 0x04
_EIATTR_PARAM_CBANK = 0x0A  # u32 sym, u16 parameter offset in bank 0, u16 parameter bytes
_EIATTR_MIN_STACK_SIZE = 0x12  # u32 sym, u32 bytes per thread
_EIATTR_CBANK_PARAM_SIZE = 0x19  # HVAL parameter bytes
_EIATTR_REGCOUNT = 0x2F  # u32 sym, u32 registers
# BVAL barrier count: ptxas 13.0 writes 4 for a kernel using bar.sync 0 and 3, nothing without barriers
# (seen in this project's ptxas output; the id is NVIDIA's EIATTR_NUM_BARRIERS, not in NV-FACTS).
_EIATTR_NUM_BARRIERS = 0x4C
_SH_INFO_REGS_SHIFT = 24  # sm_8x cubins: .text.<k> sh_info bits 31:24 = registers (NV-FACTS 7.2)


class MockGPUFault(Exception):
    """What a hardware fault would report: channel, kind, offending method and addresses."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        method: int | None = None,
        pb_address: int | None = None,
        va: int | None = None,
        xid: int = XID_PUSHBUFFER_ERROR,
    ):
        self.kind, self.method, self.pb_address, self.va, self.xid = kind, method, pb_address, va, xid
        self.channel: int | None = None
        parts = [message]
        if method is not None:
            parts.append(f"method {method:#06x}")
        if pb_address is not None:
            parts.append(f"at pushbuffer VA {pb_address:#x}")
        if va is not None:
            parts.append(f"faulting VA {va:#x}")
        super().__init__(f"{kind}: " + ", ".join(parts))


class ApproximationOutOfRange(RuntimeWarning):
    """A kernel ran an approximate instruction (sin/cos.approx) on an input outside the range the PTX ISA
    bounds its error for; the interpreter's value there is a best effort, hardware's is unspecified."""


class MockUnsupported(MockGPUFault, NotImplementedError):
    """The mock does not emulate this (e.g. executing a kernel); never silently skipped."""


@dataclass
class MockLaunch:
    """A compute launch seen by the front end (`chained`: started by a previous QMD, not SEND_PCAS)."""

    channel: int
    qmd_va: int
    qmd: bytes
    pcas_action: int
    chained: bool = False
    entry: str | None = None  # the kernel that ran (execute_kernels only)
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None


@dataclass
class GPUMapping:
    va: int
    length: int
    mem: MemObject
    offset: int


@dataclass
class ChannelState:
    handle: int
    cls: int
    gpfifo_va: int
    entries: int
    userd_host: int
    notifier_host: int | None
    tsg: Any
    vaspace: Any
    token: int | None = None
    engines: set[int] = field(default_factory=set)
    subch: dict[int, int] = field(default_factory=dict)
    regs: dict[int, int] = field(default_factory=dict)
    kicked: bool = False
    blocked: str | None = None
    error: MockGPUFault | None = None
    seg: list[int] | None = None  # [va, length_dwords, pos]
    hdr: list[int] | None = None  # [sec_op, subch, method, remaining]
    inflight: list[_Stream] = field(default_factory=list)  # launched grids not yet complete
    active_ns: int = 0  # when the channel last made progress (idle completion counts from here)


class MockGPU:
    """Front end for one mock GPU; all state is guarded by the owning kernel mock's lock."""

    def __init__(self, lock: threading.RLock, *, execute_kernels: bool = False, poll_s: float = 0.0005,
                 sm_version: int = 0x900, max_warps_per_sm: int = 0, sm_per_tpc: int = 0,
                 idle_complete_s: float = 0.2):
        self.lock = lock
        self.sm_version = sm_version
        self.max_warps_per_sm, self.sm_per_tpc = max_warps_per_sm, sm_per_tpc  # SLM sizing (0: unchecked)
        # Grids with nothing ordering them complete once their channel has been quiet this long: late enough
        # that a release not ordered after them is seen (and acted on) first.
        self.idle_complete_s = idle_complete_s
        self._seq = 0  # orders launches and copy-engine accesses
        self._access_log: list[_Access] = []  # copy-engine accesses while grids were in flight
        self._modules: dict[bytes, Any] = {}  # PTX source -> parsed interpreter module
        self.cv = threading.Condition(lock)
        self.channels: dict[int, ChannelState] = {}
        self.faults: list[MockGPUFault] = []
        self.launches: list[MockLaunch] = []
        self.unknown_doorbells: list[int] = []
        self.execute_kernels = execute_kernels
        self.poll_s = poll_s
        self._t0 = time.monotonic_ns()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.methods_executed = 0

    # -- clock -----------------------------------------------------------------------------------
    def now_ns(self) -> int:
        return time.monotonic_ns() - self._t0 + 1_000_000_000

    # -- thread ----------------------------------------------------------------------------------
    def kick(self, token: int) -> None:
        with self.lock:
            ch = next((c for c in self.channels.values() if c.token == token), None)
            if ch is None:
                self.unknown_doorbells.append(token)
                return
            ch.kicked = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mock-nv-gpu", daemon=True)
                self._thread.start()
            self.cv.notify_all()

    def shutdown(self) -> None:
        with self.lock:
            self._stop = True
            self.cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._stop = False

    def _runnable(self, ch: ChannelState) -> bool:
        return (
            ch.error is None and ch.tsg.data.get("scheduled", False) and (ch.kicked or ch.blocked is not None)
        )

    def _loop(self) -> None:
        with self.lock:
            while not self._stop:
                progressed, blocked = False, False
                for ch in list(self.channels.values()):
                    if self._runnable(ch):
                        if self._run_channel(ch):
                            progressed, ch.active_ns = True, time.monotonic_ns()
                        blocked |= ch.blocked is not None
                if progressed:
                    continue
                wait = self.poll_s if blocked else 0.05
                now = time.monotonic_ns()
                for ch in list(self.channels.values()):
                    if not ch.inflight or ch.error is not None:
                        continue
                    left = ch.active_ns + int(self.idle_complete_s * 1e9) - now
                    if left > 0:
                        wait = min(wait, left / 1e9)
                        continue
                    try:  # the channel went quiet: its grids complete
                        self._drain(ch)
                    except MockGPUFault as f:
                        self._fault(ch, f)
                    progressed = True
                if not progressed:
                    self.cv.wait(wait)

    # -- memory ----------------------------------------------------------------------------------
    def _host(self, ch: ChannelState, va: int, n: int) -> int:
        """Host address backing GPU VA [va, va+n) in the channel's VA space, or an MMU fault."""
        space = ch.vaspace.data.get("uvm")
        if space is None:
            raise MockGPUFault(
                "MMU_FAULT", "channel VA space is not registered with UVM", va=va, xid=XID_MMU_FAULT
            )
        m = space.lookup(va)
        if m is None or va + n > m.va + m.length:
            raise MockGPUFault("MMU_FAULT", f"{n}-byte access to unmapped GPU VA", va=va, xid=XID_MMU_FAULT)
        return m.mem.host_addr + m.offset + (va - m.va)

    def read32(self, ch: ChannelState, va: int) -> int:
        return int(_ffi.cast("uint32_t *", self._host(ch, va, 4))[0])

    def _write(self, ch: ChannelState, va: int, data: bytes) -> None:
        _ffi.memmove(_ffi.cast("void *", self._host(ch, va, len(data))), data, len(data))

    def _copy(self, ch: ChannelState, dst: int, src: int, n: int) -> None:
        done = 0
        while done < n:  # split at mapping boundaries (page granular at worst)
            space = ch.vaspace.data["uvm"]
            ms, md = space.lookup(src + done), space.lookup(dst + done)
            if ms is None or md is None:
                bad = src + done if ms is None else dst + done
                raise MockGPUFault(
                    "MMU_FAULT", "copy engine access to unmapped GPU VA", va=bad, xid=XID_MMU_FAULT
                )
            chunk = min(n - done, ms.va + ms.length - (src + done), md.va + md.length - (dst + done))
            if any(c.inflight for c in self.channels.values()):  # a race with those grids is checked later
                self._seq += 1
                for write, at in ((False, src + done), (True, dst + done)):
                    span = np.array([[at, at + chunk]], np.uint64)
                    self._access_log.append(_Access(self._seq, ch.handle, write, span))
            hs, hd = self._host(ch, src + done, chunk), self._host(ch, dst + done, chunk)
            _ffi.memmove(_ffi.cast("void *", hd), _ffi.cast("void *", hs), chunk)
            done += chunk

    def _semaphore_write(
        self, ch: ChannelState, va: int, payload: int, payload64: bool, with_ts: bool
    ) -> None:
        need = 16 if with_ts else (8 if payload64 else 4)
        if va % need:
            raise MockGPUFault("SEMAPHORE_ALIGNMENT", f"semaphore VA must be {need}-byte aligned", va=va)
        if with_ts:  # timestamp lands before the payload (dev_pbdma.ref)
            self._write(ch, va + 8, self.now_ns().to_bytes(8, "little"))
        if payload64 or with_ts:
            data = (payload & ((1 << 64) - 1) if payload64 else payload & 0xFFFFFFFF).to_bytes(8, "little")
        else:
            data = (payload & 0xFFFFFFFF).to_bytes(4, "little")
        self._write(ch, va, data)

    # -- channel execution -----------------------------------------------------------------------
    def _fault(self, ch: ChannelState, f: MockGPUFault) -> None:
        f.channel = ch.handle
        ch.error, ch.blocked, ch.kicked = f, None, False
        ch.inflight = []  # a faulted channel's grids never complete
        self.faults.append(f)
        if ch.notifier_host is not None:
            note = _ffi.cast("uint8_t *", ch.notifier_host)
            _ffi.memmove(
                note,
                self.now_ns().to_bytes(8, "little")
                + f.xid.to_bytes(4, "little")
                + (0).to_bytes(2, "little")
                + NOTIFIER_STATUS_ERROR.to_bytes(2, "little"),
                16,
            )

    def _run_channel(self, ch: ChannelState, max_segments: int = 64) -> bool:
        progressed = False
        try:
            for _ in range(max_segments):
                if ch.seg is None:
                    userd = _ffi.cast("uint32_t *", ch.userd_host)
                    put, get = int(userd[0x8C // 4]), int(userd[0x88 // 4])
                    if put >= ch.entries:
                        raise MockGPUFault("GPFIFO", f"GPPut {put} is outside the {ch.entries}-entry ring")
                    if get == put:
                        ch.kicked = False
                        return progressed
                    entry_va = ch.gpfifo_va + 8 * get
                    lo, hi = self.read32(ch, entry_va), self.read32(ch, entry_va + 4)
                    length = (((hi << 32) | lo) >> _GP_LENGTH_SHIFT) & _GP_LENGTH_MASK
                    userd[0x88 // 4] = (get + 1) % ch.entries
                    progressed = True
                    if length == 0:
                        if hi & _GP_OPCODE_MASK != _GP_OPCODE_NOP:
                            raise MockUnsupported(
                                "GPFIFO",
                                f"control GP entry opcode {hi & 0xFF} at index {get}",
                                pb_address=entry_va,
                            )
                        continue
                    ch.seg = [(lo & ~3) | ((hi & 0xFF) << 32), length, 0]
                if not self._run_segment(ch):
                    return progressed
                progressed = True
                ch.seg = None
            return progressed
        except MockGPUFault as f:
            self._fault(ch, f)
            return True

    def _run_segment(self, ch: ChannelState) -> bool:
        """Execute the current segment; False if the channel blocked on an acquire."""
        seg = ch.seg
        assert seg is not None
        base, length = seg[0], seg[1]
        while True:
            if ch.hdr is None:
                if seg[2] >= length:
                    return True
                addr = base + 4 * seg[2]
                word = self.read32(ch, addr)
                seg[2] += 1
                op, subch, method = word >> 29, (word >> 13) & 7, (word & 0xFFF) * 4
                count = (word >> 16) & 0x1FFF
                if word & (1 << 12):
                    raise MockGPUFault(
                        "PBDMA", f"reserved header bit 12 set in {word:#010x}", method=method, pb_address=addr
                    )
                if op == _SEC_END:
                    seg[2] = length
                    return True
                if op == _SEC_IMMD:
                    ch.hdr = [op, subch, method, 1, count, addr, 0]
                elif op in (_SEC_INC, _SEC_NONINC, _SEC_ONE_INC):
                    if seg[2] + count > length:
                        raise MockGPUFault(
                            "PBDMA",
                            f"header {word:#010x} wants {count} data dwords past the end of "
                            f"the {length}-dword segment",
                            method=method,
                            pb_address=addr,
                        )
                    ch.hdr = [op, subch, method, count, 0, addr, 0]
                else:
                    raise MockGPUFault(
                        "PBDMA",
                        f"invalid SEC_OP {op} in method header {word:#010x}",
                        method=method,
                        pb_address=addr,
                    )
                continue
            op, subch, method, remaining, imm, haddr, done = ch.hdr
            if remaining == 0:
                ch.hdr = None
                continue
            data = imm if op == _SEC_IMMD else self.read32(ch, base + 4 * seg[2])
            if not self._method(ch, subch, method, data, haddr):
                ch.blocked = f"acquire at pushbuffer VA {haddr:#x}"
                return False
            ch.blocked = None
            self.methods_executed += 1
            if op != _SEC_IMMD:
                seg[2] += 1
            ch.hdr[3] -= 1
            ch.hdr[6] += 1
            if op == _SEC_INC or (op == _SEC_ONE_INC and done == 0):  # ONE_INC: only the first dword advances
                ch.hdr[2] += 4

    # -- method dispatch -------------------------------------------------------------------------
    def _method(self, ch: ChannelState, subch: int, method: int, data: int, pb_addr: int) -> bool:
        if method == 0:
            return self._set_object(ch, subch, data, pb_addr)
        if method < 0x100:
            return self._host_method(ch, method, data, pb_addr)
        cls = ch.subch.get(subch)
        if cls is None:
            raise MockGPUFault(
                "PBDMA",
                f"engine method on subchannel {subch} with no SET_OBJECT",
                method=method,
                pb_address=pb_addr,
            )
        if cls in _COPY_UPPER_BITS:
            self._copy_method(ch, cls, method, data, pb_addr)
        else:
            self._compute_method(ch, cls, method, data, pb_addr)
        return True

    def _set_object(self, ch: ChannelState, subch: int, data: int, pb_addr: int) -> bool:
        cls = data & 0xFFFF
        if cls not in ch.engines:
            raise MockGPUFault(
                "PBDMA",
                f"SET_OBJECT class {cls:#x} is not allocated on this channel",
                method=0,
                pb_address=pb_addr,
            )
        ch.subch[subch] = cls
        return True

    def _host_method(self, ch: ChannelState, method: int, data: int, pb_addr: int) -> bool:
        r = ch.regs
        if (
            method
            in (
                _HOST_SEM_ADDR_LO,
                _HOST_SEM_PAYLOAD_LO,
                _HOST_SEM_PAYLOAD_HI,
                _HOST_WFI,
                _HOST_NON_STALL,
                _HOST_SET_REFERENCE,
            )
            or _HOST_MEM_OP_A <= method < _HOST_MEM_OP_D
        ):
            r[method] = data
            if method == _HOST_WFI:  # the channel's engine finishes everything in flight
                self._drain(ch)
            return True
        if method == _HOST_SEM_ADDR_HI:
            bits = _SEM_ADDR_HI_BITS[ch.cls]
            if data >> bits:
                raise MockGPUFault(
                    "PBDMA",
                    f"SEM_ADDR_HI {data:#x} exceeds the {bits}-bit field of class {ch.cls:#x}",
                    method=method,
                    pb_address=pb_addr,
                )
            r[method] = data
            return True
        if method == _HOST_MEM_OP_D:
            op = data >> 27
            if op not in _MEM_OP_OK:
                raise MockUnsupported(
                    "PBDMA", f"MEM_OP_D operation {op:#x}", method=method, pb_address=pb_addr
                )
            return True
        if method == _HOST_SEM_EXECUTE:
            return self._sem_execute(ch, data, pb_addr)
        raise MockGPUFault("PBDMA", "unknown host method", method=method, pb_address=pb_addr)

    def _sem_execute(self, ch: ChannelState, ex: int, pb_addr: int) -> bool:
        r = ch.regs
        va = (r.get(_HOST_SEM_ADDR_HI, 0) << 32) | (r.get(_HOST_SEM_ADDR_LO, 0) & ~3)
        payload = (r.get(_HOST_SEM_PAYLOAD_HI, 0) << 32) | r.get(_HOST_SEM_PAYLOAD_LO, 0)
        op, is64, with_ts = ex & 7, bool(ex >> 24 & 1), bool(ex >> 25 & 1)
        if op == 1:  # RELEASE
            if ex >> _SEM_RELEASE_WFI_BIT & 1:  # RELEASE_WFI: the engine goes idle before the write
                self._drain(ch)
            self._semaphore_write(ch, va, payload, is64, with_ts)
            return True
        if op in (0, 2, 3, 4, 5):
            n = 8 if is64 else 4
            if va % n:
                raise MockGPUFault(
                    "SEMAPHORE_ALIGNMENT",
                    f"acquire VA must be {n}-byte aligned",
                    va=va,
                    method=_HOST_SEM_EXECUTE,
                    pb_address=pb_addr,
                )
            mask = (1 << (8 * n)) - 1
            cur = int.from_bytes(bytes(_ffi.buffer(_ffi.cast("char *", self._host(ch, va, n)), n)), "little")
            want = payload & mask
            if op == 0:
                ok = cur == want
            elif op == 2:
                ok = cur >= want
            elif op == 3:  # wrap-around >=: (cur - want) interpreted as signed is >= 0
                ok = ((cur - want) & mask) < (1 << (8 * n - 1))
            elif op == 4:
                ok = (cur & want) != 0
            else:
                ok = (~(cur | want) & mask) != 0
            return ok
        raise MockUnsupported(
            "PBDMA", f"SEM_EXECUTE operation {op}", method=_HOST_SEM_EXECUTE, pb_address=pb_addr
        )

    def _compute_method(self, ch: ChannelState, cls: int, method: int, data: int, pb_addr: int) -> None:
        if method not in _COMPUTE_METHODS:
            raise MockGPUFault(
                "GR",
                f"unknown method for compute class {cls:#x}",
                method=method,
                pb_address=pb_addr,
                xid=XID_GR_EXCEPTION,
            )
        key = (cls, method)
        ch.regs[key] = data  # type: ignore[index]
        if method == 0x110:  # WAIT_FOR_IDLE: the engine finishes its grids before the next method
            self._drain(ch)
        if method in (0x2C0, 0x2B8, 0x2BC):  # a SEND_*PCAS*_B starts the QMD named by SEND_PCAS_A
            qmd_va = ch.regs.get((cls, 0x2B4), 0) << 8  # type: ignore[call-overload]
            n = _QMD_BYTES.get(cls, 256)
            qmd = bytes(_ffi.buffer(_ffi.cast("char *", self._host(ch, qmd_va, n)), n))
            action = data & 0xF
            launch = MockLaunch(ch.handle, qmd_va, qmd, action)
            self.launches.append(launch)
            if self.execute_kernels and action in _SCHEDULING_PCAS_ACTIONS:
                try:
                    self._launch(ch, cls, qmd_va, qmd, launch)
                except MockGPUFault as f:
                    if f.method is None:
                        f.method, f.pb_address = method, pb_addr
                    raise
        elif method == 0x1B0C:  # SET_REPORT_SEMAPHORE_D: OPERATION 1:0, STRUCTURE_SIZE 28 (1 = one word)
            if data & 3 != 0:
                raise MockUnsupported(
                    "GR", f"report semaphore operation {data & 3}", method=method, pb_address=pb_addr
                )
            bits = _COMPUTE_REPORT_UPPER_BITS.get(cls, 8)
            hi = ch.regs.get((cls, 0x1B00), 0)  # type: ignore[call-overload]
            if hi >> bits:
                raise MockGPUFault(
                    "GR",
                    f"SET_REPORT_SEMAPHORE_A {hi:#x} exceeds {bits} bits",
                    method=method,
                    pb_address=pb_addr,
                    xid=XID_GR_EXCEPTION,
                )
            va = (hi << 32) | ch.regs.get((cls, 0x1B04), 0)  # type: ignore[call-overload]
            one_word = bool(data >> 28 & 1)
            # The engine writes a report semaphore behind the work before it in its pipeline (a third-party
            # H100 bring-up uses it as the kernel-completion signal; NV-FACTS 5.1): an ordering point.
            self._drain(ch)
            self._semaphore_write(ch, va, ch.regs.get((cls, 0x1B08), 0), False, not one_word)  # type: ignore

    def _copy_method(self, ch: ChannelState, cls: int, method: int, data: int, pb_addr: int) -> None:
        if method not in _COPY_METHODS or (method == 0x24C and cls == abi.AMPERE_DMA_COPY_A):
            raise MockGPUFault(
                "CE", f"unknown method for copy class {cls:#x}", method=method, pb_address=pb_addr
            )
        r: dict[Any, int] = ch.regs  # type: ignore[assignment]
        bits = _COPY_UPPER_BITS[cls]
        if method in (0x240, 0x400, 0x408) and data >> bits:
            raise MockGPUFault(
                "CE",
                f"{_COPY_METHODS[method]} {data:#x} exceeds {bits} bits",
                method=method,
                pb_address=pb_addr,
            )
        r[(cls, method)] = data
        if method != 0x300:
            return
        transfer, flush, sem = data & 3, data >> 2 & 1, data >> 3 & 3
        if transfer:
            if not (data >> 7 & 1 and data >> 8 & 1):
                raise MockUnsupported("CE", "block-linear layouts", method=method, pb_address=pb_addr)
            if data >> 12 & 3:
                raise MockUnsupported("CE", "physical addressing", method=method, pb_address=pb_addr)
            src = (r.get((cls, 0x400), 0) << 32) | r.get((cls, 0x404), 0)
            dst = (r.get((cls, 0x408), 0) << 32) | r.get((cls, 0x40C), 0)
            line = r.get((cls, 0x418), 0)
            if data >> 9 & 1:  # MULTI_LINE_ENABLE: LINE_COUNT lines at PITCH_IN / PITCH_OUT
                for i in range(r.get((cls, 0x41C), 0)):
                    self._copy(ch, dst + i * r.get((cls, 0x414), 0), src + i * r.get((cls, 0x410), 0), line)
            else:
                self._copy(ch, dst, src, line)
        if sem:
            if sem == 3:
                raise MockUnsupported(
                    "CE", "RELEASE_CONDITIONAL_INTR semaphore", method=method, pb_address=pb_addr
                )
            del flush  # caches are coherent in the mock; FLUSH_ENABLE has no observable effect here
            va = (r.get((cls, 0x240), 0) << 32) | r.get((cls, 0x244), 0)
            is64 = bool(data >> 27 & 1)
            if is64 and cls == abi.AMPERE_DMA_COPY_A:
                raise MockGPUFault(
                    "CE",
                    "64-bit semaphore payload on a class without PAYLOAD_UPPER",
                    method=method,
                    pb_address=pb_addr,
                )
            payload = r.get((cls, 0x248), 0) | ((r.get((cls, 0x24C), 0) << 32) if is64 else 0)
            self._semaphore_write(ch, va, payload, is64, sem == 2)

    # -- kernel execution ------------------------------------------------------------------------------
    # The compute engine is asynchronous: SEND_PCAS validates the QMD against the loaded image and puts the
    # grid "in flight"; it runs (its memory effects appear) only at an ordering point on its channel: a host
    # WFI, a host release with RELEASE_WFI, the compute WAIT_FOR_IDLE, a report semaphore, or the channel
    # staying quiet for `idle_complete_s` (work finishes eventually). A grid's dependent QMDs run after it.
    # In-flight streams run latest first, so a launch that depends on an earlier one without a WFI reads
    # stale data; when more than one stream (or another channel's copy) overlaps them, every access is
    # tracked and a conflict is a fault. A release not ordered after the work (no RELEASE_WFI, or a QMD
    # release without a membar) fires at once, before the grids complete.
    def _launch(self, ch: ChannelState, cls: int, qmd_va: int, qmd: bytes, launch: MockLaunch) -> None:
        grid = self._prepare(ch, cls, qmd_va, qmd, launch)
        self._seq += 1
        ch.inflight.append(_Stream(grid, self._seq))

    def _drain(self, ch: ChannelState) -> None:
        """Complete every grid in flight on `ch` (an ordering point)."""
        streams, ch.inflight = ch.inflight, []
        if not streams:
            return
        first = min(s.seq for s in streams)
        foreign = [a for a in self._access_log if a.channel != ch.handle and a.seq > first]
        track = len(streams) > 1 or bool(foreign)
        for s in reversed(streams):  # latest first: exposes a launch that needed an earlier one to finish
            self._run_stream(ch, s, track)
        if not any(c.inflight for c in self.channels.values()):
            self._access_log.clear()
        if track:
            self._check_unordered(streams, foreign)

    def _run_stream(self, ch: ChannelState, s: _Stream, track: bool) -> None:
        g = s.head
        for _ in range(_MAX_CHAIN):
            self._run_kernel(ch, g, track)
            s.ran.append(g)
            if not g.q.get(g.fields["dep_enable"]):
                return
            if g.q.get(g.fields["dep_action"]) != _DEPENDENT_SCHEDULE:
                raise MockUnsupported("GR", f"dependent QMD action {g.q.get(g.fields['dep_action'])}",
                                      va=g.qmd_va)
            nxt = g.q.get(g.fields["dep_ptr"]) << 8
            n = _QMD_BYTES.get(g.cls, 256)
            qmd = bytes(_ffi.buffer(_ffi.cast("char *", self._host(ch, nxt, n)), n))
            launch = MockLaunch(ch.handle, nxt, qmd, _DEPENDENT_SCHEDULE, chained=True)
            self.launches.append(launch)
            g = self._prepare(ch, g.cls, nxt, qmd, launch)  # fetched when its parent completes
        raise _gr_fault(f"dependent-QMD chain longer than {_MAX_CHAIN} (a loop?)", g.qmd_va)

    def _check_unordered(self, streams: list[_Stream], foreign: list[_Access]) -> None:
        spans = [(s, _merge([g.reads for g in s.ran]), _merge([g.writes for g in s.ran])) for s in streams]
        for i, (a, ar, aw) in enumerate(spans):
            for b, br, bw in spans[i + 1:]:
                for what, x, y in (("both write", aw, bw), ("the first writes what the second reads", aw, br),
                                   ("the second writes what the first reads", ar, bw)):
                    hit = _overlap(x, y)
                    if hit is not None:
                        raise _gr_fault(
                            f"unordered overlapping writes: {a.describe()} and {b.describe()} were in flight "
                            f"together with no WFI or dependent-QMD chain between them, and {what} "
                            f"[{hit[0]:#x}, {hit[1]:#x})", b.head.qmd_va)
        for acc in foreign:
            for s, r, w in spans:
                if acc.seq <= s.seq:
                    continue
                hit = _overlap(w, acc.span)  # a read races the grid's writes, a write its reads too
                if hit is None and acc.write:
                    hit = _overlap(r, acc.span)
                if hit is not None:
                    raise _gr_fault(
                        f"unordered access: the {acc.what} on channel {acc.channel:#x} "
                        f"{'wrote' if acc.write else 'read'} [{hit[0]:#x}, {hit[1]:#x}) while "
                        f"{s.describe()}, which touches it, was still in flight: whatever let it run was "
                        f"not ordered after the kernel (a semaphore release without RELEASE_WFI, or a "
                        f"missing WFI)",
                        s.head.qmd_va)

    def _prepare(self, ch: ChannelState, cls: int, qmd_va: int, qmd: bytes, launch: MockLaunch) -> _Grid:
        """Decode and check a QMD at launch; fire its releases that nothing orders after the grid."""
        n = _QMD_BYTES.get(cls, 256)
        want_major = 4 if n == 384 else 3
        q = _QMDView(qmd)
        major = q.get(_V04["major"])
        if major != want_major:
            raise _gr_fault(f"QMD at {qmd_va:#x} has major version {major}; class {cls:#x} takes "
                            f"{want_major}", qmd_va)
        f, slots = _QMD_LAYOUTS[major]
        more = {k: q.get(v) for k, v in _QMD_MORE[major].items()}
        if q.get(f["minor"]):
            raise _gr_fault(f"QMD minor version {q.get(f['minor'])}; only {major}.0 is known", qmd_va)
        if f is _V04 and q.get(f["qmd_type"]) not in _QMD_TYPES_OK:
            raise _gr_fault(f"QMD_TYPE {q.get(f['qmd_type'])} is not a grid launch", qmd_va)
        sass = q.get(f["sass"])
        want_sass = ((self.sm_version & 0xF00) >> 4) | (self.sm_version & 0xF)
        if sass != want_sass:
            raise _gr_fault(f"SASS_VERSION {sass:#x} does not match this GPU ({want_sass:#x})", qmd_va)
        grid = (q.get(f["grid_x"]), q.get(f["grid_y"]), q.get(f["grid_z"]))
        block = (q.get(f["block_x"]), q.get(f["block_y"]), q.get(f["block_z"]))
        if (min(grid) < 1 or min(block) < 1 or block[0] * block[1] * block[2] > _MAX_BLOCK_THREADS
                or grid[0] > _MAX_GRID_X or any(b > m for b, m in zip(block, _MAX_BLOCK))):
            raise _gr_fault(f"bad launch shape: grid {grid}, block {block} (limits: grid x <= {_MAX_GRID_X}, "
                            f"block <= {_MAX_BLOCK}, {_MAX_BLOCK_THREADS} threads)", qmd_va)
        prog_va = (q.get(f["prog_hi"]) << 32) | q.get(f["prog_lo"])
        need = self._find_program(ch, prog_va)
        launch.entry, launch.grid, launch.block = need.entry, grid, block  # type: ignore[assignment]
        self._check_resources(ch, cls, q, f, more, need, block, qmd_va)
        self._check_program_fetch(more, need, prog_va, major, qmd_va)
        bank_va, bank_size = self._check_banks(ch, more, need, major, qmd_va)
        param_off = need.param_offset
        if param_off is None:
            param_off = _PARAM_OFFSET_BY_SM_MAJOR.get(self.sm_version >> 8, 0)
        if bank_size <= param_off:
            raise _gr_fault(f"constant bank 0 of {bank_size} bytes has no room for parameters at "
                            f"{param_off:#x}", qmd_va)
        g = _Grid(launch, cls, qmd_va, q, f, more, slots, need.entry, need.ptx, prog_va, grid, block, bank_va,
                  bank_size, param_off)
        self._check_releases(ch, g)
        return g

    def _check_resources(self, ch: ChannelState, cls: int, q: _QMDView, f: dict[str, tuple[int, int]],
                         more: dict[str, int], need: _ImageNeeds, block: tuple[int, int, int],
                         qmd_va: int) -> None:
        """Registers, shared memory, local memory and barriers against what the image says it needs."""
        k = f"kernel {need.entry}"
        reg_name = "REGISTER_COUNT" if f is _V04 else "REGISTER_COUNT_V"
        regs = q.get(f["registers"])
        if regs < max(1, need.registers) or regs > _MAX_REGISTERS:
            raise _gr_fault(f"QMD {reg_name} = {regs}, but {k} needs {need.registers} registers per thread "
                            f"(image REGCOUNT) and the hardware allows 1..{_MAX_REGISTERS}", qmd_va)
        threads = block[0] * block[1] * block[2]
        per_warp = -(-regs * _WARP // _REGISTER_ALLOC_UNIT) * _REGISTER_ALLOC_UNIT
        if per_warp * -(-threads // _WARP) > _REGISTER_FILE:
            raise _gr_fault(f"QMD {reg_name} = {regs} for {threads} threads needs "
                            f"{per_warp * -(-threads // _WARP)} registers, more than the SM's "
                            f"{_REGISTER_FILE}: the block can never be resident", qmd_va)
        shared = q.get(f["shared"])
        if shared < need.shared_need:
            raise _gr_fault(f"QMD SHARED_MEMORY_SIZE = {shared:#x}, but {k} needs {need.shared_need:#x} (the "
                            f"reserved {_SHARED_RESERVED:#x} + {need.shared_static:#x} bytes of static "
                            f"shared memory, image .nv.shared.{need.entry})", qmd_va)
        max_kib = _MAX_CARVEOUT_KIB.get(self.sm_version, 100)
        cfg = {}
        for name in ("MIN", "TARGET", "MAX"):
            v = more[f"{name}_SM_CONFIG_SHARED_MEM_SIZE"]
            kib = (v - 1) * _SM_CONFIG_UNIT_KIB
            if v == 0 or kib > max_kib:
                raise _gr_fault(f"QMD {name}_SM_CONFIG_SHARED_MEM_SIZE = {v} is no carve-out of this SM "
                                f"(encoding KiB/4 + 1, at most {max_kib} KiB)", qmd_va)
            cfg[name] = kib
        if not cfg["MIN"] <= cfg["TARGET"] <= cfg["MAX"]:
            raise _gr_fault(f"QMD SM_CONFIG_SHARED_MEM_SIZE carve-outs MIN {cfg['MIN']} / TARGET "
                            f"{cfg['TARGET']} / MAX {cfg['MAX']} KiB are out of order", qmd_va)
        if shared > cfg["MIN"] * _KIB:
            raise _gr_fault(f"QMD SHARED_MEMORY_SIZE = {shared:#x} does not fit the "
                            f"MIN_SM_CONFIG_SHARED_MEM_SIZE carve-out of {cfg['MIN']} KiB", qmd_va)
        low, high = more["SHADER_LOCAL_MEMORY_LOW_SIZE"], more["SHADER_LOCAL_MEMORY_HIGH_SIZE"]
        need_local = -(-(need.stack + _LOCAL_ABOVE_STACK) // _LOCAL_ROUND) * _LOCAL_ROUND
        if low + high < need_local:
            raise _gr_fault(f"QMD SHADER_LOCAL_MEMORY_HIGH_SIZE = {high:#x} (LOW {low:#x}), but {k} needs "
                            f"{need_local:#x} bytes per thread (image MIN_STACK_SIZE {need.stack:#x} + "
                            f"{_LOCAL_ABOVE_STACK:#x})", qmd_va)
        if self.max_warps_per_sm and self.sm_per_tpc and low + high:
            r = ch.regs
            per_tpc = (r.get((cls, 0x2E4), 0) << 32) | r.get((cls, 0x2E8), 0)  # type: ignore[call-overload]
            want = (-(-(low + high) * _WARP // _SLM_WARP_ROUND) * _SLM_WARP_ROUND * self.max_warps_per_sm
                    * self.sm_per_tpc)
            if per_tpc < want:
                raise _gr_fault(f"QMD local memory of {low + high:#x} bytes per thread needs {want:#x} "
                                f"bytes per TPC, but SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A/B gave "
                                f"{per_tpc:#x}", qmd_va)
        barriers = more["BARRIER_COUNT"]
        if barriers < need.barriers or barriers > _MAX_BARRIERS:
            raise _gr_fault(f"QMD BARRIER_COUNT = {barriers}, but {k} uses {need.barriers} barriers (image "
                            f"NUM_BARRIERS) and a CTA has at most {_MAX_BARRIERS}", qmd_va)
        if more["CWD_MEMBAR_TYPE"] not in (_CWD_MEMBAR_NONE, _CWD_MEMBAR_SYSMEMBAR, _CWD_MEMBAR_L1):
            raise _gr_fault(f"QMD CWD_MEMBAR_TYPE = {more['CWD_MEMBAR_TYPE']} is not a membar type", qmd_va)
        # Decoded and accepted as any value (no hardware rule and nothing to derive them from in the mock):
        # QMD_GROUP_ID, SM_GLOBAL_CACHING_ENABLE, API_VISIBLE_CALL_LIMIT, SAMPLER_INDEX, the INVALIDATE_*
        # cache bits (the mock has no caches), DEPENDENT_QMD*_PREFETCH and V04 CONSTANT_BUFFER_PREFETCH(i).

    def _check_program_fetch(self, more: dict[str, int], need: _ImageNeeds, prog_va: int, major: int,
                             qmd_va: int) -> None:
        pre = ((more["PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED"] << 32)
               | more["PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED"])
        if pre != prog_va >> _PREFETCH_SHIFT:
            raise _gr_fault(f"QMD PROGRAM_PREFETCH_ADDR_*_SHIFTED = {pre:#x}, but PROGRAM_ADDRESS >> 8 is "
                            f"{prog_va >> _PREFETCH_SHIFT:#x}", qmd_va)
        size = more["PROGRAM_PREFETCH_SIZE"] << _PREFETCH_SHIFT
        if prog_va + size > need.mapping_end:
            raise MockGPUFault("MMU_FAULT", f"QMD PROGRAM_PREFETCH_SIZE = {size:#x} bytes from {prog_va:#x} "
                               f"runs past the image's mapping (ends {need.mapping_end:#x})",
                               va=need.mapping_end, xid=XID_MMU_FAULT)
        if major == 4 and more["PROGRAM_PREFETCH_TYPE"] not in _PREFETCH_TYPES_OK:
            raise _gr_fault(f"QMD PROGRAM_PREFETCH_TYPE = {more['PROGRAM_PREFETCH_TYPE']}", qmd_va)

    def _check_banks(self, ch: ChannelState, more: dict[str, int], need: _ImageNeeds, major: int,
                     qmd_va: int) -> tuple[int, int]:
        """Every valid constant bank is mapped and sized, and the banks the image has are bound; returns bank
        0's VA and size."""
        bank0 = (0, 0)
        for i in range(_MAX_BANKS):
            if not more[f"CONSTANT_BUFFER_VALID({i})"]:
                if i == 0 or i in need.banks:
                    raise _gr_fault(f"QMD CONSTANT_BUFFER_VALID({i}) = 0, but kernel {need.entry} reads "
                                    f"constant bank {i}", qmd_va)
                continue
            size = more[f"CONSTANT_BUFFER_SIZE_SHIFTED4({i})"] << _BANK_SIZE_SHIFT
            if major == 4:
                va = ((more[f"CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6({i})"] << 32)
                      | more[f"CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6({i})"]) << _BANK_V04_SHIFT
            else:
                va = ((more[f"CONSTANT_BUFFER_ADDR_UPPER({i})"] << 32)
                      | more[f"CONSTANT_BUFFER_ADDR_LOWER({i})"])
            if not 0 < size <= _MAX_BANK_BYTES:
                raise _gr_fault(f"QMD CONSTANT_BUFFER_SIZE_SHIFTED4({i}) gives {size} bytes "
                                f"(1..{_MAX_BANK_BYTES})", qmd_va)
            try:
                self._host(ch, va, size)
            except MockGPUFault as e:
                raise MockGPUFault("MMU_FAULT", f"constant bank {i} ({size} bytes at {va:#x}) is not mapped",
                                   va=va, xid=XID_MMU_FAULT) from e
            want = need.param_end if i == 0 else need.banks.get(i)
            if want is not None and size < want:
                what = "the parameters end" if i == 0 else f"image .nv.constant{i} has"
                raise _gr_fault(f"QMD CONSTANT_BUFFER_SIZE_SHIFTED4({i}) gives {size:#x} bytes, but {what} "
                                f"{want:#x} for kernel {need.entry}", qmd_va)
            if i == 0:
                bank0 = (va, size)
        return bank0

    def _check_releases(self, ch: ChannelState, g: _Grid) -> None:
        f, more = g.fields, g.more
        for i in range(g.slots):
            if not g.q.get(f[f"rel{i}_enable"]):
                continue
            if g.q.get(f[f"rel{i}_struct"]) != _RELEASE_FOUR_WORDS:
                raise MockUnsupported("GR", f"QMD release {i} structure size {g.q.get(f[f'rel{i}_struct'])}",
                                      va=g.qmd_va)
            if f is _V04 and more[f"RELEASE_REDUCTION_ENABLE({i})"]:
                raise MockUnsupported("GR", f"QMD release {i} with a reduction", va=g.qmd_va)
            va = (g.q.get(f[f"rel{i}_hi"]) << 32) | g.q.get(f[f"rel{i}_lo"])
            if va % 16:  # four words: payload + timestamp (NV-FACTS 4.6)
                raise MockGPUFault("SEMAPHORE_ALIGNMENT", f"QMD release {i} VA must be 16-byte aligned",
                                   va=va, xid=XID_GR_EXCEPTION)
            self._host(ch, va, 16)  # an unmapped release target faults at launch
            # The release waits for the grid's stores only behind a membar: CWD_MEMBAR_TYPE (after each CTA)
            # or, on V04, the release's own FE_SYSMEMBAR. Without one it can land before the grid's writes.
            ordered = more["CWD_MEMBAR_TYPE"] != _CWD_MEMBAR_NONE or (
                f is _V04 and more[f"RELEASE_MEMBAR_TYPE({i})"] == _RELEASE_MEMBAR_FE_SYSMEMBAR)
            if not ordered:
                self._qmd_release(ch, g, i)
                g.early.add(i)

    def _run_kernel(self, ch: ChannelState, g: _Grid, track: bool) -> None:
        """Run one grid now."""
        bank = bytes(_ffi.buffer(_ffi.cast("char *", self._host(ch, g.bank_va, g.bank_size)), g.bank_size))
        prefix = np.frombuffer(bank[:_CB_GRID + 12], dtype=np.uint32)
        # compiled SASS reads blockDim/gridDim from bank 0: a wrong prefix would be a wrong kernel
        if tuple(int(x) for x in prefix[:3]) != g.block or tuple(int(x) for x in prefix[3:6]) != g.grid:
            raise _gr_fault(f"constant bank 0 says block {tuple(prefix[:3])} grid {tuple(prefix[3:6])}, the "
                            f"QMD says block {g.block} grid {g.grid}", g.qmd_va)
        module = self._module(g.ptx, g.prog_va)
        memory = MockGlobalMemory(self, ch, track=track)
        noted = len(module.warnings)
        try:
            module.launch(g.entry, g.grid, g.block, bank[g.param_off:], memory)
        except MockGPUFault:
            raise
        except Exception as e:  # an interpreter error is a kernel fault, never a dead GPU thread
            inner = _fault_in_chain(e)
            if inner is not None:
                raise inner from e
            raise _gr_fault(f"kernel {g.entry} failed: {type(e).__name__}: {e}", g.qmd_va) from e
        for note in module.warnings[noted:]:
            # an approximate instruction outside the range the ISA bounds its error for: hardware gives an
            # unspecified value there, so say so where a test run shows it
            warnings.warn(f"mock GPU, kernel {g.entry}: {note}", ApproximationOutOfRange, stacklevel=1)
        if track:
            g.reads, g.writes = memory.spans()
        for i in range(g.slots):
            if g.q.get(g.fields[f"rel{i}_enable"]) and i not in g.early:
                self._qmd_release(ch, g, i)

    def _find_program(self, ch: ChannelState, prog_va: int) -> _ImageNeeds:
        """The kernel whose code starts at `prog_va`: the image is the ELF at the start of that mapping."""
        space = ch.vaspace.data.get("uvm")
        m = space.lookup(prog_va) if space is not None else None
        if m is None:
            raise MockGPUFault("MMU_FAULT", "program address is not mapped", va=prog_va, xid=XID_MMU_FAULT)
        image = bytes(_ffi.buffer(_ffi.cast("char *", m.mem.host_addr + m.offset), m.length))
        try:
            f = elf.ElfFile.parse(image)
        except elf.ElfError as e:
            raise _gr_fault(f"no kernel image at the program address's mapping: {e}", prog_va) from e
        off = prog_va - m.va
        text = next((s for s in f.sections if s.name.startswith(_TEXT_PREFIX) and s.offset == off), None)
        if text is None:
            raise _gr_fault(f"program address is at image offset {off:#x}, not the start of a .text section",
                            prog_va)
        entry = text.name[len(_TEXT_PREFIX):]
        try:  # the SASS must be the code of the PTX interpreted below (sass_check re-assembles it)
            verify_image(image, (self.sm_version >> 8) * 10 + (self.sm_version & 0xFF))
        except BindingError as e:
            raise _gr_fault(str(e), prog_va) from e
        try:
            ptx = f.section(_PTX_SECTION).data.decode()
        except elf.ElfError as e:
            raise MockUnsupported("GR", f"kernel {entry} has no {_PTX_SECTION} section to interpret",
                                  va=prog_va) from e
        return _decode_image(f, text, entry, ptx, m.va + m.length, prog_va)

    def _module(self, ptx: str, prog_va: int) -> Any:
        key = ptx.encode()
        mod = self._modules.get(key)
        if mod is None:
            try:
                from rawgrad.drivers.nv.mock.ptx_interp import PTXModule
            except ImportError as e:
                raise MockUnsupported("GR", "the PTX interpreter is not available", va=prog_va) from e
            try:
                mod = self._modules[key] = PTXModule(ptx)
            except Exception as e:
                raise _gr_fault(f"PTX rejected: {type(e).__name__}: {e}", prog_va) from e
        return mod

    def _qmd_release(self, ch: ChannelState, g: _Grid, i: int) -> None:
        f = g.fields
        va = (g.q.get(f[f"rel{i}_hi"]) << 32) | g.q.get(f[f"rel{i}_lo"])
        payload = (g.q.get(f[f"rel{i}_pay_hi"]) << 32) | g.q.get(f[f"rel{i}_pay_lo"])
        try:
            self._semaphore_write(ch, va, payload, bool(g.q.get(f[f"rel{i}_p64"])), True)
        except MockGPUFault as e:
            e.xid = XID_MMU_FAULT if e.kind == "MMU_FAULT" else XID_GR_EXCEPTION
            raise


@dataclass
class _ImageNeeds:
    """What kernel `entry` of a loaded image needs from its QMD, from the image's own records."""

    entry: str
    ptx: str
    mapping_end: int  # VA where the image's mapping ends (instruction prefetch must stay inside)
    registers: int
    shared_static: int
    shared_need: int  # SHARED_MEMORY_SIZE at least, reserved KiB included
    stack: int  # per-thread stack bytes
    barriers: int
    param_offset: int | None  # where the parameters start in bank 0 (EIATTR_PARAM_CBANK)
    param_end: int | None  # bank 0 bytes the parameters need
    banks: dict[int, int]  # other constant banks the kernel has: index -> bytes


def _info_records(data: bytes, where: str, va: int) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    off = 0
    while off + _INFO_RECORD.size <= len(data):
        fmt, attr, val = _INFO_RECORD.unpack_from(data, off)
        off += _INFO_RECORD.size
        if fmt == _EIFMT_SVAL:
            out.append((attr, data[off:off + val]))
            off += val
        elif fmt in (_EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_NVAL):
            out.append((attr, val if fmt != _EIFMT_NVAL else 0))
        else:
            raise _gr_fault(f"{where}: unknown record format {fmt:#x}", va)
    return out


def _decode_image(f: elf.ElfFile, text: elf.ElfSection, entry: str, ptx: str, mapping_end: int,
                  va: int) -> _ImageNeeds:
    sym = next((k for k, s in enumerate(f.symbols) if s.name == entry), None)
    sections = {s.name: s for s in f.sections}
    attrs: dict[int, int | bytes] = {}
    if _NV_INFO in sections:  # keyed by symbol: keep this kernel's (an image without symbols has one kernel)
        for attr, v in _info_records(sections[_NV_INFO].data, _NV_INFO, va):
            if sym is None or not isinstance(v, bytes) or len(v) < 4 or struct.unpack_from("<I", v)[0] == sym:
                attrs[attr] = v
    if _NV_INFO_PREFIX + entry in sections:
        attrs.update(_info_records(sections[_NV_INFO_PREFIX + entry].data, _NV_INFO_PREFIX + entry, va))

    def second_u32(a: int) -> int:
        v = attrs.get(a)
        return struct.unpack_from("<II", v)[1] if isinstance(v, bytes) and len(v) >= 8 else 0

    registers = max(second_u32(_EIATTR_REGCOUNT), text.info >> _SH_INFO_REGS_SHIFT)
    barriers = attrs.get(_EIATTR_NUM_BARRIERS, 0)
    param_offset = param_end = None
    cbank = attrs.get(_EIATTR_PARAM_CBANK)
    if isinstance(cbank, bytes) and len(cbank) >= 8:
        _sym, param_offset, nbytes = struct.unpack_from("<IHH", cbank)
        param_end = param_offset + nbytes
    shared_sec = sections.get(_NV_SHARED_PREFIX + entry)
    static = shared_sec.size if shared_sec is not None else 0
    reserved_included = static >= _SHARED_RESERVED and any(
        name.startswith(_NV_SHARED_RESERVED_PREFIX) for name in sections)
    banks: dict[int, int] = {}
    for s in f.sections:
        m = _CONSTANT_BANK_RE.fullmatch(s.name)
        if m is not None and int(m.group(1)) > 0 and m.group(2) in (None, entry):
            banks[int(m.group(1))] = s.size
    shared_need = static if reserved_included else _SHARED_RESERVED + static
    return _ImageNeeds(entry, ptx, mapping_end, registers, static, shared_need,
                       second_u32(_EIATTR_MIN_STACK_SIZE), barriers if isinstance(barriers, int) else 0,
                       param_offset, param_end, banks)


@dataclass
class _Grid:
    """A launch checked at SEND_PCAS (or when its parent QMD completed) and waiting to run."""

    launch: MockLaunch
    cls: int
    qmd_va: int
    q: _QMDView
    fields: dict[str, tuple[int, int]]
    more: dict[str, int]
    slots: int
    entry: str
    ptx: str
    prog_va: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    bank_va: int
    bank_size: int
    param_off: int
    early: set[int] = field(default_factory=set)  # release slots already fired at launch
    reads: np.ndarray | None = None  # (n, 2) sorted disjoint [lo, hi) spans, once run with tracking
    writes: np.ndarray | None = None


@dataclass
class _Stream:
    """A grid started by SEND_PCAS and the QMDs it schedules: ordered inside, unordered with other streams."""

    head: _Grid
    seq: int
    ran: list[_Grid] = field(default_factory=list)

    def describe(self) -> str:
        names = ", ".join(dict.fromkeys(g.entry for g in self.ran)) or self.head.entry
        return f"kernel {names} (QMD {self.head.qmd_va:#x})"


@dataclass
class _Access:
    """A copy-engine access made while some grid was in flight."""

    seq: int
    channel: int
    write: bool
    span: np.ndarray  # (1, 2) [lo, hi)
    what: str = "copy engine"


_NO_SPANS = np.zeros((0, 2), np.uint64)


def _spans(addr: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) spans covering `size` bytes at every address, neighbours merged."""
    a = np.unique(addr)
    if a.size == 0:
        return a, a
    brk = np.nonzero(a[1:] > a[:-1] + np.uint64(size))[0]
    lo = a[np.concatenate(([0], brk + 1))]
    hi = a[np.concatenate((brk, [a.size - 1]))] + np.uint64(size)
    return lo, hi


def _merge(parts: list[np.ndarray | None]) -> np.ndarray:
    """Sorted disjoint (n, 2) spans covering every span given."""
    got = [p for p in parts if p is not None and len(p)]
    if not got:
        return _NO_SPANS
    cat = np.concatenate(got)
    order = np.argsort(cat[:, 0], kind="stable")
    lo, hi = cat[order, 0], cat[order, 1]
    reach = np.maximum.accumulate(hi)
    starts = np.nonzero(np.concatenate(([True], lo[1:] > reach[:-1])))[0]
    ends = np.concatenate((starts[1:], [lo.size])) - 1
    return np.stack([lo[starts], reach[ends]], axis=1)


def _overlap(a: np.ndarray, b: np.ndarray) -> tuple[int, int] | None:
    """The first overlap of two sorted disjoint span lists, or None."""
    if not len(a) or not len(b):
        return None
    idx = np.searchsorted(a[:, 0], b[:, 1], side="left").astype(np.int64) - 1
    ok = idx >= 0
    hit = np.zeros(len(b), bool)
    hit[ok] = a[idx[ok], 1] > b[ok, 0]
    if not hit.any():
        return None
    k = int(np.argmax(hit))
    j = int(idx[k])
    return int(max(a[j, 0], b[k, 0])), int(min(a[j, 1], b[k, 1]))


class _QMDView:
    """Bit-field reads over a QMD's bytes."""

    def __init__(self, qmd: bytes) -> None:
        self.value = int.from_bytes(qmd, "little")

    def get(self, field: tuple[int, int]) -> int:
        lo, width = field
        return (self.value >> lo) & ((1 << width) - 1)


def _gr_fault(message: str, va: int) -> MockGPUFault:
    return MockGPUFault("GR", message, va=va, xid=XID_GR_EXCEPTION)


def _fault_in_chain(e: BaseException) -> MockGPUFault | None:
    seen = 0
    cur: BaseException | None = e
    while cur is not None and seen < 16:
        if isinstance(cur, MockGPUFault):
            return cur
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


class MockGlobalMemory:
    """The interpreter's `GlobalMemory` over a channel's GPU mappings; unmapped accesses are MMU faults."""

    def __init__(self, gpu: MockGPU, ch: ChannelState, *, track: bool = False) -> None:
        self._track = track  # record every span loaded / stored (to find unordered overlaps)
        self._loaded: list[np.ndarray] = []
        self._stored: list[np.ndarray] = []
        space = ch.vaspace.data.get("uvm")
        if space is None:
            raise MockGPUFault("MMU_FAULT", "channel VA space is not registered with UVM", xid=XID_MMU_FAULT)
        self._maps = list(space._maps)  # sorted by VA; fixed while the GPU thread holds the lock
        self._starts = np.array([m.va for m in self._maps], dtype=np.uint64)
        self._views: dict[int, np.ndarray] = {}

    def _view(self, k: int) -> np.ndarray:
        v = self._views.get(k)
        if v is None:
            m = self._maps[k]
            raw = _ffi.buffer(_ffi.cast("char *", m.mem.host_addr + m.offset), m.length)
            v = np.frombuffer(raw, np.uint8)
            self._views[k] = v
        return v

    def _locate(self, addr: np.ndarray, size: int, what: str) -> np.ndarray:
        which = np.searchsorted(self._starts, addr, side="right").astype(np.int64) - 1
        bad = which < 0
        if not bad.any():
            ends = np.array([m.va + m.length for m in self._maps], dtype=np.uint64)
            bad = addr + np.uint64(size) > ends[which]
        if bad.any():
            va = int(addr[bad][0])
            raise MockGPUFault("MMU_FAULT", f"kernel {what} of {size} bytes at unmapped GPU VA", va=va,
                               xid=XID_MMU_FAULT)
        return which

    def load(self, addresses: np.ndarray, dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        addr = np.asarray(addresses, dtype=np.uint64).reshape(-1)
        which = self._locate(addr, dt.itemsize, "load")
        if self._track:
            self._loaded.append(np.stack(_spans(addr, dt.itemsize), axis=1))
        out = np.empty((addr.size, dt.itemsize), np.uint8)
        lanes = np.arange(dt.itemsize, dtype=np.int64)
        for k in np.unique(which):
            sel = which == k
            off = (addr[sel] - np.uint64(self._maps[int(k)].va)).astype(np.int64)
            out[sel] = self._view(int(k))[off[:, None] + lanes]
        return out.view(dt).reshape(np.shape(addresses))

    def store(self, addresses: np.ndarray, values: np.ndarray) -> None:
        vals = np.ascontiguousarray(values).reshape(-1)
        size = vals.dtype.itemsize
        addr = np.asarray(addresses, dtype=np.uint64).reshape(-1)
        which = self._locate(addr, size, "store")
        if self._track:
            self._stored.append(np.stack(_spans(addr, size), axis=1))
        raw = vals.view(np.uint8).reshape(-1, size)
        lanes = np.arange(size, dtype=np.int64)
        for k in np.unique(which):
            sel = which == k
            off = (addr[sel] - np.uint64(self._maps[int(k)].va)).astype(np.int64)
            self._view(int(k))[off[:, None] + lanes] = raw[sel]

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(loaded, stored) as sorted disjoint [lo, hi) spans (tracking memories only)."""
        return _merge(list(self._loaded)), _merge(list(self._stored))
