"""PM4 builders and the command-processor model: real kernels (rendered by the AMDGPU renderer, compiled by
AMDGPUCompiler, loaded by rawgrad's loader) are launched through packet streams the builders wrote, executed
by the CP model on the RDNA3 interpreter and compared with numpy; an IB is replayed with a patched kernarg
word; and every dispatch mistake the validator exists for is reported as a fault naming the field."""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.amdgpu_code import AMDCodeObject, load_code_object
from rawgrad.compiler.renderer.amdgpu import AMDGPURenderer
from rawgrad.compiler.toolchain import AMDGPUCompiler
from rawgrad.drivers.amd import pm4, regs
from rawgrad.drivers.amd.mock.cp import (
    CommandProcessor,
    CPUnsupported,
    FakeClock,
    GPUFault,
    GPUHang,
    PM4Queue,
    SignalTimeout,
)
from rawgrad.drivers.amd.mock.rdna3.interp import MemoryMap
from rawgrad.drivers.amd.regs import GFX11, GFX943, CompareFunc, DataSel, IntSel, PM4Op
from rawgrad.tensor.buffers import buffer_numpy
from rawgrad.tensor.schedule import create_schedule

RING, RING_BYTES = 0x1000_0000, 4096
CODE = 0x2000_0000
KERNARG = 0x3000_0000
SIGNALS = 0x4000_0000  # a page of 16-byte signal slots: value u64, timestamp u64
BUFS, GAP = 0x5000_0000, 0x100_0000
IB = 0x6000_0000
N = 100  # elements: not a multiple of the wave (32) nor of the local size


@dataclass
class Kernel:
    co: AMDCodeObject
    inputs: list[np.ndarray]  # buffer slots 1.. (slot 0 is the output)
    out: np.ndarray  # a zeroed array of the output's dtype and size
    scalars: list[int]  # the kernel's i64 scalar arguments after the buffer pointers
    grid: tuple[int, int, int]
    local: tuple[int, int, int]


