"""Queue Meta Data (QMD) builders: the launch descriptor a SEND_PCAS_A method points the compute engine at.

Two layouts, each a table of named fields (name -> (hi, lo) flat bit range, bit 0 = LSB of byte 0):

- QMD V03 (Ampere AMPERE_COMPUTE_A/B 0xC6C0/0xC7C0, Ada ADA_COMPUTE_A 0xC9C0): 256 bytes,
  open-gpu-doc clc6c0qmd.h / clc7c0qmd.h / clc9c0qmd.h ``*_QMDV03_00_*`` (NV-FACTS 5.3, 5.4).
- QMD V04 (Hopper HOPPER_COMPUTE_A 0xCBC0): 384 bytes, clcbc0qmd.h ``NVCBC0_QMDV04_00_*`` (NV-FACTS 5.3, 5.5).

Values may be symbolic (a `UOp` over DEFINE_VARs): a dword holding a symbolic field becomes an integer
expression (constant bits OR the shifted, masked field), which the HCQ queue turns into a patch point. So a
QMD embedded in a prebuilt queue has its grid size, argument bank address and release payload patched at
submit like any other word. Every line here restates the NV-FACTS tables; nothing is copied from another
driver.
"""

from __future__ import annotations

from typing import ClassVar

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.drivers.nv import abi

__all__ = ["QMD", "QMDV03", "QMDV04", "Value", "qmd_for_class", "sym_bits"]

Value = int | UOp
BitRange = tuple[int, int]  # (hi, lo), inclusive, flat over the whole QMD

DWORD_BITS = 32
MAX_CONSTANT_BUFFERS = 8  # CONSTANT_BUFFER_*(i), i = 0..7 in both layouts
MAX_CONSTANT_BUFFER_BYTES = 0x10000  # a constant bank is at most 64 KiB

# Enumerated field values (clc6c0qmd.h / clcbc0qmd.h; NV-FACTS 5.2, 5.4, 5.5)
QMD_TYPE_GRID_CTA = 2  # NVCBC0_QMDV04_00_QMD_TYPE_GRID_CTA (NVK leaves 0; a third-party H100 bring-up sets 2)
QMD_GROUP_ID_TINYGRAD_STYLE = 0x3F  # QMD_GROUP_ID as NV-FACTS 5.4 lists it; UNSURE whether it matters
DEPENDENT_QMD_ACTION_SCHEDULE = 1  # *_DEPENDENT_QMD0_ACTION_QMD_SCHEDULE
RELEASE_STRUCTURE_FOUR_WORDS = 0  # *_RELEASE*_STRUCTURE_SIZE_FOUR_WORDS: payload + timestamp at +8
RELEASE_MEMBAR_FE_SYSMEMBAR = 1  # NVCBC0_QMDV04_00_RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR
CWD_MEMBAR_L1_SYSMEMBAR = 1  # *_CWD_MEMBAR_TYPE_L1_SYSMEMBAR
API_VISIBLE_CALL_LIMIT_NO_CHECK = 1  # *_API_VISIBLE_CALL_LIMIT_NO_CHECK
# Shared memory: sm_80+ reserve the first 1 KiB of each CTA's window (NV-FACTS 5.6); the field counts it.
SHARED_MEMORY_RESERVED = 0x400
SHARED_MEMORY_GRANULE = 128  # SHARED_MEMORY_SIZE is rounded up to this (NV-FACTS 5.4)
# SM shared-memory carve-outs, KiB, and their field encoding KiB/4 + 1 (NV-FACTS 5.4; NVK uses the same).
SM_CONFIG_CARVEOUTS_KIB = (32, 64, 100)
SM_CONFIG_MAX_KIB = 100
KIB = 1024
PROGRAM_PREFETCH_SIZE_MAX = 0x1FF  # 9-bit PROGRAM_PREFETCH_SIZE, in 256-byte units
PROGRAM_PREFETCH_SHIFT = 8  # PROGRAM_PREFETCH_ADDR_*_SHIFTED = address >> 8
QMD_POINTER_SHIFT = 8  # DEPENDENT_QMD*_POINTER and SEND_PCAS_A take a 256-byte aligned VA >> 8
CONSTANT_BUFFER_V04_SHIFT = 6  # V04 CONSTANT_BUFFER_ADDR_*_SHIFTED6: bank VA >> 6 (64-byte aligned)
CONSTANT_BUFFER_SIZE_SHIFT = 4  # CONSTANT_BUFFER_SIZE_SHIFTED4: bytes >> 4


