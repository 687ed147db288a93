"""Target descriptors (compiler/target.py): the facts they hold, that lowering and the renderers read every
processor number from them, the launch contract a lowered kernel carries, and that no driver reaches into a
renderer."""
from __future__ import annotations

import pathlib
import re
from dataclasses import replace

import numpy as np
import pytest

from rawgrad import Device, Tensor, Variable
from rawgrad.compiler.lower import lower
from rawgrad.compiler.renderer import renderer_for
from rawgrad.compiler.renderer.llvm import LLVMRenderer
from rawgrad.compiler.renderer.ptx import PTXRenderer, render_ptx
from rawgrad.compiler.target import (
    AMD_GFX942,
    AMD_GFX1100,
    NV_SM80,
    NV_SM90,
    LaunchSpec,
    Processor,
    Target,
    host_cpu_target,
    host_vector_bits,
    nv_target,
)
from rawgrad.dtype import dtypes
from rawgrad.tensor.schedule import create_schedule

DRIVERS = pathlib.Path(__file__).resolve().parents[1] / "rawgrad" / "drivers"


def _ast(t: Tensor):  # the last kernel of t's schedule
    items, _ = create_schedule([t.uop])
    return [it for it in items if it.ast is not None][-1].ast


# ------------------------------------------------------------------------------ the descriptors
def test_host_cpu_target_describes_this_host():
    t = host_cpu_target()
    assert t.processor is Processor.CPU and not t.is_gpu
    assert t.vector_bits == host_vector_bits() and t.simd_width == host_vector_bits() // 32
    assert (t.block_threads, t.max_threads_per_block, t.shared_memory_bytes) == (1, 1, 0)
    assert t.vector_load_bytes[-1] == host_vector_bits() // 8 and t.tensor_cores == ()
    assert dtypes.bfloat16 in t.dtypes and dtypes.float64 in t.dtypes
    assert Device["CPU"].target == t  # the device exposes the target its renderer writes kernels for


def test_nv_targets():
    assert nv_target("sm_90") == NV_SM90 and NV_SM90.isa == "sm_90"  # H100 / H200
    for t in (NV_SM80, NV_SM90):
        assert t.is_gpu and t.simd_width == 32 and t.max_threads_per_block == 1024
        assert t.block_threads % t.simd_width == 0 and t.vector_lanes(4) == 4  # 16-byte ld/st.v4
        assert t.shared_memory_bytes == 48 * 1024 and t.triple == "nvptx64-nvidia-cuda"
        shapes = [(tc.m, tc.n, tc.k) for tc in t.tensor_cores if tc.dtype_in == dtypes.float16]
        assert (16, 8, 16) in shapes  # mma.sync m16n8k16
    with pytest.raises(ValueError, match="sm_90"):
        nv_target("gfx1100")
    with pytest.raises(ValueError, match="sm_80 or newer"):
        nv_target("sm_75")


def test_amd_targets_have_their_wave_width():
    assert AMD_GFX1100.simd_width == 32 and AMD_GFX942.simd_width == 64  # RDNA3 wave32, CDNA3 wave64
    for t in (AMD_GFX1100, AMD_GFX942):
        assert t.is_gpu and t.triple == "amdgcn-amd-amdhsa" and t.block_threads % t.simd_width == 0
        assert t.shared_memory_bytes == 64 * 1024 and t.tensor_cores
        assert t.max_threads_per_block == 1024


def test_a_target_with_a_block_of_partial_warps_is_refused():
    with pytest.raises(ValueError, match="whole warps"):
        replace(NV_SM90, block_threads=48)
    with pytest.raises(ValueError, match="max_threads_per_block"):
        replace(NV_SM90, block_threads=2048)


