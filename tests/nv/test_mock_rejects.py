"""The mock GPU rejects what real hardware would: each test breaks one thing in the driver (by monkeypatch:
a QMD resource below what the kernel image needs, a release or launch left without its wait-for-idle, a
semaphore release with its words swapped) and checks the mock faults with a message naming what is wrong,
or the result the test reads is wrong. The unbroken driver passes the same runs.

Kernel images are built here from the PTX (cubin.ptx_only_image) with the records ptxas would add
(`.nv.shared.<k>`, EIATTR_NUM_BARRIERS), so the checks do not depend on whether ptxas is installed."""

from __future__ import annotations

import gc
import struct
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rawgrad.compiler import elf
from rawgrad.drivers.nv import cubin
from rawgrad.drivers.nv import pushbuf as pbuf
from rawgrad.drivers.nv import qmd as qmd_module
from rawgrad.drivers.nv.hcq import NVHCQDevice, _hi32, _lo32, _NVQueue
from rawgrad.drivers.nv.mock import GPUProfile, MockNV
from rawgrad.drivers.nv.qmd import QMD, QMDV04
from rawgrad.hcq import DeviceFault

from .conftest import SMALL_WINDOW
from .test_nv_device import KERNELS

N = 200
K = 3
EXPECTED = np.arange(N) * K
STATIC_SHARED = 0x100  # what the annotated image says `fill` declares
TIMEOUT_S = 5.0
# A payload whose two 32-bit words differ, so a swap of them is a different value (and a larger one: a
# wait for >= it still passes, only the value read back shows the slip).
PAYLOAD = 0x0000_0003_0000_0005
SWAPPED = 0x0000_0005_0000_0003
NUM_BARRIERS_RECORD = struct.pack("<BBH", 0x02, 0x4C, 1)  # EIFMT_BVAL, EIATTR_NUM_BARRIERS, 1


@pytest.fixture
def mock(profile: GPUProfile) -> Iterator[MockNV]:
    m = MockNV(profile, execute_kernels=True)
    m.gpu.idle_complete_s = 2.0  # unordered grids stay in flight long enough for the early reader to act
    yield m
    m.shutdown()
    gc.collect()


@pytest.fixture
def dev(mock: MockNV) -> Iterator[NVHCQDevice]:
    d = NVHCQDevice("NV", mock, gpfifo_entries=64, window_size=SMALL_WINDOW, timeout_s=TIMEOUT_S)
    yield d
    d.close()


def annotated_image(arch: str, *, shared: int = STATIC_SHARED, barriers: bool = True) -> bytes:
    """The PTX-only image of KERNELS with `.nv.shared.fill` (`shared` bytes) and, in `.nv.info.fill`, a
    NUM_BARRIERS record of 1, as ptxas writes them."""
    img = cubin.ptx_only_image(KERNELS.format(arch=arch), arch)
    f = elf.ElfFile.parse(img)
    e_flags = struct.unpack_from("<I", img, 48)[0]  # Elf64_Ehdr.e_flags
    sections = []
    for s in f.sections[1:]:
        if s.name == ".shstrtab":
            continue
        data = s.data + (NUM_BARRIERS_RECORD if barriers and s.name == ".nv.info.fill" else b"")
        sections.append(cubin.Section(s.name, s.type, s.flags, data, max(s.align, 1)))
    sections.append(cubin.Section(".nv.shared.fill", elf.SHT_NOBITS, elf.SHF_ALLOC, b"", 8,
                                  nobits_size=shared))
    return cubin.write_elf(sections, elf_flags=e_flags)


def run_fill(d: NVHCQDevice, lib: bytes | None = None) -> np.ndarray:
    """fill(a, N, K) on the timeline, then a's contents; raises DeviceFault if the GPU faulted."""
    fill = d.program("fill", lib if lib is not None else annotated_image(d.arch))
    a = d.allocator.alloc(8 * N)
    v = d.timeline_value
    d.queue().wait(d.timeline_signal, v - 1).exec(fill, [a, N, K], (N, 1, 1)).signal(d.timeline_signal, v) \
        .submit(d)
    d.timeline_value = v + 1
    return finish_and_read(d, a)


def finish_and_read(d: NVHCQDevice, buf: Any) -> np.ndarray:
    """Wait for the timeline, then the N int64 values of `buf`; raises DeviceFault if the GPU faulted."""
    d.synchronize(timeout_s=TIMEOUT_S)
    out = np.empty(N, np.int64)
    d.allocator.copyout(memoryview(out), buf)
    d.check_fault()
    return out


def launch_with(monkeypatch: pytest.MonkeyPatch, **override: Any) -> None:
    """The driver's QMD.launch with some arguments replaced (the mutation)."""
    real = QMD.launch

    def mutated(self: QMD, **kw: Any) -> QMD:
        kw.update(override)
        return real(self, **kw)

    monkeypatch.setattr(QMD, "launch", mutated)


