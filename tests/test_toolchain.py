"""In-process LLVM toolchain: objects, caching (memory + disk), errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rawgrad.compiler import cache, toolchain
from rawgrad.compiler.elf import EM_AARCH64, ET_REL, ElfFile
from rawgrad.compiler.toolchain import CompileError, LLVMCompiler, host_compiler

ADD_IR = r"""
define i32 @add(i32 %a, i32 %b) {
  %c = add i32 %a, %b
  ret i32 %c
}
"""

VEC_IR = r"""
define void @axpy(ptr noalias %y, ptr noalias %x, float %a, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %px = getelementptr float, ptr %x, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %vx = load float, ptr %px
  %vy = load float, ptr %py
  %m = fmul float %vx, %a
  %r = fadd float %m, %vy
  store float %r, ptr %py
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""


def _entries(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix == ".o")


def test_compile_returns_relocatable_object(tmp_path: Path) -> None:
    comp = LLVMCompiler(cache_dir=str(tmp_path))
    obj = comp.compile(ADD_IR)
    e = ElfFile.parse(obj)
    assert e.elf_type == ET_REL
    assert any(s.name == "add" for s in e.symbols)
    assert comp.triple in comp.target_key and comp.cpu in comp.target_key and "O3" in comp.target_key


def test_memory_cache_hit(tmp_path: Path) -> None:
    comp = LLVMCompiler(cache_dir=str(tmp_path))
    before = (LLVMCompiler.stats.compiles, LLVMCompiler.stats.memory_hits)
    a = comp.compile(ADD_IR + "; unique memory test\n")
    b = comp.compile(ADD_IR + "; unique memory test\n")
    assert a == b
    assert LLVMCompiler.stats.compiles - before[0] == 1
    assert LLVMCompiler.stats.memory_hits - before[1] == 1


def test_disk_cache_env_and_reuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    first = LLVMCompiler()
    assert first.cache_dir == str(tmp_path / "cache")
    obj = first.compile(ADD_IR)
    assert len(_entries(tmp_path / "cache")) == 1
    assert not [p for p in (tmp_path / "cache").iterdir() if p.suffix == ".tmp"]  # temp file renamed away
    compiles = LLVMCompiler.stats.compiles
    disk_hits = LLVMCompiler.stats.disk_hits
    second = LLVMCompiler()  # fresh memory cache: must come from disk, no LLVM invoked
    assert second.compile(ADD_IR) == obj
    assert LLVMCompiler.stats.compiles == compiles
    assert LLVMCompiler.stats.disk_hits == disk_hits + 1


def test_cache_key_depends_on_target_and_ir(tmp_path: Path) -> None:
    o3 = LLVMCompiler(cache_dir=str(tmp_path))
    o1 = LLVMCompiler(cache_dir=str(tmp_path), opt_level=1)
    assert o3.target_key != o1.target_key
    assert o3.cache_key(ADD_IR) != o1.cache_key(ADD_IR)
    assert o3.cache_key(ADD_IR) != o3.cache_key(ADD_IR + "\n")
    o3.compile(ADD_IR)
    o1.compile(ADD_IR)
    assert len(_entries(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupt_cache_entry_is_recompiled(tmp_path: Path, damage: str) -> None:
    obj = LLVMCompiler(cache_dir=str(tmp_path)).compile(ADD_IR)
    (entry,) = _entries(tmp_path)
    blob = bytearray(entry.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip":
        blob[-10] ^= 0xFF
    else:
        blob = bytearray()
    entry.write_bytes(bytes(blob))
    compiles, corrupt = LLVMCompiler.stats.compiles, LLVMCompiler.stats.corrupt_entries
    assert LLVMCompiler(cache_dir=str(tmp_path)).compile(ADD_IR) == obj
    assert LLVMCompiler.stats.compiles == compiles + 1
    assert LLVMCompiler.stats.corrupt_entries == corrupt + 1
    # the entry was rewritten and is good again
    disk_hits = LLVMCompiler.stats.disk_hits
    assert LLVMCompiler(cache_dir=str(tmp_path)).compile(ADD_IR) == obj
    assert LLVMCompiler.stats.disk_hits == disk_hits + 1


def test_unreadable_cache_dir_still_compiles(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    comp = LLVMCompiler(cache_dir=str(blocker / "sub"))
    assert ElfFile.parse(comp.compile(ADD_IR)).elf_type == ET_REL


def test_empty_cache_dir_disables_disk_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache.CACHE_DIR_ENV, "")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert LLVMCompiler().cache_dir is None
    assert LLVMCompiler(cache_dir="").cache_dir is None
    LLVMCompiler().compile(ADD_IR + "; no disk\n")
    assert not any(tmp_path.rglob("*.o"))


def test_compile_error_on_bad_ir() -> None:
    comp = LLVMCompiler(cache_dir="")
    with pytest.raises(CompileError, match=r"(?s)parse.*define i32 @broken"):
        comp.compile("define i32 @broken( {\n  ret i32 0\n}\n")
    with pytest.raises(CompileError, match="doesn't match function result type"):
        comp.compile("define i32 @f() {\nentry:\n  ret i64 0\n}\n")
    # parses, but %y is used before it is defined: only the verifier catches it
    bad_verify = "define i32 @g(i32 %a) {\nentry:\n  br label %next\nnext:\n  %x = add i32 %y, 1\n" \
                 "  %y = add i32 %a, 1\n  ret i32 %x\n}\n"
    with pytest.raises(CompileError, match="verification") as info:
        comp.compile(bad_verify)
    assert info.value.ir == bad_verify and "define i32 @g" in str(info.value)


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="opt_level"):
        LLVMCompiler(opt_level=7, cache_dir="")
    with pytest.raises(ValueError, match="no-such-arch"):
        LLVMCompiler(triple="no-such-arch-unknown-none", cache_dir="")


def test_host_compiler_singleton_and_vectorizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toolchain, "_host", None)
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path))
    h = host_compiler()
    assert h is host_compiler()
    assert h.cpu and h.features
    assert ElfFile.parse(h.compile(VEC_IR)).section(".text").size > 0
    if "+avx2" in h.features.split(","):
        # loop vectorization with the host's features: packed single-precision ops on 256/512-bit registers
        asm = h.assembly(VEC_IR)
        assert "ymm" in asm or "zmm" in asm
        assert "ps\t" in asm
    assert "ymm" not in LLVMCompiler(opt_level=0, cache_dir="").assembly(VEC_IR)