def sm_config_encoding(shared_bytes: int) -> int:
    """Smallest carve-out holding `shared_bytes`, encoded KiB/4 + 1 (9, 17 or 26)."""
    for kib in SM_CONFIG_CARVEOUTS_KIB:
        if shared_bytes <= kib * KIB:
            return kib // 4 + 1
    raise ValueError(f"{shared_bytes} bytes of shared memory exceed the {SM_CONFIG_MAX_KIB} KiB carve-out")


def shared_memory_size(static_bytes: int) -> int:
    """SHARED_MEMORY_SIZE for a kernel with `static_bytes` of static shared memory (reserved KiB included)."""
    total = SHARED_MEMORY_RESERVED + static_bytes
    return (total + SHARED_MEMORY_GRANULE - 1) // SHARED_MEMORY_GRANULE * SHARED_MEMORY_GRANULE


# ------------------------------------------------------------------------------------- symbolic bit slicing
def _const(like: UOp, value: int) -> UOp:
    return UOp.const(like.dt, value)


def sym_bits(value: Value, lo: int, width: int) -> Value:
    """Bits [lo, lo + width) of `value` as a non-negative integer (an expression if `value` is symbolic)."""
    mask = (1 << width) - 1
    if isinstance(value, int):
        return (value >> lo) & mask
    shifted = value.alu(Ops.SHR, _const(value, lo)) if lo else value
    return shifted.alu(Ops.AND, _const(value, mask))


def _sym_shl(value: Value, n: int) -> Value:
    if isinstance(value, int):
        return value << n
    return value.alu(Ops.SHL, _const(value, n)) if n else value


def _sym_or(a: Value, b: Value) -> Value:
    if isinstance(a, int) and isinstance(b, int):
        return a | b
    if isinstance(a, int):
        a, b = b, a
    assert isinstance(a, UOp)
    if isinstance(b, int):
        return a if b == 0 else a.alu(Ops.OR, _const(a, b))
    return a.alu(Ops.OR, b)


