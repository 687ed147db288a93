"""Target descriptors and the launch contract: what the compiler may assume about a processor, and what a
compiled kernel promises the device that launches it.

A `Target` is one frozen record per device kind and model. Lowering (`compiler/lower.py`), kernel
optimization (`compiler/opt.py`) and the renderers read every processor number from it (SIMD or warp width,
threads per block, the widest vector access, shared memory) instead of hard-coding them, so a new device
model is a new `Target`, not a hunt through the code generator.

A `LaunchSpec` is the launch contract of one compiled kernel: its 3-D global size in threads (ints, or
expressions over the kernel's Variables), its 3-D local size (threads per block; (1, 1, 1) on the CPU), its
static shared memory, its registers per thread where the compiler reported them, and its argument layout
(buffer addresses by slot, then one 64-bit integer per scalar). The lowerer writes it, and it travels
unchanged through realize, `hcq.Program`, `HWQueue.exec` and graph templates into the device's launch
record (an NV QMD, a CPU EXEC record).

Index convention every renderer implements: thread (x, y, z) of the launched grid, counted in threads,
has the linear index `x + X * (y + Y * z)` where X and Y are the grid's x and y extents in threads (whole
blocks: a global size is rounded up to a multiple of the local size). A kernel computes the linear indices
below its own global size (the product of `LaunchSpec.global_size`, evaluated from its scalars); threads
past it do nothing. So a launch may cover more threads than the kernel needs, never fewer.
"""
from __future__ import annotations

import functools
import math
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from rawgrad.dtype import DType, dtypes

if TYPE_CHECKING:
    from rawgrad.compiler.ir import UOp

__all__ = ["AMD_GFX942", "AMD_GFX1100", "APPLE_GPU", "LaunchSpec", "NV_SM80", "NV_SM90", "Processor",
           "Target", "TensorCoreShape", "host_cpu_target", "host_vector_bits", "nv_target"]

# Lanes are counted in 32-bit elements: a SIMD register of B bits holds B // 32 of them.
LANE_BITS = 32
BITS_PER_BYTE = 8
# The 128-bit SIMD baseline every x86-64 (SSE2) and aarch64 (NEON) CPU has; AVX/AVX2 registers are 256 bits
# and AVX-512 ones 512 (Intel SDM vol. 1, "Programming with AVX" / "AVX-512").
BASELINE_VECTOR_BITS = 128
AVX_VECTOR_BITS = 256
AVX512_VECTOR_BITS = 512
# Threads the renderers put in one block: this many warps (or waves). 4 warps of 32 = 128 threads is small
# enough for any register budget and a multiple of the warp, so groups of one warp tile a block.
GPU_WARPS_PER_BLOCK = 4


class Processor(Enum):
    """How a target runs a kernel, which decides the loop structure the lowerer builds."""

    CPU = "cpu"  # a global range split across cores, each running a loop; register tiles for SIMD
    GPU = "gpu"  # one thread per output (or per vector of outputs, or a group of threads per output)


@dataclass(frozen=True)
class TensorCoreShape:
    """One matrix-multiply-accumulate instruction shape: D[m, n] += A[m, k] @ B[k, n]."""

    m: int
    n: int
    k: int
    dtype_in: DType
    dtype_acc: DType


