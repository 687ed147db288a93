"""LLVM's assembly listing beside our decode of the same kernel's object: the zip deriving the opcode table
(tools/amd_optable.py) and the check that the decoder names every instruction as LLVM's asm printer does.

Both come from one optimized module, emitted twice from fresh parses (corpus.compile_ir), so the listing and
the object hold the same instructions in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass

from rawgrad.compiler.elf import ElfFile
from rawgrad.drivers.amd.mock.rdna3.decode import Instr, decode_all

__all__ = ["AlignmentError", "KernelCode", "aligned_keys", "kernel_code", "listing_mnemonics"]

STT_FUNC = 2  # ELF symbol type of a function (System V ABI)


class AlignmentError(Exception):
    """The listing and the decoded object disagree on the number of instructions, or on a mnemonic."""


@dataclass(frozen=True)
class KernelCode:
    """The .text bytes of a code object and the extent of one kernel function in them."""

    text: bytes
    start: int
    end: int


def kernel_code(obj: bytes, name: str) -> KernelCode:
    """The kernel `name`'s machine code in a relocatable AMDGPU object: its function symbol's extent in .text
    (the padding LLVM appends after the last kernel, s_code_end words, is not part of it)."""
    elf = ElfFile.parse(obj)
    text = elf.section(".text")
    for sym in elf.symbols:
        if sym.name == name and sym.type == STT_FUNC and sym.section_index == text.index:
            return KernelCode(text.data, sym.value, sym.value + sym.size)
    raise AlignmentError(f"no function symbol {name!r} in .text")


ALIGN = ".p2align"  # a listing entry [ALIGN, "k"]: the code is padded to a 2^k-byte boundary here
S_NOP_0 = 0xBF800000  # `s_nop 0`: the word LLVM's AMDGPU assembler pads code alignment with (SOPP opcode 0)


def listing_mnemonics(asm: str, name: str) -> list[list[str]]:
    """The mnemonics of kernel `name`'s instructions in an assembly listing, one list per instruction (two for
    a VOPD line 'v_dual_a ... :: v_dual_b ...'), from the label `name:` to `.Lfunc_end`. A `.p2align k`
    inside the function (loop headers) appears as [ALIGN, "k"]: the object has s_nop padding there that the
    listing does not print."""
    lines = asm.splitlines()
    try:
        start = lines.index(f"{name}:") + 1
    except ValueError:
        raise AlignmentError(f"no label {name!r}: in the listing") from None
    out: list[list[str]] = []
    in_text = True  # the kernel descriptor block (.section .rodata) sits between the code and .Lfunc_end
    for raw in lines[start:]:
        line = raw.split(";")[0].strip()
        if line.startswith(".Lfunc_end"):
            return out
        if line.startswith((".section", ".text")):
            in_text = line == ".text" or line.split()[1].split(",")[0] == ".text"
            continue
        if not in_text:
            continue
        if line.startswith(ALIGN + " ") or line.startswith(ALIGN + "\t"):
            out.append([ALIGN, line[len(ALIGN):].split(",")[0].strip()])
            continue
        if not line or line.startswith(".") or line.endswith(":"):
            continue  # other directives and branch-target labels
        out.append([part.split()[0] for part in line.split("::")])
    raise AlignmentError(f"kernel {name!r} has no .Lfunc_end in the listing")


def _keys(ins: Instr) -> list[tuple[str, int]]:
    if ins.fmt == "VOPD":
        assert ins.op_y is not None
        return [("VOPDX", ins.op), ("VOPDY", ins.op_y)]
    return [(ins.fmt, ins.op)]


def zipped(obj: bytes, asm: str, name: str) -> list[tuple[Instr, list[str]]]:
    """Each decoded instruction of kernel `name` with the mnemonics the listing prints for it. Alignment
    padding gets ["s_nop"] after checking every padding word is `s_nop 0` and that it ends on the boundary.
    Raises AlignmentError when the two disagree on the number of instructions."""
    code = kernel_code(obj, name)
    decoded = decode_all(code.text, code.start, code.end)
    printed = listing_mnemonics(asm, name)
    out: list[tuple[Instr, list[str]]] = []
    i = consumed = padding = 0
    for names in printed:
        if names[0] == ALIGN:
            unit = 1 << int(names[1])
            while i < len(decoded) and (decoded[i].pc - code.start) % unit:
                if decoded[i].words != (S_NOP_0,):
                    raise AlignmentError(f"{name}: pc {decoded[i].pc:#x}: alignment padding is "
                                         f"{decoded[i].words}, not s_nop 0")
                out.append((decoded[i], ["s_nop"]))
                i += 1
                padding += 1
            continue
        if i == len(decoded):
            break
        out.append((decoded[i], names))
        i += 1
        consumed += 1
    printed_count = sum(names[0] != ALIGN for names in printed)
    if i != len(decoded) or consumed != printed_count:
        raise AlignmentError(f"{name}: decoded {len(decoded)} instructions, the listing has {printed_count} "
                             f"(+{padding} alignment padding)")
    return out


def aligned_keys(obj: bytes, asm: str, name: str) -> list[tuple[tuple[str, int], str]]:
    """((format, opcode), mnemonic) for every instruction of kernel `name` (both halves of VOPD)."""
    out: list[tuple[tuple[str, int], str]] = []
    for ins, names in zipped(obj, asm, name):
        keys = _keys(ins)
        if len(keys) != len(names):
            raise AlignmentError(f"{name}: pc {ins.pc:#x} decodes as {ins.fmt} but the listing prints "
                                 f"{' :: '.join(names)}")
        out.extend(zip(keys, names))
    return out


def mismatches(obj: bytes, asm: str, name: str) -> list[str]:
    """Every instruction where our decoder's mnemonic differs from LLVM's listing (empty when all agree)."""
    try:
        pairs = zipped(obj, asm, name)
    except AlignmentError as e:
        return [str(e)]
    return [f"{name}: pc {ins.pc:#x}: decoded {' :: '.join(ins.mnemonics())}, "
            f"LLVM printed {' :: '.join(names)}" for ins, names in pairs if ins.mnemonics() != names]