# ------------------------------------------------------------------------------------------------ builders
class QMD:
    """A QMD being built: `set(name, value)` with range checks, `words()` for the queue.

    Subclasses give the layout (`FIELDS`, `SIZE_BYTES`, version) and the semantic setters the queue uses
    (grid, block, program, constant buffer, release, chaining), so callers never touch bit positions.
    """

    FIELDS: ClassVar[dict[str, BitRange]]
    SIZE_BYTES: ClassVar[int]
    MAJOR_VERSION: ClassVar[int]
    MINOR_VERSION: ClassVar[int]
    MINOR_NAME: ClassVar[str]  # the minor-version field's name differs between layouts
    REGISTER_NAME: ClassVar[str]
    GRID_NAMES: ClassVar[tuple[str, str, str]]
    INVALIDATE_FIELDS: ClassVar[tuple[str, ...]]
    RELEASE_SLOTS: ClassVar[int]
    DEPENDENT_QMD_NAMES: ClassVar[tuple[str, str, str]]  # the chain's ACTION, PREFETCH and ENABLE fields
    NAME: ClassVar[str]

    def __init__(self) -> None:
        self.values: dict[str, Value] = {}
        self.releases_used = 0

    def __repr__(self) -> str:
        return f"{self.NAME}({len(self.values)} fields set)"

    @property
    def dwords(self) -> int:
        return self.SIZE_BYTES // 4

    def set(self, name: str, value: Value) -> QMD:
        """Set field `name`; an int must fit the field's width, a symbolic value is masked to it."""
        rng = self.FIELDS.get(name)
        if rng is None:
            raise KeyError(f"{self.NAME} has no field {name!r}")
        hi, lo = rng
        width = hi - lo + 1
        if isinstance(value, bool) or not isinstance(value, (int, UOp)):
            raise TypeError(f"{self.NAME}.{name} must be an int or a symbolic UOp, got "
                            f"{type(value).__name__}")
        if isinstance(value, int) and not 0 <= value < (1 << width):
            raise ValueError(f"{self.NAME}.{name} = {value:#x} does not fit bits {hi}:{lo} ({width} bits)")
        self.values[name] = value
        return self

    def get(self, name: str) -> Value:
        if name not in self.FIELDS:
            raise KeyError(f"{self.NAME} has no field {name!r}")
        return self.values.get(name, 0)

    def words(self) -> list[Value]:
        """The QMD as 32-bit words; a word holding a symbolic field is an expression of it."""
        out: list[Value] = [0] * self.dwords
        for name, value in self.values.items():
            hi, lo = self.FIELDS[name]
            bit = lo
            while bit <= hi:  # a field may straddle a dword boundary: place it piece by piece
                word, at = divmod(bit, DWORD_BITS)
                take = min(hi + 1, (word + 1) * DWORD_BITS) - bit
                piece = sym_bits(value, bit - lo, take)
                out[word] = _sym_or(out[word], _sym_shl(piece, at))
                bit += take
        return out

    def to_bytes(self) -> bytes:
        """The encoded QMD (all fields must be concrete)."""
        ws = self.words()
        if any(not isinstance(w, int) for w in ws):
            raise ValueError(f"{self.NAME} has symbolic fields; encode it through a queue")
        return b"".join(int(w).to_bytes(4, "little") for w in ws)

    # -- semantic setters --------------------------------------------------------------------------------
    def _common(self) -> None:
        raise NotImplementedError

    def launch(self, *, shared_bytes: int = 0, registers: int, barriers: int = 1,
               sass_version: int, local_bytes_per_thread: int = 0) -> QMD:
        """The fields every launch sets: version, caches, membar, shared memory, registers."""
        size = shared_memory_size(shared_bytes)
        cfg = sm_config_encoding(size)
        self.set("QMD_MAJOR_VERSION", self.MAJOR_VERSION).set(self.MINOR_NAME, self.MINOR_VERSION)
        self.set("API_VISIBLE_CALL_LIMIT", API_VISIBLE_CALL_LIMIT_NO_CHECK)
        self.set("CWD_MEMBAR_TYPE", CWD_MEMBAR_L1_SYSMEMBAR)
        self.set("SHARED_MEMORY_SIZE", size)
        self.set("MIN_SM_CONFIG_SHARED_MEM_SIZE", cfg)
        self.set("MAX_SM_CONFIG_SHARED_MEM_SIZE", sm_config_encoding(SM_CONFIG_MAX_KIB * KIB))
        self.set("TARGET_SM_CONFIG_SHARED_MEM_SIZE", cfg)
        self.set(self.REGISTER_NAME, registers)
        self.set("BARRIER_COUNT", barriers)
        self.set("SASS_VERSION", sass_version)
        self.set("SHADER_LOCAL_MEMORY_HIGH_SIZE", local_bytes_per_thread)
        for f in self.INVALIDATE_FIELDS:
            self.set(f, 1)
        self._common()
        return self

    def grid(self, x: Value, y: Value = 1, z: Value = 1) -> QMD:
        for name, v in zip(self.GRID_NAMES, (x, y, z)):
            self.set(name, v)
        return self

    def block(self, x: int, y: int = 1, z: int = 1) -> QMD:
        for i, v in enumerate((x, y, z)):
            self.set(f"CTA_THREAD_DIMENSION{i}", v)
        return self

    def program(self, address: Value, code_bytes: int) -> QMD:
        """Entry point VA (Ampere V03 and Hopper V04 both take the full VA) and the prefetch window."""
        self._set_split("PROGRAM_ADDRESS_LOWER", "PROGRAM_ADDRESS_UPPER", address)
        self._set_split("PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED", "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED", address,
                        PROGRAM_PREFETCH_SHIFT)
        prefetch = min(code_bytes >> PROGRAM_PREFETCH_SHIFT, PROGRAM_PREFETCH_SIZE_MAX)
        self.set("PROGRAM_PREFETCH_SIZE", prefetch)
        return self

    def constant_buffer(self, index: int, address: Value, size: int) -> QMD:
        raise NotImplementedError

    def release(self, address: Value, payload: Value) -> bool:
        """Fold a 64-bit semaphore release (payload + timestamp) into the next free slot; False if full."""
        if self.releases_used >= self.RELEASE_SLOTS:
            return False
        self._set_release(self.releases_used, address, payload)
        self.releases_used += 1
        return True

    def _set_release(self, slot: int, address: Value, payload: Value) -> None:
        raise NotImplementedError

    def chain(self, next_qmd: Value) -> QMD:
        """Schedule the QMD at VA `next_qmd` (256-byte aligned) when this one completes."""
        action, prefetch, enable = self.DEPENDENT_QMD_NAMES
        self.set("DEPENDENT_QMD0_POINTER", sym_bits(next_qmd, QMD_POINTER_SHIFT, DWORD_BITS))
        self.set(action, DEPENDENT_QMD_ACTION_SCHEDULE)
        self.set(prefetch, 1)
        return self.set(enable, 1)

    def _set_split(self, lower: str, upper: str, value: Value, shift: int = 0) -> QMD:
        """A value wider than a dword: bits [shift, shift + 32) into `lower`, the bits above into `upper`
        (as many as that field holds)."""
        self.set(lower, sym_bits(value, shift, DWORD_BITS))
        return self.set(upper, sym_bits(value, shift + DWORD_BITS, self._width(upper)))

    def _width(self, name: str) -> int:
        hi, lo = self.FIELDS[name]
        return hi - lo + 1


