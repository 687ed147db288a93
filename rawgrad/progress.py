"""Progress on stderr for the slow steps (loading weights, building a model, first compiles, graph capture,
generation, saving and loading a decode graph), so that no step of a command is silent for more than
about two seconds.

Why tqdm: it is small, well kept and widely installed, and it already gets right what a hand-made bar
gets wrong (terminal width, redrawing in place, rate and time left, streams that are not terminals), so
rawgrad does not maintain its own. It stays optional (the ``infer`` extra): without it the same phases
print plain log lines.

How a phase shows, chosen once per phase (``RAWGRAD_PROGRESS=bar|lines|quiet|off`` overrides):

- ``bar``: stderr is a terminal and tqdm imports. A live bar; a ticker thread redraws it every
  ``TICK_S`` so the elapsed time moves even while one long call (a compile, a capture) runs.
- ``lines``: stderr is a terminal but tqdm is missing. A line when the phase starts, another every
  ``LOG_EVERY_S`` while it runs, and one when it ends.
- ``quiet``: stderr is not a terminal (a log file, a pipe, a test). One line per phase, when it ends,
  with what it did and how long it took.
- ``off``: nothing.

A phase is a context manager, and also the ``progress(done, total)`` callback the weight loaders take
(it closes itself when ``done`` reaches ``total``)::

    with progress.Phase("compiling kernels", poll=lambda: progress.compile_sources()["new"]):
        model(x)
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from rawgrad.compiler.counters import compile_sources

__all__ = ["LOG_EVERY_S", "TICK_S", "Phase", "compile_sources", "mode"]

TICK_S = 0.5  # bar mode: redraw at least this often
LOG_EVERY_S = 2.0  # lines mode: one line at least this often
WIDTH = 30  # the width of the '#' bar of a finished phase with a known total (quiet and lines modes)
MIB = float(2**20)
ENV = "RAWGRAD_PROGRESS"
MODES = ("bar", "lines", "quiet", "off")


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def mode(stream: TextIO | None = None) -> str:
    """How a phase started now shows on `stream` (default stderr): one of MODES."""
    stream = sys.stderr if stream is None else stream
    asked = os.environ.get(ENV, "").strip().lower()
    if asked in ("0", "off", "none"):
        return "off"
    if asked in ("bar", "lines", "quiet"):
        want = asked
    else:
        try:
            want = "bar" if stream.isatty() else "quiet"
        except (AttributeError, ValueError):  # a closed or unusual stream
            want = "quiet"
    if want == "bar" and _tqdm() is None:
        return "lines"
    return want


def _sized(stream: TextIO) -> bool:
    """Whether `stream` is a terminal that reports its size (a pty nobody sized reports 0 x 0)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return True  # let tqdm find out
    return size.columns > 0 and size.lines > 0


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {s % 60:02.0f} s"


