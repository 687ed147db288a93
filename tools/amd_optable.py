"""Regenerate rawgrad/drivers/amd/mock/rdna3/optable.py, the RDNA3 (format, opcode) -> mnemonic table, from
LLVM's own encoder output; or check that the committed table is what this produces.

  python3 tools/amd_optable.py            # rewrite optable.py
  python3 tools/amd_optable.py --check    # exit 1 unless optable.py is byte-identical to a fresh generation
                                          # and the decoder names every corpus instruction as LLVM prints it
  python3 tools/amd_optable.py --exhaustive [--check]
      # the same for optable_ops.py, from every kernel the test files in OP_TESTS make (about 6 minutes on
      # the shared 2-core machine: it runs them under pytest with this file as a plugin); the decoder uses
      # both tables

Method (../shared/AMD-METAL-FACTS.md section 2.3): each kernel (the hand-written corpus of
rawgrad/drivers/amd/mock/rdna3/corpus.py, then every distinct kernel the AMDGPU renderer makes for the op list
`renderer_ops()` below) is compiled by rawgrad's AMDGPUCompiler to assembly text and to an object, each from a
freshly parsed module; the object's .text is walked with the format/length decoder and zipped instruction by
instruction with the listing's mnemonics (alignment padding, which the listing shows as `.p2align`, must be
`s_nop 0` words). Two entries for one
key, or a count mismatch, stop the tool. The table holds only what LLVM has emitted for the corpus: an opcode
outside it decodes with no mnemonic and the interpreter refuses it by format and number.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rawgrad.drivers.amd.mock.rdna3 import corpus, listing  # noqa: E402

# The renderer's kernels in the corpus: every distinct kernel these tensor ops schedule on the CPU device,
# rendered by the AMDGPU renderer (compiler/renderer/amdgpu.py) for gfx1100. tests/amd/test_rdna3_ops.py runs
# each on the interpreter against the CPU device's result for the same buffers.


def renderer_ops():  # type: ignore[no-untyped-def]
    """The op list (small shapes; fixed seeds so the kernels and their inputs are the same every run)."""
    import numpy as np

    from rawgrad import Tensor, dtypes

    rng = np.random.default_rng(18)
    a = Tensor(rng.standard_normal((8, 64)).astype(np.float32))
    b = Tensor(rng.standard_normal((8, 64)).astype(np.float32))
    m = Tensor(rng.standard_normal((64, 16)).astype(np.float32))
    yield (a * b + 1).relu()
    yield a.exp()
    yield a.log2()
    yield a.sin()
    yield a.abs().sqrt()
    yield a.abs().pow(2.5)
    yield a.abs().pow(b)  # float32 pow through the renderer's float64 routines
    yield a.sum(1)
    yield a.max(axis=1)
    yield a.sum()
    yield a.mean(0)
    yield a.softmax(-1)
    yield Tensor(rng.standard_normal((4, 4096)).astype(np.float32)).sum(1)  # a block group: LDS + barriers
    yield a @ m
    yield a.cast(dtypes.float16) * 2
    yield a.cast(dtypes.bfloat16) * 2  # bfloat16: rounded and widened through 32-bit integer ops
    Tensor.manual_seed(18)
    yield Tensor.rand(8, 64)  # threefry: 32-bit multiplies, rotates and xors
    from rawgrad import Variable
    n = Variable("optable.n", 1, 256)
    # bounds from a kernel argument: an elementwise launch of n threads (an i64 compare against the argument)
    # and reductions over n elements
    yield Tensor(np.arange(256, dtype=np.int32)).shrink(((0, n.bind(77)),)) * 3 + 1
    yield Tensor(rng.standard_normal(256).astype(np.float32)).shrink(((0, n.bind(200)),)).sum()
    rows = Tensor(rng.standard_normal((8, 256)).astype(np.float32))
    yield (rows.shrink(((0, 8), (0, n.bind(77)))) * 3).sum(1)
    # attention scores over a variable sequence length (MiniLM's softmax): 64-bit loop bounds from the
    # argument, v_cmpx_ne_u64 around the reductions
    t = Variable("optable.t", 1, 16)
    scores = Tensor(rng.standard_normal((2, 3, 16, 16)).astype(np.float32))
    yield scores.shrink((None, None, (0, t.bind(9)), (0, t.bind(9)))).softmax(-1)
    d = a.cast(dtypes.float64)
    yield d.exp()
    yield d.sqrt()
    yield d.abs().log2()
    yield d.sum(1)
    h = a.cast(dtypes.float16)
    yield h.sum(1)
    yield h.max(axis=1)
    i = Tensor(np.arange(64, dtype=np.int32).reshape(8, 8) - 20)
    yield i // 3
    yield i % 5
    yield i.sum(1)
    yield (a > 0).where(a, b)
    yield a.argmax(1)
    emb, idx = Tensor(rng.standard_normal((10, 16)).astype(np.float32)), Tensor(np.array([1, 3, 9], np.int32))
    yield emb[idx]
    # narrow and wide integers and bools (16-bit VALU ops, byte loads and stores, 64-bit compares)
    u8 = Tensor(rng.integers(0, 256, 64).astype(np.uint8))
    yield u8 * 3 + 7
    yield u8 >> 2
    yield (u8 & 0x3C) | 1
    s16 = Tensor(rng.integers(-3000, 3000, 64).astype(np.int16))
    yield s16 * 5 - 9
    yield s16 // 7
    yield (a > 0) & (b < 0)
    yield (a > 0).where(1, 0).cast(dtypes.uint8)
    i64 = Tensor(rng.integers(-(2**40), 2**40, 64).astype(np.int64))
    yield (i64 <= 5).where(i64, -i64)
    yield a.cast(dtypes.int8)
    s8 = Tensor(rng.integers(-128, 128, (4, 6)).astype(np.int8))
    yield s8.max(axis=1)  # narrow wave reductions move values through SGPRs (v_readfirstlane_b32)
    yield s8.min(axis=0)
    yield s8.prod(1)
    yield s8.max()
    yield s8.sum()
    yield (s8 > 0).any(1)


@dataclass
class Captured:
    """One kernel launch on the CPU device: its AST and name, every buffer's contents before the launch (by
    slot; slot 0 is the output), the output after it, and the scalar argument values."""

    name: str
    ast: Any
    inputs: list[Any]
    output: Any
    var_vals: dict[Any, int]


def capture_renderer_kernels() -> list[Captured]:
    """Run renderer_ops() on the CPU device, keeping the first launch of each distinct kernel."""
    from rawgrad.tensor import realize as realize_mod
    from rawgrad.tensor.buffers import buffer_numpy

    seen: dict[Any, Captured] = {}
    names: dict[str, int] = {}
    original = realize_mod.run_schedule

    def spy(items):  # type: ignore[no-untyped-def]
        for si in items:
            if si.ast is None or si.bufs[0].arg[1] == 0 or si.ast in seen:
                original([si])
                continue
            before = [buffer_numpy(b).copy() for b in si.bufs]
            original([si])
            # kernel names describe shapes, so different kernels can share one: number the repeats
            k = names[si.name] = names.get(si.name, 0) + 1
            name = si.name if k == 1 else f"{si.name}_n{k}"
            seen[si.ast] = Captured(name, si.ast, before, buffer_numpy(si.bufs[0]).copy(), dict(si.var_vals))

    realize_mod.run_schedule = spy
    try:
        for out in renderer_ops():
            out.realize()
    finally:
        realize_mod.run_schedule = original
    return list(seen.values())


def render_for_mock(ast: Any, name: str) -> tuple[Any, str]:
    """(LinearProgram, LLVM IR) of a kernel for the mock's target."""
    from rawgrad.compiler.renderer.amdgpu import AMDGPURenderer

    renderer = AMDGPURenderer(corpus.CPU)
    prog = renderer.lower(ast, name)
    return prog, renderer.render(prog)


