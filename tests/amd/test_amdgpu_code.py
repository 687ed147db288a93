"""The AMDGPU code-object loader (compiler/amdgpu_code.py): layout, the three relocation kinds, the kernel
descriptor, the msgpack metadata, and clear ElfErrors for objects that are corrupt or for another target."""
from __future__ import annotations

import struct

import pytest

from rawgrad.compiler.amdgpu_code import (
    KCP_ENABLE_SGPR_DISPATCH_PTR,
    KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR,
    KCP_ENABLE_SGPR_QUEUE_PTR,
    KD_SIZE,
    R_AMDGPU_REL32_HI,
    R_AMDGPU_REL32_LO,
    R_AMDGPU_REL64,
    load_code_object,
    read_msgpack,
)
from rawgrad.compiler.elf import ElfError, ElfFile
from rawgrad.compiler.toolchain import AMDGPUCompiler, LLVMCompiler

# Two buffers and a scalar, written the way the renderer writes kernels.
ARGS_KERNEL = """
declare i32 @llvm.amdgcn.workitem.id.x()
define amdgpu_kernel void @args(ptr addrspace(1) %out, ptr addrspace(1) %in, i64 %n) #0 {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %i = zext i32 %tid to i64
  %live = icmp slt i64 %i, %n
  br i1 %live, label %body, label %done
body:
  %src = getelementptr inbounds float, ptr addrspace(1) %in, i64 %i
  %v = load float, ptr addrspace(1) %src
  %dst = getelementptr inbounds float, ptr addrspace(1) %out, i64 %i
  store float %v, ptr addrspace(1) %dst
  br label %done
done:
  ret void
}
attributes #0 = { "amdgpu-flat-work-group-size"="1,64" }
"""
# A constant table in addrspace(4): the code reaches it through s_getpc_b64 + REL32_LO/HI relocations.
TABLE_KERNEL = """
@tbl = internal unnamed_addr addrspace(4) constant [8 x float] [float 1.0, float 2.0, float 3.0, float 4.0,
  float 5.0, float 6.0, float 7.0, float 8.0], align 4
define amdgpu_kernel void @table(ptr addrspace(1) %p, i32 %i) {
  %a = getelementptr inbounds [8 x float], ptr addrspace(4) @tbl, i32 0, i32 %i
  %v = load float, ptr addrspace(4) %a
  store float %v, ptr addrspace(1) %p
  ret void
}
"""
_RELA = struct.Struct("<QQq")
_R_INFO_SYM_SHIFT = 32


@pytest.fixture(scope="module")
def gfx1100() -> AMDGPUCompiler:
    return AMDGPUCompiler("gfx1100", cache_dir="")


@pytest.fixture(scope="module")
def args_obj(gfx1100: AMDGPUCompiler) -> bytes:
    return gfx1100.compile(ARGS_KERNEL)


def test_descriptor_and_metadata_of_a_real_kernel(args_obj: bytes) -> None:
    co = load_code_object(args_obj, "gfx1100")
    assert (co.name, co.arch, co.target) == ("args", "gfx1100", "amdgcn-amd-amdhsa--gfx1100")
    kd, meta = co.descriptor, co.metadata
    assert kd.kernarg_size == meta.kernarg_segment_size == 24
    assert [(a.name, a.offset, a.size, a.value_kind, a.address_space) for a in meta.args] == [
        ("out", 0, 8, "global_buffer", "global"), ("in", 8, 8, "global_buffer", "global"),
        ("n", 16, 8, "by_value", None)]
    assert meta.max_flat_workgroup_size == 64 and meta.wavefront_size == 32 and kd.wave32
    assert kd.group_segment_fixed_size == meta.group_segment_fixed_size == 0
    assert meta.sgpr_count > 0 and meta.vgpr_count > 0
    # the CP loads the kernarg segment pointer (2 SGPRs) as user data; nothing else is asked for
    assert kd.kernel_code_properties & KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR
    assert not kd.kernel_code_properties & (KCP_ENABLE_SGPR_DISPATCH_PTR | KCP_ENABLE_SGPR_QUEUE_PTR)
    assert kd.user_sgpr_count >= 2 and not kd.private_segment
    # text first, descriptor in .rodata at a 64-byte boundary; the REL64 made the entry point at the code
    assert co.text_offset == 0 and co.entry_offset == co.text_offset
    assert co.kd_offset % 64 == 0 and co.kd_offset >= co.text_size
    assert co.kd_offset + kd.kernel_code_entry_byte_offset == co.entry_offset
    assert struct.unpack_from("<q", co.image, co.kd_offset + 16)[0] == -co.kd_offset
    # s_endpgm (SOPP opcode 0x30 on gfx11: 0xbfb00000) ends the kernel
    words = struct.unpack(f"<{len(co.text) // 4}I", co.text)
    assert 0xBFB00000 in words


def test_gfx942_object_is_wave64_and_refused_as_gfx1100() -> None:
    obj = AMDGPUCompiler("gfx942", cache_dir="").compile(ARGS_KERNEL)
    co = load_code_object(obj, "gfx942")
    assert not co.descriptor.wave32 and co.metadata.wavefront_size == 64 and co.arch == "gfx942"
    with pytest.raises(ElfError, match="not gfx1100"):
        load_code_object(obj, "gfx1100")
    with pytest.raises(ElfError, match="unknown AMD processor"):
        load_code_object(obj, "gfx9999")


