"""PTX -> SASS through NVIDIA's ptxas: finding it, its errors, the cubins it writes, the cache, and real
cubins running on the mock GPU (which executes their `.rawgrad.ptx`, found through the cubin's own
`.text` offset and attributes). Tests that need ptxas skip without it (pip install 'rawgrad[nv]')."""

from __future__ import annotations

import os
import re
import stat
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler import elf
from rawgrad.compiler.renderer.ptx import PTXRenderer
from rawgrad.drivers.nv import cubin
from rawgrad.drivers.nv.cubin import (
    NoAssemblerError,
    NVCompiler,
    PTXAssembler,
    PTXAssemblyError,
    find_ptxas,
    program_info,
)
from rawgrad.hcq import Device
from rawgrad.tensor.schedule import create_schedule

PTXAS = find_ptxas()
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="no ptxas (pip install 'rawgrad[nv]')")

CONST_TABLE = np.array([1.5, -2.0, 3.25, 8.0], np.float32)
# A kernel reading module-scope .const data: ptxas puts it in constant bank 3 (`.nv.constant3`).
CONST_KERNEL = """.version 7.8
.target {arch}
.address_size 64
.const .align 4 .f32 table[4] = {{1.5, -2.0, 3.25, 8.0}};
.visible .entry lookup(.param .u64 out, .param .u32 i)
{{
  .reg .b64 %rd<4>; .reg .b32 %r<1>; .reg .f32 %f<1>;
  ld.param.u64 %rd0, [out]; ld.param.u32 %r0, [i];
  mul.wide.u32 %rd1, %r0, 4; mov.u64 %rd2, table; add.s64 %rd2, %rd2, %rd1;
  ld.const.f32 %f0, [%rd2];
  cvta.to.global.u64 %rd3, %rd0; st.global.f32 [%rd3], %f0; ret;
}}
"""