@dataclass(frozen=True)
class Target:
    """What the compiler may assume about one kind and model of processor (see the module docstring)."""

    name: str  # "cpu-x86_64-512", "nv-sm_90", "amd-gfx1100": for messages
    processor: Processor
    isa: str  # "x86_64", "aarch64", "sm_90", "gfx1100"
    triple: str  # the LLVM target triple of code for it
    # 32-bit lanes that execute together: a CPU's widest SIMD register, a GPU's warp (NV) or wave (AMD)
    simd_width: int
    max_threads_per_block: int  # the hardware limit of one block (workgroup); 1 on a CPU
    block_threads: int  # threads per block the renderers write kernels for; 1 on a CPU
    shared_memory_bytes: int  # static shared memory (NV) / LDS (AMD) one block may declare; 0 on a CPU
    vector_load_bytes: tuple[int, ...]  # the widths of one vector load or store instruction, ascending
    dtypes: frozenset[DType]  # element types kernels for it may use
    tensor_cores: tuple[TensorCoreShape, ...] = ()  # matrix instructions; empty where there are none

    def __post_init__(self) -> None:
        if self.simd_width < 1 or self.block_threads < 1 or self.max_threads_per_block < self.block_threads:
            raise ValueError(f"target {self.name}: need 1 <= block_threads ({self.block_threads}) <= "
                             f"max_threads_per_block ({self.max_threads_per_block}) and simd_width >= 1")
        if self.processor is Processor.GPU and self.block_threads % self.simd_width:
            raise ValueError(f"target {self.name}: a block of {self.block_threads} threads is not whole "
                             f"warps of {self.simd_width}")
        if list(self.vector_load_bytes) != sorted(self.vector_load_bytes) or not self.vector_load_bytes:
            raise ValueError(f"target {self.name}: vector_load_bytes must be non-empty and ascending")

    @property
    def is_gpu(self) -> bool:
        return self.processor is Processor.GPU

    @property
    def vector_bits(self) -> int:
        """The SIMD register width in bits (a CPU's register tiles are sized by it)."""
        return self.simd_width * LANE_BITS

    def vector_lanes(self, itemsize: int) -> int:
        """Elements of `itemsize` bytes that the widest vector load or store moves at once."""
        return max(1, self.vector_load_bytes[-1] // itemsize)

    def local_size(self, global_threads: Any) -> tuple[int, int, int]:
        """The block a kernel with `global_threads` threads (int or symbolic) runs in: (1, 1, 1) on a CPU;
        on a GPU `block_threads`, or fewer when the whole launch is smaller than one block."""
        if not self.is_gpu:
            return (1, 1, 1)
        if isinstance(global_threads, int):
            return (max(1, min(self.block_threads, global_threads)), 1, 1)
        return (self.block_threads, 1, 1)


# ---------------------------------------------------------------------------------------------- host CPU
@functools.cache
def host_vector_bits() -> int:
    """The widest float SIMD register of this CPU, as LLVM sees it."""
    try:
        import llvmlite.binding as llvm
        features = llvm.get_host_cpu_features().flatten()
    except Exception:  # no LLVM host info: assume the baseline every x86-64/aarch64 has
        return BASELINE_VECTOR_BITS
    if "+avx512f" in features:
        return AVX512_VECTOR_BITS
    if "+avx2" in features or "+avx" in features:
        return AVX_VECTOR_BITS
    return BASELINE_VECTOR_BITS


# Scalar widths of a load (1, 2, 4, 8 bytes) and vector widths from the baseline register up.
_SCALAR_LOAD_BYTES = (1, 2, 4, 8)
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
ALL_DTYPES = frozenset(dtypes.all())


@functools.cache
def host_cpu_target() -> Target:
    """The CPU this process runs on, as the LLVM renderer compiles for it (host triple and features)."""
    machine = platform.machine().lower()
    machine = _MACHINE_ALIASES.get(machine, machine)
    try:
        import llvmlite.binding as llvm
        triple = llvm.get_process_triple()
    except Exception:  # no LLVM: the descriptor stays usable for tests that only read it
        triple = f"{machine}-unknown-linux-gnu"
    bits = host_vector_bits()
    vectors = tuple(1 << k for k in range((BASELINE_VECTOR_BITS // BITS_PER_BYTE).bit_length() - 1,
                                          (bits // BITS_PER_BYTE).bit_length()))
    return Target(name=f"cpu-{machine}-{bits}", processor=Processor.CPU, isa=machine, triple=triple,
                  simd_width=bits // LANE_BITS, max_threads_per_block=1, block_threads=1,
                  shared_memory_bytes=0, vector_load_bytes=_SCALAR_LOAD_BYTES + vectors, dtypes=ALL_DTYPES)


# --------------------------------------------------------------------------------------------- NVIDIA
NV_TRIPLE = "nvptx64-nvidia-cuda"
# PTX ISA, "Parallel thread execution": a warp is 32 threads on every architecture (WARP_SZ).
NV_WARP_SIZE = 32
# CUDA C++ Programming Guide, "Compute capabilities", table of technical specifications: at most 1024
# threads per block for compute capability >= 2.0.
NV_MAX_THREADS_PER_BLOCK = 1024
# The same table: a kernel may declare 48 KiB of static shared memory; more needs a dynamic allocation with an
# opt-in attribute, which the renderers do not use.
NV_STATIC_SHARED_BYTES = 48 * 1024
# PTX ISA "ld"/"st": .v2 and .v4 vectors of at most 128 bits; scalar accesses of 1..8 bytes.
NV_LOAD_BYTES = (1, 2, 4, 8, 16)
# PTX ISA "Warp-level matrix multiply-accumulate" (mma.sync.aligned), sm_80 and newer: m16n8k16 for
# f16 and bf16 inputs with f32 accumulation, and m8n8k4 for f64.
NV_MMA_SHAPES = (TensorCoreShape(16, 8, 16, dtypes.float16, dtypes.float32),
                 TensorCoreShape(16, 8, 16, dtypes.bfloat16, dtypes.float32),
                 TensorCoreShape(8, 8, 4, dtypes.float64, dtypes.float64))
# The first architecture the PTX renderer supports (bf16 conversions need sm_80, PTX ISA "cvt").
NV_MIN_SM = 80


def nv_target(arch: str) -> Target:
    """The descriptor of an NVIDIA GPU of compute capability `arch` ("sm_80", "sm_86", "sm_89", "sm_90"; the
    H100 and H200 are sm_90)."""
    if not arch.startswith("sm_") or not arch[3:].isdigit():
        raise ValueError(f"PTX target must look like 'sm_90', got {arch!r}")
    if int(arch[3:]) < NV_MIN_SM:
        raise ValueError(f"PTX target {arch}: the renderer needs sm_{NV_MIN_SM} or newer")
    return Target(name=f"nv-{arch}", processor=Processor.GPU, isa=arch, triple=NV_TRIPLE,
                  simd_width=NV_WARP_SIZE, max_threads_per_block=NV_MAX_THREADS_PER_BLOCK,
                  block_threads=GPU_WARPS_PER_BLOCK * NV_WARP_SIZE,
                  shared_memory_bytes=NV_STATIC_SHARED_BYTES, vector_load_bytes=NV_LOAD_BYTES,
                  dtypes=ALL_DTYPES, tensor_cores=NV_MMA_SHAPES)


NV_SM80 = nv_target("sm_80")  # Ampere A100
NV_SM90 = nv_target("sm_90")  # Hopper H100 / H200


# ------------------------------------------------------------------------------------------------ AMD
AMD_TRIPLE = "amdgcn-amd-amdhsa"
# ../shared/AMD-METAL-FACTS.md section 1.1: gfx1100 (RDNA3) runs wave32 natively, gfx942 (CDNA3) wave64.
RDNA3_WAVE_SIZE = 32
CDNA3_WAVE_SIZE = 64
# LLVM AMDGPUUsage, "amdgpu-flat-work-group-size": at most 1024 work-items per workgroup on GCN and RDNA.
AMD_MAX_THREADS_PER_BLOCK = 1024
# LDS one workgroup may allocate: 64 KiB on gfx11 (RDNA3 ISA guide, "Local data share") and on gfx942
# (CDNA3 ISA guide, "LDS"; LLVM AMDGPUUsage lists 64 KiB for both).
AMD_LDS_BYTES = 64 * 1024
# global_load_b32 / _b64 / _b96 / _b128 (RDNA3), global_load_dword..dwordx4 (CDNA3), plus byte and
# short forms.
AMD_LOAD_BYTES = (1, 2, 4, 8, 12, 16)
# RDNA3 ISA "Wave matrix multiply-accumulate": v_wmma_f32_16x16x16_f16 and _bf16.
RDNA3_WMMA_SHAPES = (TensorCoreShape(16, 16, 16, dtypes.float16, dtypes.float32),
                     TensorCoreShape(16, 16, 16, dtypes.bfloat16, dtypes.float32))
# CDNA3 ISA "Matrix fused multiply-add": v_mfma_f32_16x16x16_f16, _32x32x8_f16, _16x16x16_bf16,
# _32x32x8_bf16, v_mfma_f64_16x16x4_f64.
CDNA3_MFMA_SHAPES = (TensorCoreShape(16, 16, 16, dtypes.float16, dtypes.float32),
                     TensorCoreShape(32, 32, 8, dtypes.float16, dtypes.float32),
                     TensorCoreShape(16, 16, 16, dtypes.bfloat16, dtypes.float32),
                     TensorCoreShape(32, 32, 8, dtypes.bfloat16, dtypes.float32),
                     TensorCoreShape(16, 16, 4, dtypes.float64, dtypes.float64))


def _amd_target(isa: str, wave: int, tensor_cores: tuple[TensorCoreShape, ...]) -> Target:
    return Target(name=f"amd-{isa}", processor=Processor.GPU, isa=isa, triple=AMD_TRIPLE, simd_width=wave,
                  max_threads_per_block=AMD_MAX_THREADS_PER_BLOCK, block_threads=GPU_WARPS_PER_BLOCK * wave,
                  shared_memory_bytes=AMD_LDS_BYTES, vector_load_bytes=AMD_LOAD_BYTES, dtypes=ALL_DTYPES,
                  tensor_cores=tensor_cores)


AMD_GFX1100 = _amd_target("gfx1100", RDNA3_WAVE_SIZE, RDNA3_WMMA_SHAPES)  # RX 7900 XTX, W7900
AMD_GFX942 = _amd_target("gfx942", CDNA3_WAVE_SIZE, CDNA3_MFMA_SHAPES)  # MI300X / MI300A / MI325X


# ---------------------------------------------------------------------------------------------- Apple
# Metal kernels are MSL source compiled by Apple's compiler (to AIR, whose LLVM triple is air64-apple-*);
# rawgrad never runs LLVM for them: the triple only names the target.
APPLE_TRIPLE = "air64-apple-macosx"
# Apple GPUs run SIMD-groups of 32 threads (MTLComputePipelineState.threadExecutionWidth; Metal feature set
# tables, Apple7+) and at most 1024 threads per threadgroup (maxTotalThreadsPerThreadgroup).
APPLE_SIMD_WIDTH = 32
APPLE_MAX_THREADS_PER_BLOCK = 1024
# Metal feature set tables, "Maximum total threadgroup memory allocation": 32 KiB on Apple GPUs.
APPLE_THREADGROUP_BYTES = 32 * 1024
# MSL scalar and vector types up to 16 bytes (float4, long2) load in one access.
APPLE_LOAD_BYTES = (1, 2, 4, 8, 16)
# MSL has no 64-bit float type (MSL specification, "Scalar data types": double is not supported).
APPLE_DTYPES = frozenset(dt for dt in ALL_DTYPES if dt != dtypes.float64)
APPLE_GPU = Target(name="apple-gpu", processor=Processor.GPU, isa="apple7", triple=APPLE_TRIPLE,
                   simd_width=APPLE_SIMD_WIDTH, max_threads_per_block=APPLE_MAX_THREADS_PER_BLOCK,
                   block_threads=GPU_WARPS_PER_BLOCK * APPLE_SIMD_WIDTH,
                   shared_memory_bytes=APPLE_THREADGROUP_BYTES, vector_load_bytes=APPLE_LOAD_BYTES,
                   dtypes=APPLE_DTYPES)  # M1 (Apple7) and newer


# -------------------------------------------------------------------------------------- launch contract
Dims = tuple[Any, Any, Any]  # ints or symbolic UOps


@dataclass(frozen=True)
class LaunchSpec:
    """The launch contract of one compiled kernel (see the module docstring)."""

    global_size: Dims  # threads per dimension: ints or UOps over `scalars`
    local_size: tuple[int, int, int] = (1, 1, 1)  # threads per block
    buffers: int = 0  # argument layout: this many buffer addresses (slots 0..buffers-1) ...
    scalars: tuple[UOp, ...] = ()  # ... then one 64-bit integer per Variable, in this order
    shared_bytes: int = 0  # static shared memory per block the kernel declares
    registers: int | None = None  # registers per thread, once a compiler reported them
    # the kernel runs only in blocks of exactly `local_size` (a group reduction: its threads meet through
    # warp shuffles and shared memory by their index in the block); otherwise any block size works
    exact_local: bool = False

    def __post_init__(self) -> None:
        if len(self.global_size) != 3 or len(self.local_size) != 3:
            raise ValueError(f"a launch has 3-D global and local sizes, got {self.global_size}, "
                             f"{self.local_size}")
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in self.local_size):
            raise ValueError(f"local size must be three positive ints, got {self.local_size}")
        if any(isinstance(g, int) and g < 0 for g in self.global_size):
            raise ValueError(f"negative global size {self.global_size}")

    @property
    def args(self) -> int:
        """How many 64-bit argument words a launch passes."""
        return self.buffers + len(self.scalars)

    @property
    def threads(self) -> Any:
        """The kernel's linear global size: the product of `global_size` (int or UOp)."""
        out: Any = 1
        for g in self.global_size:
            if not (isinstance(g, int) and g == 1):
                out = g if isinstance(out, int) and out == 1 else out * g
        return out

    @property
    def static_global(self) -> tuple[int, int, int] | None:
        """The global size when it names no Variable, else None."""
        gs = self.global_size
        if all(isinstance(g, int) for g in gs):
            return (int(gs[0]), int(gs[1]), int(gs[2]))
        return None

    def global_for(self, var_vals: Mapping[UOp, int]) -> tuple[int, int, int]:
        """The global size with the kernel's Variables given values."""
        from rawgrad.compiler.symbolic import sym_infer
        vals = var_vals if isinstance(var_vals, dict) else dict(var_vals)
        x, y, z = (int(sym_infer(g, vals)) for g in self.global_size)
        return (x, y, z)

    def global_for_scalars(self, vals: Sequence[int]) -> tuple[int, int, int]:
        """The global size from a launch's scalar arguments (in `scalars` order)."""
        static = self.static_global
        if static is not None:
            return static
        if len(vals) != len(self.scalars):
            raise ValueError(f"the launch contract has {len(self.scalars)} scalars, got {len(vals)} values")
        return self.global_for(dict(zip(self.scalars, vals)))

    def check_target(self, target: Target) -> None:
        """Raise if a block of this launch cannot run on `target`."""
        threads = math.prod(self.local_size)
        if threads > target.max_threads_per_block:
            raise ValueError(f"local size {self.local_size} ({threads} threads) exceeds the "
                             f"{target.max_threads_per_block} threads a block of {target.name} may have")
        if self.shared_bytes > target.shared_memory_bytes:
            raise ValueError(f"{self.shared_bytes} bytes of shared memory exceed the "
                             f"{target.shared_memory_bytes} a block of {target.name} may declare")

    def with_resources(self, *, shared_bytes: int | None = None, registers: int | None = None) -> LaunchSpec:
        """The same contract with what the device compiler reported (registers, actual shared bytes)."""
        return replace(self, shared_bytes=self.shared_bytes if shared_bytes is None else shared_bytes,
                       registers=self.registers if registers is None else registers)