def _check_bank(index: int, size: int) -> None:
    if not 0 <= index < MAX_CONSTANT_BUFFERS:
        raise ValueError(f"constant buffer index {index} is outside 0..{MAX_CONSTANT_BUFFERS - 1}")
    if size <= 0 or size % (1 << CONSTANT_BUFFER_SIZE_SHIFT):
        raise ValueError(f"constant buffer size {size} must be a positive multiple of 16 bytes")
    if size > MAX_CONSTANT_BUFFER_BYTES:
        raise ValueError(f"constant buffer {index} of {size} bytes exceeds the "
                         f"{MAX_CONSTANT_BUFFER_BYTES}-byte limit")


def _fields_v03() -> dict[str, BitRange]:
    """NVC6C0_QMDV03_00_* (clc6c0qmd.h), NV-FACTS 5.4.

    Checked bit for bit against NVIDIA's open-gpu-doc clc9c0qmd.h and clcbc0qmd.h (their V03_00 sections
    agree) by tests/nv/test_qmd_headers.py; the Ampere clc6c0qmd.h / clc7c0qmd.h were not at hand to compare.
    """
    f: dict[str, BitRange] = {
        "QMD_GROUP_ID": (133, 128),
        "SM_GLOBAL_CACHING_ENABLE": (134, 134),
        "INVALIDATE_TEXTURE_HEADER_CACHE": (186, 186),
        "INVALIDATE_TEXTURE_SAMPLER_CACHE": (187, 187),
        "INVALIDATE_TEXTURE_DATA_CACHE": (188, 188),
        "INVALIDATE_SHADER_DATA_CACHE": (189, 189),
        "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": (287, 256),
        "CWD_MEMBAR_TYPE": (369, 368),
        "API_VISIBLE_CALL_LIMIT": (378, 378),
        "SAMPLER_INDEX": (382, 382),
        "CTA_RASTER_WIDTH": (415, 384),
        "CTA_RASTER_HEIGHT": (431, 416),
        "CTA_RASTER_DEPTH": (463, 448),
        "DEPENDENT_QMD0_POINTER": (511, 480),
        "DEPENDENT_QMD0_ENABLE": (512, 512),
        "DEPENDENT_QMD0_ACTION": (515, 513),
        "DEPENDENT_QMD0_PREFETCH": (516, 516),
        "SHARED_MEMORY_SIZE": (561, 544),
        "MIN_SM_CONFIG_SHARED_MEM_SIZE": (567, 562),
        "MAX_SM_CONFIG_SHARED_MEM_SIZE": (574, 569),
        "QMD_VERSION": (579, 576),
        "QMD_MAJOR_VERSION": (583, 580),
        "CTA_THREAD_DIMENSION0": (607, 592),
        "CTA_THREAD_DIMENSION1": (623, 608),
        "CTA_THREAD_DIMENSION2": (639, 624),
        "REGISTER_COUNT_V": (656, 648),
        "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (662, 657),
        "SHADER_LOCAL_MEMORY_LOW_SIZE": (759, 736),
        "BARRIER_COUNT": (767, 763),
        "PROGRAM_ADDRESS_LOWER": (1567, 1536),
        "PROGRAM_ADDRESS_UPPER": (1584, 1568),
        "SHADER_LOCAL_MEMORY_HIGH_SIZE": (1623, 1600),
        "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1640, 1632),
        "PROGRAM_PREFETCH_SIZE": (1649, 1641),
        "SASS_VERSION": (1663, 1656),
    }
    for i in range(MAX_CONSTANT_BUFFERS):
        f[f"CONSTANT_BUFFER_VALID{i}"] = (640 + i, 640 + i)
        base = 1024 + 64 * i
        f[f"CONSTANT_BUFFER_ADDR_LOWER{i}"] = (base + 31, base)
        f[f"CONSTANT_BUFFER_ADDR_UPPER{i}"] = (base + 48, base + 32)
        f[f"CONSTANT_BUFFER_INVALIDATE{i}"] = (base + 50, base + 50)
        f[f"CONSTANT_BUFFER_SIZE_SHIFTED4{i}"] = (base + 63, base + 51)
    for i in range(2):  # RELEASE0 at 768, RELEASE1 128 bits later
        base = 768 + 128 * i
        f[f"RELEASE{i}_ADDRESS_LOWER"] = (base + 31, base)
        f[f"RELEASE{i}_ADDRESS_UPPER"] = (base + 39, base + 32)
        f[f"RELEASE{i}_ENABLE"] = (base + 55, base + 55)
        f[f"RELEASE{i}_PAYLOAD64B"] = (base + 61, base + 61)
        f[f"RELEASE{i}_STRUCTURE_SIZE"] = (base + 63, base + 62)
        f[f"RELEASE{i}_PAYLOAD_LOWER"] = (base + 95, base + 64)
        f[f"RELEASE{i}_PAYLOAD_UPPER"] = (base + 127, base + 96)
    return f


