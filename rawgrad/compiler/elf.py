"""Our own ELF64 parser, linker and loader for relocatable objects (ET_REL).

``ElfFile.parse`` reads any ELF64 little-endian file (x86-64 and aarch64 objects, NVIDIA cubins, AMD code
objects) and bounds-checks every offset. ``link`` lays out a relocatable object for a given base address
and applies its relocations in pure Python (usable for any supported machine, which is how the aarch64
relocations are tested on an x86-64 host). ``load`` maps the linked image into executable memory of this
process.

Image layout (one anonymous mapping, each part page aligned so it can carry its own protection):

    [ executable sections | call stubs ]  [ read-only sections | GOT ]  [ writable sections | .bss | COMMON ]
                 R-X                                   R--                              RW-

W^X policy: the mapping is created read-write, filled and relocated, then each part is ``mprotect``-ed;
no page is ever writable and executable at the same time, and the GOT becomes read-only (like RELRO).

External calls (x86-64 ``R_X86_64_PLT32``, aarch64 ``CALL26``/``JUMP26`` against undefined symbols) go
straight to their target when it is within the instruction's reach and otherwise through a stub placed in
the executable part: x86-64 ``jmp qword ptr [rip+0]`` followed by the 64-bit target (no register is
clobbered), aarch64 ``ldr x16, #8; br x16`` followed by the target (x16 is the psABI's intra-procedure-call
scratch register, so a veneer may clobber it). GOT-relative relocations use 8-byte slots we build in the
read-only part.
"""

from __future__ import annotations

import mmap
import os
import platform
import struct
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from rawgrad import mappings

__all__ = ["ElfError", "ElfFile", "ElfReloc", "ElfSection", "ElfSymbol", "LinkedImage", "LoadedImage",
           "link", "load"]


class ElfError(Exception):
    """A malformed ELF file, or an object that cannot be linked/loaded (the message says why)."""


# ---------------------------------------------------------------------------------------------------------
# ELF constants (System V gABI, "ELF-64 Object File Format" and elf.h)
# ---------------------------------------------------------------------------------------------------------
ELF_MAGIC = b"\x7fELF"  # e_ident[EI_MAG0..3]
EI_CLASS = 4  # e_ident index of the file class
EI_DATA = 5  # e_ident index of the data encoding
EI_VERSION = 6  # e_ident index of the ELF version
ELFCLASS64 = 2  # e_ident[EI_CLASS] for 64-bit objects
ELFDATA2LSB = 1  # e_ident[EI_DATA] for little-endian
EV_CURRENT = 1  # the only ELF version

ET_REL = 1  # e_type: relocatable object
ET_EXEC = 2  # e_type: executable
ET_DYN = 3  # e_type: shared object

EM_X86_64 = 62  # e_machine: AMD x86-64
EM_AARCH64 = 183  # e_machine: ARM 64-bit
EM_CUDA = 190  # e_machine: NVIDIA CUDA (cubins)
EM_AMDGPU = 224  # e_machine: AMD GPU code objects

SHT_NULL = 0  # sh_type values (gABI)
SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_RELA = 4
SHT_DYNSYM = 11
SHT_NOBITS = 8
SHT_REL = 9
SHT_SYMTAB_SHNDX = 18

SHF_WRITE = 0x1  # sh_flags bits (gABI)
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
SHF_TLS = 0x400

SHN_UNDEF = 0  # special section indices (gABI)
SHN_LORESERVE = 0xFF00
SHN_ABS = 0xFFF1
SHN_COMMON = 0xFFF2
SHN_XINDEX = 0xFFFF

STB_LOCAL = 0  # symbol binding, high nibble of st_info (gABI)
STB_GLOBAL = 1
STB_WEAK = 2

STT_NOTYPE = 0  # symbol type, low nibble of st_info (gABI)
STT_OBJECT = 1
STT_FUNC = 2
STT_SECTION = 3
STT_FILE = 4
STT_TLS = 6

