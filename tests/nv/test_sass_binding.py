"""The SASS of an image is bound to the PTX the mock interprets (issue "Tests that cannot lie" §2.3).

The mock GPU runs `.rawgrad.ptx`, never the SASS, so an image whose code came from other PTX would pass
every test that only looks at results. `cubin.check_binding` checks the image against its `.rawgrad.bind`
record; `mock.sass_check.verify_image` also re-assembles the embedded PTX with ptxas and compares the code.
"""

from __future__ import annotations

import inspect
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rawgrad.compiler import elf
from rawgrad.drivers.nv import cubin
from rawgrad.drivers.nv.cubin import (
    BIND_SECTION,
    PTX_SECTION,
    BindingError,
    NVCompiler,
    PTXAssembler,
    append_section,
    bind_image,
    check_binding,
    find_ptxas,
    ptx_only_fallbacks,
)
from rawgrad.drivers.nv.mock import gpu as mock_gpu
from rawgrad.drivers.nv.mock import sass_check
from rawgrad.drivers.nv.mock.sass_check import SASSMismatchError, verify_image
from rawgrad.hcq import Device

PTXAS = find_ptxas()
needs_ptxas = pytest.mark.skipif(PTXAS is None, reason="no ptxas (pip install 'rawgrad[nv]')")

TWO, THREE = "0f40000000", "0f40400000"  # 2.0f and 3.0f as PTX writes them: the same length
# out[i] = inp[i] * {scale}; `tag` keeps each test's PTX (and so its memo entries) its own
SCALE_KERNEL = """.version 7.8
.target {arch}
.address_size 64
// {tag}
.visible .entry scale(.param .u64 out, .param .u64 inp, .param .u32 n)
{{
  .reg .pred %p<1>; .reg .b32 %r<5>; .reg .b64 %rd<6>; .reg .f32 %f<3>;
  mov.u32 %r0, %ctaid.x; mov.u32 %r1, %ntid.x; mov.u32 %r2, %tid.x;
  mad.lo.s32 %r3, %r0, %r1, %r2; ld.param.u32 %r4, [n];
  setp.ge.u32 %p0, %r3, %r4; @%p0 bra DONE;
  mul.wide.u32 %rd0, %r3, 4;
  ld.param.u64 %rd1, [inp]; cvta.to.global.u64 %rd1, %rd1; add.s64 %rd2, %rd1, %rd0;
  ld.global.f32 %f0, [%rd2]; mul.f32 %f1, %f0, {scale};
  ld.param.u64 %rd3, [out]; cvta.to.global.u64 %rd3, %rd3; add.s64 %rd4, %rd3, %rd0;
  st.global.f32 [%rd4], %f1;
DONE:
  ret;
}}
"""


def _ptx(tag: str, scale: str = TWO, arch: str = "sm_90") -> str:
    return SCALE_KERNEL.format(arch=arch, tag=tag, scale=scale)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the SASS check's disk memo lives under the NV cache: keep it inside this test
    monkeypatch.setenv("RAWGRAD_CACHE_DIR", str(tmp_path / "cache"))


def _other_ptx_image(tag: str, arch: str = "sm_90") -> tuple[bytes, bytes]:
    """(image, good image): the first is the SASS of the x3.0 kernel carrying the x2.0 PTX, with a binding
    record that is consistent with both (what a driver that feeds ptxas one text and embeds another, and
    hashes the wrong one, would write); the second is the honest image of the x2.0 kernel."""
    assert PTXAS is not None
    asm = PTXAssembler(PTXAS)
    shown, assembled = _ptx(tag, TWO, arch).encode(), _ptx(tag, THREE, arch).encode()
    bad = bind_image(asm.assemble(assembled, arch), shown, arch, "ptxas", asm.identity)
    good = bind_image(asm.assemble(shown, arch), shown, arch, "ptxas", asm.identity)
    return bad, good


