"""Launch-level behaviour of the RDNA3 interpreter: where the workgroup id comes from, refusals of what it
cannot run, faults, denorm modes from rsrc1, barriers, and the exactness of its fused multiply-add."""
from __future__ import annotations

import dataclasses
import struct
from fractions import Fraction

import numpy as np
import pytest

from rawgrad.drivers.amd.mock.rdna3 import corpus
from rawgrad.drivers.amd.mock.rdna3 import decode as decode_mod
from rawgrad.drivers.amd.mock.rdna3.interp import (
    MemoryFault,
    MemoryMap,
    MockUnsupported,
    Program,
    RDNA3Fault,
    _fma32,
    run,
)
from rawgrad.drivers.amd.mock.rdna3.listing import S_NOP_0

A, O = 0x1_0000_0000, 0x2_0000_0000

def _wgid_program() -> Program:
    return corpus.program("wgid")


def _run_wgid(prog: Program, gx: int, gy: int) -> np.ndarray:
    mem = MemoryMap()
    out = mem.map(O, np.full(gx * gy, -1, np.int32))
    run(prog, mem, struct.pack("<Qi", O, gx), (gx, gy, 1), (32, 1, 1))
    return out.view(np.int32).reshape(gy, gx)


def test_workgroup_id_comes_from_user_sgpr_count() -> None:
    """LLVM pads the user SGPRs (USER_SGPR_COUNT 14 with X and Y ids), so the ids are read from s14/s15:
    the interpreter must place them after USER_SGPR_COUNT, not at s2 after the kernarg pointer."""
    prog = _wgid_program()
    assert prog.kd.user_sgpr_count == 14 and prog.kd.workgroup_id_enabled == (True, True, False)
    gx, gy = 5, 3
    want = np.add.outer(np.arange(gy) * 1000, np.arange(gx))
    np.testing.assert_array_equal(_run_wgid(prog, gx, gy), want)
    # the same code with a descriptor claiming 2 user SGPRs: the ids land in s2/s3, the code reads s14/s15
    # (zeros), so every workgroup writes group (0, 0)'s slot: the interpreter follows the descriptor
    moved = dataclasses.replace(prog.kd, compute_pgm_rsrc2=(prog.kd.compute_pgm_rsrc2 & ~0x3E) | (2 << 1))
    got = _run_wgid(Program(prog.image, prog.entry, moved, "wgid"), gx, gy)
    assert got[0, 0] == 0 and (got.reshape(-1)[1:] == -1).all()


def _patched(name: str, word: int) -> Program:
    """The corpus kernel with its first instruction's first dword replaced."""
    p = corpus.program(name)
    img = bytearray(p.image)
    struct.pack_into("<I", img, p.entry, word)
    return Program(bytes(img), p.entry, p.kd, name)


VOP1_UNKNOWN = 0x7E000000 | (0xFF << 9)  # VOP1 opcode 255: no LLVM mnemonic in the table


def test_unknown_opcode_raises_mock_unsupported() -> None:
    prog = _patched("divergent", VOP1_UNKNOWN)
    with pytest.raises(MockUnsupported, match=r"<VOP1 opcode 255>: not implemented .*no entry") as e:
        run(prog, MemoryMap(), bytes(20), (1, 1, 1), (64, 1, 1))
    assert e.value.mnemonic == "<VOP1 opcode 255>"
    assert isinstance(e.value, NotImplementedError)


def test_mnemonic_without_semantics_raises_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(decode_mod.OPTABLE, ("VOP1", 0xFF), "v_frobnicate_b32_e32")
    prog = _patched("divergent", VOP1_UNKNOWN)
    where = r"divergent: pc 0x0 v_frobnicate_b32_e32 .*"
    with pytest.raises(MockUnsupported, match=where + "v_frobnicate_b32_e32: not implemented") as e:
        run(prog, MemoryMap(), bytes(20), (1, 1, 1), (64, 1, 1))
    assert e.value.mnemonic == "v_frobnicate_b32_e32"


