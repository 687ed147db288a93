"""KFD topology: the GPUs amdkfd exposes under ``/sys/devices/virtual/kfd/kfd/topology/nodes/<n>/``.

Each node directory holds ``gpu_id`` (0 for a CPU-only node), ``name`` and ``properties`` ("key value" lines,
unsigned decimal values; AMD-METAL-FACTS 1.2 step 1). Everything is read through the OS seam
(``OSInterface.open/read/close/exists``), so the mock KFD serves the same files. The files are untrusted
input: sizes, line syntax, duplicate keys and every field the driver uses are bounds-checked, and a bad
file is reported with its path, line and the rule it broke.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rawgrad.drivers.osapi import O_CLOEXEC, O_RDONLY, OSInterface

TOPOLOGY_ROOT = "/sys/devices/virtual/kfd/kfd/topology"
NODES_DIR = TOPOLOGY_ROOT + "/nodes"
KFD_PATH = "/dev/kfd"
RENDER_NODE_PREFIX = "/dev/dri/renderD"

MAX_NODES = 256  # enumeration bound: no machine has more KFD nodes (CPU sockets + GPU partitions)
MAX_FILE_BYTES = 64 * 1024  # a properties file is ~1 KiB; anything this large is not one
_READ_CHUNK = 4096
_KEY_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
_VALUE_RE = re.compile(r"[0-9]{1,20}\Z")

# Targets rawgrad compiles and drives (AMD-METAL-FACTS 1.1): gfx1100 primary, gfx942 secondary.
SUPPORTED_TARGETS = ("gfx1100", "gfx942")
# Wave size each family's KFD reports (AMD-METAL-FACTS 1.1: RDNA3 wave32, CDNA3 wave64).
_FAMILY_WAVE = {11: 32, 9: 64}

# Fields the driver reads: name -> (min, max). Bounds are generous sanity limits (no real part is near
# them) so a corrupt or hostile file cannot size a buffer or a loop; 0 is allowed where a part may report it.
_BOUNDS: dict[str, tuple[int, int]] = {
    "gfx_target_version": (1, 999999),  # major*10000 + minor*100 + step
    "simd_count": (1, 1 << 16),
    "simd_per_cu": (1, 16),
    "wave_front_size": (32, 64),
    "max_waves_per_simd": (1, 64),
    "lds_size_in_kb": (1, 1024),
    "array_count": (1, 1024),
    "simd_arrays_per_engine": (1, 64),
    "cu_per_simd_array": (1, 256),
    "max_slots_scratch_cu": (0, 1024),
    "num_xcc": (1, 64),
    "drm_render_minor": (128, (1 << 20) - 1),  # DRM render minors start at 128
    "vendor_id": (0, 0xFFFF),
    "device_id": (0, 0xFFFF),
    "num_cp_queues": (0, 1024),
    "num_sdma_engines": (0, 64),
    "num_sdma_xgmi_engines": (0, 64),
    "num_sdma_queues_per_engine": (0, 64),
    "local_mem_size": (0, 1 << 50),
    "fw_version": (0, 0xFFFFFFFF),
    "sdma_fw_version": (0, 0xFFFFFFFF),
    "capability": (0, 0xFFFFFFFF),
    "location_id": (0, 0xFFFFFFFF),
    "domain": (0, 0xFFFFFFFF),
}
# Required on a GPU node; the rest default when an older kernel does not print them.
_REQUIRED = ("gfx_target_version", "simd_count", "simd_per_cu", "wave_front_size", "max_waves_per_simd",
             "lds_size_in_kb", "array_count", "simd_arrays_per_engine", "cu_per_simd_array",
             "drm_render_minor")
_DEFAULTS = {"num_xcc": 1, "max_slots_scratch_cu": 0, "vendor_id": 0, "device_id": 0, "num_cp_queues": 0,
             "num_sdma_engines": 0, "num_sdma_xgmi_engines": 0, "num_sdma_queues_per_engine": 0,
             "local_mem_size": 0, "fw_version": 0, "sdma_fw_version": 0, "capability": 0, "location_id": 0,
             "domain": 0}
AMD_VENDOR_ID = 0x1002  # PCI vendor id of AMD/ATI


class TopologyError(RuntimeError):
    """A KFD topology file is missing, unreadable, malformed or out of range."""


class UnsupportedTargetError(TopologyError):
    """A GPU node's target is not one rawgrad drives."""


class NoGPUError(TopologyError):
    """KFD is present but lists no GPU node (only CPU nodes), or no KFD at all."""