def test_rel32_lo_hi_pairs_reach_the_constant_table(gfx1100: AMDGPUCompiler) -> None:
    obj = gfx1100.compile(TABLE_KERNEL)
    elf = ElfFile.parse(obj)
    kinds = {r.type for r in elf.relocations}
    assert {R_AMDGPU_REL32_LO, R_AMDGPU_REL32_HI, R_AMDGPU_REL64} <= kinds, kinds
    co = load_code_object(obj, "gfx1100")
    placed = co.section_offsets
    offsets = {i: placed[s.name] for i, s in enumerate(elf.sections) if s.name in placed}
    checked = 0
    for r in elf.relocations:
        if r.type not in (R_AMDGPU_REL32_LO, R_AMDGPU_REL32_HI):
            continue
        place = offsets[r.section_index] + r.offset
        value = offsets[r.symbol.section_index] + r.symbol.value + r.addend - place  # S + A - P
        want = value & 0xFFFFFFFF if r.type == R_AMDGPU_REL32_LO else (value >> 32) & 0xFFFFFFFF
        assert struct.unpack_from("<I", co.image, place)[0] == want
        checked += 1
    assert checked >= 2
    # the table's bytes are in the image where the relocations point
    table = struct.pack("<8f", *range(1, 9))
    assert table in co.image


# ----------------------------------------------------------------------------------------- bad objects
def _rela(obj: bytes, section: str) -> int:
    """File offset of the relocation entries of `section`."""
    sec = ElfFile.parse(obj).section(section)
    return sec.offset


def _patched(obj: bytes, at: int, fmt: str, value: int) -> bytes:
    data = bytearray(obj)
    struct.pack_into(fmt, data, at, value)
    return bytes(data)


def test_not_amdgpu_or_truncated_objects_are_refused(args_obj: bytes) -> None:
    host = LLVMCompiler(cache_dir="").compile("define i32 @f() {\n  ret i32 1\n}\n")
    with pytest.raises(ElfError, match="not an AMDGPU code object"):
        load_code_object(host)
    with pytest.raises(ElfError, match="truncated"):
        load_code_object(args_obj[:100])
    with pytest.raises(ElfError, match="OS ABI"):
        load_code_object(_patched(args_obj, 7, "<B", 0))  # EI_OSABI


def test_unknown_relocation_kind_is_refused(args_obj: bytes) -> None:
    at = _rela(args_obj, ".rela.rodata")
    _off, info, _add = _RELA.unpack_from(args_obj, at)
    abs64 = (info >> _R_INFO_SYM_SHIFT) << _R_INFO_SYM_SHIFT | 3  # R_AMDGPU_ABS64: not position independent
    with pytest.raises(ElfError, match="unsupported relocation type"):
        load_code_object(_patched(args_obj, at + 8, "<Q", abs64))


def test_relocation_field_past_its_section_is_refused(args_obj: bytes) -> None:
    at = _rela(args_obj, ".rela.rodata")
    size = ElfFile.parse(args_obj).section(".rodata").size
    with pytest.raises(ElfError, match="runs past"):
        load_code_object(_patched(args_obj, at, "<Q", size - 4))  # an 8-byte REL64 at the last 4 bytes


def test_descriptor_entry_must_match_the_kernel_symbol(args_obj: bytes) -> None:
    at = _rela(args_obj, ".rela.rodata")
    _off, _info, addend = _RELA.unpack_from(args_obj, at)
    with pytest.raises(ElfError, match="does not match the kernel symbol"):
        load_code_object(_patched(args_obj, at + 16, "<q", addend + 4))


def test_corrupt_metadata_note_is_refused(args_obj: bytes) -> None:
    note = ElfFile.parse(args_obj).section(".note")
    with pytest.raises(ElfError, match="runs past the section"):
        load_code_object(_patched(args_obj, note.offset + 4, "<I", 0xFFFFFF))  # descsz
    with pytest.raises(ElfError, match="NT_AMDGPU_METADATA"):
        load_code_object(_patched(args_obj, note.offset + 8, "<I", 1))  # note type


def test_kernel_choice_and_descriptor_size(args_obj: bytes) -> None:
    assert load_code_object(args_obj, kernel="args").name == "args"
    with pytest.raises(ElfError, match="no kernel 'other'"):
        load_code_object(args_obj, kernel="other")
    assert KD_SIZE == 64


# ----------------------------------------------------------------------------------------------- msgpack
def test_msgpack_reader_decodes_the_note_types() -> None:
    doc = (b"\x84" + b"\xa1a" + b"\x93\x01\xcc\xff\xcd\x01\x00" + b"\xa1b" + b"\xd9\x03xyz"
           + b"\xa1c" + b"\x82\xa1t\xc3\xa1f\xc2" + b"\xa1d" + b"\xd0\xfe")
    assert read_msgpack(doc) == {"a": [1, 255, 256], "b": "xyz", "c": {"t": True, "f": False}, "d": -2}
    assert read_msgpack(b"\xcf" + (2 ** 40).to_bytes(8, "big")) == 2 ** 40
    assert read_msgpack(b"\xff") == -1 and read_msgpack(b"\xc0") is None


@pytest.mark.parametrize("blob, message", [
    (b"\x91" * 40 + b"\x00", "deeper"),                 # nesting bomb
    (b"\xdd\xff\xff\xff\xff", "claims"),                # an array length far past the bytes there
    (b"\xa5ab", "runs past the end"),                   # truncated string
    (b"\x01\x02", "after the msgpack value"),           # trailing bytes
    (b"\x81\x01\x02", "not a string"),                  # non-string map key
    (b"\xc1", "unsupported msgpack type"),              # the one never-used tag
    (b"\xa2\xff\xfe", "not UTF-8"),
])
def test_msgpack_reader_refuses_malformed_input(blob: bytes, message: str) -> None:
    with pytest.raises(ElfError, match=message):
        read_msgpack(blob)