def _fields_v04() -> dict[str, BitRange]:
    """NVCBC0_QMDV04_00_* (open-gpu-doc clcbc0qmd.h), NV-FACTS 5.5; checked against that header by
    tests/nv/test_qmd_headers.py."""
    f: dict[str, BitRange] = {
        "QMD_GROUP_ID": (21, 16),
        "QMD_TYPE": (25, 23),
        "DEPENDENT_QMD0_POINTER": (479, 448),
        "DEPENDENT_QMD1_POINTER": (511, 480),
        "SHADER_LOCAL_MEMORY_LOW_SIZE": (535, 512),
        "SASS_VERSION": (543, 536),
        "SHADER_LOCAL_MEMORY_HIGH_SIZE": (567, 544),
        "API_VISIBLE_CALL_LIMIT": (568, 568),
        "SAMPLER_INDEX": (569, 569),
        "QMD_MINOR_VERSION": (579, 576),
        "QMD_MAJOR_VERSION": (583, 580),
        "SHARED_MEMORY_SIZE": (601, 584),
        "INVALIDATE_TEXTURE_HEADER_CACHE": (602, 602),
        "INVALIDATE_TEXTURE_SAMPLER_CACHE": (603, 603),
        "INVALIDATE_TEXTURE_DATA_CACHE": (604, 604),
        "INVALIDATE_SHADER_DATA_CACHE": (605, 605),
        "INVALIDATE_INSTRUCTION_CACHE": (606, 606),
        "INVALIDATE_SHADER_CONSTANT_CACHE": (607, 607),
        "MIN_SM_CONFIG_SHARED_MEM_SIZE": (613, 608),
        "MAX_SM_CONFIG_SHARED_MEM_SIZE": (619, 614),
        "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (625, 620),
        "GRID_WIDTH": (1055, 1024),
        "GRID_HEIGHT": (1071, 1056),
        "GRID_DEPTH": (1103, 1088),
        "CWD_MEMBAR_TYPE": (1137, 1136),
        "CTA_THREAD_DIMENSION0": (1167, 1152),
        "CTA_THREAD_DIMENSION1": (1183, 1168),
        "CTA_THREAD_DIMENSION2": (1199, 1184),
        "REGISTER_COUNT": (1208, 1200),
        "BARRIER_COUNT": (1215, 1211),
        "PROGRAM_ADDRESS_LOWER": (1247, 1216),
        "PROGRAM_ADDRESS_UPPER": (1272, 1248),
        "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": (1375, 1344),
        "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1392, 1376),
        "PROGRAM_PREFETCH_SIZE": (1401, 1393),
        "PROGRAM_PREFETCH_TYPE": (1403, 1402),
    }
    for i in range(3):  # three release slots: config bits 320 + 16i, semaphore record 640 + 128i
        cfg = 320 + 16 * i
        f[f"RELEASE_ENABLE{i}"] = (cfg, cfg)
        f[f"RELEASE_STRUCTURE_SIZE{i}"] = (cfg + 2, cfg + 1)
        f[f"RELEASE_MEMBAR_TYPE{i}"] = (cfg + 3, cfg + 3)
        f[f"RELEASE_REDUCTION_ENABLE{i}"] = (cfg + 4, cfg + 4)
        f[f"RELEASE_REDUCTION_OP{i}"] = (cfg + 7, cfg + 5)
        f[f"RELEASE_REDUCTION_FORMAT{i}"] = (cfg + 9, cfg + 8)
        f[f"RELEASE_PAYLOAD64B{i}"] = (cfg + 12, cfg + 12)
        sem = 640 + 128 * i
        f[f"RELEASE_SEMAPHORE{i}_ADDR_LOWER"] = (sem + 31, sem)
        f[f"RELEASE_SEMAPHORE{i}_ADDR_UPPER"] = (sem + 56, sem + 32)
        f[f"RELEASE_SEMAPHORE{i}_PAYLOAD_LOWER"] = (sem + 95, sem + 64)
        f[f"RELEASE_SEMAPHORE{i}_PAYLOAD_UPPER"] = (sem + 127, sem + 96)
    for i in range(2):  # DEPENDENT_QMD_*(i) at 368 + 5i
        b = 368 + 5 * i
        f[f"DEPENDENT_QMD_ENABLE{i}"] = (b, b)
        f[f"DEPENDENT_QMD_ACTION{i}"] = (b + 3, b + 1)
        f[f"DEPENDENT_QMD_PREFETCH{i}"] = (b + 4, b + 4)
    for i in range(MAX_CONSTANT_BUFFERS):
        b = 416 + 4 * i
        f[f"CONSTANT_BUFFER_VALID{i}"] = (b, b)
        f[f"CONSTANT_BUFFER_PREFETCH{i}"] = (b + 2, b + 1)
        f[f"CONSTANT_BUFFER_INVALIDATE{i}"] = (b + 3, b + 3)
        base = 1536 + 64 * i
        f[f"CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6{i}"] = (base + 31, base)
        f[f"CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6{i}"] = (base + 50, base + 32)
        f[f"CONSTANT_BUFFER_SIZE_SHIFTED4{i}"] = (base + 63, base + 51)
    return f