# ------------------------------------------------------------------------------------------ the record
@needs_ptxas
def test_compiled_image_is_bound_and_verifies() -> None:
    src = _ptx("consistent")
    image = NVCompiler("sm_90", "ptxas", cache_dir="").compile(src)
    record = check_binding(image)
    assert record is not None and record.arch == "sm_90" and record.assembler == "ptxas"
    assert record.ptx_sha256 == cubin.sha256(src.encode())
    assert [name for name, _ in record.code] == [".text.scale"]
    before = sass_check.stats.assembled, sass_check.stats.verified
    verify_image(image, 90)
    assert (sass_check.stats.assembled, sass_check.stats.verified) == (before[0] + 1, before[1] + 1)
    # as uploaded: relocated at some base and padded to pages, it still verifies (a memo hit, no ptxas run)
    info = cubin.program_info(image, "scale", "sm_90")
    uploaded = cubin.relocate(image, info.layout, 0x7_0000_0000) + bytes(4096)
    verify_image(uploaded, 90)
    assert sass_check.stats.assembled == before[0] + 1
    with pytest.raises(BindingError, match=r"scale: assembled for sm_90, loaded on an sm_86 GPU"):
        verify_image(NVCompiler("sm_90", "ptxas", cache_dir="").compile(_ptx("consistent-86")), 86)


@needs_ptxas
def test_sass_from_other_ptx_is_rejected() -> None:
    bad, good = _other_ptx_image("other-ptx")
    assert check_binding(bad) is not None  # the driver's own record is consistent: only (c) can tell
    with pytest.raises(SASSMismatchError, match=r"kernel scale: its SASS is not what ptxas makes of the "
                                                r"embedded \.rawgrad\.ptx for sm_90 \(first difference"):
        verify_image(bad, 90)
    verify_image(good, 90)  # the same PTX with its own SASS passes


@needs_ptxas
def test_tampered_ptx_text_or_record_is_rejected() -> None:
    src = _ptx("tampered")
    image = NVCompiler("sm_90", "ptxas", cache_dir="").compile(src)
    f = elf.ElfFile.parse(image)
    ptx = f.section(PTX_SECTION)
    assert image[ptx.offset:ptx.offset + ptx.size] == src.encode()
    # (a) the embedded PTX changed after assembly (same length, one constant)
    at = image.index(TWO.encode(), ptx.offset)
    other = image[:at] + THREE.encode() + image[at + len(THREE):]
    with pytest.raises(BindingError, match=r"\.rawgrad\.ptx hashes to .* the SASS was assembled from PTX"):
        check_binding(other)
    with pytest.raises(BindingError, match="scale"):
        verify_image(other, 90)
    # (b) the code changed: one byte of the first instruction
    text = f.section(".text.scale")
    flipped = image[:text.offset] + bytes([image[text.offset] ^ 0xFF]) + image[text.offset + 1:]
    with pytest.raises(BindingError, match=r"kernel scale: \.text\.scale hashes to .*records"):
        verify_image(flipped, 90)
    # an image with SASS and PTX but no record at all
    bare = append_section(PTXAssembler(PTXAS or "").assemble(src, "sm_90"), PTX_SECTION, src.encode())
    with pytest.raises(BindingError, match=r"kernel\(s\) scale has SASS but no \.rawgrad\.bind"):
        verify_image(bare, 90)
    # an unreadable record
    broken = append_section(bare, BIND_SECTION, b"rawgrad-bind 99\n")
    with pytest.raises(BindingError, match="version '99'"):
        check_binding(broken)


def test_relocated_code_fields_are_masked() -> None:
    # R_CUDA_ABS32_LO_32 patches bytes 4..8 of the instruction at its offset (NV-FACTS 7.3)
    rel = struct.pack("<QQq", 16, (1 << 32) | cubin.R_CUDA_ABS32_LO_32, 0)
    sym = bytes(24) + struct.pack("<IBBHQQ", 1, 3, 0, 1, 0, 0)
    code = bytes(range(1, 33))
    image = cubin.write_elf([
        cubin.Section(".text.k", elf.SHT_PROGBITS, elf.SHF_ALLOC | elf.SHF_EXECINSTR, code, 128),
        cubin.Section(".strtab", elf.SHT_STRTAB, 0, b"\0k\0", 1),
        cubin.Section(".symtab", elf.SHT_SYMTAB, 0, sym, 8, link=2, entsize=24),
        cubin.Section(".rela.text.k", elf.SHT_RELA, 0, rel, 8, link=3, info=1, entsize=24),
    ])
    masked = cubin.code_sections(elf.ElfFile.parse(image))[".text.k"]
    assert masked == code[:20] + bytes(4) + code[24:]


