"""AMDGPU code objects: lay out and relocate the relocatable ELF LLVM emits, read its kernel descriptor and
its metadata note, and hand the result over as a typed `AMDCodeObject` (no linker, no ROCm).

What LLVM (llvmlite 0.50 / LLVM 22) emits for one `amdgpu_kernel` (../shared/AMD-METAL-FACTS.md section 1.8):
an ELF64 `ET_REL` for `EM_AMDGPU` with OSABI AMDGPU_HSA; `.text` (the code, 256-byte aligned), `.rodata`
(`<name>.kd`, the 64-byte kernel descriptor, 64-byte aligned), `.rela.rodata` with one `R_AMDGPU_REL64` that
fills the descriptor's code entry offset, and an `NT_AMDGPU_METADATA` note holding msgpack. Constant tables
add `R_AMDGPU_REL32_LO/HI` pairs in `.rela.text` (the `s_getpc_b64` + add sequence).

Layout: every allocated section is placed in section order at its own alignment, starting at 0 (so `.text`
comes first). All three relocation kinds are PC-relative, so the image is position independent: it can be
copied anywhere in GPU memory as one block. Relocations against non-allocated sections (debug info) are
skipped; absolute or unknown relocation kinds are refused.

Files read from disk are untrusted: every section, symbol, relocation, note and msgpack length is checked
against what contains it, and every failure is an `ElfError` that says what is wrong.

Kernel descriptor (LLVM AMDGPUUsage, "Kernel Descriptor"; LLVM `AMDHSAKernelDescriptor.h`), 64 bytes:
group_segment_fixed_size@0 (LDS bytes), private_segment_fixed_size@4 (scratch bytes per lane),
kernarg_size@8, kernel_code_entry_byte_offset@16 (i64, from the descriptor to the code), compute_pgm_rsrc3@44,
compute_pgm_rsrc1@48, compute_pgm_rsrc2@52, kernel_code_properties@56 (u16), kernarg_preload@58 (u16).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from rawgrad.compiler.elf import ElfError, ElfFile, ElfSection
from rawgrad.compiler.elf.consts import (
    EM_AMDGPU,
    ET_REL,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHN_UNDEF,
    SHT_NOBITS,
    STT_FUNC,
    STT_OBJECT,
)

__all__ = ["AMDCodeObject", "KernelArg", "KernelDescriptor", "KernelMetadata", "load_code_object",
           "read_msgpack"]

# ---------------------------------------------------------------------------------- ELF header (AMDGPUUsage)
EI_OSABI = 7  # e_ident index of the OS ABI (gABI)
EI_ABIVERSION = 8
ELFOSABI_AMDGPU_HSA = 64  # AMDGPUUsage, "AMDGPU ELF Header"
# ELFABIVERSION_AMDGPU_HSA_V4/V5/V6 = 2/3/4: code object versions 4..6 share the layout read here.
SUPPORTED_ABI_VERSIONS = (2, 3, 4)
EF_AMDGPU_MACH = 0x0FF  # e_flags bits naming the processor
# AMDGPUUsage, "AMDGPU ELF Header" EF_AMDGPU_MACH values
EF_AMDGPU_MACH_BY_ARCH = {"gfx1100": 0x041, "gfx942": 0x04C, "gfx90a": 0x03F, "gfx950": 0x04F,
                          "gfx1201": 0x04E}
SHT_NOTE = 7  # gABI
NT_AMDGPU_METADATA = 32  # AMDGPUUsage, "Code Object V3 and Above Note Records"
AMDGPU_NOTE_NAME = b"AMDGPU\0"
NOTE_HEADER = struct.Struct("<III")  # namesz, descsz, type (gABI note entry)
NOTE_ALIGN = 4  # name and descriptor are padded to 4 bytes in ELF64 notes as LLVM writes them

# ------------------------------------------------------------------------------- relocations (AMDGPUUsage)
R_AMDGPU_NONE = 0
R_AMDGPU_ABS64 = 3
R_AMDGPU_REL32 = 4
R_AMDGPU_REL64 = 5
R_AMDGPU_REL32_LO = 10
R_AMDGPU_REL32_HI = 11
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
# A code object's image bigger than this is refused (rawgrad's kernels are a few KiB; the bound keeps a
# corrupt section size from allocating gigabytes).
MAX_IMAGE_BYTES = 64 << 20
# The largest alignment a section may ask for (the CP wants 256-byte code; one page is plenty).
MAX_SECTION_ALIGN = 4096

# ------------------------------------------------------------------------------------- kernel descriptor
KD_SIZE = 64
KD_ALIGN = 64  # the CP requires 64-byte aligned descriptors (AMDGPUUsage)
_KD = struct.Struct("<IIIIq20sIIIHH4s")
# kernel_code_properties bits (AMDHSAKernelDescriptor.h)
KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER = 1 << 0
KCP_ENABLE_SGPR_DISPATCH_PTR = 1 << 1
KCP_ENABLE_SGPR_QUEUE_PTR = 1 << 2
KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR = 1 << 3
KCP_ENABLE_SGPR_DISPATCH_ID = 1 << 4
KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT = 1 << 5
KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE = 1 << 6
KCP_ENABLE_WAVEFRONT_SIZE32 = 1 << 10
KCP_USES_DYNAMIC_STACK = 1 << 11
# compute_pgm_rsrc2 fields (AMDGPUUsage, "compute_pgm_rsrc2 for GFX6-GFX12")
RSRC2_ENABLE_PRIVATE_SEGMENT = 1 << 0
RSRC2_USER_SGPR_COUNT_SHIFT, RSRC2_USER_SGPR_COUNT_MASK = 1, 0x1F
RSRC2_ENABLE_SGPR_WORKGROUP_ID_X = 1 << 7
RSRC2_ENABLE_SGPR_WORKGROUP_ID_Y = 1 << 8
RSRC2_ENABLE_SGPR_WORKGROUP_ID_Z = 1 << 9
RSRC2_ENABLE_VGPR_WORKITEM_ID_SHIFT, RSRC2_ENABLE_VGPR_WORKITEM_ID_MASK = 11, 0x3
# compute_pgm_rsrc1 fields (AMDGPUUsage, "compute_pgm_rsrc1 for GFX6-GFX12")
RSRC1_VGPR_GRANULES_MASK = 0x3F  # bits 0-5: granulated work-item VGPR count
RSRC1_SGPR_GRANULES_SHIFT, RSRC1_SGPR_GRANULES_MASK = 6, 0xF
RSRC1_WGP_MODE = 1 << 29  # gfx10+: workgroup processor mode (0 = CU mode)

# ------------------------------------------------------------------------------------------------ msgpack
# The msgpack spec (github.com/msgpack/msgpack/blob/master/spec.md), only the formats a metadata note uses.
MSGPACK_MAX_DEPTH = 16
MSGPACK_MAX_ITEMS = 1 << 20  # no real note comes close; bounds the work a hostile length can ask for


@dataclass(frozen=True)
class KernelDescriptor:
    """The 64-byte kernel descriptor, decoded (see the module docstring for the layout)."""

    group_segment_fixed_size: int  # LDS bytes per workgroup
    private_segment_fixed_size: int  # scratch bytes per work-item
    kernarg_size: int
    kernel_code_entry_byte_offset: int
    compute_pgm_rsrc3: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc2: int
    kernel_code_properties: int
    kernarg_preload: int

    @staticmethod
    def decode(raw: bytes) -> KernelDescriptor:
        if len(raw) != KD_SIZE:
            raise ElfError(f"AMDGPU kernel descriptor is {len(raw)} bytes, expected {KD_SIZE}")
        (lds, scratch, kernarg, _r0, entry, _r1, rsrc3, rsrc1, rsrc2, props, preload,
         _r2) = _KD.unpack(raw)
        return KernelDescriptor(lds, scratch, kernarg, entry, rsrc3, rsrc1, rsrc2, props, preload)

    @property
    def wave32(self) -> bool:
        return bool(self.kernel_code_properties & KCP_ENABLE_WAVEFRONT_SIZE32)

    @property
    def user_sgpr_count(self) -> int:
        """SGPRs the CP loads from USER_DATA; the workgroup IDs follow them (s[user_sgpr_count]...)."""
        return (self.compute_pgm_rsrc2 >> RSRC2_USER_SGPR_COUNT_SHIFT) & RSRC2_USER_SGPR_COUNT_MASK

    @property
    def workgroup_id_enabled(self) -> tuple[bool, bool, bool]:
        r = self.compute_pgm_rsrc2
        return (bool(r & RSRC2_ENABLE_SGPR_WORKGROUP_ID_X), bool(r & RSRC2_ENABLE_SGPR_WORKGROUP_ID_Y),
                bool(r & RSRC2_ENABLE_SGPR_WORKGROUP_ID_Z))

    @property
    def workitem_id_dims(self) -> int:
        """How many work-item ID VGPRs the CP initialises (0: x only, 1: x and y, 2: x, y, z)."""
        shifted = self.compute_pgm_rsrc2 >> RSRC2_ENABLE_VGPR_WORKITEM_ID_SHIFT
        return shifted & RSRC2_ENABLE_VGPR_WORKITEM_ID_MASK

    @property
    def private_segment(self) -> bool:
        return bool(self.compute_pgm_rsrc2 & RSRC2_ENABLE_PRIVATE_SEGMENT)

    @property
    def wgp_mode(self) -> bool:
        return bool(self.compute_pgm_rsrc1 & RSRC1_WGP_MODE)


@dataclass(frozen=True)
class KernelArg:
    """One entry of the metadata's `.args`."""

    name: str
    offset: int
    size: int
    value_kind: str  # "global_buffer", "by_value", "hidden_*", ...
    address_space: str | None  # "global" for buffers