def _fake_ptxas(folder: Path, release: str = "12.9") -> str:
    """An executable named ptxas that answers --version like NVIDIA's."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ptxas"
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _kernel_ptx(arch: str) -> tuple[str, str]:
    """(name, PTX) of a real kernel from the scheduler and our renderer: out[i] = a[i] * 2 + 1."""
    items, _ = create_schedule([(Tensor(np.arange(37, dtype=np.float32)) * 2 + 1).uop])
    (si,) = [si for si in items if si.ast is not None]
    renderer = PTXRenderer(arch)
    return "add_one", renderer.render(renderer.lower(si.ast, "add_one"))


# ------------------------------------------------------------------------------------------ discovery
def test_find_ptxas_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = _fake_ptxas(tmp_path / "explicit")
    home = _fake_ptxas(tmp_path / "cuda" / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("PTXAS", explicit)
    assert cubin.ptxas_candidates()[:2] == [explicit, home]
    assert find_ptxas() == explicit
    monkeypatch.delenv("PTXAS")
    assert find_ptxas() == home
    # a file that is not executable is passed over
    os.chmod(home, 0o644)
    assert find_ptxas() != home


def test_wheel_layout_is_searched() -> None:
    # nvidia-cuda-nvcc-cu12 unpacks ptxas as nvidia/cuda_nvcc/bin/ptxas, the CUDA 13 wheels as nvidia/cu13/bin
    assert cubin.WHEEL_PTXAS_GLOB == os.path.join("*", "bin", "ptxas")


def test_no_assembler_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # this test makes a PTX-only image on purpose: restore the process-wide fallback count afterwards, so CI's
    # "no kernel fell back to PTX only" check (tests/ci_policy.py) sees only unintended fallbacks
    monkeypatch.setattr(NVCompiler.stats, "fallbacks", NVCompiler.stats.fallbacks)
    monkeypatch.setattr(cubin, "find_ptxas", lambda: None)
    monkeypatch.setattr(cubin, "find_nvjitlink", lambda: None)
    with pytest.raises(NoAssemblerError, match=r"pip install 'rawgrad\[nv\]'"):
        NVCompiler("sm_90", require_sass=True)
    with pytest.raises(NoAssemblerError, match="no ptxas was found"):
        NVCompiler("sm_90", "ptxas")
    # the mock can still run: a PTX-only image
    comp = NVCompiler("sm_90")
    assert not comp.produces_sass
    image = comp.compile(CONST_KERNEL.format(arch="sm_90"))
    assert not program_info(image, "lookup", "sm_90").has_sass
    with pytest.raises(ValueError, match="unknown NV assembler 'nvcc'"):
        NVCompiler("sm_90", "nvcc")
    monkeypatch.setenv("NV_ASSEMBLER", "none")
    with pytest.raises(NoAssemblerError, match="NV_ASSEMBLER=none"):
        NVCompiler("sm_90", require_sass=True)


def test_old_ptxas_is_refused_for_sm90(tmp_path: Path) -> None:
    old = PTXAssembler(_fake_ptxas(tmp_path, release="11.4"))
    assert old.release == (11, 4)
    with pytest.raises(NoAssemblerError, match="sm_90 needs 11.8 or newer"):
        old.assemble(CONST_KERNEL.format(arch="sm_90"), "sm_90")


# ------------------------------------------------------------------------------------------ real ptxas
@needs_ptxas
@pytest.mark.parametrize("arch, param_offset", [("sm_90", 0x210), ("sm_86", 0x160), ("sm_80", 0x160)])
def test_cubin_attributes_match_ptxas_report(arch: str, param_offset: int) -> None:
    assert PTXAS is not None
    name, src = _kernel_ptx(arch)
    image = NVCompiler(arch, "ptxas", cache_dir="").compile(src)
    f = elf.ElfFile.parse(image)
    assert f.machine == elf.EM_CUDA  # (e_flags encode the SM differently in CUDA 12 and 13 cubins)
    info = program_info(image, name, arch)
    assert info.has_sass and info.text_offset % cubin.TEXT_ALIGN == 0 and info.text_bytes > 0
    assert info.param_offset == param_offset  # from EIATTR_PARAM_CBANK, as libcuda would use it
    # out, a, and the constant 2.0 (a float constant is a scalar argument: tensor/schedule.py scalar_arg)
    assert [(p.offset, p.size) for p in info.params] == [(0, 8), (8, 8), (16, 8)]
    assert info.ptx == src and info.constant_banks == ()
    # the register count the QMD gets is the one ptxas reports
    report = subprocess.run([PTXAS, f"-arch={arch}", "-v", "-o", os.devnull, "-"], input=src, text=True,
                            capture_output=True)
    if report.returncode != 0:  # older ptxas cannot read stdin: go through a file
        report = _ptxas_report(PTXAS, arch, src)
    assert info.registers == int(re.search(r"Used (\d+) registers", report.stderr).group(1))  # type: ignore[union-attr]


def _ptxas_report(ptxas: str, arch: str, src: str) -> subprocess.CompletedProcess[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(src)
        f.flush()
        return subprocess.run([ptxas, f"-arch={arch}", "-v", "-o", os.devnull, f.name], text=True,
                              capture_output=True, check=True)


@needs_ptxas
def test_ptxas_errors_carry_the_diagnostic() -> None:
    bad = CONST_KERNEL.format(arch="sm_90").replace("ld.const.f32", "ld.const.f33")
    with pytest.raises(PTXAssemblyError, match=r"(?s)rejected the PTX for sm_90.*f33.*--- PTX"):
        NVCompiler("sm_90", "ptxas", cache_dir="").compile(bad)


@needs_ptxas
def test_disk_cache_hits_and_survives_corruption(tmp_path: Path) -> None:
    src = CONST_KERNEL.format(arch="sm_90")
    stats = NVCompiler.stats
    before = stats.assembled
    image = NVCompiler("sm_90", "ptxas", cache_dir=str(tmp_path)).compile(src)
    assert stats.assembled == before + 1
    hits = stats.disk_hits
    assert NVCompiler("sm_90", "ptxas", cache_dir=str(tmp_path)).compile(src) == image
    assert stats.disk_hits == hits + 1 and stats.assembled == before + 1
    (entry,) = tmp_path.glob("*.cubin")
    entry.write_bytes(entry.read_bytes()[:100])  # torn write
    assert NVCompiler("sm_90", "ptxas", cache_dir=str(tmp_path)).compile(src) == image
    assert stats.assembled == before + 2


@needs_ptxas
def test_constant_bank_from_const_data() -> None:
    src = CONST_KERNEL.format(arch="sm_90")
    image = NVCompiler("sm_90", "ptxas", cache_dir="").compile(src)
    info = program_info(image, "lookup", "sm_90")
    ((index, offset, size),) = info.constant_banks
    assert index == 3 and offset % 256 == 0 and offset >= len(image) and size == 16
    blob = cubin.relocate(image, info.layout, 0x7000_0000)
    assert np.array_equal(np.frombuffer(blob[offset:offset + 16], np.float32), CONST_TABLE)


# Module-scope .global data: ptxas keeps their addresses in constant bank 4, filled by R_CUDA_64 relocations
# against `.nv.global.init` (initialised) and `.nv.global` (NOBITS, zeroed).
GLOBALS_KERNEL = """.version 7.8
.target sm_90
.address_size 64
.global .align 4 .u32 counter;
.global .align 4 .f32 table[4] = {1.0, 2.0, 3.0, 4.0};
.visible .entry bump(.param .u64 out)
{
  .reg .b64 %rd<4>; .reg .b32 %r<1>; .reg .f32 %f<1>;
  ld.param.u64 %rd0, [out];
  atom.global.add.u32 %r0, [counter], 1;
  mov.u64 %rd1, table; ld.global.f32 %f0, [%rd1+4];
  cvta.to.global.u64 %rd3, %rd0; st.global.u32 [%rd3], %r0; st.global.f32 [%rd3+4], %f0; ret;
}
"""


@needs_ptxas
def test_relocations_place_module_globals() -> None:
    image = NVCompiler("sm_90", "ptxas", cache_dir="").compile(GLOBALS_KERNEL)
    info = program_info(image, "bump", "sm_90")
    layout = info.layout
    assert layout.relocations
    base = 0x12_3450_0000
    blob = cubin.relocate(image, layout, base)
    f = elf.ElfFile.parse(image)
    (bank,) = [b for b in info.constant_banks if b[0] == 4]
    pointers = set(np.frombuffer(blob[bank[1]:bank[1] + 16], np.uint64).tolist())
    table = layout.section_offsets[".nv.global.init"] + next(s.value for s in f.symbols if s.name == "table")
    counter = layout.section_offsets[".nv.global"] + next(s.value for s in f.symbols if s.name == "counter")
    assert pointers == {base + table, base + counter}  # bank 4 holds the relocated data addresses
    assert np.array_equal(np.frombuffer(blob[table:table + 16], np.float32), [1.0, 2.0, 3.0, 4.0])
    assert blob[counter:counter + 4] == bytes(4) and counter >= len(image)  # NOBITS: zeroed, after the file
    assert cubin.relocate(image, layout, base + 0x1000) != blob  # the pointers follow the base


def test_unsupported_relocation_is_named() -> None:
    rel = struct.pack("<QQq", 0, (1 << 32) | 0x3A, 0)  # R_CUDA_ABS47_34 against symbol 1
    sym = bytes(24) + struct.pack("<IBBHQQ", 1, 3, 0, 1, 0, 0)  # a SECTION symbol of section 1
    image = cubin.write_elf([
        cubin.Section(".text.k", elf.SHT_PROGBITS, elf.SHF_ALLOC | elf.SHF_EXECINSTR, bytes(128), 128),
        cubin.Section(".strtab", elf.SHT_STRTAB, 0, b"\0k\0", 1),
        cubin.Section(".symtab", elf.SHT_SYMTAB, 0, sym, 8, link=2, entsize=24),
        cubin.Section(".rela.text.k", elf.SHT_RELA, 0, rel, 8, link=3, info=1, entsize=24),
    ])
    with pytest.raises(NotImplementedError, match="relocation type 0x3a in .text.k"):
        cubin.image_layout(image)


@needs_ptxas
def test_constant_bank_is_uploaded_and_bound(nv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dev: Any = Device[nv]
    src = CONST_KERNEL.format(arch=dev.arch)
    lib = NVCompiler(dev.arch, "ptxas", cache_dir="").compile(src)
    prog = dev.program("lookup", lib)
    ((index, va, size),) = prog.constant_banks
    assert index == 3 and va % 256 == 0 and size == 16 and va > prog.image.va
    got = np.empty(4, np.float32)
    dev.copy_out(memoryview(got).cast("B"), va)
    assert np.array_equal(got, CONST_TABLE)
    out = dev.allocator.alloc(4)
    q = dev.queue()
    q.exec(prog, [out.va_addr, 2], (1, 1, 1), (1, 1, 1))
    qmd = q._tail[0]  # the launch's QMD as built (the mock's interpreter does not model .const data)
    assert qmd.get("CONSTANT_BUFFER_VALID3") == 1 and qmd.get("CONSTANT_BUFFER_VALID0") == 1
    dev.allocator.free(out)


@needs_ptxas
def test_real_cubins_run_on_the_mock(nv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole path with ptxas output: Tensor ops -> PTX -> real cubin -> VRAM -> QMD -> the mock GPU."""
    dev: Any = Device[nv]
    assert dev.compiler.produces_sass and isinstance(dev.compiler.backend, PTXAssembler)
    stats = NVCompiler.stats
    ptx_only, cubins = stats.ptx_only, stats.assembled + stats.disk_hits + stats.memory_hits
    a = np.random.default_rng(1).standard_normal((33, 17)).astype(np.float32)
    x = Tensor(a, device=nv)
    got = ((x * 2 + 1).exp2().sum(axis=1) / 17).numpy()
    np.testing.assert_allclose(got, (np.exp2(a * 2 + 1)).sum(axis=1) / 17, rtol=1e-5)
    assert dev.mock.gpu.launches[-1].entry is not None
    # every kernel of that came from ptxas (assembled now or from a cache), none was a PTX-only image
    assert stats.ptx_only == ptx_only and stats.assembled + stats.disk_hits + stats.memory_hits > cubins
