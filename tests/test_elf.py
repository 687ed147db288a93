"""ELF parser / linker / loader: run LLVM-compiled code from our own loader, and check aarch64 patching."""

from __future__ import annotations

import platform
import random
import struct

import cffi
import numpy as np
import pytest

from rawgrad.compiler import elf as elfmod
from rawgrad.compiler.elf import ElfError, ElfFile, link, load
from rawgrad.compiler.toolchain import LLVMCompiler

ffi = cffi.FFI()
IS_X86_64 = platform.machine().lower() in ("x86_64", "amd64")
needs_x86_host = pytest.mark.skipif(not IS_X86_64, reason="executes x86-64 code")

AARCH64_TRIPLE = "aarch64-unknown-linux-gnu"
X86_64_TRIPLE = "x86_64-unknown-linux-gnu"
FAR_ADDRESS = 0x7F00_0000_1000  # a resolver answer far beyond +-2 GiB / +-128 MiB of the test bases


@pytest.fixture(scope="module")
def host() -> LLVMCompiler:
    return LLVMCompiler(cache_dir="")


def f32p(a: np.ndarray):
    return ffi.cast("float *", a.ctypes.data)


SUM_IR = r"""
define float @sum(ptr %a, i64 %n) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %s = phi float [0.0, %entry], [%s1, %loop]
  %p = getelementptr float, ptr %a, i64 %i
  %v = load float, ptr %p
  %s1 = fadd reassoc nsz arcp contract float %s, %v
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  %r = phi float [0.0, %entry], [%s1, %loop]
  ret float %r
}
"""

LIBM_IR = r"""
declare float @expf(float)
declare float @sinf(float)
define void @expsin(ptr %out, ptr %x, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %px = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %px
  %e = call float @expf(float %v)
  %s = call float @sinf(float %v)
  %r = fadd float %e, %s
  %po = getelementptr float, ptr %out, i64 %i
  store float %r, ptr %po
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""

TABLE_IR = r"""
@table = internal constant [8 x float] [float 1.0, float 2.0, float 3.0, float 4.0,
                                         float 5.0, float 6.0, float 7.0, float 8.0]
