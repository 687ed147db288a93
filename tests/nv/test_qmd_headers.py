"""QMD layouts against NVIDIA's own headers, so the check needs no network.

The bit ranges and enumerated values below are facts copied from NVIDIA's published class headers in the
repository NVIDIA/open-gpu-doc (commit 5d957df1787982e35961ab2ee6834670c6684cb9):

- QMD V03_00: classes/compute/clc9c0qmd.h ``NVC9C0_QMDV03_00_*`` (Ada). clcbc0qmd.h defines the same V03_00
  layout as ``NVCBC0_QMDV03_00_*`` and agrees on every field listed here. The Ampere headers (clc6c0qmd.h,
  clc7c0qmd.h) were not available to check against.
- QMD V04_00: classes/compute/clcbc0qmd.h ``NVCBC0_QMDV04_00_*`` (Hopper).

They list exactly the fields rawgrad's QMD builder (rawgrad/drivers/nv/qmd.py) defines and the mock GPU's
independent decoder (rawgrad/drivers/nv/mock/gpu.py) reads. Header ``MW(hi:lo)`` becomes ``(hi, lo)``; an
indexed header field ``NAME(i)`` with ``MW((hi+(i)*s):(lo+(i)*s))`` becomes ``(hi, lo, s, n)``, n being how
many of the i = 0, 1, ... rawgrad uses (qmd.py names them ``NAME0``, ``NAME1``, ...).
"""

from __future__ import annotations

import pytest

from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv import qmd as Q
from rawgrad.drivers.nv.mock import gpu as G

# ---------------------------------------------------------------------------------------------- QMD V03_00
V03_FIELDS: dict[str, tuple[int, int]] = {
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
    "RELEASE0_ADDRESS_LOWER": (799, 768),
    "RELEASE0_ADDRESS_UPPER": (807, 800),
    "RELEASE0_ENABLE": (823, 823),
    "RELEASE0_PAYLOAD64B": (829, 829),
    "RELEASE0_STRUCTURE_SIZE": (831, 830),
    "RELEASE0_PAYLOAD_LOWER": (863, 832),
    "RELEASE0_PAYLOAD_UPPER": (895, 864),
    "RELEASE1_ADDRESS_LOWER": (927, 896),
    "RELEASE1_ADDRESS_UPPER": (935, 928),
    "RELEASE1_ENABLE": (951, 951),
    "RELEASE1_PAYLOAD64B": (957, 957),
    "RELEASE1_STRUCTURE_SIZE": (959, 958),
    "RELEASE1_PAYLOAD_LOWER": (991, 960),
    "RELEASE1_PAYLOAD_UPPER": (1023, 992),
    "PROGRAM_ADDRESS_LOWER": (1567, 1536),
    "PROGRAM_ADDRESS_UPPER": (1584, 1568),
    "SHADER_LOCAL_MEMORY_HIGH_SIZE": (1623, 1600),
    "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1640, 1632),
    "PROGRAM_PREFETCH_SIZE": (1649, 1641),
    "SASS_VERSION": (1663, 1656),
}
V03_INDEXED: dict[str, tuple[int, int, int, int]] = {
    "CONSTANT_BUFFER_VALID(i)": (640, 640, 1, 8),
    "CONSTANT_BUFFER_ADDR_LOWER(i)": (1055, 1024, 64, 8),
    "CONSTANT_BUFFER_ADDR_UPPER(i)": (1072, 1056, 64, 8),
    "CONSTANT_BUFFER_INVALIDATE(i)": (1074, 1074, 64, 8),
    "CONSTANT_BUFFER_SIZE_SHIFTED4(i)": (1087, 1075, 64, 8),
}
V03_VALUES = {
    "DEPENDENT_QMD0_ACTION_QMD_SCHEDULE": 1,
    "RELEASE0_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS": 0,
    "RELEASE1_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS": 0,
    "CWD_MEMBAR_TYPE_L1_SYSMEMBAR": 1,
    "API_VISIBLE_CALL_LIMIT_NO_CHECK": 1,
}
V03_LAST_BIT = 2047  # NVC9C0_QMDV03_00_DEBUG_ID_LOWER MW(2047:2016): 256 bytes