def test_cross_target_aarch64() -> None:
    comp = LLVMCompiler(triple="aarch64-unknown-linux-gnu", cache_dir="")
    assert comp.cpu == "generic"
    e = ElfFile.parse(comp.compile(ADD_IR))
    assert e.machine == EM_AARCH64


def test_atomic_write_leaves_no_temp_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    comp = LLVMCompiler(cache_dir=str(tmp_path))

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(cache.os, "replace", broken_replace)
    comp.compile(ADD_IR + "; write fails\n")
    assert os.listdir(tmp_path) == []


def test_concurrent_compiles_are_safe(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    comp = LLVMCompiler(cache_dir=str(tmp_path))
    sources = [ADD_IR.replace("@add", f"@add{i}") for i in range(6)] * 2
    with ThreadPoolExecutor(4) as pool:
        objs = list(pool.map(comp.compile, sources))
    for i, obj in enumerate(objs):
        assert any(s.name == f"add{i % 6}" for s in ElfFile.parse(obj).symbols)
    assert len(_entries(tmp_path)) == 6


def test_pipeline_chosen_by_work(tmp_path: Path) -> None:
    """Tiny work gets the quick pipeline (no vector code, own cache entry); big or unknown work keeps O3."""
    comp = LLVMCompiler(cache_dir=str(tmp_path))
    assert comp.quick(0) and comp.quick(toolchain.QUICK_MAX_WORK)
    assert not comp.quick(toolchain.QUICK_MAX_WORK + 1) and not comp.quick(None)
    assert comp.cache_key(VEC_IR, quick=True) != comp.cache_key(VEC_IR)
    if "+avx2" in comp.features.split(","):
        assert "ymm" in comp.assembly(VEC_IR, work=toolchain.QUICK_MAX_WORK + 1)
        assert "ymm" not in comp.assembly(VEC_IR, work=16) and "zmm" not in comp.assembly(VEC_IR, work=16)
    ir = VEC_IR + "; pipeline by work\n"
    quick_before = LLVMCompiler.stats.quick_compiles
    compiles_before = LLVMCompiler.stats.compiles
    small, big = comp.compile(ir, work=16), comp.compile(ir, work=None)
    assert LLVMCompiler.stats.compiles - compiles_before == 2  # two pipelines: two objects, two entries
    assert LLVMCompiler.stats.quick_compiles - quick_before == 1
    assert small != big and len(_entries(tmp_path)) == 2
    assert any(s.name == "axpy" for s in ElfFile.parse(small).symbols)
    assert comp.compile(ir, work=16) == small and LLVMCompiler.stats.compiles - compiles_before == 2


def test_amdgpu_compiler_never_takes_the_quick_pipeline() -> None:
    assert not toolchain.AMDGPUCompiler.sizes_pipeline
    assert LLVMCompiler.sizes_pipeline


def test_kernel_work_estimate() -> None:
    """The realize loop's work estimate (lowered here, so an earlier test's cached kernel does not hide
    it): a tiny elementwise kernel is small, a 64x64 matmul is not; a quick-built kernel computes the same
    values as numpy."""
    import numpy as np

    from rawgrad import Tensor
    from rawgrad.hcq.device import Device
    from rawgrad.tensor import realize as R
    from rawgrad.tensor import schedule_cache

    def works(t: Tensor) -> list[int | None]:
        items = schedule_cache.schedule_noting_assigns([t.uop])[0]
        out = []
        for si in items:
            if si.ast is not None:
                out.append(R.kernel_work(Device[si.bufs[0].device].renderer.lower(si.ast, "k")))
        return out

    x = Tensor(np.arange(16, dtype=np.float32) / 16).realize()
    small = (x + 0.25).reshape(4, 4)[:, 1].exp()
    a = Tensor(np.ones((64, 64), np.float32)).realize()
    big = a @ a
    small_works, big_works = works(small), works(big)
    assert small_works and all(w is not None and w <= toolchain.QUICK_MAX_WORK for w in small_works)
    assert big_works and all(w is not None and w > toolchain.QUICK_MAX_WORK for w in big_works)
    np.testing.assert_allclose(small.numpy(), np.exp(np.arange(16, dtype=np.float32).reshape(4, 4)[:, 1] / 16
                                                     + 0.25), rtol=1e-6)
    np.testing.assert_allclose(big.numpy(), np.full((64, 64), 64, np.float32))


def test_quick_and_full_pipelines_round_alike() -> None:
    """A multiply-add computed by a tiny kernel (quick pipeline) and by a big one (O3) rounds the same: the
    quick pipeline's instruction selection fuses `contract` multiply-adds as O3's does."""
    import numpy as np

    from rawgrad import Tensor

    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(1 << 16).astype(np.float32) for _ in range(3))
    big = (Tensor(a) * Tensor(b) + Tensor(c)).numpy()
    small = (Tensor(a[:64]) * Tensor(b[:64]) + Tensor(c[:64])).numpy()
    np.testing.assert_array_equal(small, big[:64])