class QMDV03(QMD):
    """QMD 3.0: Ampere (0xC6C0, 0xC7C0) and Ada (0xC9C0)."""

    FIELDS = _fields_v03()
    SIZE_BYTES = 256  # 0x40 dwords (NV-FACTS 5.3)
    MAJOR_VERSION, MINOR_VERSION = 3, 0
    MINOR_NAME = "QMD_VERSION"
    REGISTER_NAME = "REGISTER_COUNT_V"
    GRID_NAMES = ("CTA_RASTER_WIDTH", "CTA_RASTER_HEIGHT", "CTA_RASTER_DEPTH")
    INVALIDATE_FIELDS = ("INVALIDATE_TEXTURE_HEADER_CACHE", "INVALIDATE_TEXTURE_SAMPLER_CACHE",
                         "INVALIDATE_TEXTURE_DATA_CACHE", "INVALIDATE_SHADER_DATA_CACHE")
    RELEASE_SLOTS = 2
    DEPENDENT_QMD_NAMES = ("DEPENDENT_QMD0_ACTION", "DEPENDENT_QMD0_PREFETCH", "DEPENDENT_QMD0_ENABLE")
    NAME = "QMDV03"

    def _common(self) -> None:
        self.set("QMD_GROUP_ID", QMD_GROUP_ID_TINYGRAD_STYLE)
        self.set("SM_GLOBAL_CACHING_ENABLE", 1)

    def constant_buffer(self, index: int, address: Value, size: int) -> QMD:
        _check_bank(index, size)
        self.set(f"CONSTANT_BUFFER_VALID{index}", 1)
        self._set_split(f"CONSTANT_BUFFER_ADDR_LOWER{index}", f"CONSTANT_BUFFER_ADDR_UPPER{index}", address)
        self.set(f"CONSTANT_BUFFER_INVALIDATE{index}", 1)
        # The intended encoding is bytes >> 4 (clc6c0qmd.h SIZE_SHIFTED4), not the raw byte count.
        return self.set(f"CONSTANT_BUFFER_SIZE_SHIFTED4{index}", size >> CONSTANT_BUFFER_SIZE_SHIFT)

    def _set_release(self, i: int, address: Value, payload: Value) -> None:
        self._set_split(f"RELEASE{i}_ADDRESS_LOWER", f"RELEASE{i}_ADDRESS_UPPER", address)
        self.set(f"RELEASE{i}_ENABLE", 1)
        self.set(f"RELEASE{i}_PAYLOAD64B", 1)
        self.set(f"RELEASE{i}_STRUCTURE_SIZE", RELEASE_STRUCTURE_FOUR_WORDS)
        self._set_split(f"RELEASE{i}_PAYLOAD_LOWER", f"RELEASE{i}_PAYLOAD_UPPER", payload)