def _compile(arch: str, make: Callable[[], Tensor]) -> Kernel:
    """The one kernel `make()` schedules, rendered and compiled for `arch` and loaded by rawgrad's loader."""
    items, _ = create_schedule([make().uop])
    kernels = [si for si in items if si.ast is not None]
    assert len(kernels) == 1, [si.name for si in kernels]
    si = kernels[0]
    r = AMDGPURenderer(arch)
    prog = r.lower(si.ast, "k")
    co = load_code_object(AMDGPUCompiler(arch, cache_dir="").compile(r.render(prog)), arch, kernel="k")
    assert isinstance(prog.global_size, int)
    local = prog.launch.local_size
    out = np.zeros_like(buffer_numpy(si.bufs[0]))
    return Kernel(co, [buffer_numpy(b).copy() for b in si.bufs[1:]], out,
                  [int(si.var_vals[v]) for v in prog.variables],
                  (-(-prog.global_size // local[0]), 1, 1), local)


A = np.linspace(-3, 5, N, dtype=np.float32)
B = np.arange(N, dtype=np.float32) * 0.25
R = np.random.default_rng(0).standard_normal((4, 4096)).astype(np.float32)


@pytest.fixture(scope="module")
def axpy() -> Kernel:
    return _compile("gfx1100", lambda: Tensor(A).realize() * 2 + Tensor(B).realize())


@pytest.fixture(scope="module")
def rowsum() -> Kernel:
    return _compile("gfx1100", lambda: Tensor(R).realize().sum(1))


class Rig:
    """A mock GPU: memory, the CP model, one PM4 queue, a kernel loaded, its buffers and kernarg segment."""

    def __init__(self, k: Kernel, *, arch: str = "gfx1100", execute: bool = True, kernarg_bytes: int = 0,
                 clock: Callable[[], int] | None = None) -> None:
        self.k, self.mem = k, MemoryMap()
        self.fam = regs.family(arch)
        self.cp = CommandProcessor(self.mem, arch, execute=execute, clock=clock)
        self.mem.map(RING, RING_BYTES)
        self.mem.map(RING + 2 * RING_BYTES, 8)  # rptr word
        self.q: PM4Queue = self.cp.pm4_queue(RING, RING_BYTES, rptr_va=RING + 2 * RING_BYTES)
        self.kernel = self.cp.load_code_object(k.co, CODE)
        self.signals = self.mem.map(SIGNALS, 4096)
        self.out = self.mem.map(BUFS, k.out)
        self.ins = [self.mem.map(BUFS + (i + 1) * GAP, a) for i, a in enumerate(k.inputs)]
        words = [BUFS + i * GAP for i in range(1 + len(k.inputs))] + k.scalars
        segment = struct.pack(f"<{len(words)}q", *words)
        self.kernarg = self.mem.map(KERNARG, kernarg_bytes or max(len(segment), 16))
        n = min(len(segment), self.kernarg.size)
        self.kernarg[:n] = np.frombuffer(segment, np.uint8)[:n]

    def dispatch(self, **kw: Any) -> pm4.DispatchPackets:
        return pm4.encode_dispatch(self.k.co, CODE, KERNARG, self.k.grid, self.k.local, fam=self.fam, **kw)

    def submit(self, words: list[int]) -> None:
        """Write `words` into the ring at the write pointer (wrapping) and ring the doorbell."""
        data = np.array(words, np.uint32).view(np.uint8)
        ring = self.mem.load(np.array([RING], np.uint64), RING_BYTES)[0].copy()
        start = self.q.wptr * 4 % RING_BYTES
        idx = (start + np.arange(data.size)) % RING_BYTES
        ring[idx] = data
        self.mem.store(np.array([RING], np.uint64), ring[None, :])
        self.q.doorbell(self.q.wptr + len(words))

    def signal_value(self, slot: int) -> int:
        return int(self.signals[16 * slot:16 * slot + 8].view(np.uint64)[0])

    def stamp(self, slot: int) -> int:
        return int(self.signals[16 * slot + 8:16 * slot + 16].view(np.uint64)[0])

    def result(self) -> np.ndarray:
        return self.out.view(self.k.out.dtype)[:self.k.out.size]


def sig(slot: int) -> int:
    return SIGNALS + 16 * slot


# ------------------------------------------------------------------------------------------- builders
def test_headers_and_fields_match_the_linux_headers() -> None:
    # PACKET3(op, n) = 3 << 30 | op << 8 | n << 16 (nvd.h), n = payload dwords - 1
    assert pm4.header(PM4Op.SET_SH_REG, 3) == 0xC0027600
    assert pm4.header(PM4Op.DISPATCH_DIRECT, 4) == 0xC0031500
    assert pm4.nop(1) == [0xC0FF1000 | (0x3FFF << 16) & 0xFFFFFFFF]  # header-only NOP, count 0x3FFF
    assert pm4.nop(1) == [0xFFFF1000]
    assert pm4.nop(3) == [0xC0011000, 0, 0]
    assert pm4.set_sh_reg(regs.COMPUTE_PGM_LO, 1, 2) == [0xC0027600, 0x20C, 1, 2]
    # the SH registers the facts give (section 1.4), relative to 0x2C00; RSRC3 differs per family
    assert (GFX11.compute_pgm_rsrc3, GFX943.compute_pgm_rsrc3) == (0x2C00 + 0x228, 0x2C00 + 0x22D)
    rm = pm4.release_mem(GFX11, addr=0x1234_5678_9ABC, data_sel=regs.DataSel.VALUE32, value=7)
    assert len(rm) == 8 and rm[0] == 0xC0064900
    assert rm[1] == 0x14 | 5 << 8 | 1 << 12 | 1 << 13 | 1 << 14 | 1 << 15 | 1 << 20 | 1 << 21 | 1 << 22
    assert rm[2] == 1 << 29 and rm[3:6] == [0x5678_9ABC, 0x1234, 7]
    w = pm4.wait_reg_mem(0x1000, 5)
    assert w == [0xC0053C00, 5 | 1 << 4, 0x1000, 0, 5, 0xFFFFFFFF, 4]
    assert pm4.indirect_buffer(0x2000, 17) == [0xC0023F00, 0x2000, 0, 17 | 1 << 23]
    assert len(pm4.acquire_mem(GFX11)) == 8 and pm4.acquire_mem(GFX11)[-1] == 0xC3F1
    assert len(pm4.acquire_mem(GFX943)) == 7 and pm4.acquire_mem(GFX943)[1] == (1 << 29 | 1 << 27 | 1 << 23
                                                                                | 1 << 22 | 1 << 18)
    assert pm4.event_write(regs.CS_PARTIAL_FLUSH, 4) == [0xC0004600, 0x407]


def test_builders_refuse_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="32 bits"):
        pm4.wait_reg_mem(0x1000, 1 << 32)  # AMD compares 32 bits: a 64-bit timeline value cannot be waited
    with pytest.raises(ValueError, match="aligned"):
        pm4.wait_reg_mem(0x1002, 1)
    with pytest.raises(ValueError, match="aligned"):
        pm4.release_mem(GFX11, addr=0x1004, data_sel=regs.DataSel.VALUE64, value=1)
    with pytest.raises(ValueError, match="INDIRECT_BUFFER of"):
        pm4.indirect_buffer(0x1000, 1 << 20)
    with pytest.raises(ValueError, match="outside the SH range"):
        pm4.set_sh_reg(0x2000, 1)
    with pytest.raises(ValueError, match="does not fit"):
        pm4.set_sh_reg(regs.COMPUTE_PGM_LO, 1 << 32)


def test_encode_dispatch_takes_everything_from_the_descriptor(axpy: Kernel) -> None:
    co, kd = axpy.co, axpy.co.descriptor
    d = pm4.encode_dispatch(co, CODE, KERNARG, axpy.grid, axpy.local)
    w = d.words
    code = CODE + co.entry_offset
    assert w[d.patch["pgm_lo"]] == (code >> 8) & 0xFFFFFFFF and w[d.patch["pgm_lo"] + 1] == code >> 40
    assert w[d.patch["rsrc1"]] == kd.compute_pgm_rsrc1
    assert w[d.patch["rsrc2"]] == kd.compute_pgm_rsrc2  # no LDS: nothing ORed in
    assert w[d.patch["rsrc3"]] == kd.compute_pgm_rsrc3
    assert (w[d.kernarg_lo], w[d.kernarg_lo + 1]) == (KERNARG & 0xFFFFFFFF, KERNARG >> 32)
    assert w[d.kernarg_lo - 1] == regs.COMPUTE_USER_DATA_0 - regs.SET_SH_REG_START  # s0:s1
    assert [w[i] for i in d.local] == list(axpy.local) and [w[i] for i in d.grid] == list(axpy.grid)
    assert w[d.patch["initiator"]] & regs.INITIATOR_CS_W32_EN  # wave32 kernel
    with pytest.raises(ValueError, match="max_flat_workgroup_size"):
        pm4.encode_dispatch(co, CODE, KERNARG, (1, 1, 1), (co.metadata.max_flat_workgroup_size + 1, 1, 1))
    with pytest.raises(ValueError, match="kernarg address"):
        pm4.encode_dispatch(co, CODE, KERNARG + 8, (1, 1, 1), axpy.local)
    with pytest.raises(ValueError, match="code address"):
        pm4.encode_dispatch(co, CODE + 64, KERNARG, (1, 1, 1), axpy.local)


def test_encode_dispatch_allocates_the_descriptors_lds(rowsum: Kernel) -> None:
    kd = rowsum.co.descriptor
    assert kd.group_segment_fixed_size > 0
    d = pm4.encode_dispatch(rowsum.co, CODE, KERNARG, rowsum.grid, rowsum.local)
    granules = (d.words[d.patch["rsrc2"]] >> regs.RSRC2_LDS_SIZE_SHIFT) & regs.RSRC2_LDS_SIZE_MASK
    assert granules * regs.LDS_GRANULE_BYTES >= kd.group_segment_fixed_size > (granules - 1) * 512


# ------------------------------------------------------------------------------------------- execution
def test_dispatch_signal_and_timestamps_match_numpy(axpy: Kernel) -> None:
    rig = Rig(axpy)
    words = pm4.timestamp(GFX11, sig(0) + 8) + rig.dispatch().words + pm4.timestamp(GFX11, sig(1) + 8)
    words += pm4.signal(GFX11, sig(1), 1, interrupt_ctxid=42)
    rig.submit(words)
    assert rig.cp.wait_signal(sig(1), 1) == 1
    np.testing.assert_array_equal(rig.result(), A * 2 + B)
    assert rig.signal_value(1) == 1
    assert rig.stamp(1) > rig.stamp(0) > 0  # 10-ns ticks around the kernel
    rec = rig.cp.dispatches[-1]
    assert rec.executed and rec.grid == axpy.grid and rec.local == axpy.local
    assert rig.stamp(0) < rec.start_ticks < rec.end_ticks < rig.stamp(1)
    assert rig.cp.interrupts == [(rig.q.name, 42)]
    assert rig.q.idle and rig.q.rptr == len(words)
    assert int(rig.mem.read(RING + 2 * RING_BYTES, np.uint64, 1)[0]) == len(words)  # rptr written back


def test_lds_kernel_runs_through_the_cp(rowsum: Kernel) -> None:
    rig = Rig(rowsum)
    rig.submit(rig.dispatch().words + pm4.signal(GFX11, sig(0), 1))
    rig.cp.wait_signal(sig(0), 1)
    np.testing.assert_allclose(rig.result(), R.sum(1), rtol=1e-5)


def test_ring_wraps_with_nop_padding(axpy: Kernel) -> None:
    rig = Rig(axpy)
    one = rig.dispatch().words + pm4.signal(GFX11, sig(0), 0)
    n = 0
    while rig.q.wptr + len(one) < 3 * RING_BYTES // 4:  # enough launches to go round the 1024-dword ring
        n += 1
        rig.submit(one[:-3] + [n] + one[-2:])
    for pad in (1, 2, 7):
        rig.submit(pm4.nop(pad))
    rig.submit(one[:-3] + [n + 1] + one[-2:])
    assert rig.cp.wait_signal(sig(0), n + 1) == n + 1
    assert rig.q.wptr * 4 > RING_BYTES  # the last launch straddled or followed the wrap
    np.testing.assert_array_equal(rig.result(), A * 2 + B)


def test_ib_replayed_twice_with_a_patched_kernarg_word(axpy: Kernel) -> None:
    rig = Rig(axpy)
    b2 = np.full(N, 100, np.float32)
    rig.mem.map(BUFS + 5 * GAP, b2)
    ib = rig.dispatch().words + pm4.signal(GFX11, sig(0), 1)
    value_at = len(ib) - 3  # RELEASE_MEM data lo: the patch point for the signal value
    ib_mem = rig.mem.map(IB, 4 * len(ib)).view(np.uint32)
    ib_mem[:] = ib
    rig.submit(pm4.indirect_buffer(IB, len(ib)))
    assert rig.cp.wait_signal(sig(0), 1) == 1
    np.testing.assert_array_equal(rig.result(), A * 2 + B)
    # patch: the third kernarg word (input b) points at b2, and the signal value becomes 2; same IB
    rig.kernarg.view(np.uint64)[2] = BUFS + 5 * GAP
    ib_mem[value_at] = 2
    rig.submit(pm4.indirect_buffer(IB, len(ib)))
    assert rig.cp.wait_signal(sig(0), 2) == 2
    np.testing.assert_array_equal(rig.result(), A * 2 + b2)
    assert [d.kernarg_va for d in rig.cp.dispatches] == [KERNARG, KERNARG]


def test_wait_reg_mem_blocks_until_the_host_kicks(axpy: Kernel) -> None:
    rig = Rig(axpy)
    rig.submit(pm4.wait_reg_mem(sig(2), 1) + rig.dispatch().words + pm4.signal(GFX11, sig(0), 1))
    assert not rig.q.idle and rig.q.blocked is not None and "WAIT_REG_MEM" in rig.q.blocked
    assert rig.cp.dispatches == [] and (rig.result() == 0).all()
    with pytest.raises(GPUHang, match=r"WAIT_REG_MEM on memory 0x40000020: \(value 0 & 0xffffffff\) >= 1"):
        rig.cp.drain()
    rig.signals.view(np.uint32)[8] = 1  # the host's kick
    assert rig.cp.wait_signal(sig(0), 1) == 1
    np.testing.assert_array_equal(rig.result(), A * 2 + B)


def test_wait_compares_32_bits(axpy: Kernel) -> None:
    rig = Rig(axpy, execute=False)
    rig.signals.view(np.uint64)[4] = (1 << 32) | 5  # a 64-bit value whose low word is 5
    rig.submit(pm4.wait_reg_mem(sig(2), 6, CompareFunc.GE) + pm4.signal(GFX11, sig(0), 1))
    assert rig.q.blocked is not None  # the high word does not count
    rig.submit([])
    rig.signals.view(np.uint32)[8] = 6
    assert rig.cp.wait_signal(sig(0), 1) == 1


def test_hdp_flush_handshake_and_register_waits(axpy: Kernel) -> None:
    rig = Rig(axpy, execute=False)
    req, done = 0x1234, 0x1235  # stand-in NBIO registers: the model's flush completes at once
    rig.submit(pm4.hdp_flush(req, done, 1 << 2) + pm4.signal(GFX11, sig(0), 1))
    assert rig.cp.wait_signal(sig(0), 1) == 1
    assert rig.cp.regs[req] == 4 and rig.cp.regs[done] & 4
    w = pm4.hdp_flush(req, done, 1)
    w[1] &= ~(3 << regs.WAIT_REG_MEM_OPERATION_SHIFT)  # operation 0: only poll the register in dword 2
    w[2] = 0x999
    rig.submit(w)
    with pytest.raises(GPUHang, match="WAIT_REG_MEM on register 0x999 = 0x0"):
        rig.cp.drain()


def test_release_mem_64_bit_value_and_interrupt_hook(axpy: Kernel) -> None:
    rig = Rig(axpy, execute=False)
    seen: list[tuple[str, int]] = []
    rig.cp.on_interrupt = lambda q, ctx: seen.append((q, ctx))
    value = (7 << 32) | 9
    rig.submit(pm4.release_mem(GFX11, addr=sig(1), data_sel=DataSel.VALUE64, value=value,
                               int_sel=IntSel.INTERRUPT_AFTER_WRITE, ctxid=5))
    rig.cp.drain()
    assert rig.signal_value(1) == value and seen == [(rig.q.name, 5)]
    words = pm4.release_mem(GFX11, addr=sig(1), data_sel=DataSel.VALUE64, value=1)
    words[3] += 4  # a 64-bit write to a 4-byte aligned address
    assert _fault(rig, words).field == "RELEASE_MEM address"


def test_nested_ibs_and_the_depth_limit(axpy: Kernel) -> None:
    rig = Rig(axpy, execute=False)
    ib2 = pm4.signal(GFX11, sig(0), 3)
    ib1 = pm4.indirect_buffer(IB + 0x100, len(ib2)) + pm4.signal(GFX11, sig(1), 4)
    mem = rig.mem.map(IB, 0x200).view(np.uint32)
    mem[:len(ib1)] = ib1
    mem[0x40:0x40 + len(ib2)] = ib2
    rig.submit(pm4.indirect_buffer(IB, len(ib1)))
    assert rig.cp.wait_signal(sig(1), 4) == 4 and rig.signal_value(0) == 3
    mem[:4] = pm4.indirect_buffer(IB, 4)  # an IB that calls itself
    e = _fault(rig, pm4.indirect_buffer(IB, 4))
    assert e.field == "INDIRECT_BUFFER" and "nested deeper than 2" in str(e) and "IB2 at 0x60000000" in str(e)


def test_fake_clock_ticks_are_10ns_and_strictly_increase() -> None:
    ns = iter([1000, 1005, 2000, 2000])
    clock = FakeClock(lambda: next(ns))
    assert [clock(), clock(), clock(), clock()] == [100, 101, 200, 201]


# ------------------------------------------------------------------------------------------- validator
def _fault(rig: Rig, words: list[int], exc: type[GPUFault] = GPUFault) -> GPUFault:
    with pytest.raises(exc) as e:
        rig.submit(words)
    assert rig.q.fault is e.value  # the queue halts
    with pytest.raises(GPUFault, match="halted"):
        rig.submit(pm4.nop(1))
    return e.value


def _patched(d: pm4.DispatchPackets, key: str, fn: Callable[[int], int]) -> list[int]:
    w = list(d.words)
    w[d.patch[key]] = fn(w[d.patch[key]])
    return w


def test_wrong_rsrc2_is_reported_with_the_field(axpy: Kernel) -> None:
    rig = Rig(axpy)
    kd = axpy.co.descriptor
    # USER_SGPR_COUNT 2 instead of the descriptor's 14/15: the workgroup id would land in s2 (facts 1.8)
    words = _patched(rig.dispatch(), "rsrc2", lambda r: (r & ~0x3E) | (2 << 1))
    e = _fault(rig, words)
    assert e.field == "COMPUTE_PGM_RSRC2"
    assert f"USER_SGPR_COUNT 2 vs {kd.user_sgpr_count}" in str(e) and "pm4 queue 0 ring dword" in str(e)
    assert (rig.result() == 0).all()  # nothing was computed


def test_wrong_rsrc1_rsrc3_and_wave_flag_are_reported(axpy: Kernel) -> None:
    for key, fn, field in (("rsrc1", lambda r: r ^ 1, "COMPUTE_PGM_RSRC1"),
                           ("rsrc3", lambda r: r ^ 4, "COMPUTE_PGM_RSRC3"),
                           ("initiator", lambda r: r & ~regs.INITIATOR_CS_W32_EN,
                            "DISPATCH_INITIATOR.CS_W32_EN")):
        rig = Rig(axpy)
        assert _fault(rig, _patched(rig.dispatch(), key, fn)).field == field
    rig = Rig(axpy)  # the PRIV bit (tinygrad's gfx11 CWSR workaround) is tolerated
    words = _patched(rig.dispatch(), "rsrc1", lambda r: r | regs.RSRC1_PRIV)
    rig.submit(words + pm4.signal(GFX11, sig(0), 1))
    assert rig.cp.wait_signal(sig(0), 1) == 1


def test_lds_below_the_descriptors_is_reported(rowsum: Kernel) -> None:
    rig = Rig(rowsum)
    e = _fault(rig, _patched(rig.dispatch(), "rsrc2", lambda r: r & ~(regs.RSRC2_LDS_SIZE_MASK << 15)))
    assert e.field == "COMPUTE_PGM_RSRC2.LDS_SIZE"
    assert f"0 bytes of LDS allocated, the descriptor's group segment needs " \
           f"{rowsum.co.descriptor.group_segment_fixed_size}" in str(e)


def test_kernarg_segment_too_small_is_reported(axpy: Kernel) -> None:
    size = axpy.co.descriptor.kernarg_size
    rig = Rig(axpy, kernarg_bytes=16)  # the segment needs 8 * (3 buffers + 1 scalar) = 32 bytes
    assert size > 16
    e = _fault(rig, rig.dispatch().words + pm4.signal(GFX11, sig(0), 1))
    assert e.field == "COMPUTE_USER_DATA_0/1 (kernarg pointer)"
    assert f"does not map the {size}-byte kernarg segment" in str(e)


def test_unmapped_addresses_are_faults_not_silence(axpy: Kernel) -> None:
    rig = Rig(axpy)  # a signal to nowhere
    e = _fault(rig, rig.dispatch().words + pm4.signal(GFX11, 0x7000_0000, 1))
    assert e.field == "RELEASE_MEM address" and e.va == 0x7000_0000 and "not mapped" in str(e)
    rig = Rig(axpy)  # a kernel argument pointing at nothing: the kernel's store faults, reported by the CP
    rig.kernarg.view(np.uint64)[0] = 0x7000_0000
    e = _fault(rig, rig.dispatch().words)
    assert e.field == "kernel" and "0x70000000" in str(e) and "global_store" in str(e)
    rig = Rig(axpy)  # an IB outside memory
    assert _fault(rig, pm4.indirect_buffer(0x7000_0000, 8)).field == "INDIRECT_BUFFER range"


def test_missing_release_mem_makes_the_host_wait_time_out(axpy: Kernel) -> None:
    rig = Rig(axpy)
    rig.submit(rig.dispatch().words)  # the work, but no RELEASE_MEM for the host to wait on
    with pytest.raises(SignalTimeout) as e:
        rig.cp.wait_signal(sig(0), 1)
    msg = str(e.value)
    assert "signal at 0x40000000 holds 0, the host waits for >= 1" in msg
    assert "no RELEASE_MEM or FENCE has written it" in msg and "idle after" in msg
    np.testing.assert_array_equal(rig.result(), A * 2 + B)  # the kernel did run


def test_program_address_must_be_a_descriptors_entry(axpy: Kernel) -> None:
    rig = Rig(axpy)
    words = _patched(rig.dispatch(), "pgm_lo", lambda w: w + 1)  # 256 bytes into the code
    e = _fault(rig, words)
    assert e.field == "COMPUTE_PGM_LO/HI" and "is not the code entry of any kernel descriptor" in str(e)


def test_launch_above_max_workgroup_size_is_reported(axpy: Kernel) -> None:
    rig = Rig(axpy)
    d = rig.dispatch()
    w = list(d.words)
    w[d.local[0]] = axpy.co.metadata.max_flat_workgroup_size + 32  # what a driver bypassing the builder does
    e = _fault(rig, w)
    assert e.field == "COMPUTE_NUM_THREAD_X/Y/Z" and "max flat workgroup size" in str(e)


def test_unknown_packet_and_bad_ib_are_reported(axpy: Kernel) -> None:
    rig = Rig(axpy)
    e = _fault(rig, [pm4.header(0x42, 1), 0], CPUnsupported)  # PM4 opcode 0x42 (PFP_SYNC_ME)
    assert "PM4 opcode 0x42" in str(e)
    rig = Rig(axpy)
    rig.mem.map(IB, 64)
    e = _fault(rig, pm4.indirect_buffer(IB, 4)[:3] + [4])  # VALID bit clear
    assert e.field == "INDIRECT_BUFFER.VALID"


def test_gfx942_dispatch_is_validated_not_executed() -> None:
    k = _compile("gfx942", lambda: Tensor(A).realize() * 2 + Tensor(B).realize())
    assert not k.co.descriptor.wave32
    rig = Rig(k, arch="gfx942", execute=False)
    d = rig.dispatch()
    assert not d.words[d.patch["initiator"]] & regs.INITIATOR_CS_W32_EN
    rig.submit(d.words + pm4.signal(GFX943, sig(0), 1))
    assert rig.cp.wait_signal(sig(0), 1) == 1
    assert [(r.kernel, r.executed) for r in rig.cp.dispatches] == [("k", False)]
    assert (rig.result() == 0).all()  # validated, not run
    rig = Rig(k, arch="gfx942")
    e = _fault(rig, rig.dispatch().words, CPUnsupported)
    assert "gfx942 machine code is never executed" in str(e)
    rig = Rig(k, arch="gfx942", execute=False)
    assert _fault(rig, _patched(rig.dispatch(), "initiator", lambda r: r | regs.INITIATOR_CS_W32_EN)).field \
        == "DISPATCH_INITIATOR.CS_W32_EN"
    rig = Rig(k, arch="gfx942", execute=False)  # the gfx11 ACQUIRE_MEM layout is wrong on gfx9
    assert _fault(rig, pm4.acquire_mem(GFX11)).field == "ACQUIRE_MEM"
