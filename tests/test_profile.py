"""PROFILE=1: device timestamps around eager kernels and inside TinyJit replays, Chrome trace + PNG export."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rawgrad import Device, Tensor
from rawgrad.hcq import profile
from rawgrad.hcq.graph import QueueTemplate
from rawgrad.hcq.queue import HWQueue
from rawgrad.hcq.signal import device_clock
from rawgrad.jit import TinyJit
from rawgrad.tensor import realize as realize_module

CHAIN = 5


@pytest.fixture
def profiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[profile.Profiler]:
    monkeypatch.setenv("PROFILE", "1")
    profile.PROFILER.reset()
    yield profile.PROFILER
    profile.PROFILER.reset()


def chain(x: Tensor) -> Tensor:
    """CHAIN kernels in a row (each realize ends one), each reading the previous one's output."""
    for k in range(CHAIN):
        x = (x * 2 + k).realize()
    return x


def chain_result(x: np.ndarray) -> np.ndarray:
    for k in range(CHAIN):
        x = x * 2 + k
    return x


@pytest.fixture
def kernel_names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels the realize loop launches during the test, in launch order."""
    names: list[str] = []
    real = realize_module.CompiledKernel.launch

    def spy(self: realize_module.CompiledKernel, *args: Any, **kwargs: Any) -> float | None:
        names.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(realize_module.CompiledKernel, "launch", spy)
    return names


def test_eager_kernels_are_timed(profiler: profile.Profiler, kernel_names: list[str]) -> None:
    a = Tensor(np.arange(1000, dtype=np.float32))
    out = ((a + 1).realize() * 3).sum()
    np.testing.assert_allclose(out.numpy(), ((np.arange(1000) + 1) * 3).sum())
    events = profiler.events()
    assert kernel_names and [e.name for e in events] == kernel_names
    for e in events:
        assert e.kind == profile.EAGER and e.device == Device.DEFAULT
        assert e.end_ns >= e.start_ns > 0
    # One device timeline: later launches start no earlier than earlier ones ended.
    for prev, cur in zip(events, events[1:]):
        assert cur.start_ns >= prev.end_ns


def test_many_async_launches_share_the_pool(profiler: profile.Profiler) -> None:
    x = Tensor(np.zeros(64, np.float32))
    n = profile.POOL_PAIRS + 20  # more launches in flight than pairs: the pool must wait, not overwrite
    for _ in range(n):
        x = (x + 1).realize()
    np.testing.assert_array_equal(x.numpy(), np.full(64, n, np.float32))
    events = profiler.events()
    assert len(events) == n
    assert len({e.batch for e in events}) == n
    for prev, cur in zip(events, events[1:]):
        assert cur.start_ns >= prev.end_ns >= prev.start_ns


def test_replay_events_in_order(profiler: profile.Profiler) -> None:
    f = TinyJit(chain)
    x_np = np.arange(32, dtype=np.float32)
    for _ in range(2):  # eager call, then the capture
        f(Tensor(x_np))
    assert f.last is not None and f.last.kernel_count == CHAIN
    profiler.reset()
    replays = 4
    for _ in range(replays):
        out = f(Tensor(x_np))
    np.testing.assert_array_equal(out.numpy(), chain_result(x_np))
    events = [e for e in profiler.events() if e.kind == profile.REPLAY]
    batches: dict[int, list[profile.ProfileEvent]] = {}
    for e in events:
        batches.setdefault(e.batch, []).append(e)
    assert len(batches) == replays
    profiled = f.last.devices[0].profiled
    assert profiled is not None and len(profiled.profile_names) == CHAIN
    names = profiled.profile_names
    # a device that cannot timestamp kernels inside a replay (Metal's ICB) reports each replay as one row
    # naming its kernels; every other device reports one row per kernel
    per_kernel = device_clock(Device[f.last.devices[0].device]).kernel_timestamps_in_replay
    last_end = 0
    for batch in batches.values():
        if per_kernel:
            assert [e.name for e in batch] == names  # the kernels in queue order
        else:
            assert len(batch) == 1 and batch[0].kernels == tuple(names), batch
        for e in batch:
            assert e.start_ns >= last_end and e.end_ns >= e.start_ns > 0  # monotonic, no overlap
            last_end = e.end_ns


def test_chrome_trace_json(profiler: profile.Profiler, tmp_path: Path) -> None:
    f = TinyJit(chain)
    for _ in range(3):
        f(Tensor(np.ones(16, np.float32)))
    path = profile.export_chrome_trace(str(tmp_path / "trace.json"))
    with open(path) as fh:
        trace = json.load(fh)
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    kinds = {e["cat"] for e in complete}
    assert kinds == {profile.EAGER, profile.REPLAY}
    assert f.last is not None
    per_kernel = device_clock(Device[f.last.devices[0].device]).kernel_timestamps_in_replay
    assert sum(e["cat"] == profile.REPLAY for e in complete) == (CHAIN if per_kernel else 1)
    for e in complete:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= e.keys()
        assert e["dur"] >= 0 and e["ts"] >= 0 and e["args"]["kernel"] == e["name"]
    assert min(e["ts"] for e in complete) == 0  # times count from the first kernel
    # Eager and replay kernels sit on different tracks of the same device, both named.
    assert len({e["pid"] for e in complete}) == 1 and len({e["tid"] for e in complete}) == 2
    meta = {(e["name"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0)] == Device.DEFAULT
    assert sorted(v.split()[0] for (k, _), v in meta.items() if k == "thread_name") == ["eager", "replay"]


def test_png_export(profiler: profile.Profiler, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    (Tensor(np.ones(8, np.float32)) + 1).realize()
    path = profile.export_png(str(tmp_path / "trace.png"))
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_names_it(profiler: profile.Profiler, monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(ImportError, match="matplotlib"):
        profile.export_png(str(tmp_path / "trace.png"))


def count_commands(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count every command encoded from now on, by kind."""
    counts = {"wait": 0, "signal": 0, "timestamp": 0, "exec": 0, "copy": 0}
    for kind in counts:
        real = getattr(HWQueue, kind)

        def counted(self: HWQueue, *args: Any, _real: Any = real, _kind: str = kind, **kw: Any) -> Any:
            counts[_kind] += 1
            return _real(self, *args, **kw)

        monkeypatch.setattr(HWQueue, kind, counted)
    # The CPU device's eager launch writes its wait -> exec -> signal records directly (CPUProgram's fast
    # path, issue 21), not through HWQueue's methods: count those three commands there.
    from rawgrad.drivers.cpu.device import CPUProgram
    real_push = CPUProgram._push_launch

    def counted_push(self: CPUProgram, *args: Any, **kw: Any) -> None:
        for kind in ("wait", "exec", "signal"):
            counts[kind] += 1
        real_push(self, *args, **kw)

    monkeypatch.setattr(CPUProgram, "_push_launch", counted_push)
    return counts


