"""Our own ELF64 parser, linker and loader for relocatable objects (ET_REL).

Split by stage: ``parse`` (ElfFile), ``link`` (layout + relocations, pure Python), ``host`` (this process's
mappings and libc symbols) and ``load`` (executable memory); ``consts`` holds the ELF numbers. This package
re-exports all of them, so ``from rawgrad.compiler import elf`` keeps working for every caller.

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

from rawgrad.compiler.elf.consts import *  # noqa: F403  (every ELF constant, ElfError)
from rawgrad.compiler.elf.consts import ElfError
from rawgrad.compiler.elf.host import host_machine
from rawgrad.compiler.elf.link import _AARCH64_LDST_SHIFT, _AARCH64_MOVW, MAX_IMAGE_SIZE, LinkedImage, link
from rawgrad.compiler.elf.load import LoadedImage, load
from rawgrad.compiler.elf.parse import ElfFile, ElfReloc, ElfSection, ElfSymbol

__all__ = ["MAX_IMAGE_SIZE", "ElfError", "ElfFile", "ElfReloc", "ElfSection", "ElfSymbol", "LinkedImage",
           "LoadedImage", "_AARCH64_LDST_SHIFT", "_AARCH64_MOVW", "host_machine", "link", "load"]
