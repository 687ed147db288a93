"""KFD topology parsing (rawgrad/drivers/amd/topology.py) through the OS seam: the mock KFD's gfx1100 and
gfx942 nodes, and every way a sysfs file can be malformed or out of range."""

from __future__ import annotations

import dataclasses

import pytest

from rawgrad.drivers.amd import topology as topo
from rawgrad.drivers.amd.mock.kfd import GFX942, GFX1100, MockKFD

GPU_PROPS = f"{topo.NODES_DIR}/1/properties"


def _set_prop(kfd: MockKFD, key: str, value: str) -> None:
    lines = kfd.files[GPU_PROPS].decode().splitlines()
    kfd.files[GPU_PROPS] = "\n".join(
        f"{key} {value}" if ln.split()[0] == key else ln for ln in lines
    ).encode()


def test_gfx1100_node() -> None:
    kfd = MockKFD(GFX1100)
    (node,) = topo.discover(kfd)
    assert (node.node_id, node.gpu_id, node.target, node.name) == (
        1,
        GFX1100.gpu_id,
        "gfx1100",
        "ip discovery",
    )
    assert (node.wave_size, node.lds_bytes, node.cu_count, node.simd_per_cu, node.num_xcc) == (
        32,
        65536,
        96,
        2,
        1,
    )
    assert (node.render_node, node.vendor_id, node.max_waves_per_simd) == ("/dev/dri/renderD128", 0x1002, 16)
    assert (node.num_sdma_engines, node.num_cp_queues, node.family) == (2, 8, 11)
    assert ("gfx_target_version", 110000) in node.properties
    assert topo.read_node(kfd, 0) is None  # node 0 is the CPU
    assert not kfd.fds  # every file opened was closed


def test_gfx942_node() -> None:
    (node,) = topo.discover(MockKFD(GFX942))
    assert (node.target, node.wave_size, node.cu_count, node.render_node) == (
        "gfx942",
        64,
        38,
        "/dev/dri/renderD129",
    )


@pytest.mark.parametrize(
    "version,name",
    [
        (110000, "gfx1100"),
        (90402, "gfx942"),
        (90010, "gfx90a"),
        (110501, "gfx1151"),
        (120001, "gfx1201"),
        (90500, "gfx950"),
    ],
)
def test_gfx_target_names(version: int, name: str) -> None:
    assert topo.gfx_target_name(version) == name


@pytest.mark.parametrize("version", [0, 91600, 90016, 42])
def test_gfx_target_name_rejects_non_targets(version: int) -> None:
    with pytest.raises(ValueError, match="does not encode a gfx target"):
        topo.gfx_target_name(version)


def test_cpu_only_topology_is_a_clear_error() -> None:
    kfd = MockKFD()
    for k in [k for k in kfd.files if k.startswith(f"{topo.NODES_DIR}/1/")]:
        del kfd.files[k]
    with pytest.raises(topo.NoGPUError, match=r"1 node\(s\), all CPU-only"):
        topo.discover(kfd)


class _NoKFD:
    """A seam with no /dev/kfd and no topology at all."""

    def exists(self, path: str) -> bool:
        return False


def test_missing_kfd_is_a_clear_error() -> None:
    with pytest.raises(topo.NoGPUError, match="KFD\\) is not loaded"):
        topo.discover(_NoKFD())  # type: ignore[arg-type]


def test_unsupported_target_names_it() -> None:
    kfd = MockKFD(dataclasses.replace(GFX942))
    _set_prop(kfd, "gfx_target_version", "90010")  # gfx90a (MI250): out of scope (AMD-METAL-FACTS 1.1)
    with pytest.raises(topo.UnsupportedTargetError, match="node 1 gfx90a.*drives gfx1100, gfx942"):
        topo.discover(kfd)
    assert [n.target for n in topo.gpu_nodes(kfd)] == ["gfx90a"]  # still listed for diagnostics


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("simd_count", "abc", r"properties:\d+: expected 'key <unsigned decimal>'"),
        ("simd_count", "-4", r"expected 'key <unsigned decimal>'"),
        ("lds_size_in_kb", "0", "lds_size_in_kb = 0 is outside 1..1024"),
        ("wave_front_size", "48", "wave_front_size 48 is neither 32 nor 64"),
        ("wave_front_size", "64", "gfx1100 reports wave_front_size 64, its family runs wave32"),
        ("simd_count", "191", "simd_count 191 is not a multiple of simd_per_cu 2"),
        ("drm_render_minor", "7", "drm_render_minor = 7 is outside 128"),
        ("num_xcc", "1000", "num_xcc = 1000 is outside 1..64"),
        ("gfx_target_version", "91600", "does not encode a gfx target"),
        ("simd_count", "99999999999999999999", "does not fit 64 bits"),
    ],
)
def test_malformed_properties(key: str, value: str, message: str) -> None:
    kfd = MockKFD()
    _set_prop(kfd, key, value)
    with pytest.raises(topo.TopologyError, match=message):
        topo.discover(kfd)
    assert not kfd.fds


def test_duplicate_and_missing_keys() -> None:
    kfd = MockKFD()
    kfd.files[GPU_PROPS] += b"simd_count 192\n"
    with pytest.raises(topo.TopologyError, match="duplicate key 'simd_count'"):
        topo.discover(kfd)
    kfd = MockKFD()
    kfd.files[GPU_PROPS] = b"".join(
        ln + b"\n" for ln in kfd.files[GPU_PROPS].splitlines() if not ln.startswith(b"wave_front_size")
    )
    with pytest.raises(topo.TopologyError, match="lacks wave_front_size"):
        topo.discover(kfd)


def test_oversized_binary_and_bad_gpu_id_files() -> None:
    kfd = MockKFD()
    kfd.files[GPU_PROPS] = b"simd_count 1\n" * 10000
    with pytest.raises(topo.TopologyError, match="larger than 65536 bytes"):
        topo.discover(kfd)
    assert not kfd.fds  # closed on the error path too
    kfd = MockKFD()
    kfd.files[GPU_PROPS] = b"simd_count \xff\n"
    with pytest.raises(topo.TopologyError, match="not ASCII"):
        topo.discover(kfd)
    kfd = MockKFD()
    kfd.files[f"{topo.NODES_DIR}/1/gpu_id"] = b"70000\n"  # gpu_ids are 16-bit hashes
    with pytest.raises(topo.TopologyError, match="gpu_id: expected an unsigned integer <= 65535"):
        topo.discover(kfd)


def test_node_enumeration_is_bounded() -> None:
    class _Endless(MockKFD):
        def exists(self, path: str) -> bool:
            return path.endswith("/gpu_id") or super().exists(path)

    with pytest.raises(topo.TopologyError, match=f"more than {topo.MAX_NODES} nodes"):
        topo.node_ids(_Endless())