TABLE_PATH = ROOT / "rawgrad" / "drivers" / "amd" / "mock" / "rdna3" / "optable.py"
OPS_TABLE_PATH = TABLE_PATH.with_name("optable_ops.py")
# the test files whose kernels make the exhaustive table: the op tests of tests/amd/amd_op_kernels.py and
# the files of the AMD CI slice that launch kernels the op tests do not (jit, autograd, torch habits, fuzzed
# graphs, schedules): every opcode a slice test runs then has a name
OP_TESTS = ["tests/test_ops_elementwise.py", "tests/test_ops_reduce.py", "tests/test_ops_nn.py",
            "tests/test_ops_movement.py", "tests/test_gather.py", "tests/test_tensor_random.py",
            "tests/test_nn.py", "tests/test_ops_math_parity.py", "tests/test_ops_nn_parity.py",
            "tests/test_jit.py", "tests/test_jit_graph.py", "tests/test_scalar_args.py",
            "tests/test_jit_storage.py", "tests/test_jit_guards.py", "tests/test_autograd.py",
            "tests/test_torch_habits.py", "tests/test_fuzz_graphs.py", "tests/test_schedule.py",
            "tests/test_schedule_cache.py", "tests/test_silent_wrong_values.py"]
REPORT_ENV = "AMD_OPTABLE_REPORT"  # where the plugin writes its report
CHECK_ENV = "AMD_OPTABLE_CHECK"  # set: the plugin also checks the decoder against every listing
FORMAT_ORDER = ("SOP1", "SOP2", "SOPC", "SOPK", "SOPP", "SMEM", "VOP1", "VOP2", "VOPC", "VOP3", "VOP3P",
                "VOPDX", "VOPDY", "DS", "FLAT", "MUBUF")