class Phase:
    """One slow step shown while it runs (see the module docstring).

    `total`: the amount of work when known (bytes when `unit` is "B", shown in MiB). `poll`: read the
    amount done so far on every tick (a file size, a counter), for work the caller cannot report itself.
    `note`: extra text after the numbers (set it any time; `describe` is called on every tick).
    """

    def __init__(self, label: str, total: float | None = None, *, unit: str = "",
                 poll: Callable[[], float] | None = None, describe: Callable[[], str] | None = None,
                 stream: TextIO | None = None) -> None:
        self.label, self.unit = label, unit
        self.total = total
        self.done: float = 0
        self.note = ""
        self.poll, self.describe = poll, describe
        self.stream = sys.stderr if stream is None else stream
        self.mode = mode(self.stream)
        self.start = self._last_line = time.perf_counter()
        self.closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bar: Any = None
        self._ticker: threading.Thread | None = None
        if self.mode == "bar":
            tqdm = _tqdm()
            sized = _sized(self.stream)  # tqdm draws nothing on a terminal of 0 x 0 (an unsized pty)
            self._bar = tqdm(total=self._shown(total), desc=label, file=self.stream, leave=True,
                             dynamic_ncols=sized, ncols=None if sized else 100, nrows=None if sized else 24,
                             mininterval=0.1, bar_format=self._format())
        elif self.mode == "lines":
            self._write(f"{label} ...")
        if self.mode in ("bar", "lines"):
            self._ticker = threading.Thread(target=self._tick_loop, name=f"progress: {label}", daemon=True)
            self._ticker.start()

    # -- what callers report ------------------------------------------------------------------------------
    def update(self, n: float = 1) -> None:
        """`n` more units done."""
        self.set(self.done + n)

    def set(self, done: float, total: float | None = None) -> None:
        """`done` units done so far (of `total`, when given)."""
        with self._lock:
            if total is not None and total != self.total:
                self.total = total
                if self._bar is not None:
                    self._bar.total = self._shown(total)
                    self._bar.bar_format = self._format()
            self.done = done
            if self._bar is not None:
                self._bar.update(self._shown(done) - self._bar.n)  # redraws at most every mininterval

    def __call__(self, done: int, total: int) -> None:
        """The `progress(done, total)` callback of the weight loaders; closes the phase at the end."""
        if self.closed:
            return
        self.set(done, total)
        if total and done >= total:
            self.close()

    def close(self, failed: bool = False) -> None:
        """End the phase (idempotent): stop the ticker and print its last line. A phase that `failed`
        erases its bar and prints nothing more: the error that ended it speaks for it."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=2 * TICK_S)
        self._refresh_counts()
        with self._lock:
            if self._bar is not None:
                self._bar.n = self._shown(self.done)
                self._bar.set_postfix_str(self.note, refresh=False)
                self._bar.leave = not failed
                self._bar.close()
            elif self.mode in ("lines", "quiet") and not failed:
                self._write(self._summary(finished=True))

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(failed=kind is not None)

    # -- drawing --------------------------------------------------------------------------------------------
    def _shown(self, amount: float | None) -> float | None:
        if amount is None:
            return None
        return round(amount / MIB, 1) if self.unit == "B" else amount

    def _unit_text(self) -> str:
        return "MiB" if self.unit == "B" else self.unit

    def _format(self) -> str:
        unit = f" {self._unit_text()}" if self._unit_text() else ""
        n = "{n:.1f}" if self.unit == "B" else "{n_fmt}"
        if self.total is None:
            count = f" {n}{unit}" if self.unit or self.poll is not None else ""
            return "{desc}:" + count + " [{elapsed}]{postfix}"
        total = "{total:.1f}" if self.unit == "B" else "{total_fmt}"
        return "{desc} |{bar}| " + n + "/" + total + unit + " [{elapsed}<{remaining}]{postfix}"

    def _amount(self, amount: float) -> str:
        return f"{amount / MIB:.1f}" if self.unit == "B" else f"{amount:g}"

    def _summary(self, finished: bool) -> str:
        took = _seconds(time.perf_counter() - self.start)
        unit = f" {self._unit_text()}" if self._unit_text() else ""
        note = f" ({self.note})" if self.note else ""
        if self.total:
            frac = min(max(self.done / self.total, 0.0), 1.0)
            filled = int(frac * WIDTH)
            bar = f"[{'#' * filled}{'.' * (WIDTH - filled)}]"
            amounts = f"{self._amount(self.done)}/{self._amount(self.total)}{unit}"
            return f"{self.label} {bar} {amounts} {'in' if finished else 'after'} {took}{note}"
        counted = f" {self._amount(self.done)}{unit}" if self.done or self.unit else ""
        state = "done" if finished else "running"
        return f"{self.label}:{counted} {state}, {took}{note}"

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed stream must not break the work being reported
            pass

    def _refresh_counts(self) -> None:
        try:
            if self.poll is not None:
                self.done = self.poll()
            if self.describe is not None:
                self.note = self.describe()
        except Exception:  # noqa: BLE001 - a progress read-out must never fail the work it reports on
            pass

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_S):
            self._refresh_counts()
            with self._lock:
                if self._stop.is_set():
                    return
                if self._bar is not None:
                    self._bar.n = self._shown(self.done)
                    self._bar.set_postfix_str(self.note, refresh=False)
                    self._bar.refresh()
                elif time.perf_counter() - self._last_line >= LOG_EVERY_S:
                    self._last_line = time.perf_counter()
                    self._write(self._summary(finished=False))
