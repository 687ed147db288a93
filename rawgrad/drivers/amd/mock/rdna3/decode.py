"""RDNA3 (gfx11) instruction decoder: format and length from the encoding's prefix bits, operand fields,
inline constants, 32-bit literals and VOP3 modifiers, decoded from the bytes of a code object.

Facts used (AMD "RDNA3 Instruction Set Architecture" reference guide, chapter "Microcode Formats"; the same
prefixes are listed in ../shared/AMD-METAL-FACTS.md section 2.3 and were checked there against 51,341
instructions of LLVM 22 output):

    SOP2 10 | SOPK 1011 | SOP1 101111101 | SOPC 101111110 | SOPP 101111111 | SMEM 111101 | VOP1 0111111 |
    VOPC 0111110 | VOP2 0 | VOP3/VOP3SD 110101 | VOP3P 11001100 | VOPD 110010 | DS 110110 |
    FLAT/GLOBAL/SCRATCH 110111 | MUBUF 111000

Which mnemonic an opcode number means is not written here: it is generated data (optable.py and
optable_ops.py, made by tools/amd_optable.py from LLVM's own encoder output), so a wrong table entry shows
up as a test failure against LLVM's assembly listing rather than as a silent mistranslation.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from functools import cache

from rawgrad.drivers.amd.mock.rdna3.optable import OPTABLE
from rawgrad.drivers.amd.mock.rdna3.optable_ops import OPTABLE_OPS

__all__ = ["DecodeError", "Instr", "Operand", "decode", "decode_all", "mnemonic_base"]


class DecodeError(Exception):
    """The bytes are not an RDNA3 instruction this decoder knows how to size (or run past the code)."""


# (name, prefix value, number of prefix bits), most specific first: VOP1 and VOPC start with the VOP2 bit 0,
# and SOP1/SOPC/SOPP/SOPK start with the SOP2 bits 10, so they must be tried before those.
_FORMATS: tuple[tuple[str, int, int], ...] = (
    ("SOP1", 0b101111101, 9), ("SOPC", 0b101111110, 9), ("SOPP", 0b101111111, 9),
    ("VOP3P", 0b11001100, 8),
    ("VOP1", 0b0111111, 7), ("VOPC", 0b0111110, 7),
    ("SMEM", 0b111101, 6), ("VOP3", 0b110101, 6), ("VOPD", 0b110010, 6), ("DS", 0b110110, 6),
    ("FLAT", 0b110111, 6), ("MUBUF", 0b111000, 6),
    ("SOPK", 0b1011, 4),
    ("SOP2", 0b10, 2),
    ("VOP2", 0b0, 1),
)
_WIDE = {"SMEM", "VOP3", "VOP3P", "VOPD", "DS", "FLAT", "MUBUF"}  # 64-bit encodings; the rest are 32-bit

LITERAL = 255  # a source field of 255 means: a 32-bit literal follows the instruction (RDNA3 ISA, "Literal")
# VOP2 and VOPD opcodes that carry a literal operand (the K of fmaak/fmamk) with no source field naming it
# (RDNA3 ISA opcode tables: V_FMAMK_F32 44, V_FMAAK_F32 45, V_FMAMK_F16 55, V_FMAAK_F16 56; VOPD
# V_DUAL_FMAAK_F32 1, V_DUAL_FMAMK_F32 2)
_VOP2_K_OPS = frozenset({44, 45, 55, 56})
_VOPD_K_OPS = frozenset({1, 2})

# scalar source/destination encodings besides s0..s105 (RDNA3 ISA, "SSRC0" operand table; gfx11 swapped
# M0 and NULL relative to gfx10)
VCC_LO, VCC_HI, SGPR_NULL, M0, EXEC_LO, EXEC_HI = 106, 107, 124, 125, 126, 127
SCC_SRC = 253
NUM_SGPRS = 106  # s0..s105 are the addressable SGPRs of a wave (RDNA3 ISA, "SGPRs")
_FLOAT_CONSTS = {240: 0.5, 241: -0.5, 242: 1.0, 243: -1.0, 244: 2.0, 245: -2.0, 246: 4.0, 247: -4.0}
INV_2PI = 248  # the inline constant 1/(2*pi)
_NAMED = {VCC_LO: "vcc_lo", VCC_HI: "vcc_hi", SGPR_NULL: "null", M0: "m0", EXEC_LO: "exec_lo",
          EXEC_HI: "exec_hi", SCC_SRC: "scc", 251: "vccz", 252: "execz", 254: "lds_direct"}


@dataclass(frozen=True)
class Operand:
    """One source operand: kind is 'sgpr' (index includes vcc/exec/m0/null at 106..127), 'vgpr', 'int'
    (an inline integer constant), 'float' (an inline float constant; `value` is the number, whose bits
    depend on the operand's width), 'inv2pi', 'literal' (`value`: the 32 bits that followed), 'scc', or
    'special' (vccz/execz/lds_direct/DPP markers the interpreter refuses)."""

    kind: str
    index: int = 0
    value: float | int = 0

    def __str__(self) -> str:
        if self.kind == "sgpr":
            return _NAMED.get(self.index, f"s{self.index}")
        if self.kind == "vgpr":
            return f"v{self.index}"
        if self.kind in ("int", "float"):
            return str(self.value)
        if self.kind == "literal":
            return f"{int(self.value):#x}"
        return _NAMED.get(self.index, self.kind)


def source(code: int, literal: int | None) -> Operand:
    """The operand a 9-bit source field (VOP*) or 8-bit scalar source field names."""
    if code < 128:
        return Operand("sgpr", code)
    if code >= 256:
        return Operand("vgpr", code - 256)
    if code <= 192:
        return Operand("int", code - 128, code - 128)  # 128..192: the integers 0..64
    if code <= 208:
        return Operand("int", code, 192 - code)  # 193..208: -1..-16
    if code in _FLOAT_CONSTS:
        return Operand("float", code, _FLOAT_CONSTS[code])
    if code == INV_2PI:
        return Operand("inv2pi", code)
    if code == LITERAL:
        if literal is None:
            raise DecodeError("literal operand without literal dword")
        return Operand("literal", code, literal)
    if code == SCC_SRC:
        return Operand("scc", code)
    return Operand("special", code)


@dataclass
class Instr:
    """One decoded instruction. `fields` holds the raw encoding fields by name (see `_fields`), `literal` the
    trailing dword if any; `mnemonic` is LLVM's name for (fmt, op) from the generated table, or None when the
    table has no entry (the interpreter then refuses it naming the format and opcode). A VOPD instruction
    carries its Y half's opcode and mnemonic in `op_y` / `mnemonic_y`."""

    pc: int
    size: int
    fmt: str
    op: int
    mnemonic: str | None
    fields: dict[str, int]
    literal: int | None = None
    op_y: int | None = None
    mnemonic_y: str | None = None
    words: tuple[int, ...] = field(default=(), repr=False)

    @property
    def name(self) -> str:
        """The mnemonic, or '<FMT opcode N>' when the table lacks it (used in error messages)."""
        return self.mnemonic or f"<{self.fmt} opcode {self.op}>"

    def src(self, name: str) -> Operand:
        return source(self.fields[name], self.literal)

    def mnemonics(self) -> list[str]:
        """What LLVM prints for this instruction: one mnemonic, or both halves of a VOPD pair."""
        out = [self.name]
        if self.fmt == "VOPD":
            out.append(self.mnemonic_y or f"<VOPDY opcode {self.op_y}>")
        return out


def classify(word: int) -> str:
    for name, prefix, bits in _FORMATS:
        if word >> (32 - bits) == prefix:
            return name
    raise DecodeError(f"no RDNA3 encoding starts with {word:#010x}")  # unreachable: VOP2 takes bit 31 == 0


def _bits(v: int, hi: int, lo: int) -> int:
    return (v >> lo) & ((1 << (hi - lo + 1)) - 1)


def _fields(fmt: str, w0: int, w1: int) -> tuple[int, dict[str, int]]:
    """(opcode, named fields) of one instruction; w1 is the second dword of 64-bit encodings (else 0)."""
    b = _bits
    if fmt == "SOP2":
        return b(w0, 29, 23), {"sdst": b(w0, 22, 16), "ssrc1": b(w0, 15, 8), "ssrc0": b(w0, 7, 0)}
    if fmt == "SOPK":
        return b(w0, 27, 23), {"sdst": b(w0, 22, 16), "simm16": b(w0, 15, 0)}
    if fmt == "SOP1":
        return b(w0, 15, 8), {"sdst": b(w0, 22, 16), "ssrc0": b(w0, 7, 0)}
    if fmt == "SOPC":
        return b(w0, 22, 16), {"ssrc1": b(w0, 15, 8), "ssrc0": b(w0, 7, 0)}
    if fmt == "SOPP":
        return b(w0, 22, 16), {"simm16": b(w0, 15, 0)}
    if fmt == "SMEM":
        return b(w0, 25, 18), {"sdata": b(w0, 12, 6), "sbase": b(w0, 5, 0) * 2, "glc": b(w0, 14, 14),
                               "dlc": b(w0, 13, 13), "offset": b(w1, 20, 0), "soffset": b(w1, 31, 25)}
    if fmt == "VOP1":
        return b(w0, 16, 9), {"vdst": b(w0, 24, 17), "src0": b(w0, 8, 0)}
    if fmt == "VOP2":
        return b(w0, 30, 25), {"vdst": b(w0, 24, 17), "vsrc1": b(w0, 16, 9), "src0": b(w0, 8, 0)}
    if fmt == "VOPC":
        return b(w0, 24, 17), {"vsrc1": b(w0, 16, 9), "src0": b(w0, 8, 0)}
    if fmt == "VOP3":
        # VOP3SD instructions (carry-out / div_scale) reuse bits 14:8 as an SGPR destination; the
        # interpreter reads `sdst` for those and `abs`/`opsel` for the others
        return b(w0, 25, 16), {"vdst": b(w0, 7, 0), "abs": b(w0, 10, 8), "opsel": b(w0, 14, 11),
                               "sdst": b(w0, 14, 8), "clamp": b(w0, 15, 15), "src0": b(w1, 8, 0),
                               "src1": b(w1, 17, 9), "src2": b(w1, 26, 18), "omod": b(w1, 28, 27),
                               "neg": b(w1, 31, 29)}
    if fmt == "VOP3P":
        return b(w0, 22, 16), {"vdst": b(w0, 7, 0), "neg_hi": b(w0, 10, 8), "opsel": b(w0, 13, 11),
                               "opsel_hi2": b(w0, 14, 14), "clamp": b(w0, 15, 15), "src0": b(w1, 8, 0),
                               "src1": b(w1, 17, 9), "src2": b(w1, 26, 18), "opsel_hi": b(w1, 28, 27),
                               "neg": b(w1, 31, 29)}
    if fmt == "VOPD":
        vdstx = b(w1, 31, 24)
        # the Y destination stores bits 7:1; bit 0 is the opposite of vdstx's (the two must use different
        # VGPR banks) (RDNA3 ISA, "VOPD")
        vdsty = (b(w1, 23, 17) << 1) | ((vdstx & 1) ^ 1)
        return b(w0, 25, 22), {"opy": b(w0, 21, 17), "vsrcx1": b(w0, 16, 9), "srcx0": b(w0, 8, 0),
                               "srcy0": b(w1, 8, 0), "vsrcy1": b(w1, 16, 9), "vdsty": vdsty, "vdstx": vdstx}
    if fmt == "DS":
        return b(w0, 25, 18), {"offset0": b(w0, 7, 0), "offset1": b(w0, 15, 8), "gds": b(w0, 17, 17),
                               "addr": b(w1, 7, 0), "data0": b(w1, 15, 8), "data1": b(w1, 23, 16),
                               "vdst": b(w1, 31, 24)}
    if fmt == "FLAT":
        return b(w0, 24, 18), {"offset": b(w0, 12, 0), "dlc": b(w0, 13, 13), "glc": b(w0, 14, 14),
                               "slc": b(w0, 15, 15), "seg": b(w0, 17, 16), "addr": b(w1, 7, 0),
                               "data": b(w1, 15, 8), "saddr": b(w1, 22, 16), "vdst": b(w1, 31, 24)}
    if fmt == "MUBUF":
        return b(w0, 25, 18), {"offset": b(w0, 11, 0), "vaddr": b(w1, 7, 0), "vdata": b(w1, 15, 8),
                               "srsrc": b(w1, 20, 16) * 4, "soffset": b(w1, 31, 24)}
    raise DecodeError(f"no field layout for {fmt}")


_SOURCE_FIELDS = {"SOP2": ("ssrc0", "ssrc1"), "SOP1": ("ssrc0",), "SOPC": ("ssrc0", "ssrc1"),
                  "VOP1": ("src0",), "VOP2": ("src0",), "VOPC": ("src0",), "VOP3": ("src0", "src1", "src2"),
                  "VOP3P": ("src0", "src1", "src2"), "VOPD": ("srcx0", "srcy0")}


def _has_literal(fmt: str, op: int, f: dict[str, int]) -> bool:
    if any(f[name] == LITERAL for name in _SOURCE_FIELDS.get(fmt, ())):
        return True
    if fmt == "VOP2":
        return op in _VOP2_K_OPS
    if fmt == "VOPD":
        return op in _VOPD_K_OPS or f["opy"] in _VOPD_K_OPS
    return False


def decode(code: bytes | memoryview, pc: int) -> Instr:
    """Decode the instruction at byte offset `pc` of `code`."""
    if pc < 0 or pc % 4 or pc + 4 > len(code):
        raise DecodeError(f"pc {pc:#x} is outside the code ({len(code)} bytes) or not 4-byte aligned")
    (w0,) = struct.unpack_from("<I", code, pc)
    fmt = classify(w0)
    size = 8 if fmt in _WIDE else 4
    if pc + size > len(code):
        raise DecodeError(f"{fmt} instruction at pc {pc:#x} runs past the end of the code")
    w1 = struct.unpack_from("<I", code, pc + 4)[0] if size == 8 else 0
    op, f = _fields(fmt, w0, w1)
    literal = None
    if _has_literal(fmt, op, f):
        if pc + size + 4 > len(code):
            raise DecodeError(f"{fmt} instruction at pc {pc:#x}: its literal runs past the end of the code")
        literal = struct.unpack_from("<I", code, pc + size)[0]
        size += 4
    words = struct.unpack_from(f"<{size // 4}I", code, pc)
    if fmt == "VOPD":
        op_y = f["opy"]
        return Instr(pc, size, fmt, op, lookup("VOPDX", op), f, literal, op_y, lookup("VOPDY", op_y), words)
    return Instr(pc, size, fmt, op, lookup(fmt, op), f, literal, words=words)


def lookup(fmt: str, op: int) -> str | None:
    """LLVM's mnemonic for (format, opcode): the corpus table (optable.py), else the exhaustive one from the
    op test kernels (optable_ops.py); None when neither has seen it. Both are generated by
    tools/amd_optable.py; a test checks they agree where both have an entry."""
    return OPTABLE.get((fmt, op)) or OPTABLE_OPS.get((fmt, op))


def decode_all(code: bytes | memoryview, start: int = 0, end: int | None = None) -> list[Instr]:
    """Decode every instruction in [start, end) back to back (a kernel's body, e.g. its symbol's extent)."""
    end = len(code) if end is None else end
    out, pc = [], start
    while pc < end:
        ins = decode(code, pc)
        out.append(ins)
        pc += ins.size
    if pc != end:
        raise DecodeError(f"the last instruction ends at {pc:#x}, past the end {end:#x}")
    return out


@cache  # a pure function of the string, asked once per interpreter step
def mnemonic_base(mnemonic: str) -> str:
    """The operation a mnemonic names, independent of encoding: 'v_add_f32_e32' / 'v_add_f32_e64' /
    'v_dual_add_f32' -> 'v_add_f32'."""
    if mnemonic.startswith("v_dual_"):
        mnemonic = "v_" + mnemonic[len("v_dual_"):]
    for suffix in ("_e32", "_e64"):
        if mnemonic.endswith(suffix):
            return mnemonic[: -len(suffix)]
    return mnemonic
