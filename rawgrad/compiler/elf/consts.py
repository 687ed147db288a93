"""ELF constants shared by the parser, the host linker and the AMDGPU code-object loader.

Numbers come from the System V gABI ("ELF-64 Object File Format", elf.h), the x86-64 psABI and AAELF64;
each block names its source.
"""

from __future__ import annotations

import struct


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
