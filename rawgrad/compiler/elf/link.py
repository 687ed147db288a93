"""Lay out a relocatable object for a chosen base address and apply its relocations (pure Python).

Works for any supported machine (x86-64, aarch64), which is how the aarch64 relocations are tested on an
x86-64 host. The layout, the call stubs and the GOT are described in ``rawgrad.compiler.elf``'s docstring.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass

from rawgrad.compiler.elf.consts import (
    EM_AARCH64,
    EM_X86_64,
    ET_REL,
    R_AARCH64_ABS32,
    R_AARCH64_ABS64,
    R_AARCH64_ADD_ABS_LO12_NC,
    R_AARCH64_ADR_GOT_PAGE,
    R_AARCH64_ADR_PREL_LO21,
    R_AARCH64_ADR_PREL_PG_HI21,
    R_AARCH64_ADR_PREL_PG_HI21_NC,
    R_AARCH64_CALL26,
    R_AARCH64_CONDBR19,
    R_AARCH64_JUMP26,
    R_AARCH64_LD64_GOT_LO12_NC,
    R_AARCH64_LDST8_ABS_LO12_NC,
    R_AARCH64_LDST16_ABS_LO12_NC,
    R_AARCH64_LDST32_ABS_LO12_NC,
    R_AARCH64_LDST64_ABS_LO12_NC,
    R_AARCH64_LDST128_ABS_LO12_NC,
    R_AARCH64_MOVW_UABS_G0,
    R_AARCH64_MOVW_UABS_G0_NC,
    R_AARCH64_MOVW_UABS_G1,
    R_AARCH64_MOVW_UABS_G1_NC,
    R_AARCH64_MOVW_UABS_G2,
    R_AARCH64_MOVW_UABS_G2_NC,
    R_AARCH64_MOVW_UABS_G3,
    R_AARCH64_NONE,
    R_AARCH64_PREL32,
    R_AARCH64_PREL64,
    R_AARCH64_TSTBR14,
    R_X86_64_32,
    R_X86_64_32S,
    R_X86_64_64,
    R_X86_64_GOTOFF64,
    R_X86_64_GOTPC32,
    R_X86_64_GOTPC64,
    R_X86_64_GOTPCREL,
    R_X86_64_GOTPCRELX,
    R_X86_64_NONE,
    R_X86_64_PC32,
    R_X86_64_PC64,
    R_X86_64_PLT32,
    R_X86_64_REX_GOTPCRELX,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHF_TLS,
    SHF_WRITE,
    SHN_ABS,
    SHN_COMMON,
    SHN_LORESERVE,
    SHN_UNDEF,
    SHT_NOBITS,
    STB_GLOBAL,
    STB_LOCAL,
    STB_WEAK,
    STT_FILE,
    STT_FUNC,
    STT_SECTION,
    ElfError,
)
from rawgrad.compiler.elf.host import process_symbol
from rawgrad.compiler.elf.parse import ElfFile, ElfReloc, ElfSection, ElfSymbol

# aarch64 LDST*_ABS_LO12_NC: the 12-bit offset is scaled by the access size (log2 bytes), AAELF64.
_AARCH64_LDST_SHIFT = {R_AARCH64_LDST8_ABS_LO12_NC: 0, R_AARCH64_LDST16_ABS_LO12_NC: 1,
                       R_AARCH64_LDST32_ABS_LO12_NC: 2, R_AARCH64_LDST64_ABS_LO12_NC: 3,
                       R_AARCH64_LDST128_ABS_LO12_NC: 4}
# aarch64 MOVW_UABS_Gn: (relocation type) -> (group n, overflow-checked?), AAELF64.
_AARCH64_MOVW = {R_AARCH64_MOVW_UABS_G0: (0, True), R_AARCH64_MOVW_UABS_G0_NC: (0, False),
                 R_AARCH64_MOVW_UABS_G1: (1, True), R_AARCH64_MOVW_UABS_G1_NC: (1, False),
                 R_AARCH64_MOVW_UABS_G2: (2, True), R_AARCH64_MOVW_UABS_G2_NC: (2, False),
                 R_AARCH64_MOVW_UABS_G3: (3, False)}

_GOT_RELOCS = {EM_X86_64: {R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX},
               EM_AARCH64: {R_AARCH64_ADR_GOT_PAGE, R_AARCH64_LD64_GOT_LO12_NC}}
_GOT_BASE_RELOCS = {R_X86_64_GOTOFF64, R_X86_64_GOTPC32, R_X86_64_GOTPC64}  # need the GOT's address only
# Relocations that patch 8 bytes (psABI / AAELF64 field widths).
_WIDE_RELOCS = {EM_X86_64: {R_X86_64_64, R_X86_64_PC64, R_X86_64_GOTOFF64, R_X86_64_GOTPC64},
                EM_AARCH64: {R_AARCH64_ABS64, R_AARCH64_PREL64}}
_CALL_RELOCS = {EM_X86_64: {R_X86_64_PLT32}, EM_AARCH64: {R_AARCH64_CALL26, R_AARCH64_JUMP26}}

# Instruction-field facts used by the aarch64 relocations (Arm ARM, A64 encodings).
_A64_PAGE_SHIFT = 12  # ADRP works on 4 KiB pages
_A64_IMM12_SHIFT = 10  # ADD/LDR (unsigned immediate): imm12 in bits [21:10]
_A64_IMM12_MASK = 0xFFF
_A64_IMM16_SHIFT = 5  # MOVZ/MOVK: imm16 in bits [20:5]
_A64_IMM16_MASK = 0xFFFF
_A64_IMM26_MASK = 0x3FFFFFF  # B/BL: imm26 in bits [25:0], word offset
_A64_IMM19_SHIFT = 5  # B.cond/CBZ: imm19 in bits [23:5]
_A64_IMM19_MASK = 0x7FFFF
_A64_IMM14_SHIFT = 5  # TBZ/TBNZ: imm14 in bits [18:5]
_A64_IMM14_MASK = 0x3FFF
_A64_ADR_IMMLO_SHIFT = 29  # ADR/ADRP: immlo in bits [30:29], immhi in bits [23:5]
_A64_ADR_IMMLO_MASK = 0x3
_A64_ADR_IMMHI_SHIFT = 5
_A64_ADR_IMMHI_MASK = 0x7FFFF
_A64_INSN_SHIFT = 2  # branch offsets count 4-byte instructions

# Call stubs. x86-64: FF /4 is JMP r/m64; ModRM 0x25 selects [RIP+disp32] (Intel SDM vol. 2, "JMP" and
# "RIP-Relative Addressing"); disp32 = 0 so the 8-byte target follows the instruction.
_X86_STUB_CODE = bytes([0xFF, 0x25, 0, 0, 0, 0])
# aarch64: LDR X16, #8 (LDR literal 64-bit, opcode 0x58000000, imm19=2 words, Rt=16) then BR X16
# (0xD61F0000 | Rn << 5 with Rn=16), Arm ARM A64 encodings; the 8-byte target follows.
_A64_STUB_CODE = struct.pack("<II", 0x58000000 | (2 << 5) | 16, 0xD61F0000 | (16 << 5))
_STUB_SIZE = 16  # either stub (code + 8-byte literal) rounded up to 16 bytes
_STUB_ALIGN = 16
_GOT_SLOT = 8  # one 64-bit address per GOT entry
# The small code model reaches everything in the image with 32-bit PC-relative offsets (x86-64 psABI
# "Small code model"), so a larger image could not be relocated anyway.
MAX_IMAGE_SIZE = 1 << 31
_U64 = (1 << 64) - 1

# AAELF64 mapping symbols ($x code, $d data) mark instruction/data ranges; they are not real symbols.
_MAPPING_SYMBOL_PREFIX = "$"

_INT32 = (-(1 << 31), (1 << 31) - 1)
_UINT32 = (0, (1 << 32) - 1)
_ANY32 = (-(1 << 31), (1 << 32) - 1)  # AAELF64 32-bit data relocations accept signed or unsigned values


# ---------------------------------------------------------------------------------------------------------
# Linker (pure Python: layout + relocation for a chosen base address)
# ---------------------------------------------------------------------------------------------------------
def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


@dataclass
class LinkedImage:
    """A relocated image for ``base``: bytes to place there, symbol addresses and page protections."""

    base: int
    size: int  # bytes of address space the image spans (``data`` may be shorter: the rest is zero)
    data: bytearray
    symbols: dict[str, int]
    section_addresses: dict[str, int]
    segments: list[tuple[int, int, int]]  # (offset, size, mmap.PROT_* flags), page aligned
    stubs: dict[str, int]  # external name -> stub address (only stubs that were reserved)
    used_stubs: set[str]  # names whose calls actually went through the stub


class _Layout:
    """Where every loaded section, stub, GOT slot and COMMON symbol lives (independent of the base)."""

    def __init__(self, elf: ElfFile, page_size: int) -> None:
        if elf.elf_type != ET_REL:
            raise ElfError(f"can only link relocatable objects (ET_REL={ET_REL}), got e_type {elf.elf_type}")
        if elf.machine not in _CALL_RELOCS:
            raise ElfError(f"cannot link ELF machine {elf.machine} (supported: x86-64={EM_X86_64}, "
                           f"aarch64={EM_AARCH64})")
        self.elf = elf
        self.page_size = page_size
        self.offsets: dict[int, int] = {}  # section index -> image offset
        loaded = [s for s in elf.sections if s.flags & SHF_ALLOC]
        for s in loaded:
            if s.flags & SHF_TLS:
                raise ElfError(f"thread-local section {s.name!r} is not supported by the loader")
            if max(s.align, 1) > page_size:
                raise ElfError(f"section {s.name!r} wants {s.align}-byte alignment, more than a page "
                               f"({page_size})")
        call_types, got_types = _CALL_RELOCS[elf.machine], _GOT_RELOCS[elf.machine]
        stub_names: list[str] = []
        got_keys: list[tuple[ElfSymbol, int]] = []
        self.needs_got = False
        for r in elf.relocations:
            external = r.symbol.section_index == SHN_UNDEF
            if r.type in call_types and external and r.symbol.name not in stub_names:
                stub_names.append(r.symbol.name)
            if r.type in got_types:
                key = self.got_key(r)
                if key not in got_keys:
                    got_keys.append(key)
            if r.type in _GOT_BASE_RELOCS and elf.machine == EM_X86_64:
                self.needs_got = True

        off = 0
        segments: list[tuple[int, int, int]] = []

        def place(secs: list[ElfSection]) -> None:
            nonlocal off
            for s in secs:
                off = _align_up(off, max(s.align, 1))
                self.offsets[s.index] = off
                off += s.size

        def close_segment(start: int, prot: int) -> int:
            nonlocal off
            off = _align_up(off, page_size)
            if off > start:
                segments.append((start, off - start, prot))
            return off

        exe = [s for s in loaded if s.flags & SHF_EXECINSTR]
        ro = [s for s in loaded if not s.flags & (SHF_EXECINSTR | SHF_WRITE)]
        rw = [s for s in loaded if s.flags & SHF_WRITE and not s.flags & SHF_EXECINSTR]
        place(exe)
        off = _align_up(off, _STUB_ALIGN)
        self.stub_offsets = {name: off + i * _STUB_SIZE for i, name in enumerate(stub_names)}
        off += len(stub_names) * _STUB_SIZE
        start = close_segment(0, mmap.PROT_READ | mmap.PROT_EXEC)
        place(ro)
        off = _align_up(off, _GOT_SLOT)
        self.got_offset = off
        self.got_slots = {key: off + i * _GOT_SLOT for i, key in enumerate(got_keys)}
        off += max(len(got_keys), 1 if self.needs_got else 0) * _GOT_SLOT
        start = close_segment(start, mmap.PROT_READ)
        place([s for s in rw if s.type != SHT_NOBITS])  # .bss last: it needs no bytes in the linked data
        self.data_size = off  # everything past this is zero-filled (.bss, COMMON) and never stored
        place([s for s in rw if s.type == SHT_NOBITS])
        self.common_offsets: dict[ElfSymbol, int] = {}
        for sym in elf.symbols:
            if sym.section_index == SHN_COMMON and sym not in self.common_offsets:
                if not 0 < sym.value <= page_size:
                    raise ElfError(f"COMMON symbol {sym.name!r} has invalid alignment {sym.value}")
                off = _align_up(off, max(sym.value, 1))  # gABI: st_value of a COMMON symbol is its alignment
                self.common_offsets[sym] = off
                off += sym.size
        close_segment(start, mmap.PROT_READ | mmap.PROT_WRITE)
        self.segments = segments
        if off > MAX_IMAGE_SIZE:
            raise ElfError(f"image would be {off} bytes, more than the {MAX_IMAGE_SIZE}-byte limit of the "
                           f"small code model")
        self.size = max(off, page_size)

    def got_key(self, r: ElfReloc) -> tuple[ElfSymbol, int]:
        # x86-64 GOTPCREL applies the addend to the PC-relative offset, aarch64 GDAT(S+A) to the slot value.
        return (r.symbol, r.addend if self.elf.machine == EM_AARCH64 else 0)


def _fits(value: int, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= value <= bounds[1]


class _Linker:
    def __init__(self, layout: _Layout, base: int, resolve: Callable[[str], int], force_stubs: bool) -> None:
        self.layout, self.base, self.resolve_ext, self.force_stubs = layout, base, resolve, force_stubs
        self.elf = layout.elf
        self.image = bytearray(layout.data_size)
        self.external: dict[str, int] = {}
        self.used_stubs: set[str] = set()
        for idx, off in layout.offsets.items():
            sec = self.elf.sections[idx]
            if sec.type != SHT_NOBITS:
                self.image[off:off + sec.size] = sec.data

    def external_address(self, sym: ElfSymbol) -> int:
        name = sym.name
        if name not in self.external:
            try:
                addr = self.resolve_ext(name)
            except (KeyError, LookupError, AttributeError) as e:
                raise ElfError(f"undefined symbol {name!r}: the resolver failed ({e})") from e
            if not addr:
                if sym.bind == STB_WEAK:
                    addr = 0  # gABI: an unresolved weak reference has the value zero
                else:
                    raise ElfError(f"undefined symbol {name!r}: not found by the resolver (C library + libm "
                                   f"when none is given)")
            self.external[name] = int(addr)
        return self.external[name]

    def symbol_address(self, sym: ElfSymbol) -> int:
        shndx = sym.section_index
        if shndx == SHN_UNDEF:
            return self.external_address(sym)
        if shndx == SHN_ABS:
            return sym.value
        if shndx == SHN_COMMON:
            return self.base + self.layout.common_offsets[sym]
        if shndx >= SHN_LORESERVE and shndx not in self.layout.offsets:
            raise ElfError(f"symbol {sym.name!r} has unsupported special section index {shndx:#x}")
        if shndx not in self.layout.offsets:
            name = self.elf.sections[shndx].name if shndx < len(self.elf.sections) else str(shndx)
            raise ElfError(f"symbol {sym.name!r} lives in section {name!r}, which is not loaded "
                           f"(not SHF_ALLOC)")
        return self.base + self.layout.offsets[shndx] + sym.value

    # --- patch helpers -------------------------------------------------------------------------------
    def _put(self, fmt: str, off: int, value: int) -> None:
        struct.pack_into(fmt, self.image, off, value)

    def _checked(self, value: int, bounds: tuple[int, int], r: ElfReloc, what: str) -> int:
        if not _fits(value, bounds):
            raise ElfError(f"relocation {what} (type {r.type}) at {self._where(r)} overflows: "
                           f"value {value:#x} is outside [{bounds[0]:#x}, {bounds[1]:#x}]")
        return value

    def _where(self, r: ElfReloc) -> str:
        return f"{self.elf.sections[r.section_index].name}+{r.offset:#x}"

    def _insn(self, off: int, mask: int, bits: int) -> None:
        insn = struct.unpack_from("<I", self.image, off)[0]
        struct.pack_into("<I", self.image, off, (insn & ~mask & 0xFFFFFFFF) | (bits & mask))

    # --- main ---------------------------------------------------------------------------------------
    def run(self) -> None:
        machine = self.elf.machine
        lay = self.layout
        for key, slot in lay.got_slots.items():
            sym, addend = key
            self._put("<Q", slot, (self.symbol_address(sym) + addend) & _U64)
        for name, off in lay.stub_offsets.items():
            code = _X86_STUB_CODE if machine == EM_X86_64 else _A64_STUB_CODE
            self.image[off:off + len(code)] = code
            self._put("<Q", off + len(code), self.external_address(ElfSymbol(name, 0, 0, STT_FUNC,
                                                                             STB_GLOBAL, SHN_UNDEF)))
        for r in self.elf.relocations:
            if r.section_index not in lay.offsets:
                continue  # patches a section we do not load (debug info, ...)
            if not r.explicit_addend:
                raise ElfError(f"SHT_REL relocations (implicit addends) are not supported for machine "
                               f"{machine}; "
                               f"x86-64 and aarch64 objects use SHT_RELA")
            sec = self.elf.sections[r.section_index]
            if sec.type == SHT_NOBITS:
                raise ElfError(f"relocation type {r.type} patches {sec.name!r}, which has no file data "
                               f"(NOBITS)")
            width = 8 if r.type in _WIDE_RELOCS[machine] else 4  # every other supported type patches 4 bytes
            if r.offset + width > max(sec.size, 0):
                raise ElfError(f"relocation type {r.type} at {self._where(r)} writes past the end of "
                               f"{sec.name!r} ({sec.size} bytes)")
            off = lay.offsets[r.section_index] + r.offset
            place = self.base + off
            if machine == EM_X86_64:
                self._x86_64(r, off, place)
            else:
                self._aarch64(r, off, place)

    def _call_target(self, r: ElfReloc, place: int, reach: tuple[int, int]) -> int:
        """S for a call, or the stub's address when S + A - P is out of reach (or stubs are forced)."""
        name = r.symbol.name
        if r.symbol.section_index != SHN_UNDEF or name not in self.layout.stub_offsets:
            return self.symbol_address(r.symbol)
        target = self.external_address(r.symbol)
        if not self.force_stubs and _fits(target + r.addend - place, reach):
            return target
        self.used_stubs.add(name)
        return self.base + self.layout.stub_offsets[name]

    def _x86_64(self, r: ElfReloc, off: int, p: int) -> None:
        t, a = r.type, r.addend
        if t == R_X86_64_NONE:
            return
        if t == R_X86_64_64:
            self._put("<Q", off, (self.symbol_address(r.symbol) + a) & _U64)
        elif t == R_X86_64_PC64:
            self._put("<Q", off, (self.symbol_address(r.symbol) + a - p) & _U64)
        elif t == R_X86_64_PC32:
            v = self._checked(self.symbol_address(r.symbol) + a - p, _INT32, r, "R_X86_64_PC32")
            self._put("<i", off, v)
        elif t == R_X86_64_PLT32:
            s = self._call_target(r, p, _INT32)
            self._put("<i", off, self._checked(s + a - p, _INT32, r, "R_X86_64_PLT32"))
        elif t == R_X86_64_32:
            self._put("<I", off, self._checked(self.symbol_address(r.symbol) + a, _UINT32, r, "R_X86_64_32"))
        elif t == R_X86_64_32S:
            self._put("<i", off, self._checked(self.symbol_address(r.symbol) + a, _INT32, r, "R_X86_64_32S"))
        elif t in _GOT_RELOCS[EM_X86_64]:
            slot = self.base + self.layout.got_slots[self.layout.got_key(r)]
            self._put("<i", off, self._checked(slot + a - p, _INT32, r, "R_X86_64_GOTPCREL*"))
        elif t == R_X86_64_GOTOFF64:
            got = self.base + self.layout.got_offset
            self._put("<Q", off, (self.symbol_address(r.symbol) + a - got) & _U64)
        elif t == R_X86_64_GOTPC32:
            got = self.base + self.layout.got_offset
            self._put("<i", off, self._checked(got + a - p, _INT32, r, "R_X86_64_GOTPC32"))
        elif t == R_X86_64_GOTPC64:
            self._put("<Q", off, (self.base + self.layout.got_offset + a - p) & _U64)
        else:
            self._unknown(r)

    def _unknown(self, r: ElfReloc) -> None:
        raise ElfError(f"unsupported relocation type {r.type} for machine {self.elf.machine} in section "
                       f"{self.elf.sections[r.section_index].name!r} (offset {r.offset:#x}, symbol "
                       f"{r.symbol.name!r})")

    def _a64_adr(self, off: int, value: int) -> None:
        """Write a 21-bit ADR/ADRP immediate (immlo in [30:29], immhi in [23:5])."""
        lo = (value & _A64_ADR_IMMLO_MASK) << _A64_ADR_IMMLO_SHIFT
        hi = ((value >> 2) & _A64_ADR_IMMHI_MASK) << _A64_ADR_IMMHI_SHIFT
        mask = (_A64_ADR_IMMLO_MASK << _A64_ADR_IMMLO_SHIFT) | (_A64_ADR_IMMHI_MASK << _A64_ADR_IMMHI_SHIFT)
        self._insn(off, mask, lo | hi)

    def _a64_imm12(self, off: int, value: int) -> None:
        self._insn(off, _A64_IMM12_MASK << _A64_IMM12_SHIFT, (value & _A64_IMM12_MASK) << _A64_IMM12_SHIFT)

    def _aarch64(self, r: ElfReloc, off: int, p: int) -> None:
        t, a = r.type, r.addend
        page = ~((1 << _A64_PAGE_SHIFT) - 1)
        adrp_reach = (-(1 << 32), (1 << 32) - 1)  # AAELF64: -2^32 <= X < 2^32 for ADR_PREL_PG_HI21
        if t == R_AARCH64_NONE:
            return
        if t == R_AARCH64_ABS64:
            self._put("<Q", off, (self.symbol_address(r.symbol) + a) & _U64)
        elif t == R_AARCH64_ABS32:
            v = self._checked(self.symbol_address(r.symbol) + a, _ANY32, r, "R_AARCH64_ABS32")
            self._put("<I", off, v & _UINT32[1])
        elif t == R_AARCH64_PREL64:
            self._put("<Q", off, (self.symbol_address(r.symbol) + a - p) & _U64)
        elif t == R_AARCH64_PREL32:
            v = self._checked(self.symbol_address(r.symbol) + a - p, _ANY32, r, "R_AARCH64_PREL32")
            self._put("<I", off, v & _UINT32[1])
        elif t in _AARCH64_MOVW:
            group, check = _AARCH64_MOVW[t]
            v = self.symbol_address(r.symbol) + a
            if check:
                self._checked(v, (0, (1 << (16 * (group + 1))) - 1), r, f"R_AARCH64_MOVW_UABS_G{group}")
            imm = (v >> (16 * group)) & _A64_IMM16_MASK
            self._insn(off, _A64_IMM16_MASK << _A64_IMM16_SHIFT, imm << _A64_IMM16_SHIFT)
        elif t in (R_AARCH64_ADR_PREL_PG_HI21, R_AARCH64_ADR_PREL_PG_HI21_NC):
            v = ((self.symbol_address(r.symbol) + a) & page) - (p & page)
            if t == R_AARCH64_ADR_PREL_PG_HI21:
                self._checked(v, adrp_reach, r, "R_AARCH64_ADR_PREL_PG_HI21")
            self._a64_adr(off, v >> _A64_PAGE_SHIFT)
        elif t == R_AARCH64_ADR_PREL_LO21:
            v = self._checked(self.symbol_address(r.symbol) + a - p, (-(1 << 20), (1 << 20) - 1), r,
                              "R_AARCH64_ADR_PREL_LO21")
            self._a64_adr(off, v)
        elif t == R_AARCH64_ADD_ABS_LO12_NC:
            self._a64_imm12(off, self.symbol_address(r.symbol) + a)
        elif t in _AARCH64_LDST_SHIFT:
            lo12 = (self.symbol_address(r.symbol) + a) & _A64_IMM12_MASK
            self._a64_imm12(off, lo12 >> _AARCH64_LDST_SHIFT[t])
        elif t in (R_AARCH64_CALL26, R_AARCH64_JUMP26):
            reach = (-(1 << 27), (1 << 27) - 1)  # AAELF64: -2^27 <= X < 2^27 (+-128 MiB)
            v = self._checked(self._call_target(r, p, reach) + a - p, reach, r, "R_AARCH64_CALL26/JUMP26")
            self._insn(off, _A64_IMM26_MASK, v >> _A64_INSN_SHIFT)
        elif t == R_AARCH64_CONDBR19:
            v = self._checked(self.symbol_address(r.symbol) + a - p, (-(1 << 20), (1 << 20) - 1), r,
                              "R_AARCH64_CONDBR19")
            self._insn(off, _A64_IMM19_MASK << _A64_IMM19_SHIFT, (v >> _A64_INSN_SHIFT) << _A64_IMM19_SHIFT)
        elif t == R_AARCH64_TSTBR14:
            v = self._checked(self.symbol_address(r.symbol) + a - p, (-(1 << 15), (1 << 15) - 1), r,
                              "R_AARCH64_TSTBR14")
            self._insn(off, _A64_IMM14_MASK << _A64_IMM14_SHIFT, (v >> _A64_INSN_SHIFT) << _A64_IMM14_SHIFT)
        elif t == R_AARCH64_ADR_GOT_PAGE:
            slot = self.base + self.layout.got_slots[self.layout.got_key(r)]
            v = self._checked((slot & page) - (p & page), adrp_reach, r, "R_AARCH64_ADR_GOT_PAGE")
            self._a64_adr(off, v >> _A64_PAGE_SHIFT)
        elif t == R_AARCH64_LD64_GOT_LO12_NC:
            slot = self.base + self.layout.got_slots[self.layout.got_key(r)]
            self._a64_imm12(off, (slot & _A64_IMM12_MASK) >> 3)  # LDR Xt: offset scaled by 8 (log2 = 3)
        else:
            self._unknown(r)

    def symbol_table(self) -> dict[str, int]:
        out: dict[str, int] = {}
        locals_: dict[str, int] = {}
        for sym in self.elf.symbols:
            if not sym.name or sym.type in (STT_SECTION, STT_FILE) or sym.section_index == SHN_UNDEF:
                continue
            if sym.bind == STB_LOCAL and sym.name.startswith(_MAPPING_SYMBOL_PREFIX):
                continue
            special = sym.section_index in (SHN_ABS, SHN_COMMON)
            if sym.section_index not in self.layout.offsets and not special:
                continue
            (locals_ if sym.bind == STB_LOCAL else out)[sym.name] = self.symbol_address(sym)
        return {**locals_, **out}  # a global wins over a local of the same name


def link(obj: bytes | ElfFile, base: int, resolve: Callable[[str], int] | None = None, *,
         force_stubs: bool = False, page_size: int = mmap.PAGESIZE) -> LinkedImage:
    """Lay out and relocate a relocatable object as if placed at ``base`` (pure Python, any machine).

    ``resolve(name)`` returns the address of an undefined symbol (0 = not found); by default the C
    library and libm of this process are searched. ``force_stubs`` routes every external call through
    its stub even when the target is within reach (tests use it).
    """
    elf = obj if isinstance(obj, ElfFile) else ElfFile.parse(obj)
    layout = _Layout(elf, page_size)
    if base % page_size:
        raise ElfError(f"base {base:#x} is not aligned to the page size {page_size}")
    linker = _Linker(layout, base, resolve if resolve is not None else process_symbol, force_stubs)
    linker.run()
    sections = {elf.sections[i].name: base + off for i, off in layout.offsets.items()}
    stubs = {name: base + off for name, off in layout.stub_offsets.items()}
    return LinkedImage(base, layout.size, linker.image, linker.symbol_table(), sections, layout.segments,
                       stubs, linker.used_stubs)