def build() -> tuple[dict[tuple[str, int], str], list[str]]:
    """The table and one provenance line per corpus kernel (name, IR hash, instruction count)."""
    table: dict[tuple[str, int], str] = {}
    notes = []
    for k in corpus.KERNELS:
        text = corpus.module_text(k)
        c = corpus.compile_ir(k.name, text)
        pairs = listing.aligned_keys(c.obj, c.asm, k.name)
        for key, mnemonic in pairs:
            have = table.setdefault(key, mnemonic)
            if have != mnemonic:
                raise SystemExit(f"conflict: {key} is {have!r} and {mnemonic!r} (kernel {k.name})")
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        notes.append(f"{k.name} (IR sha256 {digest}, {len(pairs)} instructions, a VOPD pair counted twice)")
    for cap in capture_renderer_kernels():
        _, ir = render_for_mock(cap.ast, cap.name)
        c = corpus.compile_ir(cap.name, ir)
        for key, mnemonic in listing.aligned_keys(c.obj, c.asm, cap.name):
            have = table.setdefault(key, mnemonic)
            if have != mnemonic:
                raise SystemExit(f"conflict: {key} is {have!r} and {mnemonic!r} (renderer kernel {cap.name})")
    # the renderer's kernels are named, not counted or hashed: the file then changes only when an opcode
    # appears or disappears, not with every renderer change
    notes.append("and every distinct kernel the AMDGPU renderer makes for renderer_ops() in the tool")
    return table, notes


