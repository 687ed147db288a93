"""In-process LLVM toolchain: LLVM IR text -> ELF relocatable object, through llvmlite.

No clang or ld binary is involved. The object is laid out and relocated by ``rawgrad.compiler.elf``.

Code model choice: objects are built position independent (reloc model ``pic``) with the ``small`` code
model. Every reference from code to code or data inside the object is then PC-relative (x86-64
``R_X86_64_PC32``/``PLT32``, aarch64 ``ADRP``+``ADD``/``LDR`` pairs), which is valid wherever the loader
places the image as long as the image itself is smaller than 2 GiB. References to symbols outside the
object are either calls (the loader routes them through a stub inside the image when the target is too
far away) or data loads through a GOT slot the loader builds inside the image. A ``static`` object would
use absolute 32-bit addresses (``R_X86_64_32S``) that only work when the image lands in the low 2 GiB,
and the ``large`` code model costs a 64-bit immediate for every address; ``pic``+``small`` keeps both the
code fast and the loader simple.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm

from rawgrad.compiler.cache import BUILT, DISK, MEMORY, CompileCache, cache_folder, content_key
from rawgrad.compiler.counters import CompileCount, register_compile_counter
from rawgrad.compiler.target import AMD_TRIPLE

__all__ = ["AMDGPUCompiler", "CompileError", "CompileStats", "LLVMCompiler", "amdgpu_compiler",
           "host_compiler"]

# Default relocation model and code model (see the module docstring for why).
DEFAULT_RELOC = "pic"
DEFAULT_CODE_MODEL = "small"
# llvmlite's PipelineTuningOptions accepts speed levels 0..3 (-O0 .. -O3).
MAX_OPT_LEVEL = 3
# Which counter of CompileStats a cache lookup bumps.
_STAT_BY_SOURCE = {MEMORY: "memory_hits", DISK: "disk_hits", BUILT: "compiles"}
# How many lines of the offending IR a CompileError quotes.
_IR_LINES_IN_ERROR = 12
# Per-kernel pipeline choice. A kernel whose work per call (the caller's estimate: loop iterations times
# body nodes, see `compile`) is at most QUICK_MAX_WORK is built with no IR optimisation passes and codegen
# at -O1. Measured on this x86-64 host (llvmlite 0.50 / LLVM 22, a 4-element `exp` kernel): 2.1 ms instead
# of 17-18 ms at O3, which still vectorizes a 4-iteration loop 16-wide with an epilogue. Codegen -O0 (0.7 ms)
# is not used: its fast instruction selector does not fuse `contract` multiply-adds into FMAs as the
# selection DAG does at -O1 and above, so a small kernel's results would round differently from the same
# kernel at O3 (tests/amd/test_amd_run.py compares the CPU device bit for bit). Unoptimised code runs ~4 ns
# per element of that body against 0.2 ns vectorized, so at 1 << 14 node-iterations it costs ~1.5 µs more
# per call, well under one launch's overhead (15-35 µs). Bigger or unknown (symbolic) work keeps the full
# pipeline at the compiler's opt level.
QUICK_MAX_WORK = 1 << 14
QUICK_OPT_LEVEL = 0  # IR pass pipeline speed level
QUICK_CODEGEN_LEVEL = 1  # target machine (instruction selection, register allocation) level

_init_lock = threading.Lock()
_initialized = False
# LLVM's global context and target registry are shared process-wide; serialise compiles through it.
_llvm_lock = threading.RLock()


def _init_llvm() -> None:
    """Register every LLVM target once (thread-safe); needed for cross targets such as aarch64."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            _initialized = True


class CompileError(Exception):
    """LLVM rejected the IR (parse, verify or codegen); carries the diagnostic and the IR's first lines."""

    def __init__(self, stage: str, diagnostic: str, ir: str) -> None:
        head = "\n".join(ir.splitlines()[:_IR_LINES_IN_ERROR])
        super().__init__(f"LLVM {stage} failed: {diagnostic.strip()}\n--- IR (first lines) ---\n{head}")
        self.stage = stage
        self.diagnostic = diagnostic
        self.ir = ir


@dataclass
class CompileStats:
    """Process-wide counters: ``compiles`` are real LLVM invocations, the others are cache hits."""

    compiles: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    corrupt_entries: int = 0
    quick_compiles: int = 0  # of `compiles`, those built with the quick pipeline (see QUICK_MAX_WORK)

    @property
    def cache_hits(self) -> int:
        return self.memory_hits + self.disk_hits

    def reset(self) -> None:
        self.compiles = self.memory_hits = self.disk_hits = self.corrupt_entries = self.quick_compiles = 0


