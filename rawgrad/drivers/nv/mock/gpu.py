"""Mock GPU front end: GPFIFO -> pushbuffer methods -> host semaphores, copy engine, launch records.

The decoder below restates the encodings from the class headers on its own (it does not import the
encoders in ``pushbuf.py``), so a field slip in an encoder shows up as a fault here instead of being
mirrored. Work runs on one "GPU" thread, as on hardware: the CPU rings a doorbell and later polls memory.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cffi
import numpy as np

from rawgrad.compiler import elf
from rawgrad.drivers.nv import abi

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
_QMD_TYPES_OK = (0, 2)  # V04 QMD_TYPE: NVK leaves 0, GRID_CTA is 2 (NV-FACTS 5.5)
_SCHEDULING_PCAS_ACTIONS = (2, 3, 9, 0xA, 0xB)  # PCAS actions that schedule the QMD (NV-FACTS 5.2)
_DEPENDENT_SCHEDULE = 1  # DEPENDENT_QMD0_ACTION_QMD_SCHEDULE
_MAX_CHAIN = 1 << 16  # dependent-QMD chain length before the mock calls it a loop
_SHARED_RESERVED = 0x400  # sm_80+: SHARED_MEMORY_SIZE counts the reserved KiB (NV-FACTS 5.6)
_MAX_REGISTERS = 255
_MAX_BLOCK_THREADS = 1024
_RELEASE_FOUR_WORDS = 0
# Constant bank 0 (NV-FACTS 7.4): block dims at 0x00, grid dims at 0x0C; parameters from 0x160 (sm_8x) or
# 0x210 (sm_90).
_CB_BLOCK, _CB_GRID = 0x00, 0x0C
_PARAM_OFFSET_BY_SM_MAJOR = {8: 0x160, 9: 0x210}
_PTX_SECTION = ".rawgrad.ptx"
_TEXT_PREFIX = ".text."


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


class MockGPU:
    """Front end for one mock GPU; all state is guarded by the owning kernel mock's lock."""

    def __init__(self, lock: threading.RLock, *, execute_kernels: bool = False, poll_s: float = 0.0005,
                 sm_version: int = 0x900):
        self.lock = lock
        self.sm_version = sm_version
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
                        progressed |= self._run_channel(ch)
                        blocked |= ch.blocked is not None
                if progressed:
                    continue
                self.cv.wait(self.poll_s if blocked else 0.05)

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
        if method in (0x2C0, 0x2B8, 0x2BC):  # a SEND_*PCAS*_B starts the QMD named by SEND_PCAS_A
            qmd_va = ch.regs.get((cls, 0x2B4), 0) << 8  # type: ignore[call-overload]
            n = _QMD_BYTES.get(cls, 256)
            qmd = bytes(_ffi.buffer(_ffi.cast("char *", self._host(ch, qmd_va, n)), n))
            action = data & 0xF
            self.launches.append(MockLaunch(ch.handle, qmd_va, qmd, action))
            if self.execute_kernels and action in _SCHEDULING_PCAS_ACTIONS:
                try:
                    self._run_qmds(ch, cls, qmd_va)
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
    def _run_qmds(self, ch: ChannelState, cls: int, qmd_va: int) -> None:
        """Run the QMD at `qmd_va` and every QMD it schedules through DEPENDENT_QMD0."""
        n = _QMD_BYTES.get(cls, 256)
        want_major = 4 if n == 384 else 3
        for step in range(_MAX_CHAIN):
            if step:
                qmd = bytes(_ffi.buffer(_ffi.cast("char *", self._host(ch, qmd_va, n)), n))
            else:
                qmd = self.launches[-1].qmd
            q = _QMDView(qmd)
            major = q.get(_V04["major"])
            if major != want_major:
                raise _gr_fault(f"QMD at {qmd_va:#x} has major version {major}; class {cls:#x} takes "
                                f"{want_major}", qmd_va)
            fields, slots = _QMD_LAYOUTS[major]
            if step:
                self.launches.append(MockLaunch(ch.handle, qmd_va, qmd, _DEPENDENT_SCHEDULE, chained=True))
            self._run_kernel(ch, q, fields, qmd_va)
            self._qmd_releases(ch, q, fields, slots, qmd_va)
            if not q.get(fields["dep_enable"]):
                return
            if q.get(fields["dep_action"]) != _DEPENDENT_SCHEDULE:
                raise MockUnsupported("GR", f"dependent QMD action {q.get(fields['dep_action'])}", va=qmd_va)
            qmd_va = q.get(fields["dep_ptr"]) << 8
        raise _gr_fault(f"dependent-QMD chain longer than {_MAX_CHAIN} (a loop?)", qmd_va)

    def _run_kernel(self, ch: ChannelState, q: _QMDView, f: dict[str, tuple[int, int]], qmd_va: int) -> None:
        if f is _V04 and q.get(f["qmd_type"]) not in _QMD_TYPES_OK:
            raise _gr_fault(f"QMD_TYPE {q.get(f['qmd_type'])} is not a grid launch", qmd_va)
        sass = q.get(f["sass"])
        want_sass = ((self.sm_version & 0xF00) >> 4) | (self.sm_version & 0xF)
        if sass != want_sass:
            raise _gr_fault(f"SASS_VERSION {sass:#x} does not match this GPU ({want_sass:#x})", qmd_va)
        grid = (q.get(f["grid_x"]), q.get(f["grid_y"]), q.get(f["grid_z"]))
        block = (q.get(f["block_x"]), q.get(f["block_y"]), q.get(f["block_z"]))
        if min(grid) < 1 or min(block) < 1 or block[0] * block[1] * block[2] > _MAX_BLOCK_THREADS:
            raise _gr_fault(f"bad launch shape: grid {grid}, block {block}", qmd_va)
        regs = q.get(f["registers"])
        if not 1 <= regs <= _MAX_REGISTERS:
            raise _gr_fault(f"REGISTER_COUNT {regs} is outside 1..{_MAX_REGISTERS}", qmd_va)
        if q.get(f["shared"]) < _SHARED_RESERVED:
            raise _gr_fault(f"SHARED_MEMORY_SIZE {q.get(f['shared']):#x} lacks the reserved "
                            f"{_SHARED_RESERVED:#x}", qmd_va)
        if not q.get(f["cb0_valid"]):
            raise _gr_fault("constant buffer 0 is not valid", qmd_va)
        if f is _V04:
            bank_va = ((q.get(f["cb0_hi6"]) << 32) | q.get(f["cb0_lo6"])) << 6
        else:
            bank_va = (q.get(f["cb0_hi"]) << 32) | q.get(f["cb0_lo"])
        bank_size = q.get(f["cb0_size16"]) << 4
        param_off = _PARAM_OFFSET_BY_SM_MAJOR.get(self.sm_version >> 8, 0)
        if bank_size <= param_off:
            raise _gr_fault(f"constant bank 0 of {bank_size} bytes has no room for parameters at "
                            f"{param_off:#x}", qmd_va)
        bank = bytes(_ffi.buffer(_ffi.cast("char *", self._host(ch, bank_va, bank_size)), bank_size))
        prefix = np.frombuffer(bank[:_CB_GRID + 12], dtype=np.uint32)
        # compiled SASS reads blockDim/gridDim from bank 0: a wrong prefix would be a wrong kernel
        if tuple(int(x) for x in prefix[:3]) != block or tuple(int(x) for x in prefix[3:6]) != grid:
            raise _gr_fault(f"constant bank 0 says block {tuple(prefix[:3])} grid {tuple(prefix[3:6])}, the "
                            f"QMD "
                            f"says block {block} grid {grid}", qmd_va)
        prog_va = (q.get(f["prog_hi"]) << 32) | q.get(f["prog_lo"])
        entry, ptx = self._find_program(ch, prog_va)
        launch = self.launches[-1]
        launch.entry, launch.grid, launch.block = entry, grid, block  # type: ignore[assignment]
        module = self._module(ptx, prog_va)
        memory = MockGlobalMemory(self, ch)
        try:
            module.launch(entry, grid, block, bank[param_off:], memory)
        except MockGPUFault:
            raise
        except Exception as e:  # an interpreter error is a kernel fault, never a dead GPU thread
            inner = _fault_in_chain(e)
            if inner is not None:
                raise inner from e
            raise _gr_fault(f"kernel {entry} failed: {type(e).__name__}: {e}", qmd_va) from e

    def _find_program(self, ch: ChannelState, prog_va: int) -> tuple[str, str]:
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
        entry = next((s.name[len(_TEXT_PREFIX):] for s in f.sections
                      if s.name.startswith(_TEXT_PREFIX) and s.offset == off), None)
        if entry is None:
            raise _gr_fault(f"program address is at image offset {off:#x}, not the start of a .text section",
                            prog_va)
        try:
            ptx = f.section(_PTX_SECTION).data.decode()
        except elf.ElfError as e:
            raise MockUnsupported("GR", f"kernel {entry} has no {_PTX_SECTION} section to interpret",
                                  va=prog_va) from e
        return entry, ptx

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

    def _qmd_releases(self, ch: ChannelState, q: _QMDView, f: dict[str, tuple[int, int]], slots: int,
                      qmd_va: int) -> None:
        for i in range(slots):
            if not q.get(f[f"rel{i}_enable"]):
                continue
            if q.get(f[f"rel{i}_struct"]) != _RELEASE_FOUR_WORDS:
                raise MockUnsupported("GR", f"QMD release {i} structure size {q.get(f[f'rel{i}_struct'])}",
                                      va=qmd_va)
            va = (q.get(f[f"rel{i}_hi"]) << 32) | q.get(f[f"rel{i}_lo"])
            payload = (q.get(f[f"rel{i}_pay_hi"]) << 32) | q.get(f[f"rel{i}_pay_lo"])
            try:
                self._semaphore_write(ch, va, payload, bool(q.get(f[f"rel{i}_p64"])), True)
            except MockGPUFault as e:
                e.xid = XID_MMU_FAULT if e.kind == "MMU_FAULT" else XID_GR_EXCEPTION
                raise


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

    def __init__(self, gpu: MockGPU, ch: ChannelState) -> None:
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
        raw = vals.view(np.uint8).reshape(-1, size)
        lanes = np.arange(size, dtype=np.int64)
        for k in np.unique(which):
            sel = which == k
            off = (addr[sel] - np.uint64(self._maps[int(k)].va)).astype(np.int64)
            self._view(int(k))[off[:, None] + lanes] = raw[sel]