# ----------------------------------------------------------------------------- QMD against the image
def test_unmutated_driver_runs_the_annotated_image(dev: NVHCQDevice, mock: MockNV) -> None:
    np.testing.assert_array_equal(run_fill(dev), EXPECTED)
    assert not mock.gpu.faults


def test_registers_below_the_image_need_fault(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    launch_with(monkeypatch, registers=1)
    with pytest.raises(DeviceFault, match=r"REGISTER_COUNT(_V)? = 1, but kernel fill needs "
                                          rf"{cubin.PTX_ONLY_REGISTERS} registers"):
        run_fill(dev)


def test_registers_above_the_hardware_limit_fault(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    launch_with(monkeypatch, registers=300)  # fits the 9-bit field, not an SM thread
    with pytest.raises(DeviceFault, match=r"REGISTER_COUNT(_V)? = 300.*allows 1\.\.255"):
        run_fill(dev)


def test_shared_memory_without_the_static_size_faults(dev: NVHCQDevice,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    launch_with(monkeypatch, shared_bytes=0)  # the image's .nv.shared.fill ignored
    need = 0x400 + STATIC_SHARED
    with pytest.raises(DeviceFault, match=rf"SHARED_MEMORY_SIZE = 0x400, but kernel fill needs {need:#x} "
                                          rf"\(the reserved 0x400 \+ {STATIC_SHARED:#x} bytes"):
        run_fill(dev)


def test_shared_memory_without_the_reserved_kib_faults(dev: NVHCQDevice,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qmd_module, "shared_memory_size", lambda static: static)  # forgets the reserved KiB
    with pytest.raises(DeviceFault, match=rf"SHARED_MEMORY_SIZE = {STATIC_SHARED:#x}, but kernel fill needs"):
        run_fill(dev)


def test_local_memory_below_the_stack_faults(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    launch_with(monkeypatch, local_bytes_per_thread=0)
    with pytest.raises(DeviceFault, match=r"SHADER_LOCAL_MEMORY_HIGH_SIZE = 0x0 .*needs 0x240 bytes"):
        run_fill(dev)


def test_barriers_below_the_image_need_fault(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    launch_with(monkeypatch, barriers=0)
    with pytest.raises(DeviceFault, match=r"BARRIER_COUNT = 0, but kernel fill uses 1 barriers"):
        run_fill(dev)


@pytest.mark.xfail(strict=True, reason="the driver writes BARRIER_COUNT = 1 whatever EIATTR_NUM_BARRIERS "
                                       "says (cubin.ProgramInfo has no barrier count)")
def test_driver_follows_the_image_barrier_count(dev: NVHCQDevice) -> None:
    img = annotated_image(dev.arch, barriers=False)
    f = elf.ElfFile.parse(img)
    e_flags = struct.unpack_from("<I", img, 48)[0]
    four = struct.pack("<BBH", 0x02, 0x4C, 4)  # a kernel using bar.sync 0..3
    sections = [cubin.Section(s.name, s.type, s.flags, s.data + (four if s.name == ".nv.info.fill" else b""),
                              max(s.align, 1), nobits_size=s.size if s.type == elf.SHT_NOBITS else 0)
                for s in f.sections[1:] if s.name != ".shstrtab"]
    np.testing.assert_array_equal(run_fill(dev, cubin.write_elf(sections, elf_flags=e_flags)), EXPECTED)


def test_prefetch_address_must_follow_the_program(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    real = QMD.program

    def off_by_a_page(self: QMD, address: Any, code_bytes: int) -> QMD:
        real(self, address, code_bytes)
        lower = "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED"
        return self.set(lower, int(self.get(lower)) + 0x10)

    monkeypatch.setattr(QMD, "program", off_by_a_page)
    with pytest.raises(DeviceFault, match=r"PROGRAM_PREFETCH_ADDR_\*_SHIFTED = .*but PROGRAM_ADDRESS >> 8"):
        run_fill(dev)


# ----------------------------------------------------------------------------- ordering (asynchronous engine)
def no_release_wfi(self: _NVQueue, address: Any, value: Any, *, timestamp: bool) -> None:
    """_NVQueue._release without RELEASE_WFI (the mutation)."""
    ex = pbuf.SemExecute(pbuf.SemOp.RELEASE, payload_64bit=True, release_wfi=False,
                         release_timestamp=timestamp)
    self._host_sem(address, value, ex)


def run_fill_then_host_signal(d: NVHCQDevice) -> np.ndarray:
    """fill(a) then, after an acquire that breaks the QMD chain, the timeline signal as a host release."""
    fill = d.program("fill", annotated_image(d.arch))
    a = d.allocator.alloc(8 * N)
    ready = d.new_signal(1)
    v = d.timeline_value
    q = d.queue().wait(d.timeline_signal, v - 1).exec(fill, [a, N, K], (N, 1, 1))
    q.wait(ready, 1).signal(d.timeline_signal, v).submit(d)
    d.timeline_value = v + 1
    d.synchronize(timeout_s=TIMEOUT_S)
    out = np.empty(N, np.int64)
    d.allocator.copyout(memoryview(out), a)  # the copy engine waits for the timeline, then reads a
    return out


def test_release_after_wfi_sees_the_kernel(dev: NVHCQDevice, mock: MockNV) -> None:
    np.testing.assert_array_equal(run_fill_then_host_signal(dev), EXPECTED)
    dev.check_fault()
    assert not mock.gpu.faults


def test_release_without_wfi_fires_before_the_kernel(dev: NVHCQDevice, mock: MockNV,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    dev.program("fill", annotated_image(dev.arch))  # (loaded through the unbroken driver)
    monkeypatch.setattr(_NVQueue, "_release", no_release_wfi)
    out = run_fill_then_host_signal(dev)
    # the timeline release did not wait for fill: the copy engine read a before fill wrote it
    assert not np.array_equal(out, EXPECTED)
    deadline = time.monotonic() + 4 * mock.gpu.idle_complete_s
    while not mock.gpu.faults and time.monotonic() < deadline:  # fill completes once the channel is quiet
        time.sleep(0.02)
    assert mock.gpu.faults, "the mock did not report the copy that raced the in-flight kernel"
    msg = str(mock.gpu.faults[0])
    assert "unordered access: the copy engine" in msg and "read" in msg and "kernel fill" in msg, msg
    assert "without RELEASE_WFI" in msg, msg


def fill_wait_add1(dev: NVHCQDevice) -> np.ndarray:
    """fill(a); an acquire (breaking the QMD chain); add1(b, a): the second launch needs the first done."""
    lib = cubin.ptx_only_image(KERNELS.format(arch=dev.arch), dev.arch)
    fill, add1 = dev.program("fill", lib), dev.program("add1", lib)
    a, b = dev.allocator.alloc(8 * N), dev.allocator.alloc(8 * N)
    ready = dev.new_signal(1)
    v = dev.timeline_value
    q = dev.queue().wait(dev.timeline_signal, v - 1).exec(fill, [a, N, K], (N, 1, 1)).wait(ready, 1)
    q.exec(add1, [b, a, N], (N, 1, 1)).signal(dev.timeline_signal, v).submit(dev)  # add1 reads fill's a
    dev.timeline_value = v + 1
    return finish_and_read(dev, b)


def test_launches_after_a_wait_are_ordered(dev: NVHCQDevice, mock: MockNV) -> None:
    np.testing.assert_array_equal(fill_wait_add1(dev), EXPECTED + 1)
    assert not mock.gpu.faults


def test_launches_without_wfi_between_them_fault(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _NVQueue._method

    def drop_wfi(self: _NVQueue, subch: int, method: int, *data: Any) -> int:
        if subch == pbuf.SUBCH_HOST and method == pbuf.NVC56F_WFI:
            return len(self._words)  # the WFI between two launches is not emitted
        return real(self, subch, method, *data)

    monkeypatch.setattr(_NVQueue, "_method", drop_wfi)
    with pytest.raises(DeviceFault, match=r"unordered overlapping writes: kernel fill .* and kernel add1 .* "
                                          r"the first writes what the second reads"):
        fill_wait_add1(dev)


# ----------------------------------------------------------------------------- swapped release words
def host_release_value(d: NVHCQDevice) -> int:
    sig = d.new_signal(0)
    d.queue().signal(sig, PAYLOAD).submit(d)  # no kernel before it: a host SEM release
    sig.wait(1, timeout_s=TIMEOUT_S, check=d.check_fault)
    return sig.value


def qmd_release_value(d: NVHCQDevice) -> int:
    fill = d.program("fill", annotated_image(d.arch))
    a = d.allocator.alloc(8 * N)
    sig = d.new_signal(0)
    v = d.timeline_value
    q = d.queue().wait(d.timeline_signal, v - 1).exec(fill, [a, N, K], (N, 1, 1))
    q.signal(sig, PAYLOAD).signal(d.timeline_signal, v).submit(d)  # both folded into the QMD's releases
    d.timeline_value = v + 1
    d.synchronize(timeout_s=TIMEOUT_S)
    d.check_fault()
    return sig.value


@pytest.mark.parametrize("via", [host_release_value, qmd_release_value], ids=["host", "qmd"])
def test_release_words_land_in_place(dev: NVHCQDevice, via: Any) -> None:
    assert via(dev) == PAYLOAD


def swapped_host_sem(payload_words: bool) -> Any:
    def _host_sem(self: _NVQueue, address: Any, payload: Any, execute: pbuf.SemExecute) -> None:
        addr = (_hi32(address), _lo32(address)) if not payload_words else (_lo32(address), _hi32(address))
        pay = (_hi32(payload), _lo32(payload)) if payload_words else (_lo32(payload), _hi32(payload))
        self._method(pbuf.SUBCH_HOST, pbuf.NVC56F_SEM_ADDR_LO, *addr, *pay, execute.encode())
    return _host_sem


def swapped_qmd_release(layout: type[QMD], payload_words: bool) -> Any:
    def _set_release(self: QMD, i: int, address: Any, payload: Any) -> None:
        if layout is QMDV04:
            names = {k: f"RELEASE_SEMAPHORE{i}_{k}" for k in ("ADDR_LOWER", "ADDR_UPPER", "PAYLOAD_LOWER",
                                                              "PAYLOAD_UPPER")}
            self.set(f"RELEASE_ENABLE{i}", 1).set(f"RELEASE_STRUCTURE_SIZE{i}", 0)
            self.set(f"RELEASE_MEMBAR_TYPE{i}", 1).set(f"RELEASE_PAYLOAD64B{i}", 1)
        else:
            names = {"ADDR_LOWER": f"RELEASE{i}_ADDRESS_LOWER", "ADDR_UPPER": f"RELEASE{i}_ADDRESS_UPPER",
                     "PAYLOAD_LOWER": f"RELEASE{i}_PAYLOAD_LOWER",
                     "PAYLOAD_UPPER": f"RELEASE{i}_PAYLOAD_UPPER"}
            self.set(f"RELEASE{i}_ENABLE", 1).set(f"RELEASE{i}_PAYLOAD64B", 1)
            self.set(f"RELEASE{i}_STRUCTURE_SIZE", 0)
        lo, hi = ("PAYLOAD_LOWER", "PAYLOAD_UPPER") if payload_words else ("ADDR_LOWER", "ADDR_UPPER")
        other = ("ADDR_LOWER", "ADDR_UPPER") if payload_words else ("PAYLOAD_LOWER", "PAYLOAD_UPPER")
        self._set_split(names[hi], names[lo], payload if payload_words else address)  # the swap
        self._set_split(names[other[0]], names[other[1]], address if payload_words else payload)
    return _set_release


def test_swapped_host_payload_words_are_read_back_wrong(dev: NVHCQDevice,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_NVQueue, "_host_sem", swapped_host_sem(payload_words=True))
    assert host_release_value(dev) == SWAPPED  # test_release_words_land_in_place[host] fails on this driver


def test_swapped_qmd_payload_words_are_read_back_wrong(dev: NVHCQDevice,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev.qmd_class, "_set_release", swapped_qmd_release(dev.qmd_class, payload_words=True))
    assert qmd_release_value(dev) == SWAPPED  # test_release_words_land_in_place[qmd] fails on this driver


def test_swapped_host_address_words_fault(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_NVQueue, "_host_sem", swapped_host_sem(payload_words=False))
    with pytest.raises(DeviceFault, match=r"SEM_ADDR_HI .* exceeds the \d+-bit field|MMU_FAULT"):
        host_release_value(dev)


def test_swapped_qmd_address_words_fault(dev: NVHCQDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    swapped = swapped_qmd_release(dev.qmd_class, payload_words=False)
    monkeypatch.setattr(dev.qmd_class, "_set_release", swapped)
    # where the low address word does not fit the upper field (8 bits in V03, 25 in V04) the driver's own
    # range check refuses it; where it fits, the mock faults on the unmapped address at launch
    with pytest.raises((DeviceFault, ValueError), match="MMU_FAULT|does not fit"):
        qmd_release_value(dev)


def test_an_approximation_out_of_its_range_is_a_warning(dev: NVHCQDevice,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # the interpreter notes sin/cos.approx outside the ISA's bounded range in PTXModule.warnings; the mock
    # GPU must surface each new note (the GPU path used to drop them)
    from rawgrad.drivers.nv.mock import gpu as mock_gpu
    from rawgrad.drivers.nv.mock import ptx_interp
    real = ptx_interp.PTXModule.launch

    def noting(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        self.warnings.append("line 9: sin.approx.f32 of 1e+06 is outside [-100pi, 100pi]")

    monkeypatch.setattr(ptx_interp.PTXModule, "launch", noting)
    with pytest.warns(mock_gpu.ApproximationOutOfRange, match=r"kernel fill: line 9: sin\.approx"):
        np.testing.assert_array_equal(run_fill(dev), EXPECTED)