# ------------------------------------------------------------------------------------------ the cache
@needs_ptxas
def test_cache_key_follows_the_ptx_and_a_misfiled_entry_is_not_used(tmp_path: Path) -> None:
    two, three = _ptx("cache", TWO), _ptx("cache", THREE)
    comp = NVCompiler("sm_90", "ptxas", cache_dir=str(tmp_path))
    assert comp.cache_key(two) != comp.cache_key(three) and comp.cache_key(two) == comp.cache_key(two)
    assert comp.cache_key(two) != NVCompiler("sm_86", "ptxas", cache_dir="").cache_key(two)
    comp.compile(two)
    (entry,) = tmp_path.glob("*.cubin")
    assert entry.name == comp.cache_key(two) + ".cubin"
    # the x2 image filed under the x3 key (a wrongly keyed entry) is a miss, and x3 is assembled
    shutil.copy(entry, tmp_path / (comp.cache_key(three) + ".cubin"))
    fresh = NVCompiler("sm_90", "ptxas", cache_dir=str(tmp_path))
    assembled, disk_hits = NVCompiler.stats.assembled, NVCompiler.stats.disk_hits
    image = fresh.compile(three)
    assert NVCompiler.stats.assembled == assembled + 1 and NVCompiler.stats.disk_hits == disk_hits
    assert fresh._cache.disk.corrupt_entries == 1
    assert elf.ElfFile.parse(image).section(PTX_SECTION).data == three.encode()
    verify_image(image, 90)
    # and the right entry is a hit
    assert NVCompiler("sm_90", "ptxas", cache_dir=str(tmp_path)).compile(two) == comp.compile(two)
    assert NVCompiler.stats.disk_hits == disk_hits + 1


# ------------------------------------------------------------------------------------------ the fallback
def test_ptx_only_fallback_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # restored afterwards: CI's fallback check (tests/ci_policy.py) must see only unintended fallbacks
    monkeypatch.setattr(NVCompiler.stats, "fallbacks", NVCompiler.stats.fallbacks)
    monkeypatch.setattr(cubin, "find_ptxas", lambda: None)
    monkeypatch.setattr(cubin, "find_nvjitlink", lambda: None)
    monkeypatch.delenv("NV_ASSEMBLER", raising=False)
    before, ptx_only = ptx_only_fallbacks(), NVCompiler.stats.ptx_only
    image = NVCompiler("sm_90").compile(_ptx("fallback"))  # "auto" found nothing: a fallback
    assert ptx_only_fallbacks() == before + 1
    NVCompiler("sm_90", "none").compile(_ptx("fallback"))  # asked for: PTX-only, but no fallback
    assert ptx_only_fallbacks() == before + 1 and NVCompiler.stats.ptx_only == ptx_only + 2
    # nothing to bind in a PTX-only image: the check lets it through, and says so in its counters
    assert check_binding(image) is None
    no_sass = sass_check.stats.no_sass
    verify_image(image, 90)
    assert sass_check.stats.no_sass == no_sass + 1


# ------------------------------------------------------------------------------------------ on the mock
_HOOKED = "verify_image" in inspect.getsource(mock_gpu)


@needs_ptxas
@pytest.mark.skipif(not _HOOKED, reason="mock/gpu.py does not call sass_check.verify_image yet")
def test_mock_refuses_to_run_sass_from_other_ptx(nv: str) -> None:
    dev: Any = Device[nv]
    bad, good = _other_ptx_image("mock-" + dev.arch, dev.arch)
    n = 40
    inp = np.arange(n, dtype=np.float32)
    src, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
    dev.allocator.copyin(src, memoryview(inp).cast("B"))
    dev.program("scale", good)(out, src, global_size=(n, 1, 1), vals=(n,), wait=True)
    got = np.empty(n, np.float32)
    dev.allocator.copyout(memoryview(got).cast("B"), out)
    np.testing.assert_array_equal(got, inp * 2)  # the honest image runs, with the PTX's x2.0
    with pytest.raises(Exception, match="kernel scale: its SASS is not what ptxas makes"):
        dev.program("scale", bad)(out, src, global_size=(n, 1, 1), vals=(n,), wait=True)