def test_lds_overrun_faults() -> None:
    """reduce_sum stores 64 floats to LDS; a descriptor granting 128 bytes makes lane 32's store fault."""
    p = corpus.program("reduce_sum")
    small = dataclasses.replace(p.kd, group_segment_fixed_size=128)
    mem = MemoryMap()
    mem.map(A, np.ones(64, np.float32))
    mem.map(O, 4)
    with pytest.raises(MemoryFault, match=r"ds_store_b32 .*LDS access of 4 bytes at 0x80: past the "
                                          r"workgroup's 128 bytes"):
        run(Program(p.image, p.entry, small, "reduce_sum"), mem, struct.pack("<2Qi", O, A, 64), (1, 1, 1),
            (64, 1, 1))


def test_runaway_loop_is_stopped() -> None:
    mem = MemoryMap()
    mem.map(A, np.ones((1, 4096), np.float32))
    mem.map(O, 4)
    with pytest.raises(RDNA3Fault, match="still running after 50 steps"):
        run(corpus.program("reduce_sum"), mem, struct.pack("<2Qi", O, A, 4096), (1, 1, 1), (64, 1, 1),
            max_steps=50)


def test_barrier_parks_both_waves() -> None:
    mem = MemoryMap()
    mem.map(A, np.arange(64, dtype=np.float32))
    out = mem.map(O, 4)
    stats = run(corpus.program("reduce_sum"), mem, struct.pack("<2Qi", O, A, 64), (1, 1, 1), (64, 1, 1),
                count=True)
    assert out.view(np.float32)[0] == np.float32(2016)
    assert stats.waves == 2 and stats.executed is not None
    # both waves reach each barrier at one pc, so every s_barrier step ran them together: 7 levels + 1
    assert stats.executed["s_barrier"] == 7


def _denorm_program(mode: int) -> Program:
    p = corpus.program("divergent")
    kd = dataclasses.replace(p.kd, compute_pgm_rsrc1=(p.kd.compute_pgm_rsrc1 & ~(3 << 16)) | (mode << 16))
    return Program(p.image, p.entry, kd, "divergent")


@pytest.mark.parametrize("mode,flushed", [(3, False), (0, True), (1, True)])
def test_f32_denorm_mode_from_rsrc1(mode: int, flushed: bool) -> None:
    """divergent computes -2 * a for a <= 0: a subnormal result survives only in FLOAT_DENORM_MODE 3."""
    a = np.array([-1e-39, -2e-40], np.float32)  # -2a stays subnormal (< 1.18e-38)
    mem = MemoryMap()
    mem.map(A, a)
    out = mem.map(O, 8)
    run(_denorm_program(mode), mem, struct.pack("<2Qi", O, A, 2), (1, 1, 1), (64, 1, 1))
    want = np.zeros(2, np.float32) if flushed else a * np.float32(-2)
    np.testing.assert_array_equal(out.view(np.float32), want)


