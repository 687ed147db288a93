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
    """A compute launch seen by the front end (kernels are recorded, not run)."""

    channel: int
    qmd_va: int
    qmd: bytes
    pcas_action: int


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

    def __init__(self, lock: threading.RLock, *, execute_kernels: bool = False, poll_s: float = 0.0005):
        self.lock = lock
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
            self.launches.append(MockLaunch(ch.handle, qmd_va, qmd, data & 0xF))
            if self.execute_kernels:
                raise MockUnsupported(
                    "GR",
                    "kernel execution is not emulated (QMD launch recorded only)",
                    method=method,
                    pb_address=pb_addr,
                    va=qmd_va,
                )
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