# Record layouts (ELF-64 Object File Format, little-endian).
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym
_RELA = struct.Struct("<QQq")  # Elf64_Rela
_REL = struct.Struct("<QQ")  # Elf64_Rel
_R_SYM_SHIFT = 32  # ELF64_R_SYM(info) = info >> 32
_R_TYPE_MASK = 0xFFFFFFFF  # ELF64_R_TYPE(info) = info & 0xffffffff
_ST_BIND_SHIFT = 4  # ELF64_ST_BIND(info) = info >> 4
_ST_TYPE_MASK = 0xF  # ELF64_ST_TYPE(info) = info & 0xf

# ---------------------------------------------------------------------------------------------------------
# Relocation types
# ---------------------------------------------------------------------------------------------------------
# x86-64 psABI, table "Relocation Types".
R_X86_64_NONE = 0
R_X86_64_64 = 1
R_X86_64_PC32 = 2
R_X86_64_PLT32 = 4
R_X86_64_GOTPCREL = 9
R_X86_64_32 = 10
R_X86_64_32S = 11
R_X86_64_PC64 = 24
R_X86_64_GOTOFF64 = 25
R_X86_64_GOTPC32 = 26
R_X86_64_GOTPC64 = 29
R_X86_64_GOTPCRELX = 41
R_X86_64_REX_GOTPCRELX = 42

# ELF for the Arm 64-bit Architecture (AAELF64), section "Relocation codes".
R_AARCH64_NONE = 0
R_AARCH64_ABS64 = 257
R_AARCH64_ABS32 = 258
R_AARCH64_PREL64 = 260
R_AARCH64_PREL32 = 261
R_AARCH64_MOVW_UABS_G0 = 263
R_AARCH64_MOVW_UABS_G0_NC = 264
R_AARCH64_MOVW_UABS_G1 = 265
R_AARCH64_MOVW_UABS_G1_NC = 266
R_AARCH64_MOVW_UABS_G2 = 267
R_AARCH64_MOVW_UABS_G2_NC = 268
R_AARCH64_MOVW_UABS_G3 = 269
R_AARCH64_ADR_PREL_LO21 = 274
R_AARCH64_ADR_PREL_PG_HI21 = 275
R_AARCH64_ADR_PREL_PG_HI21_NC = 276
R_AARCH64_ADD_ABS_LO12_NC = 277
R_AARCH64_LDST8_ABS_LO12_NC = 278
R_AARCH64_TSTBR14 = 279
R_AARCH64_CONDBR19 = 280
R_AARCH64_JUMP26 = 282
R_AARCH64_CALL26 = 283
R_AARCH64_LDST16_ABS_LO12_NC = 284
R_AARCH64_LDST32_ABS_LO12_NC = 285
R_AARCH64_LDST64_ABS_LO12_NC = 286
R_AARCH64_LDST128_ABS_LO12_NC = 299
R_AARCH64_ADR_GOT_PAGE = 311
R_AARCH64_LD64_GOT_LO12_NC = 312

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
# Parser
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ElfSection:
    """One section header plus its bytes (empty for SHT_NOBITS)."""

    index: int
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class ElfSymbol:
    """One symbol-table entry; ``section_index`` is the resolved st_shndx (SHN_XINDEX expanded)."""

    name: str
    value: int
    size: int
    type: int
    bind: int
    section_index: int


@dataclass(frozen=True)
class ElfReloc:
    """One relocation: patch ``offset`` bytes into section ``section_index``.

    ``explicit_addend`` is False for SHT_REL entries, whose addend lives in the patched bytes (then
    ``addend`` is 0).
    """

    section_index: int
    offset: int
    type: int
    symbol: ElfSymbol
    addend: int
    explicit_addend: bool = True


def _unpack(st: struct.Struct, data: bytes, off: int, what: str) -> tuple:
    if off < 0 or off + st.size > len(data):
        raise ElfError(f"truncated ELF: {what} at offset {off:#x} (+{st.size}) is past the end "
                       f"({len(data)} bytes)")
    return st.unpack_from(data, off)