def test_fma32_rounds_once() -> None:
    """Against exact rational arithmetic, including products whose float64 sum would double-round."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(2000).astype(np.float32)
    b = rng.standard_normal(2000).astype(np.float32)
    c = (rng.standard_normal(2000) * np.exp2(rng.integers(-30, 30, 2000))).astype(np.float32)
    # hard cases: a*b = 1 + 2^-24 + 2^-47 style sums land right next to a float32 rounding midpoint
    one_p = np.float32(1 + 2.0**-23)
    a = np.concatenate([a, [one_p, one_p, np.float32(1 + 2.0**-12)]]).astype(np.float32)
    b = np.concatenate([b, [one_p, np.float32(1 - 2.0**-24), np.float32(1 + 2.0**-12)]]).astype(np.float32)
    c = np.concatenate([c, [np.float32(-1), np.float32(2.0**-50), np.float32(-2.0**-47)]]).astype(np.float32)
    got = _fma32(a, b, c)
    for x, y, z, g in zip(a, b, c, got):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        want = np.float32(float(exact))  # float(Fraction) rounds correctly to float64, then to float32 ...
        lo, hi = np.nextafter(want, np.float32(-np.inf)), np.nextafter(want, np.float32(np.inf))
        # ... which can itself double-round: accept only the candidate nearest to the exact value
        best = min((want, lo, hi), key=lambda v: (abs(Fraction(float(v)) - exact),
                                                  int(np.float32(v).view(np.uint32)) & 1))
        assert g == best, (x, y, z, g, best)


def test_memory_map_rejects_overlap_and_describes_faults() -> None:
    mem = MemoryMap()
    mem.map(0x1000, 256)
    with pytest.raises(ValueError, match="overlaps"):
        mem.map(0x10F0, 16)
    with pytest.raises(MemoryFault, match=r"at 0x1100: not inside any mapping \(0 bytes past the end of "
                                          r"\[0x1000, 0x1100\)\)"):
        mem.load(np.array([0x10FC], np.uint64) + np.uint64(4), 4)
    with pytest.raises(MemoryFault, match="straddles|not inside"):
        mem.load(np.array([0x10FE], np.uint64), 4)  # starts inside, ends outside


def _without_barrier(name: str, which: int) -> Program:
    """The corpus kernel with its `which`-th s_barrier turned into s_nop 0 (same size, no effect)."""
    p = corpus.program(name)
    barriers = [pc for pc in range(p.entry, len(p.image), 4) if _is_barrier(p, pc)]
    img = bytearray(p.image)
    struct.pack_into("<I", img, barriers[which], S_NOP_0)
    return Program(bytes(img), p.entry, p.kd, name)


def _is_barrier(p: Program, pc: int) -> bool:
    try:
        return p.at(pc).mnemonic == "s_barrier"
    except RDNA3Fault:
        return False


def test_missing_barrier_is_an_lds_race() -> None:
    """reduce_sum's two waves exchange partial sums through LDS; without the first barrier (between the
    stores of both waves and wave 0's reads of wave 1's slots) the lockstep order would still give the right
    sum, so the race detector must report it."""
    mem = MemoryMap()
    mem.map(A, np.ones(64, np.float32))
    mem.map(O, 4)
    with pytest.raises(RDNA3Fault, match=r"LDS race in workgroup 0 of the batch: wave 0 reads byte 0x80, "
                                         r"which wave 1 wrote since the last s_barrier"):
        run(_without_barrier("reduce_sum", 0), mem, struct.pack("<2Qi", O, A, 64), (1, 1, 1), (64, 1, 1))


def test_redundant_barrier_is_not_a_race() -> None:
    """After the first tree level only wave 0 touches LDS, so the second barrier orders nothing: removing it
    is no race (the detector must not report one) and the sum is unchanged."""
    mem = MemoryMap()
    mem.map(A, np.arange(64, dtype=np.float32))
    out = mem.map(O, 4)
    run(_without_barrier("reduce_sum", 1), mem, struct.pack("<2Qi", O, A, 64), (1, 1, 1), (64, 1, 1))
    assert out.view(np.float32)[0] == np.float32(2016)


def test_matmul_without_tile_barrier_races() -> None:
    prog = _without_barrier("matmul_tiled", 0)
    mem = MemoryMap()
    mem.map(A, np.ones(256, np.float32))
    mem.map(A + 0x10000, np.ones(256, np.float32))
    mem.map(O, 1024)
    with pytest.raises(RDNA3Fault, match="LDS race"):
        run(prog, mem, struct.pack("<3Q3i", O, A, A + 0x10000, 16, 16, 16), (1, 1, 1), (16, 16, 1))


def _without_waitcnt(name: str, text: str) -> Program:
    """The corpus kernel with its first `s_waitcnt` whose operand LLVM printed as `text` made an s_nop."""
    p = corpus.program(name)
    c = corpus.compiled(name)
    printed = [ln.strip() for ln in c.asm.split(f"\n{name}:\n")[1].splitlines()]
    waits = [ln for ln in printed if ln.startswith("s_waitcnt ")]
    pcs = [pc for pc in range(p.entry, len(p.image), 4) if _mnemonic(p, pc) == "s_waitcnt"]
    img = bytearray(p.image)
    struct.pack_into("<I", img, pcs[waits.index(f"s_waitcnt {text}")], S_NOP_0)
    return Program(bytes(img), p.entry, p.kd, name)


def _mnemonic(p: Program, pc: int) -> str | None:
    try:
        return p.at(pc).mnemonic
    except RDNA3Fault:
        return None


def test_missing_scalar_waitcnt_is_reported() -> None:
    """divergent loads n with s_load_b32 and compares with it after `s_waitcnt lgkmcnt(0)`; without the wait
    the compare would read the old s2 on hardware: the interpreter reports the read."""
    mem = MemoryMap()
    mem.map(A, np.ones(4, np.float32))
    mem.map(O, 16)
    pattern = r"reads s\d+ while s_load_b\d+ at pc 0x[0-9a-f]+, which loads it, is still in flight: a missing"
    with pytest.raises(RDNA3Fault, match=pattern + " s_waitcnt"):
        run(_without_waitcnt("divergent", "lgkmcnt(0)"), mem, struct.pack("<2Qi", O, A, 4), (1, 1, 1),
            (64, 1, 1))


def test_missing_vector_waitcnt_is_reported() -> None:
    mem = MemoryMap()
    mem.map(A, np.ones(4, np.float32))
    mem.map(O, 16)
    with pytest.raises(RDNA3Fault, match=r"v\d+ while global_load_b32 at pc 0x[0-9a-f]+, which loads it, is "
                                         r"still in flight"):
        run(_without_waitcnt("divergent", "vmcnt(0)"), mem, struct.pack("<2Qi", O, A, 4), (1, 1, 1),
            (64, 1, 1))


def test_lds_loads_complete_at_their_waitcnt() -> None:
    """matmul_tiled waits for its 16 LDS loads in steps (lgkmcnt(12), (11), ... (0)) and uses each pair as
    soon as its wait allows. A read of a register whose load is still queued faults, so this run passing shows
    every partial wait released the oldest loads, the ones the code reads next (the in-order LDS queue)."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((16, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    mem = MemoryMap()
    mem.map(A, a)
    mem.map(A + 0x10000, b)
    out = mem.map(O, 1024)
    run(corpus.program("matmul_tiled"), mem, struct.pack("<3Q3i", O, A, A + 0x10000, 16, 16, 16), (1, 1, 1),
        (16, 16, 1))
    np.testing.assert_allclose(out.view(np.float32).reshape(16, 16), a.astype(np.float64) @ b, rtol=1e-5,
                               atol=1e-5)