def render(table: dict[tuple[str, int], str], notes: list[str], name: str = "OPTABLE", flag: str = "") -> str:
    lines = [
        '"""RDNA3 opcode table: (format, opcode) -> the mnemonic LLVM prints.',
        f"GENERATED by tools/amd_optable.py{flag}; do not edit (rerun it; with `--check` it verifies this",
        "file is byte-identical to a fresh generation).",
        "",
        f"Source: the LLVM {corpus.llvm_version()} AMDGPU encoder and asm printer (through llvmlite), target "
        f"{corpus.TRIPLE}",
        f"cpu {corpus.CPU} features {corpus.FEATURES}, O{corpus.OPT_LEVEL}. Corpus "
        "(rawgrad/drivers/amd/mock/rdna3/corpus.py):",
        *(f"  {n}" for n in notes),
        "Formats VOPDX/VOPDY are the two halves of a VOPD (dual-issue) instruction; VOP3 also encodes",
        "the VOP1, VOP2 and VOPC operations (their _e64 forms).",
        '"""',
        "",
        f"{name}: dict[tuple[str, int], str] = {{",
    ]
    for fmt in FORMAT_ORDER:
        for (f, op), name in sorted(table.items(), key=lambda kv: kv[0][1]):
            if f == fmt:
                lines.append(f'    ("{f}", {op}): "{name}",')
    unknown = sorted({f for f, _ in table} - set(FORMAT_ORDER))
    if unknown:
        raise SystemExit(f"formats without a place in FORMAT_ORDER: {unknown}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def check(text: str) -> list[str]:
    """Problems: the table file differs from `text`, or the decoder (with the table in the file, which the
    decoder imported) names an instruction of a corpus or renderer kernel differently from LLVM."""
    problems = []
    if TABLE_PATH.read_text() != text:
        problems.append(f"{TABLE_PATH.relative_to(ROOT)} differs from a fresh generation (rerun the tool)")
    for k in corpus.KERNELS:
        c = corpus.compiled(k.name)
        problems.extend(listing.mismatches(c.obj, c.asm, k.name))
    for cap in capture_renderer_kernels():
        _, ir = render_for_mock(cap.ast, cap.name)
        c = corpus.compile_ir(cap.name, ir)
        problems.extend(listing.mismatches(c.obj, c.asm, cap.name))
    return problems


# ------------------------------------------------------------------ the exhaustive table (op test kernels)
_op_asts: dict[Any, str] = {}


def pytest_configure(config: Any) -> None:
    """As a pytest plugin (-p amd_optable): remember every kernel AST the CPU renderer is asked to lower."""
    from rawgrad.compiler.renderer.llvm import LLVMRenderer

    original = LLVMRenderer.lower

    def spy(self: Any, ast: Any, name: str) -> Any:
        _op_asts.setdefault(ast, name)
        return original(self, ast, name)

    LLVMRenderer.lower = spy  # type: ignore[method-assign]


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Render each remembered kernel for gfx1100, zip its object with its listing, write the report."""
    import json
    import os

    pairs: dict[tuple[str, int], str] = {}
    problems: list[str] = []
    for i, ast in enumerate(_op_asts):
        name = f"op{i}"
        try:
            _, ir = render_for_mock(ast, name)
            c = corpus.compile_ir(name, ir)
            for key, mnemonic in listing.aligned_keys(c.obj, c.asm, name):
                if pairs.setdefault(key, mnemonic) != mnemonic:
                    problems.append(f"conflict: {key} is {pairs[key]!r} and {mnemonic!r} "
                                    f"({_op_asts[ast]})")
            if os.environ.get(CHECK_ENV):
                problems.extend(listing.mismatches(c.obj, c.asm, name))
        except Exception as e:  # a kernel the renderer or compiler refuses is reported, not skipped
            problems.append(f"{_op_asts[ast]}: {type(e).__name__}: {e}")
    report = {"kernels": len(_op_asts), "pairs": [[f, op, m] for (f, op), m in pairs.items()],
              "problems": problems}
    Path(os.environ[REPORT_ENV]).write_text(json.dumps(report))


def build_exhaustive(check: bool) -> tuple[dict[tuple[str, int], str], list[str], list[str]]:
    """(table, provenance notes, problems) from the op test files, run in a pytest subprocess."""
    import json
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        path = os.pathsep.join([str(ROOT / "tools"), str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, REPORT_ENV: str(report), "RAWGRAD_CACHE_DIR": "", "PYTHONPATH": path,
               CHECK_ENV: "1" if check else ""}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "amd_optable", *OP_TESTS]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if not report.exists():
            raise SystemExit(f"op tests ended (status {proc.returncode}) without a report:\n"
                             f"{proc.stdout[-3000:]}")
        data = json.loads(report.read_text())
    table = {(f, op): m for f, op, m in data["pairs"]}
    notes = ["every distinct kernel the op test files make, rendered by the AMDGPU renderer:",
             *(f"  {t}" for t in OP_TESTS)]
    return table, notes, data["problems"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="verify instead of writing")
    ap.add_argument("--exhaustive", action="store_true", help="optable_ops.py from the op tests' kernels")
    args = ap.parse_args(argv)
    if args.exhaustive:
        table, notes, problems = build_exhaustive(args.check)
        text = render(table, notes, "OPTABLE_OPS", " --exhaustive")
        if args.check:
            if OPS_TABLE_PATH.read_text() != text:
                problems.append(f"{OPS_TABLE_PATH.relative_to(ROOT)} differs from a fresh generation")
            for p in problems:
                print(p)
            verdict = "OK" if not problems else f"{len(problems)} problem(s)"
            print(f"{len(table)} exhaustive table entries: {verdict}")
            return 1 if problems else 0
        if problems:
            for p in problems:
                print(p)
            return 1
        OPS_TABLE_PATH.write_text(text)
        print(f"wrote {OPS_TABLE_PATH.relative_to(ROOT)}: {len(table)} entries")
        return 0
    table, notes = build()
    text = render(table, notes)
    if args.check:
        problems = check(text)
        for p in problems:
            print(p)
        print(f"{len(table)} table entries, {len(corpus.KERNELS)} corpus kernels and the renderer's: "
              f"{'OK' if not problems else f'{len(problems)} problem(s)'}")
        return 1 if problems else 0
    TABLE_PATH.write_text(text)
    print(f"wrote {TABLE_PATH.relative_to(ROOT)}: {len(table)} entries from {len(corpus.KERNELS)} corpus "
          "kernels and the renderer's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
