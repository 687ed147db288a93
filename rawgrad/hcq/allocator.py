"""Device buffers and the allocator base: an LRU cache of freed buffers and double-free detection."""
from __future__ import annotations

import threading
import warnings
from collections import OrderedDict, deque
from typing import Any

__all__ = ["Allocator", "HCQBuffer"]

# Freed buffers kept for reuse, in bytes per allocator; beyond it the least recently freed go back to
# the driver. Large enough for a model's activations to cycle without driver calls.
DEFAULT_CACHE_LIMIT_BYTES = 1 << 30


class HCQBuffer:
    """`size` bytes at device virtual address `va_addr`; `meta` is the driver's handle for it."""

    __slots__ = ("va_addr", "size", "meta", "base", "__weakref__")

    def __init__(self, va_addr: int, size: int, meta: Any = None, base: HCQBuffer | None = None) -> None:
        self.va_addr, self.size, self.meta, self.base = va_addr, size, meta, base

    def __repr__(self) -> str:
        return f"HCQBuffer(va_addr={self.va_addr:#x}, size={self.size})"

    def view(self, offset: int, size: int) -> HCQBuffer:
        """A sub-range sharing this buffer's memory; it cannot be freed on its own."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ValueError(f"view [{offset}, {offset + size}) is outside a buffer of {self.size} bytes")
        return HCQBuffer(self.va_addr + offset, size, self.meta, self.base or self)


class Allocator:
    """Base allocator. Drivers implement `_alloc`, `_free`, `_copyin`, `_copyout`.

    `free` does not release memory at once: the buffer goes to a per-size LRU cache that `alloc`
    serves first, bounded by `cache_limit` bytes. `free_cache()` releases everything cached.

    Threads: the cache and the live set are guarded by one lock. `free` never blocks on it: frees come from
    garbage-collector finalizers (DeviceMemory.__del__), which can run on any thread at any allocation,
    also on a thread that already holds this lock or a device's lock; a free that finds the lock taken is
    queued and applied by whoever takes the lock next. So this lock may be taken before a device's lock
    (a driver's `_alloc` / `_free` may submit or synchronize) and never waits behind one.
    """

    def __init__(self, cache_limit: int = DEFAULT_CACHE_LIMIT_BYTES) -> None:
        self.cache_limit = cache_limit
        self._live: dict[int, HCQBuffer] = {}
        self._lru: OrderedDict[int, HCQBuffer] = OrderedDict()  # id(buf) -> buf, oldest first
        self._by_size: dict[int, list[HCQBuffer]] = {}
        self.cached_bytes = 0
        self._lock = threading.Lock()  # not re-entrant on purpose: a free from inside is queued instead
        self._queued_frees: deque[HCQBuffer] = deque()  # appends and pops are atomic: no lock needed

    # ------------------------------------------------------------------ driver hooks
    def _alloc(self, nbytes: int) -> HCQBuffer:
        raise NotImplementedError

    def _free(self, buf: HCQBuffer) -> None:
        raise NotImplementedError

    def _copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        raise NotImplementedError

    def _copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ public API
    def alloc(self, nbytes: int) -> HCQBuffer:
        """A buffer of at least `nbytes` (exactly `nbytes` as far as `.size` says)."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"allocation size must be a positive int, got {nbytes!r}")
        lock = self._lock
        lock.acquire()  # acquire/release, not `with`: measurably cheaper on this per-buffer path
        try:
            if self._queued_frees:
                self._apply_queued_frees()
            same = self._by_size.get(nbytes)
            if same:
                buf = same.pop()
                del self._lru[id(buf)]
                self.cached_bytes -= buf.size
            else:
                try:
                    buf = self._alloc(nbytes)
                except MemoryError:
                    # The cache may be what fills the device; give it back and try once more.
                    self._free_cache_locked()
                    buf = self._alloc(nbytes)
            self._live[id(buf)] = buf
            return buf
        finally:
            lock.release()

    def free(self, buf: HCQBuffer) -> None:
        """Give `buf` back (into the cache); freeing it twice or freeing a view raises ValueError (a free
        queued because another thread held the allocator reports a double free as a warning instead)."""
        if buf.base is not None:
            raise ValueError(f"{buf!r} is a view of {buf.base!r}; free the base buffer instead")
        lock = self._lock
        if not lock.acquire(False):  # never wait (see the class docstring): queue it instead
            self._queued_frees.append(buf)
            return
        try:
            self._free_locked(buf)
            if self._queued_frees:
                self._apply_queued_frees()
        finally:
            lock.release()

    def _free_locked(self, buf: HCQBuffer) -> None:
        if self._live.pop(id(buf), None) is None:
            state = "already freed" if id(buf) in self._lru else "not allocated by this allocator"
            raise ValueError(f"double free or foreign buffer: {buf!r} is {state}")
        if buf.size > self.cache_limit:
            self._free(buf)
            return
        self._lru[id(buf)] = buf
        self._by_size.setdefault(buf.size, []).append(buf)
        self.cached_bytes += buf.size
        while self.cached_bytes > self.cache_limit:
            _, old = self._lru.popitem(last=False)
            self._by_size[old.size].remove(old)
            self.cached_bytes -= old.size
            self._free(old)

    def _apply_queued_frees(self) -> None:
        """The frees that found the lock taken (the caller holds it now)."""
        while self._queued_frees:
            buf = self._queued_frees.popleft()
            try:
                self._free_locked(buf)
            except ValueError as e:  # raising here would fail an unrelated alloc or free
                warnings.warn(f"a queued free failed: {e}", RuntimeWarning, stacklevel=3)

    def free_cache(self) -> None:
        """Release every cached buffer to the driver."""
        with self._lock:
            if self._queued_frees:
                self._apply_queued_frees()
            self._free_cache_locked()

    def _free_cache_locked(self) -> None:
        for buf in self._lru.values():
            self._free(buf)
        self._lru.clear()
        self._by_size.clear()
        self.cached_bytes = 0

    def copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        """Copy host bytes `src` into the start of `buf`."""
        src = memoryview(src).cast("B")
        if src.nbytes > buf.size:
            raise ValueError(f"copyin of {src.nbytes} bytes into a buffer of {buf.size}")
        self._copyin(buf, src)

    def copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        """Copy the start of `buf` into host memory `dst` (as many bytes as `dst` holds)."""
        dst = memoryview(dst).cast("B")
        if dst.nbytes > buf.size:
            raise ValueError(f"copyout of {dst.nbytes} bytes from a buffer of {buf.size}")
        self._copyout(dst, buf)

    @property
    def live_buffers(self) -> int:
        if self._queued_frees:
            with self._lock:
                self._apply_queued_frees()
        return len(self._live)