def _sopp(op: int, simm16: int = 0) -> int:
    return (0b101111111 << 23) | (op << 16) | simm16  # SOPP prefix, opcode 22:16, SIMM16 15:0 (RDNA3 ISA)


SOPP_NOP, SOPP_ENDPGM, SOPP_SENDMSG = 0, 48, 54  # gfx11 SOPP opcodes (the generated tables name them)


def _words(*words: int) -> Program:
    """A hand-assembled body under the wgid kernel's descriptor (wave32, a kernarg pointer)."""
    kd = corpus.program("wgid").kd
    return Program(struct.pack(f"<{len(words)}I", *words), 0, kd, "hand")


def test_sendmsg_dealloc_vgprs_before_endpgm_is_accepted() -> None:
    stats = run(_words(_sopp(SOPP_SENDMSG, 3), _sopp(SOPP_ENDPGM)), MemoryMap(), bytes(16), (2, 1, 1),
                (64, 1, 1), count=True)
    assert stats.executed == {"s_sendmsg": 1, "s_endpgm": 1} and stats.waves == 4


def test_sendmsg_dealloc_vgprs_must_end_the_program() -> None:
    prog = _words(_sopp(SOPP_SENDMSG, 3), _sopp(SOPP_NOP), _sopp(SOPP_ENDPGM))
    with pytest.raises(RDNA3Fault, match=r"MSG_DEALLOC_VGPRS\) is followed by s_nop, not s_endpgm"):
        run(prog, MemoryMap(), bytes(16), (1, 1, 1), (32, 1, 1))


@pytest.mark.parametrize("msg", [0x2, 0x13, 0xB3])
def test_other_messages_are_refused(msg: int) -> None:
    with pytest.raises(MockUnsupported, match=f"s_sendmsg: not implemented .*message {msg:#x}"):
        run(_words(_sopp(SOPP_SENDMSG, msg), _sopp(SOPP_ENDPGM)), MemoryMap(), bytes(16), (1, 1, 1),
            (32, 1, 1))