@counter = global i64 0
@bias = dso_local global float 0.5
define void @scale(ptr %out, ptr %x, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %k = and i64 %i, 7
  %pt = getelementptr [8 x float], ptr @table, i64 0, i64 %k
  %t = load float, ptr %pt
  %px = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %px
  %b = load float, ptr @bias
  %m = fmul float %v, %t
  %r = fadd float %m, %b
  %po = getelementptr float, ptr %out, i64 %i
  store float %r, ptr %po
  %i1 = add i64 %i, 1
  %c = icmp slt i64 %i1, %n
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
define i64 @bump() {
  %v = load i64, ptr @counter
  %w = add i64 %v, 1
  store i64 %w, ptr @counter
  ret i64 %w
}
"""

CALL_IR = r"""
define i64 @square_plus(i64 %x) noinline {
  %s = mul i64 %x, %x
  %r = add i64 %s, 7
  ret i64 %r
}
define i64 @twice(i64 %x) {
  %a = call i64 @square_plus(i64 %x)
  %b = call i64 @square_plus(i64 %a)
  ret i64 %b
}
"""

MEMCPY_IR = r"""
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
define void @copy_then_clear(ptr %dst, ptr %src, i64 %n, ptr %clr, i64 %m) {
  call void @llvm.memcpy.p0.p0.i64(ptr %dst, ptr %src, i64 %n, i1 false)
  call void @llvm.memset.p0.i64(ptr %clr, i8 0, i64 %m, i1 false)
  ret void
}
"""


# --------------------------------------------------------------------------------------------- execution
@needs_x86_host
@pytest.mark.parametrize("n", [0, 1, 7, 1003])
def test_sum_loop(host: LLVMCompiler, n: int) -> None:
    img = load(host.compile(SUM_IR))
    fn = ffi.cast("float(*)(float *, long)", img.symbol("sum"))
    a = np.random.default_rng(0).standard_normal(max(n, 1)).astype(np.float32)
    np.testing.assert_allclose(fn(f32p(a), n), a[:n].sum(dtype=np.float64), rtol=1e-4, atol=1e-4)
    img.close()


@needs_x86_host
@pytest.mark.parametrize("force_stubs", [False, True])
def test_libm_calls(host: LLVMCompiler, force_stubs: bool) -> None:
    img = load(host.compile(LIBM_IR), force_stubs=force_stubs)
    assert set(img.stubs) == {"expf", "sinf"}
    if force_stubs:
        assert img.used_stubs == {"expf", "sinf"}
    fn = ffi.cast("void(*)(float *, float *, long)", img.symbol("expsin"))
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    out = np.zeros_like(x)
    fn(f32p(out), f32p(x), x.size)
    np.testing.assert_allclose(out, np.exp(x) + np.sin(x), rtol=1e-5, atol=1e-6)
    img.close()


@needs_x86_host
def test_global_table_and_mutable_data(host: LLVMCompiler) -> None:
    obj = host.compile(TABLE_IR)
    kinds = {r.type for r in ElfFile.parse(obj).relocations}
    assert elfmod.R_X86_64_PC32 in kinds  # table / bias: PC-relative data references
    assert kinds & {elfmod.R_X86_64_REX_GOTPCRELX, elfmod.R_X86_64_GOTPCREL}  # counter: through the GOT
    img = load(obj)
    fn = ffi.cast("void(*)(float *, float *, long)", img.symbol("scale"))
    x = np.arange(37, dtype=np.float32)
    out = np.zeros_like(x)
    fn(f32p(out), f32p(x), x.size)
    np.testing.assert_allclose(out, x * (np.arange(37) % 8 + 1) + 0.5)
    bump = ffi.cast("long(*)(void)", img.symbol("bump"))
    assert [bump(), bump(), bump()] == [1, 2, 3]
    assert ffi.cast("long *", img.symbol("counter"))[0] == 3
    img.close()


@needs_x86_host
def test_internal_call(host: LLVMCompiler) -> None:
    with load(host.compile(CALL_IR)) as img:
        fn = ffi.cast("long(*)(long)", img.symbol("twice"))
        sq = lambda v: v * v + 7
        assert fn(3) == sq(sq(3))
        assert not img.used_stubs


@needs_x86_host
def test_memcpy_memset_from_libc(host: LLVMCompiler) -> None:
    with load(host.compile(MEMCPY_IR), force_stubs=True) as img:
        fn = ffi.cast("void(*)(void *, void *, long, void *, long)", img.symbol("copy_then_clear"))
        src = np.arange(1000, dtype=np.uint8)
        dst = np.zeros_like(src)
        clr = np.full(300, 9, dtype=np.uint8)
        fn(ffi.cast("void *", dst.ctypes.data), ffi.cast("void *", src.ctypes.data), 1000,
           ffi.cast("void *", clr.ctypes.data), 200)
        np.testing.assert_array_equal(dst, src)
        assert (clr[:200] == 0).all() and (clr[200:] == 9).all()


@needs_x86_host
def test_custom_resolver_callback(host: LLVMCompiler) -> None:
    ir = "declare float @my_hook(float)\n" \
         "define float @use(float %x) {\n  %y = call float @my_hook(float %x)\n  ret float %y\n}\n"
    cb = ffi.callback("float(float)", lambda v: v * 10 + 1)
    addr = int(ffi.cast("uintptr_t", cb))
    asked: list[str] = []

    def resolve(name: str) -> int:
        asked.append(name)
        return addr if name == "my_hook" else 0

    with load(host.compile(ir), resolve=resolve) as img:
        assert ffi.cast("float(*)(float)", img.symbol("use"))(2.0) == 21.0
    assert asked == ["my_hook"]


@needs_x86_host
def test_protections_are_w_xor_x(host: LLVMCompiler) -> None:
    img = load(host.compile(TABLE_IR))
    perms = {}
    with open("/proc/self/maps") as f:
        for line in f:
            rng, mode = line.split()[:2]
            lo, hi = (int(v, 16) for v in rng.split("-"))
            if img.base <= lo < img.base + img.size:
                perms[lo - img.base] = mode[:3]
    assert "r-x" in perms.values() and "rw-" in perms.values()
    assert all(not ("w" in m and "x" in m) for m in perms.values())
    text = img.section_addresses[".text"] - img.base
    assert perms[max(o for o in perms if o <= text)] == "r-x"
    img.close()


# ------------------------------------------------------------------------------------------ error paths
@needs_x86_host
def test_unknown_external_symbol(host: LLVMCompiler) -> None:
    ir = "declare void @rawgrad_no_such_function_xyz()\n" \
         "define void @f() {\n  call void @rawgrad_no_such_function_xyz()\n  ret void\n}\n"
    with pytest.raises(ElfError, match="rawgrad_no_such_function_xyz"):
        load(host.compile(ir))


@needs_x86_host
def test_missing_symbol_lookup_and_close_twice(host: LLVMCompiler) -> None:
    img = load(host.compile(CALL_IR))
    with pytest.raises(ElfError, match=r"'nope'.*twice"):
        img.symbol("nope")
    img.close()
    img.close()
    assert img.closed
    with pytest.raises(ElfError, match="closed"):
        img.symbol("twice")


def test_parse_sections_and_symbols(host: LLVMCompiler) -> None:
    e = ElfFile.parse(host.compile(TABLE_IR))
    assert e.elf_type == elfmod.ET_REL
    text = e.section(".text")
    assert text.flags & elfmod.SHF_EXECINSTR and len(text.data) == text.size
    names = {s.name for s in e.symbols}
    assert {"scale", "bump", "counter", "table"} <= names
    with pytest.raises(ElfError, match=r"no section '\.nope'.*\.text"):
        e.section(".nope")


def test_parser_rejects_truncated_and_garbage(host: LLVMCompiler) -> None:
    obj = host.compile(TABLE_IR)
    for cut in (0, 3, 20, 63, len(obj) // 2, len(obj) - 1):
        with pytest.raises(ElfError):
            ElfFile.parse(obj[:cut])
    for garbage in (b"hello world" * 10, bytes(200), b"\x7fELF" + bytes(100)):
        with pytest.raises(ElfError):
            ElfFile.parse(garbage)
    bad_class = bytearray(obj)
    bad_class[elfmod.EI_CLASS] = 1  # ELFCLASS32
    with pytest.raises(ElfError, match="class"):
        ElfFile.parse(bytes(bad_class))


def test_parser_fuzz_only_raises_elferror(host: LLVMCompiler) -> None:
    obj = host.compile(CALL_IR)
    shoff = struct.unpack_from("<Q", obj, 0x28)[0]  # e_shoff (ELF-64 header layout)
    rng = random.Random(1234)
    for _ in range(300):
        data = bytearray(obj)
        for _ in range(rng.randint(1, 4)):
            # hit the header and the section header table, where offsets and sizes live
            pos = rng.choice([rng.randrange(64), rng.randrange(shoff, len(obj))])
            data[pos] = rng.randrange(256)
        try:
            ElfFile.parse(bytes(data))
        except ElfError:
            pass


def test_unknown_relocation_type(host: LLVMCompiler) -> None:
    obj = bytearray(host.compile(LIBM_IR))
    rela = ElfFile.parse(bytes(obj)).section(".rela.text")
    struct.pack_into("<I", obj, rela.offset + 8, 9999)  # low half of r_info of the first Elf64_Rela
    with pytest.raises(ElfError, match=r"relocation type 9999.*'\.text'"):
        link(bytes(obj), 0x400000, lambda name: FAR_ADDRESS)


def test_wrong_machine_and_cubin_like_parse(host: LLVMCompiler) -> None:
    obj = bytearray(host.compile(CALL_IR))
    struct.pack_into("<H", obj, 18, elfmod.EM_CUDA)  # e_machine at offset 18
    e = ElfFile.parse(bytes(obj))
    assert e.machine == elfmod.EM_CUDA
    with pytest.raises(ElfError, match="machine 190"):
        load(bytes(obj))
    with pytest.raises(ElfError, match="190"):
        link(e, 0x400000)


# ------------------------------------------------------------------------------ x86-64 patching (no run)
def test_x86_64_stub_for_far_call() -> None:
    comp = LLVMCompiler(triple=X86_64_TRIPLE, cpu="x86-64", features="", cache_dir="")
    e = ElfFile.parse(comp.compile(LIBM_IR))
    base = 0x400000
    li = link(e, base, lambda name: FAR_ADDRESS + (16 if name == "sinf" else 0))
    assert li.used_stubs == {"expf", "sinf"}
    for r in e.relocations:
        if r.type != elfmod.R_X86_64_PLT32:
            continue
        p = li.section_addresses[".text"] + r.offset
        disp = struct.unpack_from("<i", li.data, p - base)[0]
        stub = li.stubs[r.symbol.name]
        assert p + disp - r.addend == stub
        # jmp qword ptr [rip+0] ; .quad target
        assert li.data[stub - base:stub - base + 6] == bytes([0xFF, 0x25, 0, 0, 0, 0])
        target = struct.unpack_from("<Q", li.data, stub - base + 6)[0]
        assert target == FAR_ADDRESS + (16 if r.symbol.name == "sinf" else 0)
    near = link(e, base, lambda name: base + 0x100000)
    assert not near.used_stubs


# ----------------------------------------------------------------------- aarch64 patching (decode only)
A64_IR = r"""
@b8 = dso_local global i8 1, section ".data.b8"
@h16 = dso_local global i16 2, section ".data.h16"
@w32 = dso_local global i32 3, section ".data.w32"
@x64 = dso_local global i64 4, section ".data.x64"
@q128 = dso_local global <4 x float> <float 1.0, float 2.0, float 3.0, float 4.0>, section ".data.q128"
@tab = internal constant [4 x i32] [i32 10, i32 20, i32 30, i32 40]
@ext_data = external global i64
@ptrs = global [2 x ptr] [ptr @w32, ptr @near_fn]
@rel = global i32 trunc (i64 sub (i64 ptrtoint (ptr @x64 to i64), i64 ptrtoint (ptr @rel to i64)) to i32)
declare i64 @near_fn(i64)
declare i64 @far_fn(i64)
define i64 @helper(i64 %x) noinline {
  %y = mul i64 %x, 3
  ret i64 %y
}
define i64 @entry(i64 %x, ptr %out) {
  %a = load volatile i8, ptr @b8
  %b = load volatile i16, ptr @h16
  %c = load volatile i32, ptr @w32
  %d = load volatile i64, ptr @x64
  %v = load volatile <4 x float>, ptr @q128
  store volatile <4 x float> %v, ptr %out
  %e = load i64, ptr @ext_data
  %t = getelementptr [4 x i32], ptr @tab, i64 0, i64 %x
  %tv = load i32, ptr %t
  %a1 = zext i8 %a to i64
  %b1 = zext i16 %b to i64
  %c1 = zext i32 %c to i64
  %tv1 = zext i32 %tv to i64
  %s1 = add i64 %a1, %b1
  %s2 = add i64 %s1, %c1
  %s3 = add i64 %s2, %d
  %s4 = add i64 %s3, %e
  %s5 = add i64 %s4, %tv1
  %h = call i64 @helper(i64 %s5)
  %n = call i64 @near_fn(i64 %h)
  %f = call i64 @far_fn(i64 %n)
  %r = tail call i64 @far_fn(i64 %f)
  ret i64 %r
}
"""
A64_BASE = 0x1234_5000
A64_EXTERNALS = {"near_fn": A64_BASE + 0x10_0000, "far_fn": FAR_ADDRESS, "ext_data": 0x5555_0000_1238}


def _sext(v: int, bits: int) -> int:
    return v - (1 << bits) if v & (1 << (bits - 1)) else v


def _page(v: int) -> int:
    return v & ~0xFFF


class _A64Check:
    """Decode patched aarch64 fields (Arm ARM A64 encodings) and compare with AAELF64 formulas."""

    def __init__(self, e: ElfFile, li: elfmod.LinkedImage) -> None:
        self.e, self.li = e, li

    def s(self, sym: elfmod.ElfSymbol) -> int:
        if sym.section_index == elfmod.SHN_UNDEF:
            return A64_EXTERNALS[sym.name]
        return self.li.section_addresses[self.e.sections[sym.section_index].name] + sym.value

    def place(self, r: elfmod.ElfReloc) -> int:
        return self.li.section_addresses[self.e.sections[r.section_index].name] + r.offset

    def word(self, addr: int) -> int:
        return struct.unpack_from("<I", self.li.data, addr - self.li.base)[0]

    def quad(self, addr: int) -> int:
        return struct.unpack_from("<Q", self.li.data, addr - self.li.base)[0]

    def adrp_delta(self, insn: int) -> int:
        assert insn & 0x9F000000 == 0x90000000, f"not ADRP: {insn:#x}"
        imm = ((insn >> 5) & 0x7FFFF) << 2 | (insn >> 29) & 3
        return _sext(imm, 21) << 12

    def ldst_offset(self, insn: int) -> int:
        """Byte offset of LDR/STR (unsigned immediate): imm12 scaled by the access size from size/V/opc."""
        size, vector, opc = insn >> 30, (insn >> 26) & 1, (insn >> 22) & 3
        scale = 4 if vector and size == 0 and opc & 2 else size
        return ((insn >> 10) & 0xFFF) << scale


def _a64_link(**kw) -> tuple[ElfFile, elfmod.LinkedImage, _A64Check]:
    comp = LLVMCompiler(triple=AARCH64_TRIPLE, cache_dir="", **kw)
    e = ElfFile.parse(comp.compile(A64_IR))
    assert e.machine == elfmod.EM_AARCH64
    li = link(e, A64_BASE, A64_EXTERNALS.__getitem__)
    return e, li, _A64Check(e, li)


def test_aarch64_pic_relocations() -> None:
    e, li, c = _a64_link()
    seen: set[int] = set()
    got_pages: dict[str, int] = {}
    for r in e.relocations:
        if r.section_index not in {s.index for s in e.sections if s.flags & elfmod.SHF_ALLOC}:
            continue
        p, sa = c.place(r), c.s(r.symbol) + r.addend
        t = r.type
        seen.add(t)
        if t == elfmod.R_AARCH64_ABS64:
            assert c.quad(p) == sa
        elif t == elfmod.R_AARCH64_PREL32:
            assert _sext(c.word(p), 32) == sa - p
        elif t == elfmod.R_AARCH64_PREL64:
            assert c.quad(p) == (sa - p) & (2**64 - 1)
        elif t == elfmod.R_AARCH64_ADR_PREL_PG_HI21:
            assert c.adrp_delta(c.word(p)) == _page(sa) - _page(p)
        elif t == elfmod.R_AARCH64_ADD_ABS_LO12_NC:
            insn = c.word(p)
            assert insn & 0x7F800000 == 0x11000000, "ADD (immediate) opcode preserved"
            assert (insn >> 10) & 0xFFF == sa & 0xFFF
        elif t in (elfmod.R_AARCH64_LDST8_ABS_LO12_NC, elfmod.R_AARCH64_LDST16_ABS_LO12_NC,
                   elfmod.R_AARCH64_LDST32_ABS_LO12_NC, elfmod.R_AARCH64_LDST64_ABS_LO12_NC,
                   elfmod.R_AARCH64_LDST128_ABS_LO12_NC):
            assert c.ldst_offset(c.word(p)) == sa & 0xFFF
            assert sa % {278: 1, 284: 2, 285: 4, 286: 8, 299: 16}[t] == 0  # AAELF64 type numbers
        elif t in (elfmod.R_AARCH64_CALL26, elfmod.R_AARCH64_JUMP26):
            insn = c.word(p)
            assert insn & 0x7C000000 == 0x14000000, "B/BL opcode preserved"
            assert bool(insn & 0x80000000) == (t == elfmod.R_AARCH64_CALL26)
            target = p + (_sext(insn & 0x3FFFFFF, 26) << 2)
            if r.symbol.name == "far_fn":  # out of +-128 MiB: must land on the veneer
                assert target == li.stubs["far_fn"]
                assert c.word(target) == 0x58000050  # LDR X16, #8
                assert c.word(target + 4) == 0xD61F0200  # BR X16
                assert c.quad(target + 8) == FAR_ADDRESS
            else:
                assert target == sa
        elif t == elfmod.R_AARCH64_ADR_GOT_PAGE:
            got_pages[r.symbol.name] = _page(p) + c.adrp_delta(c.word(p))
        elif t == elfmod.R_AARCH64_LD64_GOT_LO12_NC:
            slot = got_pages[r.symbol.name] + c.ldst_offset(c.word(p))
            assert c.quad(slot) == sa
            assert li.base <= slot < li.base + len(li.data)
        else:
            raise AssertionError(f"test does not check relocation type {t}")
    expected = {elfmod.R_AARCH64_ABS64, elfmod.R_AARCH64_PREL32, elfmod.R_AARCH64_ADR_PREL_PG_HI21,
                elfmod.R_AARCH64_ADD_ABS_LO12_NC, elfmod.R_AARCH64_LDST8_ABS_LO12_NC,
                elfmod.R_AARCH64_LDST16_ABS_LO12_NC, elfmod.R_AARCH64_LDST32_ABS_LO12_NC,
                elfmod.R_AARCH64_LDST64_ABS_LO12_NC, elfmod.R_AARCH64_LDST128_ABS_LO12_NC,
                elfmod.R_AARCH64_CALL26, elfmod.R_AARCH64_JUMP26, elfmod.R_AARCH64_ADR_GOT_PAGE,
                elfmod.R_AARCH64_LD64_GOT_LO12_NC}
    assert expected <= seen, f"missing: {expected - seen}"
    assert li.used_stubs == {"far_fn"}
    assert "$x" not in li.symbols and {"entry", "helper", "ptrs"} <= set(li.symbols)


def test_aarch64_movw_large_code_model() -> None:
    e, li, c = _a64_link(reloc="static", code_model="large")
    groups = set()
    for r in e.relocations:
        if r.type not in elfmod._AARCH64_MOVW:
            continue
        insn = c.word(c.place(r))
        assert insn & 0x1F800000 == 0x12800000, f"MOVZ/MOVK opcode preserved: {insn:#x}"
        hw = (insn >> 21) & 3  # the instruction's own shift field picks the 16-bit group
        groups.add(hw)
        assert (insn >> 5) & 0xFFFF == ((c.s(r.symbol) + r.addend) >> (16 * hw)) & 0xFFFF
    assert groups == {0, 1, 2, 3}


def test_aarch64_call26_overflow_without_stub_is_an_error() -> None:
    e, li, _ = _a64_link()
    assert li.symbols["helper"] >= A64_BASE
    # A defined callee never gets a stub: move it 1 GiB away (an absolute symbol) and expect a clear error.
    far_helper = elfmod.ElfSymbol("helper", 1 << 30, 0, elfmod.STT_FUNC, elfmod.STB_GLOBAL, elfmod.SHN_ABS)
    far = [elfmod.ElfReloc(r.section_index, r.offset, r.type, far_helper, r.addend)
           for r in e.relocations if r.symbol.name == "helper"]
    assert far and far[0].type == elfmod.R_AARCH64_CALL26
    forged = ElfFile(e.machine, e.elf_type, e.flags, e.entry, e.sections, e.symbols, far)
    with pytest.raises(ElfError, match="CALL26.*overflows"):
        link(forged, A64_BASE)


def test_split_package_keeps_one_api() -> None:
    # compiler.elf is a package now (parse / link / host / load); every name callers used is still there and
    # is the same object as in its stage module, so isinstance checks and error handling keep working
    import importlib
    stage = {name: importlib.import_module(f"rawgrad.compiler.elf.{name}") for name in ("consts", "parse",
                                                                                        "link", "load")}
    assert elfmod.ElfFile is stage["parse"].ElfFile and elfmod.ElfError is stage["consts"].ElfError
    assert elfmod.link is stage["link"].link and elfmod.load is stage["load"].load
    assert elfmod.LinkedImage is stage["link"].LinkedImage and elfmod.LoadedImage is stage["load"].LoadedImage
    for name in ("R_AARCH64_CALL26", "R_X86_64_PLT32", "EM_CUDA", "EM_AMDGPU", "SHT_RELA", "SHF_ALLOC",
                 "ELF_MAGIC", "_AARCH64_MOVW"):
        assert hasattr(elfmod, name), name
    with pytest.raises(ElfError, match="not an ELF file"):
        ElfFile.parse(b"\0" * 64)
