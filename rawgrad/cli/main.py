"""Command line: `python -m rawgrad [demo | info | doctor | smoke | amd-smoke | metal-smoke |
infer minilm|gpt2 | bench cpu|dispatch|infer|saved-graph|gpu]` (rawgrad/__main__.py runs `run` from here)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from rawgrad import Device, Tensor, config, progress
from rawgrad.cli import amd_smoke, bench_gpu, nv_smoke
from rawgrad.cli.bench import bench_cpu, bench_saved_graph, blas_description, run_without_blas_overrides
from rawgrad.cli.bench_dispatch import CHAIN_LENGTHS, bench_dispatch
from rawgrad.cli.bench_infer import bench_infer
from rawgrad.cli.doctor import main as doctor_main
from rawgrad.drivers.nv import missing_driver
from rawgrad.errors import RawgradError
from rawgrad.hcq.device import DeviceUnavailable
from rawgrad.models import gpt2, minilm
from rawgrad.models.decoding import CheckpointNotFound
from rawgrad.models.minilm import MissingDependency
from rawgrad.tensor.realize import GlobalCounters, capture_launches


def demo() -> int:
    """Build a few lazy graphs, show how they fuse, run them on the default device, check with numpy."""
    dev = Device.DEFAULT
    print(f"rawgrad demo on device {dev}")
    rng = np.random.default_rng(0)
    na, nb, nc = (rng.standard_normal((512, 512)).astype(np.float32) for _ in range(3))
    a, b, c = Tensor(na), Tensor(nb), Tensor(nc)
    cases = [
        ("((a*b + c).relu()).sum()", lambda: ((a * b + c).relu()).sum(),
         lambda: np.maximum(na * nb + nc, 0).sum()),
        ("softmax(a, -1)", lambda: a.softmax(-1),
         lambda: np.exp(na - na.max(-1, keepdims=True)) / np.exp(na - na.max(-1, keepdims=True)).sum(-1,
                                                                                                  keepdims=True)),
        ("a @ b", lambda: a @ b, lambda: na @ nb),
        ("(a.T + 1).exp().mean(0)", lambda: (a.T + 1).exp().mean(0), lambda: np.exp(na.T + 1).mean(0)),
    ]
    ok = True
    for label, build, ref in cases:
        GlobalCounters.reset()
        t0 = time.perf_counter()
        compiles = CompileTally()
        with capture_launches() as launched:
            out = build().numpy()
        dt = time.perf_counter() - t0
        expect = ref()
        good = np.allclose(out, expect, rtol=1e-4, atol=1e-3)
        ok &= bool(good)
        print(f"  {label:28s} kernels={GlobalCounters.kernel_count}"
              f"  {compiles}"
              f"  {dt * 1e3:8.2f} ms  matches numpy: {good}")
        names = [e.kernel.name for e in launched if e.kernel is not None]
        print(f"    ran: {', '.join(names)}")
    print("all results match numpy" if ok else "MISMATCH against numpy")
    return 0 if ok else 1


class ProgressBar(progress.Phase):
    """Weights loading on stderr, in bytes (a `progress(done, total)` callback; see rawgrad.progress)."""

    WIDTH = progress.WIDTH

    def __init__(self, label: str) -> None:
        super().__init__(label, unit="B")


class CompileTally:
    """What the compilers did since this was made: "compiled=N" new kernels (compiler runs) and
    "cached=M" read back from the disk cache, which cost no compile."""

    def __init__(self) -> None:
        self.before = progress.compile_sources()

    def counts(self) -> tuple[int, int]:
        now = progress.compile_sources()
        return now["new"] - self.before["new"], now["cached"] - self.before["cached"]

    def __str__(self) -> str:
        new, cached = self.counts()
        return f"compiled={new} cached={cached}"


def _compile_phase(label: str, total: int | None = None,
                   unit: str = "") -> tuple[progress.Phase, CompileTally]:
    """A phase whose note counts the kernels compiled and read from the cache while it runs."""
    tally = CompileTally()
    return progress.Phase(label, total, unit=unit, describe=lambda: str(tally)), tally


DEFAULT_SENTENCES = ["The quick brown fox jumps over the lazy dog.",
                     "A fast auburn fox leaps above a sleepy hound.",
                     "GPUs execute thousands of threads in parallel."]


def infer_minilm(sentences: list[str], show: int, repeats: int) -> int:
    """Embed sentences with all-MiniLM-L6-v2 through the captured graph; print vectors, similarities and
    timing."""
    sentences = sentences or DEFAULT_SENTENCES
    t0 = time.perf_counter()
    with ProgressBar("loading all-MiniLM-L6-v2") as bar:  # the bar's clock also runs while the model builds
        model = minilm.load(progress=bar)
    print(f"model loaded in {time.perf_counter() - t0:.2f} s on {Device.DEFAULT}")
    runs = []
    slow = {0: "call 1: first run, compiling kernels", 1: "call 2: capturing the graph"}
    for k in range(max(repeats, 3)):  # call 1 eager, call 2 captures, later calls replay the graph
        phase, tally = _compile_phase(slow[k]) if k in slow else (None, CompileTally())
        t = time.perf_counter()
        try:
            vectors = model.embed(sentences)
        finally:
            if phase is not None:
                phase.close()
        runs.append((time.perf_counter() - t, model.stats, str(tally)))
    for i, s in enumerate(sentences):
        head = " ".join(f"{v:+.4f}" for v in vectors[i, :show])
        print(f"[{i}] {s[:60]!r}\n    ({vectors.shape[1]} dims) {head} ...")
    if len(sentences) > 1:
        sims = vectors @ vectors.T
        print("cosine similarity:")
        for i in range(len(sentences)):
            print("   " + " ".join(f"{sims[i, j]:6.3f}" for j in range(len(sentences))))
    print("timing (tokenize + encode + readback):")
    for k, (dt, st, compiles) in enumerate(runs):
        kind = "eager" if k == 0 else "capture" if k == 1 else "replay"
        print(f"  call {k + 1} ({kind:7s}) {dt * 1e3:9.2f} ms  kernels={st.kernels_launched} "
              f"{compiles}  {len(sentences) / dt:8.1f} sentences/s")
    best = min(dt for dt, _, _ in runs[2:])
    print(f"replayed graph: {best * 1e3:.2f} ms for {len(sentences)} sentence(s); each replay submits its "
          f"{runs[-1][1].kernels_launched} kernels as one prebuilt queue ({runs[-1][1].captures} capture(s) "
          f"serve every sequence length); norms {np.linalg.norm(vectors, axis=1).round(4).tolist()}")
    return 0


def infer_gpt2(tokens: int, weights: str | None, prompt: list[int], temperature: float, top_k: int | None,
               seed: int, size: str = "124m") -> int:
    """Generate with GPT-2 (random 124M weights unless a Hugging Face checkpoint is given)."""
    t0 = time.perf_counter()
    if weights:
        with ProgressBar(f"loading {weights}") as bar:
            model = gpt2.GPT2.from_pretrained(weights, progress=bar)
        what = weights
    else:
        cfg = gpt2.GPT2Config.gpt2_124m() if size == "124m" else gpt2.GPT2Config.tiny()
        print(f"GPT-2 {size} with random weights (give --weights DIR for a Hugging Face checkpoint)")
        with progress.Phase(f"building GPT-2 {size} (random weights)"):
            model = gpt2.GPT2(cfg, seed=seed)
        if any(t >= cfg.vocab_size for t in prompt):
            prompt = [t % cfg.vocab_size for t in prompt]
        what = "random init"
    print(f"model ready in {time.perf_counter() - t0:.2f} s ({what}) on {Device.DEFAULT}")
    # the first steps compile and capture the decode graph: count tokens and compiles as they come
    phase, tally = _compile_phase(f"generating {tokens} tokens", tokens, "tokens")
    with phase:
        on_token: Callable[[int, int], None] = lambda _row, _tok: phase.update()  # noqa: E731
        out = model.generate([prompt], tokens, temperature=temperature, top_k=top_k, seed=seed,
                             on_token=on_token)
    timing = model.last_timing
    assert timing is not None
    print(f"prompt {prompt} -> {out[0]}")
    per = timing.per_token_s
    print(f"prefill {timing.prefill_s * 1e3:.2f} ms; {len(per)} decode steps: median "
          f"{statistics.median(per) * 1e3:.2f} ms/token ({1 / statistics.median(per):.1f} tokens/s), min "
          f"{min(per) * 1e3:.2f} ms; {timing.tokens_per_s:.1f} tokens/s overall (first steps run eagerly and "
          f"capture); captures={len(model.decode_jit.captures)} {tally}")
    return 0


def info() -> int:
    print(f"default device: {Device.DEFAULT}")
    print(f"known devices: {', '.join(Device.known)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rawgrad")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("demo", help="run the demo (default)")
    sub.add_parser("info", help="show devices")
    doctor = sub.add_parser("doctor", help="which device paths work here, and why the others do not")
    doctor.add_argument("--verbose", action="store_true", help="list every ioctl, RM class and control")
    smoke = sub.add_parser("smoke", help="NV bring-up smoke run, one mechanism per step (table + JSON)")
    nv_smoke.add_arguments(smoke)
    amd = sub.add_parser("amd-smoke", help="AMD bring-up checklist for the first real AMD GPU, one step per "
                                           "mechanism (table + JSON)")
    amd_smoke.add_arguments(amd)
    metal = sub.add_parser("metal-smoke", help="Metal bring-up checklist for the first Mac, one step per "
                                               "mechanism (--mock: rehearse it on the Linux mock runtime)")
    metal.add_argument("--mock", action="store_true", help="run on the mock Objective-C runtime (not a Mac)")
    infer = sub.add_parser("infer", help="run a model through its captured graph")
    infer_sub = infer.add_subparsers(dest="model", required=True)
    ml = infer_sub.add_parser("minilm", help="sentence embeddings with all-MiniLM-L6-v2")
    ml.add_argument("sentences", nargs="*", help="sentences to embed (a few defaults if none)")
    ml.add_argument("--show", type=int, default=6, help="embedding dims to print per sentence")
    ml.add_argument("--repeats", type=int, default=5, help="calls to time (1 eager, 1 capture, replays)")
    g2 = infer_sub.add_parser("gpt2", help="generate tokens with GPT-2")
    g2.add_argument("--tokens", type=int, default=32, help="new tokens to generate")
    g2.add_argument("--weights", help="Hugging Face GPT-2 checkpoint (.safetensors file or directory)")
    g2.add_argument("--prompt", type=int, nargs="+", default=[464, 2068, 7586], help="prompt token ids")
    g2.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g2.add_argument("--top-k", type=int, default=None)
    g2.add_argument("--seed", type=int, default=0)
    g2.add_argument("--size", choices=["124m", "tiny"], default="124m", help="random-weight model size")
    bench = sub.add_parser("bench", help="benchmarks against numpy / torch (and others when installed)")
    bench.add_argument("what", choices=["cpu", "dispatch", "infer", "saved-graph", "gpu"])
    bench.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    bench.add_argument("--protocol", choices=["async", "sync", "both"], default="both",
                       help="bench dispatch: async = N calls then one sync, sync = sync + readback after "
                            "every call (same protocol on every column)")
    bench.add_argument("--lengths", type=int, nargs="+", help="bench dispatch: chain lengths (1 10 100 1000)")
    bench.add_argument("--kernels", type=int, default=100, help="bench saved-graph: kernels in the chain")
    bench.add_argument("--elements", type=int, default=256, help="bench saved-graph: float32 elements")
    bench.add_argument("--runs", type=int, default=3, help="bench saved-graph: fresh processes")
    bench.add_argument("--json", help="bench gpu: JSON result path (default $OUT/bench_gpu.json)")
    args = parser.parse_args(argv)
    if args.cmd in (None, "demo"):
        return demo()
    if args.cmd == "info":
        return info()
    if args.cmd == "doctor":
        return doctor_main(["--verbose"] if args.verbose else [])
    if args.cmd == "smoke":
        return nv_smoke.run_command(args)
    if args.cmd == "amd-smoke":
        return amd_smoke.run_command(args)
    if args.cmd == "metal-smoke":
        from rawgrad.drivers.metal import smoke as metal_smoke  # loads the Metal driver only when asked
        return metal_smoke.main(["--mock"] if args.mock else [])
    if args.cmd == "infer" and args.model == "minilm":
        return infer_minilm(args.sentences, args.show, args.repeats)
    if args.cmd == "infer" and args.model == "gpt2":
        return infer_gpt2(args.tokens, args.weights, args.prompt, args.temperature, args.top_k, args.seed,
                          args.size)
    if args.cmd == "bench" and args.what != "gpu":
        code = run_without_blas_overrides(sys.argv[1:] if argv is None else argv)
        if code is not None:
            return code
        if args.what != "cpu":  # bench cpu prints it in its own header
            print(blas_description())
    if args.cmd == "bench" and args.what == "saved-graph":
        bench_saved_graph(args.kernels, args.elements, 1 if args.quick else args.runs)
        return 0
    if args.cmd == "bench" and args.what == "infer":
        return bench_infer(quick=args.quick)
    if args.cmd == "bench" and args.what == "dispatch":
        protocols = ("async", "sync") if args.protocol == "both" else (args.protocol,)
        lengths = tuple(args.lengths) if args.lengths else CHAIN_LENGTHS[:3] if args.quick else CHAIN_LENGTHS
        bench_dispatch(lengths, protocols)
        if bench_gpu.default_is_nv():  # on a GPU, also the empty-kernel chains against CUDA Graphs
            bench_gpu.dispatch(quick=args.quick, json_path=args.json)
        return 0
    if args.cmd == "bench" and args.what == "gpu":
        if bench_gpu.default_device_kind() == "AMD":  # DEV=AMD (AMD_MOCK=1: the mock, labelled as such)
            return bench_gpu.main(quick=args.quick, json_path=args.json, device="AMD")
        if missing_driver() is not None:  # nothing of it can run: say why in one line, not a table of n/a
            raise DeviceUnavailable("NV", str(missing_driver()), hint="bench gpu needs an NVIDIA GPU (bench "
                                    "cpu, dispatch and infer run without one; DEV=AMD runs it on AMD)")
        return bench_gpu.main(quick=args.quick, json_path=args.json)
    if args.cmd == "bench":
        return bench_cpu(quick=args.quick)
    parser.print_help()
    return 2


def run(argv: list[str] | None = None) -> int:
    """`main` for a shell: what a first run meets (no GPU, an unknown DEV, a bad weights path, a missing
    package, an argument out of range) is one line on stderr and exit status 1, not a traceback. DEBUG=1
    shows the traceback."""
    try:
        return main(argv)
    except Exception as e:
        setup = _setup_problem(e)
        if config.DEBUG() >= 1 or not (setup or _user_error(e)):
            raise
        hint = "; `python -m rawgrad doctor` checks this setup" if setup else ""
        print(f"rawgrad: error: {e}{hint}", file=sys.stderr)
        return 1


def _user_error(e: BaseException) -> bool:
    return isinstance(e, (DeviceUnavailable, RawgradError))


def _setup_problem(e: BaseException) -> bool:
    """A missing checkpoint or package."""
    return isinstance(e, (CheckpointNotFound, MissingDependency))


if __name__ == "__main__":
    sys.exit(run())