def _cstring(table: bytes, off: int, what: str) -> str:
    if not 0 <= off < len(table):
        if off == 0 and not table:
            return ""
        raise ElfError(f"corrupt ELF: {what} name offset {off:#x} is outside its string table "
                       f"({len(table)} bytes)")
    end = table.find(b"\0", off)
    if end < 0:
        raise ElfError(f"corrupt ELF: {what} name at offset {off:#x} is not NUL-terminated")
    return table[off:end].decode("utf-8", errors="replace")


class ElfFile:
    """A parsed ELF64 little-endian file: sections, the symbol table and all relocations."""

    machine: int
    elf_type: int
    flags: int
    entry: int
    sections: list[ElfSection]
    symbols: list[ElfSymbol]
    relocations: list[ElfReloc]

    def __init__(self, machine: int, elf_type: int, flags: int, entry: int, sections: list[ElfSection],
                 symbols: list[ElfSymbol], relocations: list[ElfReloc]) -> None:
        self.machine, self.elf_type, self.flags, self.entry = machine, elf_type, flags, entry
        self.sections, self.symbols, self.relocations = sections, symbols, relocations

    def __repr__(self) -> str:
        return (f"ElfFile(machine={self.machine}, type={self.elf_type}, sections={len(self.sections)}, "
                f"symbols={len(self.symbols)}, relocations={len(self.relocations)})")

    def section(self, name: str) -> ElfSection:
        """The first section called ``name``; ElfError listing the existing names when absent."""
        for s in self.sections:
            if s.name == name:
                return s
        names = ", ".join(s.name for s in self.sections if s.name)
        raise ElfError(f"ELF has no section {name!r} (sections: {names})")

    @staticmethod
    def parse(data: bytes) -> ElfFile:
        """Parse an ELF64 little-endian file; ElfError on truncated or corrupt input."""
        data = bytes(data)
        if len(data) < _EHDR.size:
            raise ElfError(f"truncated ELF: {len(data)} bytes is shorter than the {_EHDR.size}-byte "
                           f"ELF64 header")
        (ident, e_type, e_machine, e_version, e_entry, _phoff, e_shoff, e_flags, _ehsize, _phentsize, _phnum,
         e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(data, 0)
        if ident[:4] != ELF_MAGIC:
            raise ElfError(f"not an ELF file: magic is {ident[:4]!r}, expected {ELF_MAGIC!r}")
        if ident[EI_CLASS] != ELFCLASS64:
            raise ElfError(f"unsupported ELF class {ident[EI_CLASS]} (only ELFCLASS64={ELFCLASS64})")
        if ident[EI_DATA] != ELFDATA2LSB:
            raise ElfError(f"unsupported ELF data encoding {ident[EI_DATA]} (only little-endian)")
        # A cubin keeps its CUDA ELF ABI version in e_version (ptxas writes 0x81), so only the ident byte
        # is the ELF version there.
        if ident[EI_VERSION] != EV_CURRENT or (e_version != EV_CURRENT and e_machine != EM_CUDA):
            raise ElfError(f"unsupported ELF version {ident[EI_VERSION]}/{e_version}")

        raw = []
        if e_shoff:
            if e_shentsize != _SHDR.size:
                raise ElfError(f"corrupt ELF: e_shentsize is {e_shentsize}, expected {_SHDR.size}")
            first = _unpack(_SHDR, data, e_shoff, "section header 0")
            count = e_shnum if e_shnum else first[5]  # gABI: e_shnum == 0 -> count is section 0's sh_size
            if e_shstrndx == SHN_XINDEX:
                e_shstrndx = first[6]  # gABI: the real index is section 0's sh_link
            if e_shoff + count * _SHDR.size > len(data):
                raise ElfError(f"truncated ELF: {count} section headers at {e_shoff:#x} exceed "
                               f"{len(data)} bytes")
            raw = [_SHDR.unpack_from(data, e_shoff + i * _SHDR.size) for i in range(count)]

        def section_bytes(i: int) -> bytes:
            _n, sh_type, _f, _a, off, size = raw[i][:6]
            if sh_type in (SHT_NOBITS, SHT_NULL):
                return b""
            if off + size > len(data):
                raise ElfError(f"truncated ELF: section {i} data [{off:#x}, {off + size:#x}) "
                               f"exceeds the file ({len(data)} bytes)")
            return data[off:off + size]

        shstr = b""
        if raw and e_shstrndx != SHN_UNDEF:
            if e_shstrndx >= len(raw):
                raise ElfError(f"corrupt ELF: e_shstrndx {e_shstrndx} out of range ({len(raw)} sections)")
            shstr = section_bytes(e_shstrndx)
        sections = []
        for i, (nm, typ, flg, addr, off, size, lnk, info, align, entsize) in enumerate(raw):
            name = _cstring(shstr, nm, f"section {i}") if shstr else ""
            sections.append(ElfSection(i, name, typ, flg, addr, off, size, lnk, info, align, entsize,
                                       section_bytes(i)))

        symtabs: dict[int, list[ElfSymbol]] = {}

        def symbols_of(idx: int) -> list[ElfSymbol]:
            if idx in symtabs:
                return symtabs[idx]
            if not 0 < idx < len(sections):
                raise ElfError(f"corrupt ELF: symbol table index {idx} out of range "
                               f"({len(sections)} sections)")
            sec = sections[idx]
            if sec.type not in (SHT_SYMTAB, SHT_DYNSYM):
                raise ElfError(f"corrupt ELF: section {idx} ({sec.name!r}) is not a symbol table")
            if sec.size % _SYM.size:
                raise ElfError(f"corrupt ELF: symbol table {sec.name!r} size {sec.size} is not a multiple of "
                               f"{_SYM.size}")
            if not 0 <= sec.link < len(sections):
                raise ElfError(f"corrupt ELF: symbol table {sec.name!r} links string table {sec.link}, "
                               f"out of range")
            strtab = sections[sec.link].data
            xindex = next((s.data for s in sections if s.type == SHT_SYMTAB_SHNDX and s.link == idx), b"")
            out = []
            for k in range(sec.size // _SYM.size):
                st_name, st_info, _other, shndx, value, size = _SYM.unpack_from(sec.data, k * _SYM.size)
                if shndx == SHN_XINDEX:
                    if 4 * k + 4 > len(xindex):
                        raise ElfError(f"corrupt ELF: symbol {k} uses SHN_XINDEX but SHT_SYMTAB_SHNDX "
                                       f"is missing")
                    shndx = struct.unpack_from("<I", xindex, 4 * k)[0]
                out.append(ElfSymbol(_cstring(strtab, st_name, f"symbol {k}"), value, size,
                                     st_info & _ST_TYPE_MASK, st_info >> _ST_BIND_SHIFT, shndx))
            symtabs[idx] = out
            return out

        symbols: list[ElfSymbol] = []
        symtab_idx = next((s.index for s in sections if s.type == SHT_SYMTAB), None)
        if symtab_idx is not None:
            symbols = symbols_of(symtab_idx)

        relocations = []
        for sec in sections:
            if sec.type not in (SHT_RELA, SHT_REL):
                continue
            rela = sec.type == SHT_RELA
            st = _RELA if rela else _REL
            if sec.size % st.size:
                raise ElfError(f"corrupt ELF: relocation section {sec.name!r} size {sec.size} is not "
                               f"a multiple of {st.size}")
            if not 0 <= sec.info < len(sections):
                raise ElfError(f"corrupt ELF: relocation section {sec.name!r} targets section {sec.info}, "
                               f"out of range")
            target = sections[sec.info]
            syms = symbols_of(sec.link) if sec.link else []
            for k in range(sec.size // st.size):
                fields = st.unpack_from(sec.data, k * st.size)
                r_offset, r_info = fields[0], fields[1]
                addend = fields[2] if rela else 0
                sym_idx, r_type = r_info >> _R_SYM_SHIFT, r_info & _R_TYPE_MASK
                if sym_idx >= max(len(syms), 1):
                    raise ElfError(f"corrupt ELF: relocation {k} in {sec.name!r} names symbol {sym_idx}, "
                                   f"but the symbol table has {len(syms)}")
                sym = syms[sym_idx] if syms else ElfSymbol("", 0, 0, STT_NOTYPE, STB_LOCAL, SHN_UNDEF)
                if target.type != SHT_NOBITS and r_offset >= max(target.size, 1):
                    raise ElfError(f"corrupt ELF: relocation {k} in {sec.name!r} patches offset "
                                   f"{r_offset:#x}, outside {target.name!r} ({target.size} bytes)")
                relocations.append(ElfReloc(sec.info, r_offset, r_type, sym, addend, rela))
        return ElfFile(e_machine, e_type, e_flags, e_entry, sections, symbols, relocations)


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
    linker = _Linker(layout, base, resolve if resolve is not None else _libc().resolve, force_stubs)
    linker.run()
    sections = {elf.sections[i].name: base + off for i, off in layout.offsets.items()}
    stubs = {name: base + off for name, off in layout.stub_offsets.items()}
    return LinkedImage(base, layout.size, linker.image, linker.symbol_table(), sections, layout.segments,
                       stubs, linker.used_stubs)


# ---------------------------------------------------------------------------------------------------------
# Loader (executable memory through libc via cffi)
# ---------------------------------------------------------------------------------------------------------
_CDEF = """
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int mprotect(void *addr, size_t len, int prot);
int munmap(void *addr, size_t length);
void *dlopen(const char *filename, int flags);
void *dlsym(void *handle, const char *symbol);
"""
_MAP_FAILED = -1  # (void *)-1, sys/mman.h
_LIBM_NAME = "libm.so.6"  # glibc's math library soname
_LIBGCC_NAME = "libgcc_s.so.1"  # holds __clear_cache (instruction-cache flush) on aarch64 hosts
_HOST_MACHINES = {"x86_64": EM_X86_64, "amd64": EM_X86_64, "aarch64": EM_AARCH64, "arm64": EM_AARCH64}


class _Libc:
    """mmap/mprotect/munmap and dlsym through cffi (ABI mode, no compiler needed)."""

    def __init__(self) -> None:
        import cffi

        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self.lib = self.ffi.dlopen(None)
        self.handles = [self.ffi.NULL]  # RTLD_DEFAULT (NULL in glibc's dlfcn.h): every loaded library
        libm = self.lib.dlopen(_LIBM_NAME.encode(), os.RTLD_NOW | os.RTLD_LOCAL)
        if libm != self.ffi.NULL:
            self.handles.append(libm)
        self._lock = threading.Lock()

    def resolve(self, name: str) -> int:
        for h in self.handles:
            p = self.lib.dlsym(h, name.encode())
            if p != self.ffi.NULL:
                return int(self.ffi.cast("uintptr_t", p))
        return 0

    def _fail(self, call: str) -> OSError:
        err = self.ffi.errno
        return OSError(err, f"{call} failed: {os.strerror(err)}")

    def map(self, size: int) -> int:
        p = self.lib.mmap(self.ffi.NULL, size, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        addr = int(self.ffi.cast("intptr_t", p))
        if addr == _MAP_FAILED:
            raise self._fail(f"mmap({size} bytes)")
        return int(self.ffi.cast("uintptr_t", p))

    def protect(self, addr: int, size: int, prot: int) -> None:
        if self.lib.mprotect(self.ffi.cast("void *", addr), size, prot) != 0:
            raise self._fail(f"mprotect({addr:#x}, {size}, {prot})")

    def unmap(self, addr: int, size: int) -> None:
        if self.lib.munmap(self.ffi.cast("void *", addr), size) != 0:
            raise self._fail(f"munmap({addr:#x}, {size})")

    def write(self, addr: int, data: bytes | bytearray) -> None:
        self.ffi.memmove(self.ffi.cast("void *", addr), bytes(data), len(data))

    def flush_icache(self, addr: int, size: int) -> None:
        """aarch64 needs the instruction cache synchronised with freshly written code (x86 does not)."""
        fn = self.resolve("__clear_cache")
        if not fn:
            h = self.lib.dlopen(_LIBGCC_NAME.encode(), os.RTLD_NOW | os.RTLD_LOCAL)
            p = self.lib.dlsym(h, b"__clear_cache") if h != self.ffi.NULL else self.ffi.NULL
            fn = int(self.ffi.cast("uintptr_t", p))
        if not fn:
            raise ElfError("cannot flush the instruction cache: __clear_cache not found in libgcc_s")
        clear = self.ffi.cast("void(*)(void *, void *)", fn)
        clear(self.ffi.cast("void *", addr), self.ffi.cast("void *", addr + size))


_libc_lock = threading.Lock()
_libc_instance: _Libc | None = None


def _libc() -> _Libc:
    global _libc_instance
    if _libc_instance is None:
        with _libc_lock:
            if _libc_instance is None:
                _libc_instance = _Libc()
    return _libc_instance


def _unmap(addr: int, size: int) -> None:
    if mappings.pinned():  # an abandoned worker may still run this code (rawgrad/mappings.py)
        return
    _libc().unmap(addr, size)


def host_machine() -> int:
    """The ELF e_machine of this process's CPU (ElfError if the loader does not support it)."""
    m = platform.machine().lower()
    if m not in _HOST_MACHINES:
        raise ElfError(f"the ELF loader does not support host CPU {m!r}")
    return _HOST_MACHINES[m]


class LoadedImage:
    """A relocated object mapped into executable memory; ``symbols`` maps names to absolute addresses."""

    base: int
    size: int
    symbols: dict[str, int]

    def __init__(self, base: int, size: int, symbols: dict[str, int], linked: LinkedImage) -> None:
        self.base, self.size, self.symbols = base, size, symbols
        self.section_addresses = linked.section_addresses
        self.stubs = linked.stubs
        self.used_stubs = linked.used_stubs
        self._finalizer = weakref.finalize(self, _unmap, base, size)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def symbol(self, name: str) -> int:
        """Absolute address of a defined symbol; ElfError listing the defined names when missing."""
        if self.closed:
            raise ElfError(f"image at {self.base:#x} is closed; cannot look up {name!r}")
        try:
            return self.symbols[name]
        except KeyError:
            raise ElfError(f"symbol {name!r} is not defined in the loaded image "
                           f"(defined: {', '.join(sorted(self.symbols)) or 'none'})") from None

    def close(self) -> None:
        """Unmap the image (idempotent; also runs when the object is garbage collected)."""
        self._finalizer()

    def __enter__(self) -> LoadedImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.symbols)} symbols"
        return f"LoadedImage(base={self.base:#x}, size={self.size}, {state})"


def load(obj: bytes, resolve: Callable[[str], int] | None = None, *,
         force_stubs: bool = False) -> LoadedImage:
    """Map a relocatable object for this CPU into executable memory and relocate it (W^X, see module doc)."""
    elf = ElfFile.parse(obj)
    host = host_machine()
    if elf.machine != host:
        raise ElfError(f"object is for ELF machine {elf.machine}, but this host is machine {host}")
    libc = _libc()
    page = mmap.PAGESIZE
    size = _Layout(elf, page).size
    size = _align_up(size, page)
    base = libc.map(size)
    try:
        linked = link(elf, base, resolve if resolve is not None else libc.resolve, force_stubs=force_stubs,
                      page_size=page)
        libc.write(base, linked.data)
        if host == EM_AARCH64:
            libc.flush_icache(base, size)
        for off, length, prot in linked.segments:
            libc.protect(base + off, length, prot)
    except BaseException:
        libc.unmap(base, size)
        raise
    return LoadedImage(base, size, linked.symbols, linked)