class LLVMCompiler:
    """Compile LLVM IR text to an ELF relocatable object (ET_REL) for one target, with caching.

    ``triple``/``cpu``/``features`` default to the host (so AVX2/AVX-512 are used where present).
    ``cache_dir`` None reads ``RAWGRAD_CACHE_DIR`` (default ``~/.cache/rawgrad/llvm``); ``''`` disables
    the disk cache. ``stats`` is shared by all instances so a caller can assert no compile happened.
    """

    stats: CompileStats = CompileStats()
    _stats_lock = threading.Lock()
    # Whether `compile(ir, work=...)` may choose the quick pipeline for tiny kernels (host CPU code only:
    # GPU kernels run many threads per call and AMDGPU at -O0 spills to scratch memory).
    sizes_pipeline: bool = True

    def __init__(self, triple: str | None = None, cpu: str | None = None, features: str | None = None,
                 opt_level: int = 3, cache_dir: str | None = None, *, reloc: str = DEFAULT_RELOC,
                 code_model: str = DEFAULT_CODE_MODEL) -> None:
        if not 0 <= opt_level <= MAX_OPT_LEVEL:
            raise ValueError(f"opt_level must be in 0..{MAX_OPT_LEVEL}, got {opt_level}")
        _init_llvm()
        host = triple is None
        self.triple: str = llvm.get_process_triple() if host else str(triple)
        if cpu is None:
            cpu = llvm.get_host_cpu_name() if host else "generic"
        if features is None:
            features = llvm.get_host_cpu_features().flatten() if host else ""
        self.cpu: str = cpu
        self.features: str = features
        self.opt_level: int = opt_level
        self.reloc: str = reloc
        self.code_model: str = code_model
        try:
            target = llvm.Target.from_triple(self.triple)
        except RuntimeError as e:
            raise ValueError(f"LLVM has no target for triple {self.triple!r}: {e}") from e
        self._target = target
        self._tm = target.create_target_machine(cpu=cpu, features=features, opt=opt_level, reloc=reloc,
                                                codemodel=code_model)
        self._quick_tm: llvm.TargetMachine | None = None  # codegen -O1, made on first quick compile
        self.target_key: str = "|".join([self.triple, cpu, features, f"O{opt_level}", reloc, code_model])
        self.cache_dir: str | None = cache_folder("llvm", cache_dir)
        self._cache = CompileCache(self.cache_dir, ".o")

    def __repr__(self) -> str:
        return f"LLVMCompiler({self.target_key!r}, cache_dir={self.cache_dir!r})"

    def cache_key(self, llvm_ir: str, quick: bool = False) -> str:
        """sha256 over the IR text, the target key (with the pipeline) and the llvmlite version."""
        target_key = self.target_key + (f"|quick-O{QUICK_OPT_LEVEL}-cg{QUICK_CODEGEN_LEVEL}" if quick else "")
        return content_key(llvm_ir, target_key, llvmlite.__version__)

    def quick(self, work: int | None) -> bool:
        """Whether a kernel doing `work` per call (None: unknown) gets the quick pipeline."""
        return self.sizes_pipeline and work is not None and 0 <= work <= QUICK_MAX_WORK

    def compile(self, llvm_ir: str, work: int | None = None) -> bytes:
        """Return the ELF relocatable object for ``llvm_ir`` (memory cache, then disk cache, then LLVM).

        `work` is the caller's estimate of the kernel's work per call (loop iterations times statements);
        at most QUICK_MAX_WORK picks the quick pipeline (no passes, codegen -O1), None or more the full one.
        """
        quick = self.quick(work)
        corrupt = self._cache.disk.corrupt_entries
        obj, source = self._cache.get(self.cache_key(llvm_ir, quick),
                                      lambda: self._codegen(llvm_ir, assembly=False, quick=quick))
        if self._cache.disk.corrupt_entries != corrupt:
            self._count("corrupt_entries")
        self._count(_STAT_BY_SOURCE[source])
        if quick and source == BUILT:
            self._count("quick_compiles")
        return obj

    def _count(self, field: str) -> None:
        with self._stats_lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)

    def assembly(self, llvm_ir: str, work: int | None = None) -> str:
        """The target assembly for ``llvm_ir`` as `compile` would build it (for DEBUG output and tests;
        never cached)."""
        return self._codegen(llvm_ir, assembly=True, quick=self.quick(work)).decode()

    def _quick_machine(self) -> llvm.TargetMachine:
        """The target machine for the quick pipeline (codegen QUICK_CODEGEN_LEVEL), made once (under
        _llvm_lock)."""
        if self._quick_tm is None:
            self._quick_tm = self._target.create_target_machine(
                cpu=self.cpu, features=self.features, opt=QUICK_CODEGEN_LEVEL, reloc=self.reloc,
                codemodel=self.code_model)
        return self._quick_tm

    def _parse(self, llvm_ir: str) -> llvm.ModuleRef:
        """A freshly parsed module: codegen mutates the module it runs on, so every emission parses anew."""
        try:
            return llvm.parse_assembly(llvm_ir)
        except RuntimeError as e:
            raise CompileError("IR parse", str(e), llvm_ir) from e

    def _codegen(self, llvm_ir: str, assembly: bool, quick: bool = False) -> bytes:
        with _llvm_lock:
            tm = self._quick_machine() if quick else self._tm
            mod = self._parse(llvm_ir)
            # The compiler's target wins over whatever the IR declares, so one IR text serves any target.
            mod.triple = self.triple
            mod.data_layout = str(tm.target_data)
            try:
                mod.verify()
            except RuntimeError as e:
                raise CompileError("IR verification", str(e), llvm_ir) from e
            level = QUICK_OPT_LEVEL if quick else self.opt_level
            pto = llvm.PipelineTuningOptions(speed_level=level)
            vectorize = level >= 2
            pto.loop_vectorization = vectorize
            pto.slp_vectorization = vectorize
            pto.loop_unrolling = level >= 2
            pb = llvm.create_pass_builder(tm, pto)
            try:
                pb.getModulePassManager().run(mod, pb)
                if assembly:
                    return tm.emit_assembly(mod).encode()
                return bytes(tm.emit_object(mod))
            except RuntimeError as e:
                raise CompileError("code generation", str(e), llvm_ir) from e