# ------------------------------------------------------------------------------ the launch contract
def test_launch_spec():
    n = Variable("t.n", 1, 100)
    spec = LaunchSpec((n, 3, 1), (32, 1, 1), buffers=2, scalars=(n,))
    assert spec.args == 3 and spec.static_global is None
    assert spec.global_for_scalars([7]) == (7, 3, 1) and spec.global_for({n: 9}) == (9, 3, 1)
    assert LaunchSpec((4, 2, 3)).threads == 24 and LaunchSpec((4, 2, 3)).static_global == (4, 2, 3)
    with pytest.raises(ValueError, match="local size"):
        LaunchSpec((4, 1, 1), (0, 1, 1))
    with pytest.raises(ValueError, match="3-D"):
        LaunchSpec((4, 1), (1, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scalars"):
        spec.global_for_scalars([1, 2])
    with pytest.raises(ValueError, match="exceeds"):
        LaunchSpec((1, 1, 1), (2048, 1, 1)).check_target(NV_SM90)


def test_lowering_writes_the_launch_contract():
    x = Tensor(np.ones((6, 4096), np.float32))
    cpu = lower(_ast(x.sum(1)), "k", host_cpu_target())
    assert cpu.launch.local_size == (1, 1, 1) and cpu.launch.global_size == (cpu.global_size, 1, 1)
    assert cpu.launch.buffers == 2 and cpu.launch.scalars == () and cpu.target == host_cpu_target()
    gpu = lower(_ast(x.sum(1)), "k", NV_SM90)  # a long row: a whole block per output
    assert gpu.group_size == NV_SM90.block_threads and gpu.launch.local_size == (gpu.group_size, 1, 1)
    assert gpu.launch.global_size == (6 * gpu.group_size, 1, 1)
    assert gpu.launch.shared_bytes == gpu.group_size // NV_SM90.simd_width * 8  # one slot per warp
    small = lower(_ast(Tensor(np.ones(5, np.float32)) + 1), "k", NV_SM90)
    assert small.launch.local_size == (5, 1, 1)  # a launch smaller than a block runs one small block


def test_lowering_reads_the_warp_block_and_vector_width_from_the_target():
    x = Tensor(np.ones((3, 512), np.float32))
    wave64 = lower(_ast(x.sum(1)), "k", AMD_GFX942)
    assert wave64.group_size == 64  # a wave of 64 per output, not NV's warp of 32
    assert lower(_ast(x.sum(1)), "k", NV_SM90).group_size == 32
    long = Tensor(np.ones((2, 64 * 1024), np.float32))
    assert lower(_ast(long.sum(1)), "k", AMD_GFX942).group_size == AMD_GFX942.block_threads == 256
    narrow = replace(NV_SM90, name="nv-narrow", vector_load_bytes=(1, 2, 4, 8))  # at most 8-byte accesses
    a = Tensor(np.ones((8, 64), np.float32))
    prog = lower(_ast(a * 2 + 1), "k", narrow)
    assert prog.vector_groups and all(len(g) == 2 for g in prog.vector_groups)
    assert lower(_ast(a * 2 + 1), "k", NV_SM90).vector_groups[0].__len__() == 4
    with pytest.raises(TypeError, match="Target"):
        lower(_ast(a * 2), "k", "gpu")  # type: ignore[arg-type]


def test_ptx_renderer_takes_block_and_warp_from_the_target():
    wide = replace(NV_SM90, name="nv-wide-block", block_threads=256)
    x = Tensor(np.ones((2, 8192), np.float32))
    prog = lower(_ast(x.sum(1)), "k", wide)
    assert prog.group_size == 256 and prog.launch.local_size == (256, 1, 1)
    text = render_ptx(prog, wide)
    # a block group runs only in its block (.reqntid), with one shared slot per warp
    assert prog.launch.exact_local and ".reqntid 256, 1, 1" in text and f"[{256 // 32 * 8}]" in text
    assert all(f"%{reg}.{a}" in text for reg in ("ctaid", "ntid", "nctaid") for a in "xyz")  # 3-D index
    nv = PTXRenderer("sm_90")
    assert ".reqntid 128, 1, 1" in nv.render(nv.lower(_ast(x.sum(1)), "k"))
    elementwise = nv.lower(_ast(x + 1), "k")  # runs in any block: bounded by the renderer's block size
    assert not elementwise.launch.exact_local and ".maxntid 128, 1, 1" in nv.render(elementwise)
    with pytest.raises(ValueError, match="NVIDIA"):
        render_ptx(prog, AMD_GFX1100)


def test_exec_refuses_another_block_for_a_kernel_that_needs_its_own():
    from rawgrad.hcq.program import Program
    dev = Device["CPU"]
    prog = Program(dev, "group_kernel", b"", LaunchSpec((256, 1, 1), (128, 1, 1), exact_local=True))
    with pytest.raises(ValueError, match=r"only in blocks of \(128, 1, 1\)"):
        dev.queue().exec(prog, [], (256, 1, 1), (64, 1, 1))
    with pytest.raises(ValueError, match="only in blocks"):
        dev.queue().exec(prog, [], (256, 1, 1), (1, 1, 1))


def test_llvm_kernels_clamp_their_range_to_the_global_size():
    prog = LLVMRenderer().lower(_ast(Tensor(np.ones(10, np.float32)) + 1), "k")
    text = LLVMRenderer().render(prog)
    assert re.search(r"icmp slt i64 %end, 10", text)


def test_renderer_for_picks_by_target():
    assert isinstance(renderer_for(host_cpu_target()), LLVMRenderer)
    r = renderer_for(NV_SM80)
    assert isinstance(r, PTXRenderer) and r.target == NV_SM80
    custom = Target("gpu-unknown", Processor.GPU, "x", "unknown-triple", 32, 1024, 128, 0, (4,), frozenset())
    with pytest.raises(NotImplementedError, match="gpu-unknown"):
        renderer_for(custom)
    with pytest.raises(ValueError, match="CPU target"):
        LLVMRenderer(NV_SM90)


def test_no_driver_imports_a_renderer_module_or_its_constants():
    """A driver gets its renderer from `renderer_for(target)` and its launch block from the program's launch
    contract; renderer modules and their constants are the compiler's business."""
    offenders = []
    for path in DRIVERS.rglob("*.py"):
        text = path.read_text()
        for pattern in (r"renderer\.(ptx|llvm|amdgpu)\b", r"\bTHREADS_PER_BLOCK\b", r"\bPTXRenderer\b",
                        r"\bLLVMRenderer\b"):
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(DRIVERS)}: {pattern}")
    assert not offenders, offenders


def test_graph_copy_is_the_queue_copy_on_the_cpu():
    from rawgrad.drivers.cpu.records import RECORD_WORDS, Op
    from rawgrad.hcq.graph import CopyCommand, address_var, build_template
    dev = Device["CPU"]
    assert dev.graph_copy(0, 0, 16) is None  # the CPU's compute queue has its own copy command
    template, programs = build_template(dev, [CopyCommand(address_var("t.dst"), address_var("t.src"), 64)])
    ops = [int(w) for w in template.words[::RECORD_WORDS]]
    assert ops == [Op.WAIT, Op.COPY, Op.SIGNAL] and programs == []