class QMDV04(QMD):
    """QMD 4.0: Hopper (0xCBC0)."""

    FIELDS = _fields_v04()
    SIZE_BYTES = 384  # 0x60 dwords (NV-FACTS 5.3)
    MAJOR_VERSION, MINOR_VERSION = 4, 0
    MINOR_NAME = "QMD_MINOR_VERSION"
    REGISTER_NAME = "REGISTER_COUNT"
    GRID_NAMES = ("GRID_WIDTH", "GRID_HEIGHT", "GRID_DEPTH")
    INVALIDATE_FIELDS = ("INVALIDATE_TEXTURE_HEADER_CACHE", "INVALIDATE_TEXTURE_SAMPLER_CACHE",
                         "INVALIDATE_TEXTURE_DATA_CACHE", "INVALIDATE_SHADER_DATA_CACHE",
                         "INVALIDATE_INSTRUCTION_CACHE", "INVALIDATE_SHADER_CONSTANT_CACHE")
    RELEASE_SLOTS = 3
    DEPENDENT_QMD_NAMES = ("DEPENDENT_QMD_ACTION0", "DEPENDENT_QMD_PREFETCH0", "DEPENDENT_QMD_ENABLE0")
    NAME = "QMDV04"

    def _common(self) -> None:
        self.set("QMD_TYPE", QMD_TYPE_GRID_CTA)
        self.set("QMD_GROUP_ID", QMD_GROUP_ID_TINYGRAD_STYLE)

    def constant_buffer(self, index: int, address: Value, size: int) -> QMD:
        _check_bank(index, size)
        if isinstance(address, int) and address % (1 << CONSTANT_BUFFER_V04_SHIFT):
            raise ValueError(f"V04 constant buffer VA {address:#x} must be 64-byte aligned")
        self.set(f"CONSTANT_BUFFER_VALID{index}", 1)
        self.set(f"CONSTANT_BUFFER_INVALIDATE{index}", 1)
        self._set_split(f"CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6{index}",
                        f"CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6{index}", address, CONSTANT_BUFFER_V04_SHIFT)
        return self.set(f"CONSTANT_BUFFER_SIZE_SHIFTED4{index}", size >> CONSTANT_BUFFER_SIZE_SHIFT)

    def _set_release(self, i: int, address: Value, payload: Value) -> None:
        self.set(f"RELEASE_ENABLE{i}", 1)
        self.set(f"RELEASE_STRUCTURE_SIZE{i}", RELEASE_STRUCTURE_FOUR_WORDS)
        self.set(f"RELEASE_MEMBAR_TYPE{i}", RELEASE_MEMBAR_FE_SYSMEMBAR)
        self.set(f"RELEASE_PAYLOAD64B{i}", 1)
        self._set_split(f"RELEASE_SEMAPHORE{i}_ADDR_LOWER", f"RELEASE_SEMAPHORE{i}_ADDR_UPPER", address)
        self._set_split(f"RELEASE_SEMAPHORE{i}_PAYLOAD_LOWER", f"RELEASE_SEMAPHORE{i}_PAYLOAD_UPPER", payload)


# Which layout each compute class takes (NV-FACTS 5.3).
QMD_BY_CLASS: dict[int, type[QMD]] = {
    abi.AMPERE_COMPUTE_A: QMDV03,
    abi.AMPERE_COMPUTE_B: QMDV03,
    abi.ADA_COMPUTE_A: QMDV03,
    abi.HOPPER_COMPUTE_A: QMDV04,
}


def qmd_for_class(compute_class: int) -> type[QMD]:
    """The QMD layout a compute class consumes; ValueError for classes without one here (Blackwell)."""
    try:
        return QMD_BY_CLASS[compute_class]
    except KeyError:
        name = abi.CLASS_NAMES.get(compute_class, hex(compute_class))
        raise ValueError(f"no QMD layout for compute class {name} (V03: Ampere/Ada, V04: Hopper)") from None
