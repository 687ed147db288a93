"""The CPU driver's one window onto the operating system: libc through cffi.

Everything the CPU device needs from the kernel (anonymous memory, threads) goes through a `HostOS`
object handed to the device, so tests can count or fake these calls without touching builtins.
"""
from __future__ import annotations

import os

import cffi

from rawgrad import mappings

__all__ = ["HostOS"]

_CDEF = """
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
typedef unsigned long pthread_t;
struct timespec { long tv_sec; long tv_nsec; };
int pthread_create(pthread_t *thread, const void *attr, void *(*start)(void *), void *arg);
int pthread_timedjoin_np(pthread_t thread, void **retval, const struct timespec *abstime);
int clock_gettime(int clk, struct timespec *tp);
"""

# sys/mman.h (Linux): PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS; MAP_FAILED is (void *)-1.
PROT_READ_WRITE = 0x1 | 0x2
MAP_PRIVATE_ANONYMOUS = 0x02 | 0x20
MAP_FAILED = 2**64 - 1
# errno.h ETIMEDOUT, returned by pthread_timedjoin_np when the thread did not finish in time.
ETIMEDOUT = 110
# time.h CLOCK_REALTIME: the clock pthread_timedjoin_np's absolute deadline is measured on.
CLOCK_REALTIME = 0
NS_PER_S = 1_000_000_000
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class HostOS:
    """libc calls used by the CPU device: mmap/munmap and pthread create/timed join."""

    def __init__(self) -> None:
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self.libc = self.ffi.dlopen(None)
        self.mapped_bytes = 0

    @staticmethod
    def page_round(nbytes: int) -> int:
        return (nbytes + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE

    def mmap(self, nbytes: int) -> int:
        """Zeroed, page-aligned, read-write anonymous memory of `nbytes` (rounded up to pages)."""
        size = self.page_round(nbytes)
        p = self.libc.mmap(self.ffi.NULL, size, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)
        addr = int(self.ffi.cast("uintptr_t", p))
        if addr == MAP_FAILED:
            err = self.ffi.errno
            raise MemoryError(f"mmap of {size} bytes failed: {os.strerror(err)} (errno {err})")
        self.mapped_bytes += size
        return addr

    def munmap(self, addr: int, nbytes: int) -> None:
        if mappings.pinned():  # an abandoned worker may still use this memory (rawgrad/mappings.py)
            return
        size = self.page_round(nbytes)
        if self.libc.munmap(self.ffi.cast("void *", addr), size) != 0:
            err = self.ffi.errno
            raise OSError(err, f"munmap({addr:#x}, {size}) failed: {os.strerror(err)}")
        self.mapped_bytes -= size

    def thread_start(self, entry: int, arg: int) -> int:
        """Start a native thread running `void *entry(void *arg)`; returns its pthread_t."""
        tid = self.ffi.new("pthread_t *")
        fn = self.ffi.cast("void *(*)(void *)", entry)
        rc = self.libc.pthread_create(tid, self.ffi.NULL, fn, self.ffi.cast("void *", arg))
        if rc != 0:
            raise OSError(rc, f"pthread_create failed: {os.strerror(rc)}")
        return int(tid[0])

    def thread_join(self, thread: int, timeout_s: float) -> bool:
        """Join `thread`, giving up after `timeout_s`; True when it has finished."""
        now = self.ffi.new("struct timespec *")
        self.libc.clock_gettime(CLOCK_REALTIME, now)
        deadline_ns = now.tv_sec * NS_PER_S + now.tv_nsec + int(timeout_s * NS_PER_S)
        deadline = self.ffi.new("struct timespec *", (deadline_ns // NS_PER_S, deadline_ns % NS_PER_S))
        rc = self.libc.pthread_timedjoin_np(thread, self.ffi.NULL, deadline)
        if rc == ETIMEDOUT:
            return False
        if rc != 0:
            raise OSError(rc, f"pthread_timedjoin_np failed: {os.strerror(rc)}")
        return True