# ---------------------------------------------------------------------------------------------- QMD V04_00
V04_FIELDS: dict[str, tuple[int, int]] = {
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
    "RELEASE_SEMAPHORE0_ADDR_LOWER": (671, 640),
    "RELEASE_SEMAPHORE0_ADDR_UPPER": (696, 672),
    "RELEASE_SEMAPHORE0_PAYLOAD_LOWER": (735, 704),
    "RELEASE_SEMAPHORE0_PAYLOAD_UPPER": (767, 736),
    "RELEASE_SEMAPHORE1_ADDR_LOWER": (799, 768),
    "RELEASE_SEMAPHORE1_ADDR_UPPER": (824, 800),
    "RELEASE_SEMAPHORE1_PAYLOAD_LOWER": (863, 832),
    "RELEASE_SEMAPHORE1_PAYLOAD_UPPER": (895, 864),
    "RELEASE_SEMAPHORE2_ADDR_LOWER": (927, 896),
    "RELEASE_SEMAPHORE2_ADDR_UPPER": (952, 928),
    "RELEASE_SEMAPHORE2_PAYLOAD_LOWER": (991, 960),
    "RELEASE_SEMAPHORE2_PAYLOAD_UPPER": (1023, 992),
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
V04_INDEXED: dict[str, tuple[int, int, int, int]] = {
    "RELEASE_ENABLE(i)": (320, 320, 16, 3),
    "RELEASE_STRUCTURE_SIZE(i)": (322, 321, 16, 3),
    "RELEASE_MEMBAR_TYPE(i)": (323, 323, 16, 3),
    "RELEASE_REDUCTION_ENABLE(i)": (324, 324, 16, 3),
    "RELEASE_REDUCTION_OP(i)": (327, 325, 16, 3),
    "RELEASE_REDUCTION_FORMAT(i)": (329, 328, 16, 3),
    "RELEASE_PAYLOAD64B(i)": (332, 332, 16, 3),
    "DEPENDENT_QMD_ENABLE(i)": (368, 368, 5, 2),
    "DEPENDENT_QMD_ACTION(i)": (371, 369, 5, 2),
    "DEPENDENT_QMD_PREFETCH(i)": (372, 372, 5, 2),
    "CONSTANT_BUFFER_VALID(i)": (416, 416, 4, 8),
    "CONSTANT_BUFFER_PREFETCH(i)": (418, 417, 4, 8),
    "CONSTANT_BUFFER_INVALIDATE(i)": (419, 419, 4, 8),
    "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(i)": (1567, 1536, 64, 8),
    "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(i)": (1586, 1568, 64, 8),
    "CONSTANT_BUFFER_SIZE_SHIFTED4(i)": (1599, 1587, 64, 8),
}
V04_VALUES = {
    "QMD_TYPE_GRID_CTA": 2,
    "DEPENDENT_QMD_ACTION_QMD_SCHEDULE": 1,
    "RELEASE_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS": 0,
    "RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR": 1,
    "CWD_MEMBAR_TYPE_L1_SYSMEMBAR": 1,
    "API_VISIBLE_CALL_LIMIT_NO_CHECK": 1,
}
V04_LAST_BIT = 3071  # NVCBC0_QMDV04_00_OUTER_STICKY_OVERFLOW MW(3071:3071): 384 bytes

# The mock decoder's names -> header names (NAME(0) = index 0 of an indexed field).
MOCK_V03_NAMES = {
    "major": "QMD_MAJOR_VERSION", "minor": "QMD_VERSION",
    "grid_x": "CTA_RASTER_WIDTH", "grid_y": "CTA_RASTER_HEIGHT", "grid_z": "CTA_RASTER_DEPTH",
    "block_x": "CTA_THREAD_DIMENSION0", "block_y": "CTA_THREAD_DIMENSION1",
    "block_z": "CTA_THREAD_DIMENSION2",
    "registers": "REGISTER_COUNT_V", "shared": "SHARED_MEMORY_SIZE", "sass": "SASS_VERSION",
    "prog_lo": "PROGRAM_ADDRESS_LOWER", "prog_hi": "PROGRAM_ADDRESS_UPPER",
    "cb0_valid": "CONSTANT_BUFFER_VALID(0)", "cb0_lo": "CONSTANT_BUFFER_ADDR_LOWER(0)",
    "cb0_hi": "CONSTANT_BUFFER_ADDR_UPPER(0)", "cb0_size16": "CONSTANT_BUFFER_SIZE_SHIFTED4(0)",
    "dep_enable": "DEPENDENT_QMD0_ENABLE", "dep_action": "DEPENDENT_QMD0_ACTION",
    "dep_ptr": "DEPENDENT_QMD0_POINTER",
    **{f"rel{i}_{short}": f"RELEASE{i}_{name}" for i in range(2) for short, name in (
        ("enable", "ENABLE"), ("lo", "ADDRESS_LOWER"), ("hi", "ADDRESS_UPPER"), ("p64", "PAYLOAD64B"),
        ("struct", "STRUCTURE_SIZE"), ("pay_lo", "PAYLOAD_LOWER"), ("pay_hi", "PAYLOAD_UPPER"))},
}
MOCK_V04_NAMES = {
    "major": "QMD_MAJOR_VERSION", "minor": "QMD_MINOR_VERSION", "qmd_type": "QMD_TYPE",
    "grid_x": "GRID_WIDTH", "grid_y": "GRID_HEIGHT", "grid_z": "GRID_DEPTH",
    "block_x": "CTA_THREAD_DIMENSION0", "block_y": "CTA_THREAD_DIMENSION1",
    "block_z": "CTA_THREAD_DIMENSION2",
    "registers": "REGISTER_COUNT", "shared": "SHARED_MEMORY_SIZE", "sass": "SASS_VERSION",
    "prog_lo": "PROGRAM_ADDRESS_LOWER", "prog_hi": "PROGRAM_ADDRESS_UPPER",
    "cb0_valid": "CONSTANT_BUFFER_VALID(0)", "cb0_lo6": "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0)",
    "cb0_hi6": "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(0)", "cb0_size16": "CONSTANT_BUFFER_SIZE_SHIFTED4(0)",
    "dep_enable": "DEPENDENT_QMD_ENABLE(0)", "dep_action": "DEPENDENT_QMD_ACTION(0)",
    "dep_ptr": "DEPENDENT_QMD0_POINTER",
    **{f"rel{i}_{short}": name for i in range(3) for short, name in (
        ("enable", f"RELEASE_ENABLE({i})"), ("struct", f"RELEASE_STRUCTURE_SIZE({i})"),
        ("p64", f"RELEASE_PAYLOAD64B({i})"), ("lo", f"RELEASE_SEMAPHORE{i}_ADDR_LOWER"),
        ("hi", f"RELEASE_SEMAPHORE{i}_ADDR_UPPER"), ("pay_lo", f"RELEASE_SEMAPHORE{i}_PAYLOAD_LOWER"),
        ("pay_hi", f"RELEASE_SEMAPHORE{i}_PAYLOAD_UPPER"))},
}


def header_ranges(plain: dict[str, tuple[int, int]], indexed: dict[str, tuple[int, int, int, int]],
                  header_style: bool = False) -> dict[str, tuple[int, int]]:
    """Expand indexed fields: ``NAME(i)`` -> ``NAME0``, ``NAME1``, ... (header_style: ``NAME(0)``, ...)."""
    out = dict(plain)
    for name, (hi, lo, stride, count) in indexed.items():
        base = name.removesuffix("(i)")
        for i in range(count):
            out[f"{base}({i})" if header_style else f"{base}{i}"] = (hi + i * stride, lo + i * stride)
    return out


LAYOUTS = {
    "V03": (Q.QMDV03, V03_FIELDS, V03_INDEXED, V03_LAST_BIT, G._V03, MOCK_V03_NAMES),
    "V04": (Q.QMDV04, V04_FIELDS, V04_INDEXED, V04_LAST_BIT, G._V04, MOCK_V04_NAMES),
}


@pytest.mark.parametrize("version", sorted(LAYOUTS))
def test_builder_fields_match_header(version: str) -> None:
    cls, plain, indexed, last_bit, _, _ = LAYOUTS[version]
    want = header_ranges(plain, indexed)
    assert set(cls.FIELDS) == set(want), (set(cls.FIELDS) ^ set(want))
    wrong = {n: (cls.FIELDS[n], want[n]) for n in want if cls.FIELDS[n] != want[n]}
    assert not wrong, f"{version} fields (ours, header) differ: {wrong}"
    assert cls.SIZE_BYTES * 8 == last_bit + 1


@pytest.mark.parametrize("version", sorted(LAYOUTS))
def test_mock_decoder_matches_header(version: str) -> None:
    _, plain, indexed, _, table, names = LAYOUTS[version]
    header = header_ranges(plain, indexed, header_style=True)
    assert set(table) == set(names), f"mock {version} fields unmapped: {set(table) ^ set(names)}"
    wrong = {k: ((lo + width - 1, lo), header[names[k]]) for k, (lo, width) in table.items()
             if (lo + width - 1, lo) != header[names[k]]}
    assert not wrong, f"mock {version} fields (ours as (hi, lo), header) differ: {wrong}"


def test_enumerated_values_match_header() -> None:
    assert (Q.QMDV03.MAJOR_VERSION, Q.QMDV03.MINOR_VERSION) == (3, 0)  # "Queue Meta Data, Version 03_00"
    assert (Q.QMDV04.MAJOR_VERSION, Q.QMDV04.MINOR_VERSION) == (4, 0)  # "Queue Meta Data, Version 04_00"
    assert Q.QMD_TYPE_GRID_CTA == V04_VALUES["QMD_TYPE_GRID_CTA"]
    assert Q.DEPENDENT_QMD_ACTION_SCHEDULE == V03_VALUES["DEPENDENT_QMD0_ACTION_QMD_SCHEDULE"]
    assert Q.DEPENDENT_QMD_ACTION_SCHEDULE == V04_VALUES["DEPENDENT_QMD_ACTION_QMD_SCHEDULE"]
    assert Q.RELEASE_STRUCTURE_FOUR_WORDS == V03_VALUES["RELEASE0_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS"]
    assert Q.RELEASE_STRUCTURE_FOUR_WORDS == V04_VALUES["RELEASE_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS"]
    assert Q.RELEASE_MEMBAR_FE_SYSMEMBAR == V04_VALUES["RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR"]
    assert Q.CWD_MEMBAR_L1_SYSMEMBAR == V03_VALUES["CWD_MEMBAR_TYPE_L1_SYSMEMBAR"]
    assert Q.CWD_MEMBAR_L1_SYSMEMBAR == V04_VALUES["CWD_MEMBAR_TYPE_L1_SYSMEMBAR"]
    assert Q.API_VISIBLE_CALL_LIMIT_NO_CHECK == V03_VALUES["API_VISIBLE_CALL_LIMIT_NO_CHECK"]
    assert Q.API_VISIBLE_CALL_LIMIT_NO_CHECK == V04_VALUES["API_VISIBLE_CALL_LIMIT_NO_CHECK"]
    assert Q.PROGRAM_PREFETCH_SIZE_MAX == (1 << 9) - 1  # PROGRAM_PREFETCH_SIZE is 9 bits in both
    # the mock's own constants
    assert G._DEPENDENT_SCHEDULE == V04_VALUES["DEPENDENT_QMD_ACTION_QMD_SCHEDULE"]
    assert G._RELEASE_FOUR_WORDS == V04_VALUES["RELEASE_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS"]
    assert V04_VALUES["QMD_TYPE_GRID_CTA"] in G._QMD_TYPES_OK
    assert G._QMD_BYTES[abi.HOPPER_COMPUTE_A] * 8 == V04_LAST_BIT + 1


def _field(raw: bytes, rng: tuple[int, int]) -> int:
    hi, lo = rng
    return (int.from_bytes(raw, "little") >> lo) & ((1 << (hi - lo + 1)) - 1)


@pytest.mark.parametrize("version", sorted(LAYOUTS))
def test_semantic_setters_decode_through_header(version: str) -> None:
    """Build a whole launch with the semantic setters and read it back with the header's bit ranges only."""
    cls, plain, indexed, _, table, names = LAYOUTS[version]
    h = header_ranges(plain, indexed, header_style=True)
    values = V04_VALUES if version == "V04" else V03_VALUES
    prog, bank, sig, nxt = 0x1_2345_6789_AB00, 0x1_0203_0405_0640, 0xAB_CDEF_1200, 0x12_3456_7800
    q = cls()
    q.launch(shared_bytes=0x100, registers=40, barriers=2, sass_version=0x86, local_bytes_per_thread=0x240)
    q.grid(7, 5, 3).block(128, 2, 1).program(prog, 0x3456).constant_buffer(0, bank, 0x220)
    assert q.release(sig, 0x1122_3344_5566_7788)
    q.chain(nxt)
    raw = q.to_bytes()
    f = lambda name: _field(raw, h[name])  # noqa: E731
    lo_hi = lambda lo, hi: f(lo) | (f(hi) << 32)  # noqa: E731

    assert f("QMD_MAJOR_VERSION") == cls.MAJOR_VERSION
    assert f("CWD_MEMBAR_TYPE") == values["CWD_MEMBAR_TYPE_L1_SYSMEMBAR"]
    assert f("API_VISIBLE_CALL_LIMIT") == values["API_VISIBLE_CALL_LIMIT_NO_CHECK"]
    assert [f(f"CTA_THREAD_DIMENSION{i}") for i in range(3)] == [128, 2, 1]
    assert f("SHARED_MEMORY_SIZE") == 0x500 and f("BARRIER_COUNT") == 2 and f("SASS_VERSION") == 0x86
    assert f("SHADER_LOCAL_MEMORY_HIGH_SIZE") == 0x240
    assert f("PROGRAM_ADDRESS_LOWER") | (f("PROGRAM_ADDRESS_UPPER") << 32) == prog
    assert lo_hi("PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED", "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED") == prog >> 8
    assert f("PROGRAM_PREFETCH_SIZE") == 0x34
    assert f("CONSTANT_BUFFER_VALID(0)") == 1 and f("CONSTANT_BUFFER_INVALIDATE(0)") == 1
    assert f("CONSTANT_BUFFER_SIZE_SHIFTED4(0)") == 0x220 >> 4
    assert f("DEPENDENT_QMD0_POINTER") == nxt >> 8
    if version == "V03":
        assert f("QMD_VERSION") == 0 and f("REGISTER_COUNT_V") == 40
        assert [f(n) for n in ("CTA_RASTER_WIDTH", "CTA_RASTER_HEIGHT", "CTA_RASTER_DEPTH")] == [7, 5, 3]
        assert lo_hi("CONSTANT_BUFFER_ADDR_LOWER(0)", "CONSTANT_BUFFER_ADDR_UPPER(0)") == bank
        assert lo_hi("RELEASE0_ADDRESS_LOWER", "RELEASE0_ADDRESS_UPPER") == sig
        assert lo_hi("RELEASE0_PAYLOAD_LOWER", "RELEASE0_PAYLOAD_UPPER") == 0x1122_3344_5566_7788
        assert f("RELEASE0_ENABLE") == 1 and f("RELEASE0_PAYLOAD64B") == 1
        assert f("RELEASE0_STRUCTURE_SIZE") == values["RELEASE0_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS"]
        assert f("DEPENDENT_QMD0_ENABLE") == 1 and f("DEPENDENT_QMD0_PREFETCH") == 1
        assert f("DEPENDENT_QMD0_ACTION") == values["DEPENDENT_QMD0_ACTION_QMD_SCHEDULE"]
    else:
        assert f("QMD_MINOR_VERSION") == 0 and f("REGISTER_COUNT") == 40
        assert f("QMD_TYPE") == values["QMD_TYPE_GRID_CTA"]
        assert [f(n) for n in ("GRID_WIDTH", "GRID_HEIGHT", "GRID_DEPTH")] == [7, 5, 3]
        shifted = lo_hi("CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(0)", "CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(0)")
        assert shifted << 6 == bank
        assert lo_hi("RELEASE_SEMAPHORE0_ADDR_LOWER", "RELEASE_SEMAPHORE0_ADDR_UPPER") == sig
        payload = lo_hi("RELEASE_SEMAPHORE0_PAYLOAD_LOWER", "RELEASE_SEMAPHORE0_PAYLOAD_UPPER")
        assert payload == 0x1122_3344_5566_7788
        assert f("RELEASE_ENABLE(0)") == 1 and f("RELEASE_PAYLOAD64B(0)") == 1
        assert f("RELEASE_STRUCTURE_SIZE(0)") == values["RELEASE_STRUCTURE_SIZE_SEMAPHORE_FOUR_WORDS"]
        assert f("RELEASE_MEMBAR_TYPE(0)") == values["RELEASE_MEMBAR_TYPE_FE_SYSMEMBAR"]
        assert f("DEPENDENT_QMD_ENABLE(0)") == 1 and f("DEPENDENT_QMD_PREFETCH(0)") == 1
        assert f("DEPENDENT_QMD_ACTION(0)") == values["DEPENDENT_QMD_ACTION_QMD_SCHEDULE"]

    # the mock reads the same bytes to the same values
    view = G._QMDView(raw)
    assert {k: view.get(table[k]) for k in table} == {k: f(names[k]) for k in table}
