"""Kernel images for the NV device: PTX -> cubin, and what a launch needs from an image (entry point,
parameter layout, registers, shared/local memory, extra constant banks).

Every image carries the PTX it came from in a section named ``.rawgrad.ptx``. On hardware the image is a
real cubin for the GPU's ``sm_XX`` with that section appended, assembled by NVIDIA's ``ptxas`` (found on
PATH, under CUDA_HOME / CUDA_PATH / /usr/local/cuda, or in NVIDIA's ``nvidia-cuda-nvcc`` wheel, which the
``nv`` extra installs) or, failing that, by ``libnvJitLink`` (NV-FACTS 7.1). Assembled images are cached on
disk by content (``RAWGRAD_CACHE_DIR``). With no assembler at all the mock still runs: it gets a small ELF
of our own holding an empty ``.text.<kernel>`` (where the SASS would be), ``.nv.info`` records in the cubin
format (NV-FACTS 7.2) and the PTX, which the mock GPU interprets. One loader path reads both kinds; such a
fallback is counted (`ptx_only_fallbacks`) so a test run that has an assembler can insist on none.

The mock interprets the PTX, not the SASS, so an assembled image also binds the two (``.rawgrad.bind``):
the sha256 of the exact PTX bytes given to the assembler, the sha256 of the code it produced (every
``.text.<kernel>``, relocated fields zeroed), the architecture and which assembler ran. `check_binding`
verifies that record against the image; the mock's ``sass_check.verify_image`` also re-assembles the PTX
itself and compares the code, which is what catches SASS made from some other PTX.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import cffi

from rawgrad.compiler import elf
from rawgrad.compiler.cache import BUILT, DISK, MEMORY, CompileCache, DiskCache, cache_folder, content_key
from rawgrad.compiler.counters import CompileCount, register_compile_counter

__all__ = ["Binding", "BindingError", "NVCompiler", "NoAssemblerError", "PTXAssemblyError", "PTXParam",
           "ProgramInfo", "append_section", "check_binding", "find_ptxas", "program_info",
           "ptx_only_fallbacks", "write_elf"]

PTX_SECTION = ".rawgrad.ptx"
BIND_SECTION = ".rawgrad.bind"  # what the PTX and the SASS of an assembled image are (see the docstring)
BIND_VERSION = 1  # part of the cache key: entries made before binding existed are never reused
TEXT_PREFIX = ".text."
NV_INFO = ".nv.info"  # per-function attributes keyed by symbol (SHT_CUDA_INFO)
NV_INFO_PREFIX = ".nv.info."  # kernel attributes
NV_SHARED_PREFIX = ".nv.shared."  # static shared memory, NOBITS (sh_size = bytes)
# Constant banks other than 0: ".nv.constant<N>" (module scope, e.g. PTX .const data in bank 3) or
# ".nv.constant<N>.<kernel>"; bound as QMD constant buffer N.
_CONSTANT_BANK_RE = re.compile(r"\.nv\.constant(\d+)(?:\.(.+))?")

SHT_CUDA_INFO = 0x70000000  # SHT_LOPROC + 0: cubin .nv.info sections
ET_EXEC = 2  # cubins are ET_EXEC
ELF_ALIGN = 8  # header tables are 8-byte aligned
TEXT_ALIGN = 128  # code sections (and our stand-in) are 128-byte aligned (NV-FACTS 7.2)
TEXT_STANDIN_BYTES = 128  # the PTX-only image has no SASS: a zeroed stand-in so the entry VA is inside it

# .nv.info record formats and attributes (NV-FACTS 7.2)
EIFMT_NVAL = 0x01  # no value
EIFMT_BVAL = 0x02  # the u16 holds a byte value
EIFMT_HVAL = 0x03  # the u16 holds the value
EIFMT_SVAL = 0x04  # the u16 is a byte length; that many payload bytes follow
EIATTR_PARAM_CBANK = 0x0A  # u32 sym, u16 parameter offset in bank 0, u16 parameter bytes
EIATTR_MIN_STACK_SIZE = 0x12  # u32 sym, u32 bytes per thread
EIATTR_CBANK_PARAM_SIZE = 0x19  # HVAL: parameter bytes
EIATTR_REGCOUNT = 0x2F  # u32 sym, u32 registers per thread
_RECORD = struct.Struct("<BBH")

# Where kernel parameters start in constant bank 0 when the image does not say (EIATTR_PARAM_CBANK;
# NV-FACTS 7.4): 0x160 on sm_8x, 0x210 on sm_90.
PARAM_OFFSET_BY_MAJOR = {8: 0x160, 9: 0x210}
# Registers a PTX-only image claims (it has no SASS, so no EIATTR_REGCOUNT from ptxas): a typical count
# that keeps QMD REGISTER_COUNT in range; only the mock runs such an image.
PTX_ONLY_REGISTERS = 32
# Per-thread local memory: the stack size plus 0x240 bytes, rounded to 32 (NV-FACTS 5.6).
LOCAL_MEMORY_EXTRA = 0x240
LOCAL_MEMORY_ROUND = 32

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
EHDR_BYTES = _EHDR.size
ELF_IDENT = elf.ELF_MAGIC + bytes([elf.ELFCLASS64, elf.ELFDATA2LSB, elf.EV_CURRENT]) + bytes(9)


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def sm_number(arch: str) -> int:
    """"sm_90" -> 90."""
    m = re.fullmatch(r"sm_(\d+)a?", arch)
    if m is None:
        raise ValueError(f"not an SM architecture name: {arch!r} (expected e.g. 'sm_90')")
    return int(m.group(1))


# ----------------------------------------------------------------------------------------------- ELF writer
@dataclass
class Section:
    """A section to write: `data` (or, for NOBITS, just `nobits_size`)."""

    name: str
    type: int
    flags: int = 0
    data: bytes = b""
    align: int = 1
    nobits_size: int = 0
    link: int = 0
    info: int = 0
    entsize: int = 0


def write_elf(sections: list[Section], *, machine: int = elf.EM_CUDA, elf_flags: int = 0,
              elf_type: int = ET_EXEC) -> bytes:
    """An ELF64 little-endian file with `sections` (after the null section) and a section-name table."""
    names = b"\0"
    name_off: list[int] = []
    for s in [*sections, Section(".shstrtab", elf.SHT_STRTAB)]:
        name_off.append(len(names))
        names += s.name.encode() + b"\0"
    body = bytearray(EHDR_BYTES)
    headers = [_SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    for s, off in zip(sections, name_off):
        if s.type == elf.SHT_NOBITS:
            headers.append(_SHDR.pack(off, s.type, s.flags, 0, len(body), s.nobits_size, s.link, s.info,
                                      s.align, s.entsize))
            continue
        body += bytes(_align(len(body), s.align) - len(body))
        headers.append(_SHDR.pack(off, s.type, s.flags, 0, len(body), len(s.data), s.link, s.info, s.align,
                                  s.entsize))
        body += s.data
    strtab_off = len(body)
    body += names
    headers.append(_SHDR.pack(name_off[-1], elf.SHT_STRTAB, 0, 0, strtab_off, len(names), 0, 0, 1, 0))
    body += bytes(_align(len(body), ELF_ALIGN) - len(body))
    shoff = len(body)
    body += b"".join(headers)
    body[:EHDR_BYTES] = _EHDR.pack(ELF_IDENT, elf_type, machine, elf.EV_CURRENT, 0, 0, shoff, elf_flags,
                                   EHDR_BYTES, 0, 0, _SHDR.size, len(headers), len(headers) - 1)
    return bytes(body)


def append_section(image: bytes, name: str, data: bytes, *, sh_type: int = elf.SHT_PROGBITS,
                   align: int = 1) -> bytes:
    """`image` with one more section appended; nothing already in the file moves.

    The data, a new section-name table (the old one plus `name`) and a new header table go after the end
    of the file; only e_shoff / e_shnum / e_shstrndx change. A real cubin keeps every byte where it was.
    """
    ehdr = list(_EHDR.unpack_from(image, 0))
    shoff, shentsize, shnum, shstrndx = ehdr[6], ehdr[11], ehdr[12], ehdr[13]
    if shentsize != _SHDR.size or shnum == 0 or shstrndx >= shnum:
        raise elf.ElfError(f"cannot append to this ELF (shentsize {shentsize}, shnum {shnum}, shstrndx "
                           f"{shstrndx})")
    headers = [list(_SHDR.unpack_from(image, shoff + i * _SHDR.size)) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = image[strtab[4]:strtab[4] + strtab[5]]
    out = bytearray(image)
    out += bytes(_align(len(out), align) - len(out))
    data_off = len(out)
    out += data
    new_name = len(names)
    names += name.encode() + b"\0"
    strtab[4], strtab[5] = len(out), len(names)
    out += names
    headers.append([new_name, sh_type, 0, 0, data_off, len(data), 0, 0, align, 0])
    out += bytes(_align(len(out), ELF_ALIGN) - len(out))
    new_shoff = len(out)
    out += b"".join(_SHDR.pack(*h) for h in headers)
    ehdr[6], ehdr[12] = new_shoff, len(headers)
    out[:EHDR_BYTES] = _EHDR.pack(*ehdr)
    return bytes(out)


# -------------------------------------------------------------------------------------------- .nv.info
def info_record(attr: int, payload: bytes | None = None, value: int = 0) -> bytes:
    """One .nv.info record: SVAL with `payload`, else HVAL with `value`."""
    if payload is None:
        return _RECORD.pack(EIFMT_HVAL, attr, value)
    return _RECORD.pack(EIFMT_SVAL, attr, len(payload)) + payload


def parse_info(data: bytes) -> list[tuple[int, int | bytes]]:
    """Records of a .nv.info section as (attribute, value or payload bytes)."""
    out: list[tuple[int, int | bytes]] = []
    off = 0
    while off + _RECORD.size <= len(data):
        fmt, attr, val = _RECORD.unpack_from(data, off)
        off += _RECORD.size
        if fmt == EIFMT_SVAL:
            if off + val > len(data):
                raise elf.ElfError(f".nv.info record {attr:#x} runs past the section ({val} bytes at {off})")
            out.append((attr, data[off:off + val]))
            off += val
        elif fmt in (EIFMT_HVAL, EIFMT_BVAL):
            out.append((attr, val))
        elif fmt == EIFMT_NVAL:
            out.append((attr, 0))
        else:
            raise elf.ElfError(f"unknown .nv.info record format {fmt:#x} at offset {off - _RECORD.size}")
    return out


# ------------------------------------------------------------------------------------------ PTX signatures
@dataclass(frozen=True)
class PTXParam:
    """One kernel parameter: its PTX name, type (".u64", ".s32", ...), offset in the block and size."""

    name: str
    type: str
    offset: int
    size: int


_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)", re.S)
_TYPE_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}


def ptx_entries(ptx: str) -> list[str]:
    """Names of the kernels (`.entry`) in a PTX module."""
    return [m.group(1) for m in _ENTRY_RE.finditer(_strip_comments(ptx))]


def _strip_comments(ptx: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", ptx, flags=re.S)


def ptx_params(ptx: str, entry: str) -> list[PTXParam]:
    """The parameter block of kernel `entry`, laid out as the CUDA ABI does (each at its alignment)."""
    for m in _ENTRY_RE.finditer(_strip_comments(ptx)):
        if m.group(1) != entry:
            continue
        out: list[PTXParam] = []
        offset = 0
        for decl in filter(None, (d.strip() for d in m.group(2).split(","))):
            tokens = decl.replace(".ptr", " .ptr").split()
            if not tokens or tokens[0] != ".param":
                raise ValueError(f"cannot read PTX parameter {decl!r} of {entry}")
            name = tokens[-1]
            count = 1
            arr = re.fullmatch(r"(\w+)\[(\d+)\]", name)
            if arr:
                name, count = arr.group(1), int(arr.group(2))
            ty = next((t for t in tokens[1:-1] if re.fullmatch(r"\.[busf](8|16|32|64)", t)), None)
            if ty is None:
                raise ValueError(f"PTX parameter {decl!r} of {entry} has no scalar type")
            size = _TYPE_SIZES[ty[2:]]
            align = size
            if ".align" in tokens:
                align = int(tokens[tokens.index(".align") + 1])
            offset = _align(offset, align)
            out.append(PTXParam(name, ty, offset, size * count))
            offset += size * count
        return out
    raise ValueError(f"PTX module has no kernel {entry!r} (kernels: {ptx_entries(ptx)})")


# ------------------------------------------------------------------------------------------ loading
# Relocation types (NV-FACTS 7.3): S = VA of the symbol's section + symbol value + addend.
R_CUDA_32 = 1  # u32 S at the offset
R_CUDA_64 = 2  # u64 S at the offset (ptxas: addresses of module .global data in a constant bank)
R_CUDA_ABS32_LO_32 = 0x38  # low 32 bits of S into the immediate of a 128-bit instruction (offset + 4)
R_CUDA_ABS32_HI_32 = 0x39  # high 32 bits of S, likewise
INSTRUCTION_IMMEDIATE_OFFSET = 4
CONSTANT_BANK_ALIGN = 256  # extra banks are copied to 256-byte aligned places (V04 needs 64)
CONSTANT_BANK_SIZE_ALIGN = 16  # the QMD's bank size unit (SIZE_SHIFTED4)
GLOBAL_DATA_PREFIX = ".nv.global"  # module .global data: PROGBITS (.init) or NOBITS (zeroed)


class BankCopy(NamedTuple):
    """A constant bank other than 0, copied to its own aligned place in the loaded image."""

    bank: int  # the QMD constant buffer it is bound as
    kernel: str  # the kernel it belongs to ("" for a module-scope bank)
    offset: int  # where the copy lives, from the image base
    size: int  # bytes bound: the section's size rounded up to the QMD's 16-byte unit
    data: bytes


@dataclass(frozen=True)
class ImageLayout:
    """How a kernel image sits in GPU memory at some base VA: the file verbatim (so `.text` offsets are
    entry points), then zero-filled NOBITS `.nv.global` data, then a 256-byte aligned copy of every constant
    bank other than 0 (the QMD binds the copy: a bank's file offset is only 4-byte aligned). Relocations
    (offset in the image, type, image offset of the symbol's section + symbol value + addend) are applied
    once the base is known (`relocate`)."""

    size: int
    section_offsets: dict[str, int]  # where each loaded section lives, as an offset from the base
    banks: tuple[BankCopy, ...]
    relocations: tuple[tuple[int, int, int], ...]


def image_layout(image: bytes, f: elf.ElfFile | None = None) -> ImageLayout:
    f = f if f is not None else elf.ElfFile.parse(image)
    offsets = {s.name: s.offset for s in f.sections if s.flags & elf.SHF_ALLOC and s.type != elf.SHT_NOBITS}
    end = len(image)
    for s in f.sections:
        if s.type == elf.SHT_NOBITS and s.name.startswith(GLOBAL_DATA_PREFIX):
            end = _align(end, max(s.align, 1))
            offsets[s.name] = end
            end += s.size
    banks: list[BankCopy] = []
    for s in f.sections:
        m = _CONSTANT_BANK_RE.fullmatch(s.name)
        if m is None or int(m.group(1)) == 0:
            continue  # bank 0 is filled per launch
        end = _align(end, CONSTANT_BANK_ALIGN)
        size = max(_align(s.size, CONSTANT_BANK_SIZE_ALIGN), CONSTANT_BANK_SIZE_ALIGN)
        banks.append(BankCopy(int(m.group(1)), m.group(2) or "", end, size, s.data))
        offsets[s.name] = end  # the bound copy is the one relocations must patch
        end += size
    relocations: list[tuple[int, int, int]] = []
    for r in f.relocations:
        target = f.sections[r.section_index]
        if target.name not in offsets:
            continue  # e.g. .rela.debug_frame: the debug frame is never loaded
        if r.type not in (R_CUDA_32, R_CUDA_64, R_CUDA_ABS32_LO_32, R_CUDA_ABS32_HI_32):
            raise NotImplementedError(f"relocation type {r.type:#x} in {target.name} (symbol "
                                      f"{r.symbol.name!r}) is not supported (NV-FACTS 7.3)")
        home = f.sections[r.symbol.section_index].name if r.symbol.section_index < len(f.sections) else ""
        if home not in offsets:
            raise NotImplementedError(f"relocation in {target.name} refers to {r.symbol.name!r} in "
                                      f"{home or 'no section'}, which is not loaded")
        relocations.append((offsets[target.name] + r.offset, r.type,
                            offsets[home] + r.symbol.value + r.addend))
    return ImageLayout(end, offsets, tuple(banks), tuple(relocations))


def relocate(image: bytes, layout: ImageLayout, base: int) -> bytes:
    """The bytes to upload at GPU VA `base`: file, global data, bank copies, relocations applied."""
    blob = bytearray(image) + bytes(layout.size - len(image))
    for bank in layout.banks:
        blob[bank.offset:bank.offset + len(bank.data)] = bank.data
    for at, kind, target in layout.relocations:
        value = base + target
        if kind == R_CUDA_64:
            struct.pack_into("<Q", blob, at, value)
        elif kind == R_CUDA_32:
            struct.pack_into("<I", blob, at, value & 0xFFFFFFFF)
        elif kind == R_CUDA_ABS32_LO_32:
            struct.pack_into("<I", blob, at + INSTRUCTION_IMMEDIATE_OFFSET, value & 0xFFFFFFFF)
        else:  # R_CUDA_ABS32_HI_32
            struct.pack_into("<I", blob, at + INSTRUCTION_IMMEDIATE_OFFSET, value >> 32)
    return bytes(blob)


# ------------------------------------------------------------------------------------------ program info
@dataclass(frozen=True)
class ProgramInfo:
    """What a launch needs to know about kernel `name` in an image."""

    name: str
    ptx: str
    text_offset: int  # file offset of .text.<name>: the entry point when the file is loaded verbatim
    text_bytes: int
    param_offset: int  # where the parameters start in constant bank 0
    params: tuple[PTXParam, ...]
    registers: int
    shared_bytes: int
    local_bytes: int  # per-thread local memory (SHADER_LOCAL_MEMORY_HIGH_SIZE)
    has_sass: bool
    layout: ImageLayout  # how the file is placed in GPU memory (see image_layout)
    # constant banks other than 0 the kernel reads: (bank index, offset in the loaded image, bytes to bind)
    constant_banks: tuple[tuple[int, int, int], ...]

    @property
    def param_bytes(self) -> int:
        return max((p.offset + p.size for p in self.params), default=0)


@functools.lru_cache(maxsize=256)
def program_info(image: bytes, name: str, arch: str) -> ProgramInfo:
    """Read kernel `name` from an image made by NVCompiler (a cubin or a PTX-only ELF)."""
    f = elf.ElfFile.parse(image)
    text = f.section(TEXT_PREFIX + name)
    if text.offset % TEXT_ALIGN:
        raise elf.ElfError(f"{TEXT_PREFIX}{name} at file offset {text.offset:#x} is not {TEXT_ALIGN}-byte "
                           f"aligned; the image is loaded verbatim, so its entry point would be misaligned")
    layout = image_layout(image, f)
    ptx = f.section(PTX_SECTION).data.decode()
    attrs: dict[int, int | bytes] = {}
    # .nv.info holds per-function records keyed by symbol index (a module with several kernels, or a
    # kernel calling functions, has one REGCOUNT per function): keep this kernel's; our own PTX-only
    # images have no symbol table and one kernel, so there every record is taken.
    symbol = next((k for k, sym in enumerate(f.symbols) if sym.name == name), None)
    if any(s.name == NV_INFO for s in f.sections):
        for attr, value in parse_info(f.section(NV_INFO).data):
            if symbol is None or not isinstance(value, bytes) or struct.unpack_from("<I", value)[0] == symbol:
                attrs[attr] = value
    if any(s.name == NV_INFO_PREFIX + name for s in f.sections):
        attrs.update(parse_info(f.section(NV_INFO_PREFIX + name).data))
    param_offset = PARAM_OFFSET_BY_MAJOR.get(sm_number(arch) // 10)
    cbank = attrs.get(EIATTR_PARAM_CBANK)
    if isinstance(cbank, bytes):
        _sym, param_offset, _size = struct.unpack_from("<IHH", cbank)
    if param_offset is None:
        raise ValueError(f"no parameter offset known for {arch} and the image has no EIATTR_PARAM_CBANK")
    regs = attrs.get(EIATTR_REGCOUNT)
    registers = struct.unpack_from("<II", regs)[1] if isinstance(regs, bytes) else PTX_ONLY_REGISTERS
    stack = attrs.get(EIATTR_MIN_STACK_SIZE)
    stack_bytes = struct.unpack_from("<II", stack)[1] if isinstance(stack, bytes) else 0
    shared = next((s.size for s in f.sections if s.name == NV_SHARED_PREFIX + name), 0)
    banks = sorted((b.bank, b.offset, b.size) for b in layout.banks if b.kernel in ("", name))
    return ProgramInfo(name, ptx, text.offset, text.size, param_offset, tuple(ptx_params(ptx, name)),
                       registers, shared, _align(stack_bytes + LOCAL_MEMORY_EXTRA, LOCAL_MEMORY_ROUND),
                       has_sass(f), layout, tuple(banks))


# ------------------------------------------------------------------------------------------ PTX <-> SASS
class BindingError(RuntimeError):
    """An image's code, its embedded PTX and its `.rawgrad.bind` record disagree (the message says which
    kernel and which check)."""


class Binding(NamedTuple):
    """The `.rawgrad.bind` record of an assembled image: ASCII lines ``key value``."""

    arch: str  # the -arch the assembler was given
    assembler: str  # "ptxas" or "nvjitlink"
    assembler_sha256: str  # sha256 of the assembler's identity (ptxas: its --version text)
    ptx_sha256: str  # sha256 of the exact PTX bytes the assembler read
    code: tuple[tuple[str, str], ...]  # (".text.<kernel>", sha256 of its bytes, relocated fields zeroed)

    def encode(self) -> bytes:
        lines = [f"rawgrad-bind {BIND_VERSION}", f"arch {self.arch}", f"assembler {self.assembler}",
                 f"assembler-sha256 {self.assembler_sha256}", f"ptx-sha256 {self.ptx_sha256}"]
        lines += [f"text {name} {digest}" for name, digest in self.code]
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> Binding:
        fields: dict[str, str] = {}
        code: list[tuple[str, str]] = []
        try:
            for line in data.decode("ascii").splitlines():
                key, _, value = line.partition(" ")
                if key == "text":
                    name, digest = value.split(" ")
                    code.append((name, digest))
                else:
                    fields[key] = value
            if fields.get("rawgrad-bind") != str(BIND_VERSION):
                raise BindingError(f"{BIND_SECTION} is version {fields.get('rawgrad-bind')!r}, this driver "
                                   f"reads {BIND_VERSION}")
            return cls(fields["arch"], fields["assembler"], fields["assembler-sha256"], fields["ptx-sha256"],
                       tuple(code))
        except (UnicodeDecodeError, ValueError, KeyError) as e:
            raise BindingError(f"unreadable {BIND_SECTION} section: {type(e).__name__}: {e}") from e


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def has_sass(f: elf.ElfFile) -> bool:
    """Whether any kernel of the image has code (a PTX-only image's stand-in `.text` is all zeros)."""
    return any(s.flags & elf.SHF_EXECINSTR and s.size > 0 and s.data.strip(b"\0")
               for s in f.sections if s.name.startswith(TEXT_PREFIX))


# Bytes a relocation of each type patches, from its offset: (start, width). Anything else: the whole
# 16-byte instruction it lies in.
_RELOCATED_BYTES = {R_CUDA_32: (0, 4), R_CUDA_64: (0, 8),
                    R_CUDA_ABS32_LO_32: (INSTRUCTION_IMMEDIATE_OFFSET, 4),
                    R_CUDA_ABS32_HI_32: (INSTRUCTION_IMMEDIATE_OFFSET, 4)}
_INSTRUCTION_BYTES = 16


def code_sections(f: elf.ElfFile, masks_from: elf.ElfFile | None = None) -> dict[str, bytes]:
    """Every ``.text.<kernel>`` of an image with the bytes its relocations patch zeroed: the same for a
    cubin as assembled and as uploaded at any base address (`relocate` writes into `.text`). `masks_from`:
    take the relocations from that image instead (to compare two images field for field)."""
    code = {s.name: bytearray(s.data) for s in f.sections if s.name.startswith(TEXT_PREFIX)}
    masks = masks_from if masks_from is not None else f
    for r in masks.relocations:
        target = masks.sections[r.section_index].name if r.section_index < len(masks.sections) else ""
        if target not in code:
            continue
        start, width = _RELOCATED_BYTES.get(r.type, (-(r.offset % _INSTRUCTION_BYTES), _INSTRUCTION_BYTES))
        lo = max(r.offset + start, 0)
        hi = min(lo + width, len(code[target]))
        code[target][lo:hi] = bytes(max(hi - lo, 0))
    return {name: bytes(data) for name, data in sorted(code.items())}


def make_binding(cubin: bytes, ptx: bytes, arch: str, assembler: str, identity: str) -> Binding:
    """The record for `cubin`, assembled from exactly `ptx` for `arch` by `assembler` (`identity`)."""
    code = code_sections(elf.ElfFile.parse(cubin))
    return Binding(arch, assembler, sha256(identity), sha256(ptx),
                   tuple((name, sha256(data)) for name, data in code.items()))


def bind_image(cubin: bytes, ptx: bytes, arch: str, assembler: str, identity: str) -> bytes:
    """`cubin` with the PTX it was assembled from and the record binding the two appended."""
    record = make_binding(cubin, ptx, arch, assembler, identity)
    return append_section(append_section(cubin, PTX_SECTION, ptx), BIND_SECTION, record.encode())


def check_binding(image: bytes, f: elf.ElfFile | None = None) -> Binding | None:
    """The image's binding record after checking it against the image: its `.rawgrad.ptx` hashes to the
    recorded PTX digest and each `.text.<kernel>` to its recorded digest (relocated fields zeroed, so an
    uploaded image checks too). None for an image without SASS (a PTX-only image: nothing to bind).
    Raises BindingError naming the kernel or section that disagrees. This is the driver's own record:
    ``mock.sass_check.verify_image`` also re-assembles the PTX to check the record is true."""
    f = f if f is not None else elf.ElfFile.parse(image)
    if not has_sass(f):
        return None
    names = {s.name for s in f.sections}
    kernels = sorted(n[len(TEXT_PREFIX):] for n in names if n.startswith(TEXT_PREFIX))
    for need in (PTX_SECTION, BIND_SECTION):
        if need not in names:
            raise BindingError(f"the image of kernel(s) {', '.join(kernels)} has SASS but no {need} section: "
                               f"nothing ties its code to the PTX the mock would interpret")
    record = Binding.decode(f.section(BIND_SECTION).data)
    ptx_digest = sha256(f.section(PTX_SECTION).data)
    if ptx_digest != record.ptx_sha256:
        raise BindingError(f"kernel(s) {', '.join(kernels)}: {PTX_SECTION} hashes to {ptx_digest[:16]}..., "
                           f"but the SASS was assembled from PTX {record.ptx_sha256[:16]}... (the embedded "
                           f"PTX is not what the assembler read)")
    code = {name: sha256(data) for name, data in code_sections(f).items()}
    recorded = dict(record.code)
    for name in sorted(set(code) | set(recorded)):
        if code.get(name) != recorded.get(name):
            raise BindingError(f"kernel {name[len(TEXT_PREFIX):]}: {name} "
                               f"{'hashes to ' + code[name][:16] + '...' if name in code else 'is missing'}, "
                               f"{BIND_SECTION} records "
                               f"{recorded[name][:16] + '...' if name in recorded else 'no such section'}")
    return record


def ptx_only_fallbacks() -> int:
    """How many PTX-only images (no SASS) this process made because no assembler was found, as opposed to
    an explicit ``NV_ASSEMBLER=none``. CI with the ``nv`` extra installed wants 0: else the mock ran
    kernels that were never assembled, and the SASS checks never happened."""
    return NVCompiler.stats.fallbacks


def ptx_only_image(ptx: str, arch: str) -> bytes:
    """An ELF with the PTX and cubin-style attributes for each kernel, but no SASS (what the mock runs)."""
    sm = sm_number(arch)
    param_offset = PARAM_OFFSET_BY_MAJOR.get(sm // 10, 0)
    sections: list[Section] = []
    info = b""
    for name in ptx_entries(ptx):
        sections.append(Section(TEXT_PREFIX + name, elf.SHT_PROGBITS, elf.SHF_ALLOC | elf.SHF_EXECINSTR,
                                bytes(TEXT_STANDIN_BYTES), TEXT_ALIGN))
        nbytes = max((p.offset + p.size for p in ptx_params(ptx, name)), default=0)
        kinfo = info_record(EIATTR_PARAM_CBANK, struct.pack("<IHH", 0, param_offset, nbytes))
        kinfo += info_record(EIATTR_CBANK_PARAM_SIZE, value=nbytes)
        sections.append(Section(NV_INFO_PREFIX + name, SHT_CUDA_INFO, 0, kinfo, 4))
        info += info_record(EIATTR_REGCOUNT, struct.pack("<II", 0, PTX_ONLY_REGISTERS))
    sections.append(Section(NV_INFO, SHT_CUDA_INFO, 0, info, 4))
    sections.append(Section(PTX_SECTION, elf.SHT_PROGBITS, 0, ptx.encode(), 1))
    return write_elf(sections, elf_flags=sm)  # cubin convention: e_flags low byte = SM version


# ------------------------------------------------------------------------------------------ nvJitLink
NVJITLINK_SUCCESS = 0  # nvJitLink.h nvJitLinkResult
NVJITLINK_INPUT_PTX = 2  # nvJitLink.h nvJitLinkInputType (NONE 0, CUBIN 1, PTX 2); UNSURE until a GPU run
NVJITLINK_ENV = "NVJITLINK_PATH"  # optional explicit path of libnvJitLink.so
_NVJITLINK_FUNCS = {
    "Create": "int {n}(void **handle, uint32_t numOptions, const char **options);",
    "Destroy": "int {n}(void **handle);",
    "AddData": "int {n}(void *handle, int inputType, const void *data, size_t size, const char *name);",
    "Complete": "int {n}(void *handle);",
    "GetLinkedCubinSize": "int {n}(void *handle, size_t *size);",
    "GetLinkedCubin": "int {n}(void *handle, void *cubin);",
    "GetErrorLogSize": "int {n}(void *handle, size_t *size);",
    "GetErrorLog": "int {n}(void *handle, char *log);",
}
# Library versions export the API under versioned names too (__nvJitLinkCreate_12_0 ...); try plain first.
_NVJITLINK_SUFFIXES = ["", *[f"_{major}_{minor}" for major in (13, 12) for minor in range(9, -1, -1)]]
_NVJITLINK_SEARCH = ("/usr/local/cuda/lib64/libnvJitLink.so*", "/usr/local/cuda-*/lib64/libnvJitLink.so*",
                     "/usr/lib/x86_64-linux-gnu/libnvJitLink.so*")


class NVJitLinkError(RuntimeError):
    """nvJitLink rejected the PTX; the message carries its error log."""


class _NVJitLink:
    """libnvJitLink through cffi (ABI mode): PTX -> cubin for one architecture."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ffi = cffi.FFI()
        self.fn: dict[str, Any] = {}
        for suffix in _NVJITLINK_SUFFIXES:
            names = {k: (f"__nvJitLink{k}{suffix}" if suffix else f"nvJitLink{k}") for k in _NVJITLINK_FUNCS}
            ffi = cffi.FFI()
            ffi.cdef("\n".join(_NVJITLINK_FUNCS[k].format(n=n) for k, n in names.items()))
            lib = ffi.dlopen(path)
            try:
                self.fn = {k: getattr(lib, n) for k, n in names.items()}
            except AttributeError:
                continue
            self.ffi = ffi
            return
        raise OSError(f"{path} exports no nvJitLink API this driver knows")

    @property
    def identity(self) -> str:
        return f"nvjitlink|{os.path.realpath(self.path)}"

    def __repr__(self) -> str:
        return f"nvJitLink({self.path!r})"

    def link(self, ptx: str | bytes, arch: str) -> bytes:
        ffi, fn = self.ffi, self.fn
        handle = ffi.new("void **")
        opts = [ffi.new("char[]", f"-arch={arch}".encode())]
        self._check(fn["Create"](handle, len(opts), ffi.new("const char *[]", opts)), "create", None)
        try:
            src = ptx.encode() if isinstance(ptx, str) else ptx
            self._check(fn["AddData"](handle[0], NVJITLINK_INPUT_PTX, src, len(src), b"rawgrad.ptx"), "add",
                        handle[0])
            self._check(fn["Complete"](handle[0]), "complete", handle[0])
            size = ffi.new("size_t *")
            self._check(fn["GetLinkedCubinSize"](handle[0], size), "size", handle[0])
            buf = ffi.new("char[]", size[0])
            self._check(fn["GetLinkedCubin"](handle[0], buf), "cubin", handle[0])
            return bytes(ffi.buffer(buf, size[0]))
        finally:
            fn["Destroy"](handle)

    def _check(self, status: int, step: str, handle: Any) -> None:
        if status == NVJITLINK_SUCCESS:
            return
        log = ""
        if handle is not None:
            n = self.ffi.new("size_t *")
            if self.fn["GetErrorLogSize"](handle, n) == NVJITLINK_SUCCESS and n[0]:
                buf = self.ffi.new("char[]", n[0])
                self.fn["GetErrorLog"](handle, buf)
                log = self.ffi.string(buf).decode(errors="replace")
        raise NVJitLinkError(f"nvJitLink {step} failed with status {status}: {log.strip()}")


_jitlink_lock = threading.Lock()
_jitlink: list[_NVJitLink | None] = []


def find_nvjitlink() -> _NVJitLink | None:
    """The process-wide nvJitLink, or None when no libnvJitLink.so is installed."""
    with _jitlink_lock:
        if not _jitlink:
            paths = [os.environ[NVJITLINK_ENV]] if os.environ.get(NVJITLINK_ENV) else []
            for pattern in _NVJITLINK_SEARCH:
                paths += sorted(glob.glob(pattern), reverse=True)
            paths.append("libnvJitLink.so")  # whatever the dynamic loader finds
            found: _NVJitLink | None = None
            for p in paths:
                try:
                    found = _NVJitLink(p)
                    break
                except OSError:
                    continue
            _jitlink.append(found)
        return _jitlink[0]


# ------------------------------------------------------------------------------------------ ptxas
PTXAS_ENV = "PTXAS"  # explicit path of the ptxas binary
ASSEMBLER_ENV = "NV_ASSEMBLER"  # "ptxas", "nvjitlink", "none" (PTX-only images: mock only) or "auto"
ASSEMBLERS = ("auto", "ptxas", "nvjitlink", "none")
PTXAS_TIMEOUT_S = 120.0  # one kernel takes ~25 ms; a hung assembler must not hang the program
# Folders a CUDA toolkit lives in, by environment variable, then the default install location.
CUDA_HOME_ENVS = ("CUDA_HOME", "CUDA_PATH")
DEFAULT_CUDA_HOME = "/usr/local/cuda"
# NVIDIA's pip wheels unpack under the `nvidia` namespace package: nvidia-cuda-nvcc-cu12 as
# nvidia/cuda_nvcc/bin/ptxas, the CUDA 13 wheels as nvidia/cu13/bin/ptxas.
WHEEL_PTXAS_GLOB = os.path.join("*", "bin", "ptxas")
MIN_PTXAS_RELEASE = {90: (11, 8)}  # sm_90 needs CUDA 11.8 or newer (NV-FACTS 7.1)
INSTALL_HINT = ("install NVIDIA's PTX assembler: `pip install 'rawgrad[nv]'` (the nvidia-cuda-nvcc wheel "
                "ships ptxas), or put a CUDA toolkit's bin folder on PATH, or set CUDA_HOME or PTXAS")
_PTX_LINES_IN_ERROR = 12


class PTXAssemblyError(RuntimeError):
    """ptxas rejected a PTX module; the message carries its diagnostics and the module's first lines."""


class NoAssemblerError(RuntimeError):
    """No way to turn PTX into SASS on this machine (the message says what to install)."""


def ptxas_candidates() -> list[str]:
    """Where ptxas may be, in the order tried: $PTXAS, PATH, $CUDA_HOME / $CUDA_PATH, /usr/local/cuda,
    NVIDIA's pip wheels."""
    out: list[str] = []
    if os.environ.get(PTXAS_ENV):
        out.append(os.environ[PTXAS_ENV])
    on_path = shutil.which("ptxas")
    if on_path:
        out.append(on_path)
    homes = [os.environ[v] for v in CUDA_HOME_ENVS if os.environ.get(v)] + [DEFAULT_CUDA_HOME]
    out += [os.path.join(h, "bin", "ptxas") for h in homes]
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        out += sorted(glob.glob(os.path.join(folder, WHEEL_PTXAS_GLOB)))
    return list(dict.fromkeys(out))


def find_ptxas() -> str | None:
    """The first executable ptxas of `ptxas_candidates()`, or None."""
    return next((p for p in ptxas_candidates() if os.path.isfile(p) and os.access(p, os.X_OK)), None)


@functools.lru_cache(maxsize=8)
def ptxas_version(path: str) -> tuple[tuple[int, int], str]:
    """((major, minor), the full `--version` text) of the ptxas at `path`."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=PTXAS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NoAssemblerError(f"cannot run {path} --version: {e}") from e
    m = re.search(r"release (\d+)\.(\d+)", proc.stdout)
    if proc.returncode != 0 or m is None:
        raise NoAssemblerError(f"{path} --version did not name a CUDA release (exit {proc.returncode}): "
                               f"{(proc.stdout + proc.stderr).strip()[:200]}")
    return (int(m.group(1)), int(m.group(2))), proc.stdout.strip()


def ptxas_command(path: str, arch: str, src: str, out: str) -> list[str]:
    """The ptxas command line that assembles file `src` into cubin `out` (the mock's SASS check runs the
    same options: different options would give different code)."""
    return [path, f"-arch={arch}", "-o", out, src]


class PTXAssembler:
    """NVIDIA's ptxas as a subprocess: PTX text -> cubin for one `sm_XX`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.release, self.version_text = ptxas_version(path)

    def __repr__(self) -> str:
        return f"PTXAssembler({self.path!r}, release {self.release[0]}.{self.release[1]})"

    @property
    def identity(self) -> str:
        """What the cache key records about the assembler: a different build gives different SASS."""
        return f"ptxas|{self.version_text}"

    def assemble(self, ptx: str | bytes, arch: str) -> bytes:
        """The cubin ptxas makes from exactly these PTX bytes (a str is UTF-8 encoded)."""
        need = MIN_PTXAS_RELEASE.get(sm_number(arch))
        if need is not None and self.release < need:
            raise NoAssemblerError(f"{self.path} is CUDA {self.release[0]}.{self.release[1]}; {arch} needs "
                                   f"{need[0]}.{need[1]} or newer: {INSTALL_HINT}")
        data = ptx.encode() if isinstance(ptx, str) else ptx
        with tempfile.TemporaryDirectory(prefix="rawgrad-ptxas-") as folder:
            src, out = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
            with open(src, "wb") as f:
                f.write(data)
            try:
                proc = subprocess.run(ptxas_command(self.path, arch, src, out), capture_output=True,
                                      text=True, timeout=PTXAS_TIMEOUT_S)
            except subprocess.TimeoutExpired as e:
                raise PTXAssemblyError(f"ptxas ({self.path}) did not finish within "
                                       f"{PTXAS_TIMEOUT_S:.0f} s") from e
            if proc.returncode != 0:
                head = "\n".join(data.decode(errors="replace").splitlines()[:_PTX_LINES_IN_ERROR])
                raise PTXAssemblyError(f"ptxas ({self.path}) rejected the PTX for {arch} (exit "
                                       f"{proc.returncode}):\n{(proc.stderr + proc.stdout).strip()}\n"
                                       f"--- PTX (first lines) ---\n{head}")
            with open(out, "rb") as f:
                return f.read()


# --------------------------------------------------------------------------------------- the compiler
@dataclass
class NVCompileStats:
    """Process-wide counters: `assembled` are real ptxas / nvJitLink runs, the others cache hits."""

    assembled: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    ptx_only: int = 0  # PTX-only images made (no assembler, chosen or not)
    fallbacks: int = 0  # of those, made because "auto" found no assembler (see ptx_only_fallbacks)

    def count(self, source: str) -> None:
        field = {MEMORY: "memory_hits", DISK: "disk_hits", BUILT: "assembled"}[source]
        setattr(self, field, getattr(self, field) + 1)


class NVCompiler:
    """PTX -> kernel image for one SM architecture.

    `assembler` (default: $NV_ASSEMBLER, else "auto"): "ptxas", "nvjitlink", "none" (a PTX-only image,
    which only the mock GPU runs), or "auto" = ptxas when found, else nvJitLink when found, else none.
    `require_sass` (a real GPU) turns "none" into NoAssemblerError naming what to install. Assembled images
    are cubins with ``.rawgrad.ptx`` appended, cached in memory and on disk (`cache_dir` as for the LLVM
    compiler: None = $RAWGRAD_CACHE_DIR or ~/.cache/rawgrad/nv, '' = no disk cache).
    """

    stats = NVCompileStats()

    def __init__(self, arch: str, assembler: str | None = None, *, require_sass: bool = False,
                 cache_dir: str | None = None) -> None:
        sm_number(arch)
        choice = assembler or os.environ.get(ASSEMBLER_ENV) or "auto"
        if choice not in ASSEMBLERS:
            source = "the argument" if assembler else ASSEMBLER_ENV
            raise ValueError(f"unknown NV assembler {choice!r} (from {source}); choose one of "
                             f"{', '.join(ASSEMBLERS)}")
        self.arch = arch
        self.choice = choice
        self.require_sass = require_sass
        self.backend: PTXAssembler | _NVJitLink | None = self._pick(choice)
        if self.backend is None and require_sass:
            why = ("NV_ASSEMBLER=none" if choice == "none"
                   else f"no ptxas or libnvJitLink found; {INSTALL_HINT}")
            raise NoAssemblerError(f"{arch} kernels need SASS, which needs an assembler: {why}")
        self._cache = CompileCache(cache_folder("nv", cache_dir), ".cubin")
        # a disk entry is used only if it is an image of the PTX its key names, with a consistent binding
        self._cache.disk = _BoundDiskCache(self._cache.disk.folder, self._cache.disk.suffix, self)

    def _pick(self, choice: str) -> PTXAssembler | _NVJitLink | None:
        if choice in ("auto", "ptxas"):
            path = find_ptxas()
            if path is not None:
                return PTXAssembler(path)
            if choice == "ptxas":
                raise NoAssemblerError(f"NV_ASSEMBLER=ptxas but no ptxas was found (looked at "
                                       f"{', '.join(ptxas_candidates())}); {INSTALL_HINT}")
        if choice in ("auto", "nvjitlink"):
            linker = find_nvjitlink()
            if linker is not None:
                return linker
            if choice == "nvjitlink":
                raise NoAssemblerError(f"NV_ASSEMBLER=nvjitlink but no libnvJitLink.so was found; set "
                                       f"{NVJITLINK_ENV} or install NVIDIA's nvJitLink library")
        return None

    def __repr__(self) -> str:
        return f"NVCompiler({self.arch!r}, {self.backend!r})"

    @property
    def produces_sass(self) -> bool:
        return self.backend is not None

    def compile(self, src: str) -> bytes:
        if not ptx_entries(src):
            raise ValueError("PTX module has no .entry kernel")
        if self.backend is None:
            NVCompiler.stats.ptx_only += 1
            if self.choice == "auto":
                NVCompiler.stats.fallbacks += 1
            return ptx_only_image(src, self.arch)
        image, source = self._cache.get(self.cache_key(src), lambda: self._assemble(src))
        NVCompiler.stats.count(source)
        return image

    def cache_key(self, src: str | bytes) -> str:
        """The cache key of the image for PTX `src`: the PTX's sha256, the architecture, the assembler's
        identity (another build gives other SASS) and the binding format."""
        backend = self.backend
        assert backend is not None
        data = src.encode() if isinstance(src, str) else src
        return content_key(sha256(data), self.arch, backend.identity, f"bind-v{BIND_VERSION}")

    def _assemble(self, src: str) -> bytes:
        backend = self.backend
        assert backend is not None  # compile() makes PTX-only images itself when there is no assembler
        ptx = src.encode()  # the exact bytes the assembler reads, embedded and hashed below
        if isinstance(backend, PTXAssembler):
            cubin, kind = backend.assemble(ptx, self.arch), "ptxas"
        else:
            cubin, kind = backend.link(ptx, self.arch), "nvjitlink"
        return bind_image(cubin, ptx, self.arch, kind, backend.identity)


def _nv_compile_count() -> CompileCount:
    nv = NVCompiler.stats
    built = nv.assembled + nv.ptx_only
    return CompileCount(built + nv.memory_hits + nv.disk_hits, built, nv.disk_hits)


register_compile_counter("nv", _nv_compile_count)


class _BoundDiskCache(DiskCache):
    """The NV disk cache: an entry counts (else it is a miss, counted as corrupt, and rebuilt) only when
    its binding checks and its key is the key of the PTX it embeds, for this compiler; a file stored
    under the wrong key, or an image whose code disagrees with its record, is never handed out."""

    def __init__(self, folder: str | None, suffix: str, compiler: NVCompiler) -> None:
        super().__init__(folder, suffix)
        self.compiler = compiler

    def get(self, key: str) -> bytes | None:
        payload = super().get(key)
        if payload is None:
            return None
        try:
            f = elf.ElfFile.parse(payload)
            record = check_binding(payload, f)
            ok = (record is not None and record.arch == self.compiler.arch
                  and self.compiler.cache_key(f.section(PTX_SECTION).data) == key)
        except (elf.ElfError, BindingError):
            ok = False
        if not ok:
            self.corrupt_entries += 1
            return None
        return payload
