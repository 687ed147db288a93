"""Parse an ELF64 little-endian file into sections, symbols and relocations, bounds-checking every offset.

Any machine is accepted here (x86-64 and aarch64 objects, NVIDIA cubins, AMD code objects); what may be
linked or loaded is decided by ``link``/``load`` and ``rawgrad.compiler.amdgpu_code``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rawgrad.compiler.elf.consts import (
    _EHDR,
    _R_SYM_SHIFT,
    _R_TYPE_MASK,
    _REL,
    _RELA,
    _SHDR,
    _ST_BIND_SHIFT,
    _ST_TYPE_MASK,
    _SYM,
    EI_CLASS,
    EI_DATA,
    EI_VERSION,
    ELF_MAGIC,
    ELFCLASS64,
    ELFDATA2LSB,
    EM_CUDA,
    EV_CURRENT,
    SHN_UNDEF,
    SHN_XINDEX,
    SHT_DYNSYM,
    SHT_NOBITS,
    SHT_NULL,
    SHT_REL,
    SHT_RELA,
    SHT_SYMTAB,
    SHT_SYMTAB_SHNDX,
    STB_LOCAL,
    STT_NOTYPE,
    ElfError,
)


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
        header = _Header.read(data)
        raw = _section_headers(data, header)
        sections = _sections(data, raw)
        tables = _SymbolTables(sections)
        symtab = next((s.index for s in sections if s.type == SHT_SYMTAB), None)
        symbols = tables.get(symtab) if symtab is not None else []
        relocations = [r for sec in sections if sec.type in (SHT_RELA, SHT_REL)
                       for r in _relocations(sec, sections, tables)]
        h = header
        return ElfFile(h.machine, h.type, h.flags, h.entry, sections, symbols, relocations)


@dataclass(frozen=True)
class _Header:
    """The fields of the ELF64 file header the parser uses (after the identity checks)."""

    type: int
    machine: int
    entry: int
    shoff: int
    flags: int
    shentsize: int
    shnum: int
    shstrndx: int

    @staticmethod
    def read(data: bytes) -> _Header:
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
        return _Header(e_type, e_machine, e_entry, e_shoff, e_flags, e_shentsize, e_shnum, e_shstrndx)


def _section_headers(data: bytes, h: _Header) -> tuple[list[tuple], int]:
    """The raw section-header tuples and the resolved section-name string table index."""
    if not h.shoff:
        return [], h.shstrndx
    if h.shentsize != _SHDR.size:
        raise ElfError(f"corrupt ELF: e_shentsize is {h.shentsize}, expected {_SHDR.size}")
    first = _unpack(_SHDR, data, h.shoff, "section header 0")
    count = h.shnum if h.shnum else first[5]  # gABI: e_shnum == 0 -> count is section 0's sh_size
    shstrndx = first[6] if h.shstrndx == SHN_XINDEX else h.shstrndx  # gABI: then it is section 0's sh_link
    if h.shoff + count * _SHDR.size > len(data):
        raise ElfError(f"truncated ELF: {count} section headers at {h.shoff:#x} exceed {len(data)} bytes")
    return [_SHDR.unpack_from(data, h.shoff + i * _SHDR.size) for i in range(count)], shstrndx


def _section_bytes(data: bytes, raw: list[tuple], i: int) -> bytes:
    _n, sh_type, _f, _a, off, size = raw[i][:6]
    if sh_type in (SHT_NOBITS, SHT_NULL):
        return b""
    if off + size > len(data):
        raise ElfError(f"truncated ELF: section {i} data [{off:#x}, {off + size:#x}) exceeds the file "
                       f"({len(data)} bytes)")
    return data[off:off + size]


def _sections(data: bytes, headers: tuple[list[tuple], int]) -> list[ElfSection]:
    raw, shstrndx = headers
    shstr = b""
    if raw and shstrndx != SHN_UNDEF:
        if shstrndx >= len(raw):
            raise ElfError(f"corrupt ELF: e_shstrndx {shstrndx} out of range ({len(raw)} sections)")
        shstr = _section_bytes(data, raw, shstrndx)
    sections = []
    for i, (nm, typ, flg, addr, off, size, lnk, info, align, entsize) in enumerate(raw):
        name = _cstring(shstr, nm, f"section {i}") if shstr else ""
        sections.append(ElfSection(i, name, typ, flg, addr, off, size, lnk, info, align, entsize,
                                   _section_bytes(data, raw, i)))
    return sections


class _SymbolTables:
    """Symbol tables by section index, each decoded once (relocation sections may share one)."""

    def __init__(self, sections: list[ElfSection]) -> None:
        self.sections = sections
        self.cache: dict[int, list[ElfSymbol]] = {}

    def get(self, idx: int) -> list[ElfSymbol]:
        if idx not in self.cache:
            self.cache[idx] = self._decode(idx)
        return self.cache[idx]

    def _decode(self, idx: int) -> list[ElfSymbol]:
        sections = self.sections
        if not 0 < idx < len(sections):
            raise ElfError(f"corrupt ELF: symbol table index {idx} out of range ({len(sections)} sections)")
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
                    raise ElfError(f"corrupt ELF: symbol {k} uses SHN_XINDEX but SHT_SYMTAB_SHNDX is missing")
                shndx = struct.unpack_from("<I", xindex, 4 * k)[0]
            out.append(ElfSymbol(_cstring(strtab, st_name, f"symbol {k}"), value, size,
                                 st_info & _ST_TYPE_MASK, st_info >> _ST_BIND_SHIFT, shndx))
        return out


def _relocations(sec: ElfSection, sections: list[ElfSection], tables: _SymbolTables) -> list[ElfReloc]:
    """The entries of one SHT_RELA/SHT_REL section, each checked against its symbol table and target."""
    rela = sec.type == SHT_RELA
    st = _RELA if rela else _REL
    if sec.size % st.size:
        raise ElfError(f"corrupt ELF: relocation section {sec.name!r} size {sec.size} is not a multiple of "
                       f"{st.size}")
    if not 0 <= sec.info < len(sections):
        raise ElfError(f"corrupt ELF: relocation section {sec.name!r} targets section {sec.info}, "
                       f"out of range")
    target = sections[sec.info]
    syms = tables.get(sec.link) if sec.link else []
    out = []
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
            raise ElfError(f"corrupt ELF: relocation {k} in {sec.name!r} patches offset {r_offset:#x}, "
                           f"outside {target.name!r} ({target.size} bytes)")
        out.append(ElfReloc(sec.info, r_offset, r_type, sym, addend, rela))
    return out