_host_lock = threading.Lock()
_host: LLVMCompiler | None = None


register_compile_counter("llvm", lambda: CompileCount(
    LLVMCompiler.stats.compiles + LLVMCompiler.stats.cache_hits, LLVMCompiler.stats.compiles,
    LLVMCompiler.stats.disk_hits))


def host_compiler() -> LLVMCompiler:
    """The process-wide compiler for the host CPU (created on first use)."""
    global _host
    if _host is None:
        with _host_lock:
            if _host is None:
                _host = LLVMCompiler()
    return _host


# ------------------------------------------------------------------------------------------------ AMD GPUs
# Compute-unit mode, HIP's default (-mcumode): without it gfx10+ objects are built for WGP mode
# (../shared/AMD-METAL-FACTS.md section 1.8; LLVM AMDGPUUsage, "Target features").
AMDGPU_FEATURES = "+cumode"
# float64 math intrinsics the AMDGPU backend cannot lower. LLVM reports them with `LLVM ERROR`, which aborts
# the whole process instead of raising ("no libcall available for fexp2", "Cannot select: fpow f64";
# measured with llvmlite 0.50 / LLVM 22), so the compiler refuses them before codegen. The AMDGPU renderer
# decomposes them; this catches IR from anywhere else.
_AMDGPU_ABORTING_INTRINSIC = re.compile(r"@llvm\.(pow|powi|exp|exp2|exp10|log|log2|log10|sin|cos|tan)\.f64\b")
# Lines that name the target inside IR text; the compiler writes its own.
_TARGET_LINE = re.compile(r"^\s*target\s+(triple|datalayout)\s*=.*$", re.MULTILINE)


class AMDGPUCompiler(LLVMCompiler):
    """LLVM IR -> AMDGPU relocatable code object (ELF ET_REL, no linker) for one gfx target.

    The triple and datalayout are written into the IR text before it is parsed: LLVM fixes an alloca's
    address space when it parses it, and one set afterwards does not retarget it (AMDGPU needs
    `addrspace(5)`). Every emission parses a fresh module (see `_parse`): a second emission from one module
    aborts the process in AMDGPU instruction selection ("Cannot select: intrinsic llvm.amdgcn.if").
    ``assembly(ir)`` gives the assembly text of the same code (for the RDNA3 decoder tool and tests).
    """

    sizes_pipeline = False  # always the full pipeline (see LLVMCompiler.sizes_pipeline)

    def __init__(self, arch: str = "gfx1100", opt_level: int = 3, cache_dir: str | None = None) -> None:
        super().__init__(triple=AMD_TRIPLE, cpu=arch, features=AMDGPU_FEATURES, opt_level=opt_level,
                         cache_dir=cache_dir)
        self.arch = arch
        self.data_layout = str(self._tm.target_data)

    def __repr__(self) -> str:
        return f"AMDGPUCompiler({self.arch!r}, cache_dir={self.cache_dir!r})"

    def _parse(self, llvm_ir: str) -> llvm.ModuleRef:
        bad = _AMDGPU_ABORTING_INTRINSIC.search(llvm_ir)
        if bad is not None:
            raise CompileError("AMDGPU check", f"{bad.group(0)} has no AMDGPU lowering (LLVM would abort the "
                               f"process); decompose it in the renderer", llvm_ir)
        body = _TARGET_LINE.sub("", llvm_ir)
        head = f'target datalayout = "{self.data_layout}"\ntarget triple = "{self.triple}"\n'
        return super()._parse(head + body)


_amd_lock = threading.Lock()
_amd: dict[str, AMDGPUCompiler] = {}


def amdgpu_compiler(arch: str) -> AMDGPUCompiler:
    """The process-wide compiler for one AMD gfx target (created on first use)."""
    with _amd_lock:
        if arch not in _amd:
            _amd[arch] = AMDGPUCompiler(arch)
        return _amd[arch]