@pytest.mark.parametrize("on", [False, True])
def test_profile_off_adds_no_commands(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setenv("PROFILE", "1" if on else "0")
    profile.PROFILER.reset()
    counts = count_commands(monkeypatch)
    f = TinyJit(chain)
    x = Tensor(np.zeros(8, np.float32))
    f(x)  # eager: CHAIN launches of wait -> exec -> signal (+ 2 timestamps each when profiling)
    eager = dict(counts)
    # (a GPU adds signals of its own: the input's upload on NV's copy queue, NV's separate timing signals)
    assert eager["exec"] == CHAIN and eager["wait"] >= CHAIN and eager["signal"] >= CHAIN, eager
    if Device.DEFAULT == "CPU":
        assert eager["wait"] == eager["signal"] == CHAIN
    assert eager["timestamp"] == (2 * CHAIN if on else 0)
    dev = Device[Device.DEFAULT]

    def bound_words(template: QueueTemplate) -> int:
        """Words of `template` once bound (a driver adds its own: NV's retirement release, alignment)."""
        q = dev.queue()
        q._load_layout([int(w) for w in template.words], template.patches, template.data_words)
        return len(q.bind(dev).words())

    f(x)  # the capture: CHAIN eager launches again, then the graph's template(s)
    assert f.last is not None
    dg = f.last.devices[0]
    bound = len(f.last._graphs[0].queue.words())
    if on:
        assert dg.profiled is not None and dg.profiled.profile_names
        # the bound queue is the profiled template: 2 more commands per kernel, saved template untouched
        assert bound == bound_words(dg.profiled) > bound_words(dg.template)
    else:
        assert dg.profiled is None and f.last._graphs[0].profile_pairs == []
        assert counts["timestamp"] == 0
        assert bound == bound_words(dg.template)
    before = dict(counts)
    out = f(x)
    assert counts == before  # a replay encodes nothing new
    np.testing.assert_array_equal(out.numpy(), chain_result(np.zeros(8, np.float32)))  # (a GPU copies out)
    profile.PROFILER.reset()


def test_exit_writes_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    script = "from rawgrad import Tensor\n(Tensor([1.0, 2.0]) * 3).realize()\n"
    env = {**os.environ, "PROFILE": "1", "PROFILE_OUT": str(out)}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert str(out) in res.stdout
    trace = json.loads(out.read_text())
    assert [e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"] == [profile.EAGER]