def gfx_target_name(version: int) -> str:
    """``gfx_target_version`` -> LLVM target: 110000 -> gfx1100, 90402 -> gfx942, 90010 -> gfx90a.

    KFD packs major*10000 + minor*100 + step; the target name writes minor and step as one hex digit each."""
    major, minor, step = version // 10000, version // 100 % 100, version % 100
    if major == 0 or minor > 15 or step > 15:
        raise ValueError(f"gfx_target_version {version} does not encode a gfx target")
    return f"gfx{major}{minor:x}{step:x}"


def read_text(os_iface: OSInterface, path: str, limit: int = MAX_FILE_BYTES) -> str:
    """The whole text of a small file through the OS seam (at most ``limit`` bytes, ASCII)."""
    fd = os_iface.open(path, O_RDONLY | O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        total = 0
        while True:
            b = os_iface.read(fd, _READ_CHUNK)
            if not b:
                break
            total += len(b)
            if total > limit:
                raise TopologyError(f"{path}: larger than {limit} bytes; not a KFD topology file")
            chunks.append(b)
    finally:
        os_iface.close(fd)
    try:
        return b"".join(chunks).decode("ascii")
    except UnicodeDecodeError as e:
        raise TopologyError(f"{path}: not ASCII text (byte {e.start})") from None


def parse_properties(text: str, path: str = "properties") -> dict[str, int]:
    """``key value`` lines -> dict. Keys are lower-case identifiers, values unsigned decimal < 2^64; a
    duplicate key, a malformed line or an overflowing value is an error naming the line."""
    props: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not _KEY_RE.match(parts[0]) or not _VALUE_RE.match(parts[1]):
            raise TopologyError(f"{path}:{lineno}: expected 'key <unsigned decimal>', got {line[:80]!r}")
        key, value = parts[0], int(parts[1])
        if value >= 1 << 64:
            raise TopologyError(f"{path}:{lineno}: {key} = {value} does not fit 64 bits")
        if key in props:
            raise TopologyError(f"{path}:{lineno}: duplicate key {key!r}")
        props[key] = value
    return props


def _parse_int_file(text: str, path: str, hi: int) -> int:
    s = text.strip()
    if not _VALUE_RE.match(s) or int(s) > hi:
        raise TopologyError(f"{path}: expected an unsigned integer <= {hi}, got {s[:40]!r}")
    return int(s)


@dataclass(frozen=True)
class AMDNode:
    """One GPU node of the KFD topology, as the driver needs it."""

    node_id: int
    gpu_id: int  # the 16-bit id every KFD ioctl names the GPU by
    name: str  # the node's `name` file ("ip discovery" on current kernels)
    target: str  # LLVM target, e.g. "gfx1100"
    gfx_target_version: int
    simd_count: int
    simd_per_cu: int
    wave_size: int
    max_waves_per_simd: int
    lds_bytes: int
    array_count: int
    simd_arrays_per_engine: int
    cu_per_simd_array: int
    max_slots_scratch_cu: int
    num_xcc: int
    drm_render_minor: int
    vendor_id: int
    device_id: int
    num_cp_queues: int
    num_sdma_engines: int
    num_sdma_xgmi_engines: int
    num_sdma_queues_per_engine: int
    local_mem_size: int
    fw_version: int
    sdma_fw_version: int
    capability: int
    location_id: int
    domain: int
    properties: tuple[tuple[str, int], ...]  # every key of the file, for diagnostics

    @property
    def cu_count(self) -> int:
        return self.simd_count // self.simd_per_cu

    @property
    def render_node(self) -> str:
        return f"{RENDER_NODE_PREFIX}{self.drm_render_minor}"

    @property
    def family(self) -> int:
        return self.gfx_target_version // 10000


def _node_dir(node_id: int, root: str) -> str:
    return f"{root}/{node_id}"


def read_node(os_iface: OSInterface, node_id: int, root: str = NODES_DIR) -> AMDNode | None:
    """Node ``node_id``: None for a CPU-only node (gpu_id 0), else its checked :class:`AMDNode`."""
    d = _node_dir(node_id, root)
    if not os_iface.exists(f"{d}/gpu_id"):
        raise TopologyError(f"{d}/gpu_id is missing (not a KFD topology node)")
    gpu_id = _parse_int_file(read_text(os_iface, f"{d}/gpu_id"), f"{d}/gpu_id", (1 << 16) - 1)
    if gpu_id == 0:
        return None
    path = f"{d}/properties"
    props = parse_properties(read_text(os_iface, path), path)
    missing = [k for k in _REQUIRED if k not in props]
    if missing:
        raise TopologyError(f"{path}: GPU node (gpu_id {gpu_id:#x}) lacks {', '.join(missing)}")
    vals: dict[str, Any] = dict(_DEFAULTS)
    for key, (lo, hi) in _BOUNDS.items():
        if key in props:
            if not lo <= props[key] <= hi:
                raise TopologyError(f"{path}: {key} = {props[key]} is outside {lo}..{hi}")
            vals[key] = props[key]
    try:
        target = gfx_target_name(vals["gfx_target_version"])
    except ValueError as e:
        raise TopologyError(f"{path}: {e}") from None
    if vals["simd_count"] % vals["simd_per_cu"]:
        raise TopologyError(f"{path}: simd_count {vals['simd_count']} is not a multiple of simd_per_cu "
                            f"{vals['simd_per_cu']}")
    if vals["wave_front_size"] not in (32, 64):
        raise TopologyError(f"{path}: wave_front_size {vals['wave_front_size']} is neither 32 nor 64")
    family_wave = _FAMILY_WAVE.get(vals["gfx_target_version"] // 10000)
    if family_wave is not None and family_wave != vals["wave_front_size"]:
        raise TopologyError(f"{path}: {target} reports wave_front_size {vals['wave_front_size']}, its "
                            f"family runs wave{family_wave}")
    name = read_text(os_iface, f"{d}/name").strip() if os_iface.exists(f"{d}/name") else ""
    return AMDNode(
        node_id=node_id, gpu_id=gpu_id, name=name[:64], target=target,
        gfx_target_version=vals["gfx_target_version"], simd_count=vals["simd_count"],
        simd_per_cu=vals["simd_per_cu"], wave_size=vals["wave_front_size"],
        max_waves_per_simd=vals["max_waves_per_simd"], lds_bytes=vals["lds_size_in_kb"] * 1024,
        array_count=vals["array_count"], simd_arrays_per_engine=vals["simd_arrays_per_engine"],
        cu_per_simd_array=vals["cu_per_simd_array"], max_slots_scratch_cu=vals["max_slots_scratch_cu"],
        num_xcc=vals["num_xcc"], drm_render_minor=vals["drm_render_minor"], vendor_id=vals["vendor_id"],
        device_id=vals["device_id"], num_cp_queues=vals["num_cp_queues"],
        num_sdma_engines=vals["num_sdma_engines"], num_sdma_xgmi_engines=vals["num_sdma_xgmi_engines"],
        num_sdma_queues_per_engine=vals["num_sdma_queues_per_engine"], local_mem_size=vals["local_mem_size"],
        fw_version=vals["fw_version"], sdma_fw_version=vals["sdma_fw_version"], capability=vals["capability"],
        location_id=vals["location_id"], domain=vals["domain"], properties=tuple(sorted(props.items())))


def node_ids(os_iface: OSInterface, root: str = NODES_DIR) -> list[int]:
    """Node directories 0, 1, ... (KFD numbers them densely; the seam has no directory listing)."""
    ids = []
    for i in range(MAX_NODES + 1):
        if not os_iface.exists(f"{_node_dir(i, root)}/gpu_id"):
            break
        if i == MAX_NODES:
            raise TopologyError(f"{root}: more than {MAX_NODES} nodes; refusing to enumerate further")
        ids.append(i)
    return ids


def gpu_nodes(os_iface: OSInterface, root: str = NODES_DIR) -> list[AMDNode]:
    """Every GPU node, supported or not (CPU-only nodes are skipped)."""
    return [n for i in node_ids(os_iface, root) if (n := read_node(os_iface, i, root)) is not None]


def discover(os_iface: OSInterface, root: str = NODES_DIR,
             supported: tuple[str, ...] = SUPPORTED_TARGETS) -> list[AMDNode]:
    """The GPUs rawgrad can drive, in node order. No KFD, only CPU nodes, or only unsupported targets is an
    error that says which."""
    if not os_iface.exists(KFD_PATH):
        raise NoGPUError(f"{KFD_PATH} does not exist: the amdgpu kernel driver (KFD) is not loaded")
    ids = node_ids(os_iface, root)
    if not ids:
        raise NoGPUError(f"{root}: no topology nodes (KFD present but exposes none)")
    gpus = [n for i in ids if (n := read_node(os_iface, i, root)) is not None]
    if not gpus:
        raise NoGPUError(f"{root}: {len(ids)} node(s), all CPU-only (gpu_id 0): no AMD GPU is visible "
                         "(check /dev/kfd permissions and the render group)")
    ok = [n for n in gpus if n.target in supported]
    if not ok:
        seen = ", ".join(f"node {n.node_id} {n.target}" for n in gpus)
        raise UnsupportedTargetError(f"no supported AMD GPU: found {seen}; rawgrad drives "
                                     f"{', '.join(supported)}")
    return ok