@dataclass(frozen=True)
class KernelMetadata:
    """The fields of one `amdhsa.kernels` entry that a driver or the mock needs."""

    name: str
    symbol: str
    args: tuple[KernelArg, ...]
    kernarg_segment_size: int
    kernarg_segment_align: int
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    sgpr_count: int
    vgpr_count: int
    wavefront_size: int
    max_flat_workgroup_size: int


@dataclass(frozen=True)
class AMDCodeObject:
    """A relocated AMDGPU code object: copy `image` to GPU memory at any 256-byte aligned address; the code
    starts at `entry_offset`, the descriptor is at `kd_offset`."""

    name: str
    arch: str  # "gfx1100", from amdhsa.target
    target: str  # the full amdhsa.target string
    e_flags: int
    image: bytes
    text_offset: int
    text_size: int
    entry_offset: int
    kd_offset: int
    descriptor: KernelDescriptor
    metadata: KernelMetadata
    section_offsets: dict[str, int]

    @property
    def text(self) -> bytes:
        """The relocated code of `.text` (what a decoder walks)."""
        return self.image[self.text_offset:self.text_offset + self.text_size]


# ------------------------------------------------------------------------------------------------ msgpack
class _MsgpackReader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.items = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ElfError(f"AMDGPU metadata: {what} of {n} bytes at offset {self.pos} runs past the end of "
                           f"the {len(self.data)}-byte msgpack note")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def uint(self, n: int, what: str) -> int:
        return int.from_bytes(self.take(n, what), "big")

    def count(self, n: int, what: str) -> int:
        # every element needs at least one byte, so a count beyond the bytes left is a lie
        if n > len(self.data) - self.pos:
            raise ElfError(f"AMDGPU metadata: {what} claims {n} elements with {len(self.data) - self.pos} "
                           f"bytes left")
        self.items += n
        if self.items > MSGPACK_MAX_ITEMS:
            raise ElfError(f"AMDGPU metadata: more than {MSGPACK_MAX_ITEMS} msgpack items")
        return n

    def value(self, depth: int = 0) -> Any:
        if depth > MSGPACK_MAX_DEPTH:
            raise ElfError(f"AMDGPU metadata: msgpack nested deeper than {MSGPACK_MAX_DEPTH}")
        tag = self.uint(1, "type tag")
        if tag <= 0x7F:  # positive fixint
            return tag
        if tag >= 0xE0:  # negative fixint
            return tag - 0x100
        if 0x80 <= tag <= 0x8F:
            return self.map(tag & 0x0F, depth)
        if 0x90 <= tag <= 0x9F:
            return self.array(tag & 0x0F, depth)
        if 0xA0 <= tag <= 0xBF:
            return self.string(tag & 0x1F)
        fixed = {0xC0: None, 0xC2: False, 0xC3: True}
        if tag in fixed:
            return fixed[tag]
        if tag in (0xCC, 0xCD, 0xCE, 0xCF):  # uint 8/16/32/64
            return self.uint(1 << (tag - 0xCC), "uint")
        if tag in (0xD0, 0xD1, 0xD2, 0xD3):  # int 8/16/32/64
            n = 1 << (tag - 0xD0)
            return int.from_bytes(self.take(n, "int"), "big", signed=True)
        if tag in (0xCA, 0xCB):  # float 32/64
            single = tag == 0xCA
            return struct.unpack(">f" if single else ">d", self.take(4 if single else 8, "float"))[0]
        if tag in (0xD9, 0xDA, 0xDB):  # str 8/16/32
            return self.string(self.uint(1 << (tag - 0xD9), "str length"))
        if tag in (0xC4, 0xC5, 0xC6):  # bin 8/16/32
            return self.take(self.uint(1 << (tag - 0xC4), "bin length"), "bin")
        if tag in (0xDC, 0xDD):  # array 16/32
            return self.array(self.uint(2 if tag == 0xDC else 4, "array length"), depth)
        if tag in (0xDE, 0xDF):  # map 16/32
            return self.map(self.uint(2 if tag == 0xDE else 4, "map length"), depth)
        raise ElfError(f"AMDGPU metadata: unsupported msgpack type 0x{tag:02x} at offset {self.pos - 1}")

    def string(self, n: int) -> str:
        raw = self.take(n, "string")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ElfError(f"AMDGPU metadata: string at offset {self.pos - n} is not UTF-8 ({e})") from None

    def array(self, n: int, depth: int) -> list[Any]:
        return [self.value(depth + 1) for _ in range(self.count(n, "array"))]

    def map(self, n: int, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for _ in range(self.count(n, "map")):
            key = self.value(depth + 1)
            if not isinstance(key, str):
                raise ElfError(f"AMDGPU metadata: map key {key!r} is not a string")
            out[key] = self.value(depth + 1)
        return out


def read_msgpack(data: bytes) -> Any:
    """Decode one msgpack value that spans all of `data` (ElfError on anything malformed or left over)."""
    reader = _MsgpackReader(bytes(data))
    out = reader.value()
    if reader.pos != len(reader.data):
        raise ElfError(f"AMDGPU metadata: {len(reader.data) - reader.pos} bytes after the msgpack value")
    return out


# --------------------------------------------------------------------------------------------- metadata
def _notes(sec: ElfSection) -> list[tuple[bytes, int, bytes]]:
    """(name, type, descriptor) of every entry of a SHT_NOTE section."""
    out, off, data = [], 0, sec.data
    while off < len(data):
        if off + NOTE_HEADER.size > len(data):
            raise ElfError(f"AMDGPU note {sec.name!r}: truncated note header at offset {off}")
        namesz, descsz, ntype = NOTE_HEADER.unpack_from(data, off)
        name_at = off + NOTE_HEADER.size
        desc_at = name_at + _align(namesz, NOTE_ALIGN)
        end = desc_at + _align(descsz, NOTE_ALIGN)
        if desc_at + descsz > len(data):
            raise ElfError(f"AMDGPU note {sec.name!r}: entry at offset {off} (name {namesz}, desc {descsz} "
                           f"bytes) runs past the section ({len(data)} bytes)")
        out.append((data[name_at:name_at + namesz], ntype, data[desc_at:desc_at + descsz]))
        off = end
    return out


def _field(entry: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in entry:
        raise ElfError(f"AMDGPU metadata: {where} has no {key!r}")
    v = entry[key]
    if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
        raise ElfError(f"AMDGPU metadata: {where} {key!r} is {v!r}, expected a non-negative integer")
    if kind is str and not isinstance(v, str):
        raise ElfError(f"AMDGPU metadata: {where} {key!r} is {v!r}, expected a string")
    return v


def _kernel_metadata(entry: Any) -> KernelMetadata:
    if not isinstance(entry, dict):
        raise ElfError(f"AMDGPU metadata: a kernel entry is {type(entry).__name__}, expected a map")
    name = _field(entry, ".name", str, "kernel")
    where = f"kernel {name!r}"
    raw_args = entry.get(".args", [])
    if not isinstance(raw_args, list):
        raise ElfError(f"AMDGPU metadata: {where} .args is not a list")
    args = []
    for k, a in enumerate(raw_args):
        if not isinstance(a, dict):
            raise ElfError(f"AMDGPU metadata: {where} argument {k} is not a map")
        aw = f"{where} argument {k}"
        space = a.get(".address_space")
        args.append(KernelArg(str(a.get(".name", "")), _field(a, ".offset", int, aw),
                              _field(a, ".size", int, aw), _field(a, ".value_kind", str, aw),
                              space if isinstance(space, str) else None))
    fields = [_field(entry, key, int, where) for key in (
        ".kernarg_segment_size", ".kernarg_segment_align", ".group_segment_fixed_size",
        ".private_segment_fixed_size", ".sgpr_count", ".vgpr_count", ".wavefront_size",
        ".max_flat_workgroup_size")]
    meta = KernelMetadata(name, _field(entry, ".symbol", str, where), tuple(args), *fields)
    for a in meta.args:
        if a.offset + a.size > meta.kernarg_segment_size:
            raise ElfError(f"AMDGPU metadata: {where} argument {a.name!r} [{a.offset}, {a.offset + a.size}) "
                           f"lies outside the {meta.kernarg_segment_size}-byte kernarg segment")
    return meta


def _metadata(elf: ElfFile) -> tuple[str, list[KernelMetadata]]:
    blobs = [desc for sec in elf.sections if sec.type == SHT_NOTE for (name, ntype, desc) in _notes(sec)
             if name == AMDGPU_NOTE_NAME and ntype == NT_AMDGPU_METADATA]
    if len(blobs) != 1:
        raise ElfError(f"AMDGPU code object has {len(blobs)} NT_AMDGPU_METADATA notes, expected 1")
    doc = read_msgpack(blobs[0])
    if not isinstance(doc, dict):
        raise ElfError("AMDGPU metadata: the note is not a msgpack map")
    target = _field(doc, "amdhsa.target", str, "the note")
    kernels = doc.get("amdhsa.kernels")
    if not isinstance(kernels, list):
        raise ElfError("AMDGPU metadata: amdhsa.kernels is missing or not a list")
    return target, [_kernel_metadata(k) for k in kernels]


# ----------------------------------------------------------------------------------- layout + relocation
def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _layout(elf: ElfFile) -> tuple[dict[int, int], int]:
    """Image offset of every allocated section (section order, each at its alignment) and the image size."""
    offsets: dict[int, int] = {}
    off = 0
    for s in elf.sections:
        if not s.flags & SHF_ALLOC:
            continue
        align = max(s.align, 1)
        if align > MAX_SECTION_ALIGN or align & (align - 1):
            raise ElfError(f"AMDGPU section {s.name!r} asks for alignment {s.align} (a power of two up to "
                           f"{MAX_SECTION_ALIGN} is accepted)")
        off = _align(off, align)
        offsets[s.index] = off
        off += s.size
        if off > MAX_IMAGE_BYTES:
            raise ElfError(f"AMDGPU code object image would exceed {MAX_IMAGE_BYTES} bytes")
    return offsets, off


def _relocate(elf: ElfFile, image: bytearray, offsets: dict[int, int]) -> None:
    for k, r in enumerate(elf.relocations):
        if r.section_index not in offsets:
            continue  # a relocation in a section that is not loaded (debug info): nothing to patch
        sec = elf.sections[r.section_index]
        where = f"AMDGPU relocation {k} (type {r.type}) at {sec.name}+{r.offset:#x}"
        if r.type == R_AMDGPU_NONE:
            continue
        if r.type not in (R_AMDGPU_REL64, R_AMDGPU_REL32_LO, R_AMDGPU_REL32_HI):
            raise ElfError(f"{where}: unsupported relocation type (the loader handles "
                           f"REL64={R_AMDGPU_REL64}, REL32_LO={R_AMDGPU_REL32_LO} and "
                           f"REL32_HI={R_AMDGPU_REL32_HI})")
        if not r.explicit_addend:
            raise ElfError(f"{where}: SHT_REL entries are not used by AMDGPU code objects")
        sym = r.symbol
        if sym.section_index == SHN_UNDEF or sym.section_index not in offsets:
            raise ElfError(f"{where}: symbol {sym.name!r} is not defined in a loaded section (undefined "
                           f"symbols cannot be resolved without a linker)")
        width = 8 if r.type == R_AMDGPU_REL64 else 4
        if r.offset + width > sec.size:
            raise ElfError(f"{where}: the {width}-byte field runs past {sec.name!r} ({sec.size} bytes)")
        target = elf.sections[sym.section_index]
        if sym.value > target.size:
            raise ElfError(f"{where}: symbol {sym.name!r} value {sym.value:#x} is outside {target.name!r}")
        place = offsets[r.section_index] + r.offset
        value = offsets[sym.section_index] + sym.value + r.addend - place  # S + A - P
        if r.type == R_AMDGPU_REL64:
            struct.pack_into("<Q", image, place, value & _U64)
        elif r.type == R_AMDGPU_REL32_LO:
            struct.pack_into("<I", image, place, value & _U32)
        else:
            struct.pack_into("<I", image, place, (value >> 32) & _U32)


def load_code_object(obj: bytes, arch: str | None = None, kernel: str | None = None) -> AMDCodeObject:
    """Lay out, relocate and decode an AMDGPU relocatable code object (see the module docstring).

    `arch` ("gfx1100"): refuse an object built for another processor. `kernel`: which kernel to describe
    when the object holds several (default: the only one)."""
    elf = ElfFile.parse(obj)
    data = bytes(obj)
    if elf.machine != EM_AMDGPU:
        raise ElfError(f"not an AMDGPU code object: e_machine is {elf.machine}, expected {EM_AMDGPU}")
    if elf.elf_type != ET_REL:
        raise ElfError(f"AMDGPU code object must be relocatable (ET_REL={ET_REL}), got e_type {elf.elf_type}")
    if data[EI_OSABI] != ELFOSABI_AMDGPU_HSA or data[EI_ABIVERSION] not in SUPPORTED_ABI_VERSIONS:
        raise ElfError(f"AMDGPU code object has OS ABI {data[EI_OSABI]} version {data[EI_ABIVERSION]}; "
                       f"expected AMDGPU_HSA ({ELFOSABI_AMDGPU_HSA}) version in {SUPPORTED_ABI_VERSIONS}")
    if arch is not None:
        want = EF_AMDGPU_MACH_BY_ARCH.get(arch)
        if want is None:
            known = ", ".join(sorted(EF_AMDGPU_MACH_BY_ARCH))
            raise ElfError(f"unknown AMD processor {arch!r} (known: {known})")
        if elf.flags & EF_AMDGPU_MACH != want:
            raise ElfError(f"AMDGPU code object is for processor mach {elf.flags & EF_AMDGPU_MACH:#x}, "
                           f"not {arch} ({want:#x})")
    target, kernels = _metadata(elf)
    if kernel is None:
        if len(kernels) != 1:
            raise ElfError(f"AMDGPU code object holds {len(kernels)} kernels "
                           f"({', '.join(m.name for m in kernels)}); name the one to load")
        meta = kernels[0]
    else:
        found = [m for m in kernels if m.name == kernel]
        if not found:
            raise ElfError(f"AMDGPU code object has no kernel {kernel!r} "
                           f"(has: {', '.join(m.name for m in kernels)})")
        meta = found[0]
    offsets, size = _layout(elf)
    image = bytearray(size)
    for idx, off in offsets.items():
        s = elf.sections[idx]
        if s.type != SHT_NOBITS:
            image[off:off + s.size] = s.data
    _relocate(elf, image, offsets)
    by_name = {s.name: s for s in elf.symbols if s.section_index in offsets}
    kd_sym, code_sym = by_name.get(meta.symbol), by_name.get(meta.name)
    if kd_sym is None or kd_sym.type != STT_OBJECT or kd_sym.size != KD_SIZE:
        raise ElfError(f"AMDGPU code object: kernel descriptor symbol {meta.symbol!r} is missing or not a "
                       f"{KD_SIZE}-byte object")
    kd_sec = elf.sections[kd_sym.section_index]
    if kd_sym.value + KD_SIZE > kd_sec.size:
        raise ElfError(f"AMDGPU code object: descriptor {meta.symbol!r} lies outside {kd_sec.name!r}")
    kd_offset = offsets[kd_sym.section_index] + kd_sym.value
    if kd_offset % KD_ALIGN:
        raise ElfError(f"AMDGPU code object: descriptor {meta.symbol!r} at image offset {kd_offset:#x} is "
                       f"not {KD_ALIGN}-byte aligned")
    kd = KernelDescriptor.decode(bytes(image[kd_offset:kd_offset + KD_SIZE]))
    entry = kd_offset + kd.kernel_code_entry_byte_offset
    text_idx = next((i for i in offsets if elf.sections[i].flags & SHF_EXECINSTR
                     and offsets[i] <= entry < offsets[i] + elf.sections[i].size), None)
    if text_idx is None:
        raise ElfError(f"AMDGPU code object: kernel {meta.name!r} code entry {entry:#x} is not inside an "
                       f"executable section")
    code_at = None if code_sym is None else offsets[code_sym.section_index] + code_sym.value
    if code_sym is None or code_sym.type != STT_FUNC or code_at != entry:
        raise ElfError(f"AMDGPU code object: descriptor entry {entry:#x} does not match the kernel symbol "
                       f"{meta.name!r}")
    text = elf.sections[text_idx]
    arch_name = target.rsplit("--", 1)[-1].split(":", 1)[0]
    return AMDCodeObject(meta.name, arch_name, target, elf.flags, bytes(image), offsets[text_idx], text.size,
                         entry, kd_offset, kd, meta, {elf.sections[i].name: o for i, o in offsets.items()})
