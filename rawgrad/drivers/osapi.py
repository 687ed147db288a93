"""The operating-system seam every driver talks through.

Drivers never call libc, ``os`` or ``mmap`` directly: they receive an object implementing
:class:`OSInterface` at construction. Production code passes :class:`LibcOS` (libc through cffi);
tests pass a mock kernel driver that emulates the device nodes with the same call surface.

Besides the usual file calls the seam carries an MMIO read (the usermode timer) and the GPFIFO publish
sequence (ring entry, store fence, put index, store fence, doorbell), because a doorbell write is the one
place where a CPU store has a side effect a mock must observe. In production the publish sequence is native
code (``rawgrad.drivers.mmio``): Python cannot emit the fences.
"""

from __future__ import annotations

import errno as _errno
import os
import platform
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import cffi

from rawgrad.drivers.mmio import native_mmio

# Linux x86-64 values, from <asm-generic/fcntl.h>, <asm-generic/mman-common.h>, <asm-generic/mman.h>.
O_RDONLY = 0o0  # fcntl.h O_RDONLY
O_RDWR = 0o2  # fcntl.h O_RDWR
O_CLOEXEC = 0o2000000  # fcntl.h O_CLOEXEC
PROT_NONE = 0x0  # mman-common.h PROT_NONE
PROT_READ = 0x1  # mman-common.h PROT_READ
PROT_WRITE = 0x2  # mman-common.h PROT_WRITE
MAP_SHARED = 0x01  # mman-common.h MAP_SHARED
MAP_PRIVATE = 0x02  # mman-common.h MAP_PRIVATE
MAP_FIXED = 0x10  # mman-common.h MAP_FIXED
MAP_ANONYMOUS = 0x20  # mman-common.h MAP_ANONYMOUS
MAP_NORESERVE = 0x4000  # asm-generic/mman.h MAP_NORESERVE
MAP_FIXED_NOREPLACE = 0x100000  # mman-common.h MAP_FIXED_NOREPLACE (Linux >= 4.17)
MAP_FAILED = (1 << 64) - 1  # sys/mman.h MAP_FAILED ((void *)-1) as an unsigned address
PAGE_SIZE = 4096  # x86-64 base page


@runtime_checkable
class OSInterface(Protocol):
    """Operating-system calls a driver may make; a mock implements the same surface."""

    def open(self, path: str, flags: int) -> int: ...
    def close(self, fd: int) -> None: ...
    def ioctl(self, fd: int, request: int, buf: Any) -> int: ...
    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int: ...
    def munmap(self, addr: int, length: int) -> None: ...
    def read(self, fd: int, n: int) -> bytes: ...
    def exists(self, path: str) -> bool: ...
    def mmio_read32(self, addr: int) -> int: ...
    def gpfifo_publisher(self, ring: int, entries: int, put_word: int, doorbell: int,
                         token: int) -> Callable[[int, int], None]:
        """`publish(slot, entry)`: store the 64-bit `entry` at `ring[slot]`, store fence, store
        `(slot + 1) % entries` at `put_word`, store fence, write `token` to the `doorbell` register."""
        ...


@runtime_checkable
class DoorbellOS(OSInterface, Protocol):
    """An OSInterface that can also publish a ring's write pointer and ring its 64-bit doorbell.

    Kept apart from OSInterface so seams that never ring such a doorbell (the NV mock) need not implement
    it. AMD KFD queues use it (AMD-METAL-FACTS 1.2 step 8): the CP reads the write pointer word after it
    sees the doorbell, so the word must be visible first; the mock observes the doorbell write here."""

    def doorbell_publisher(self, write_pointer: int, doorbell: int) -> Callable[[int], None]:
        """`publish(value)`: store the 64-bit `value` at `write_pointer`, then (ordered after it) at the
        64-bit `doorbell` register."""
        ...


def os_error(call: str, err: int, detail: str = "") -> OSError:
    """An OSError whose message names the failing call and the errno symbol."""
    name = _errno.errorcode.get(err, str(err))
    msg = f"{call} failed: {name} ({os.strerror(err)})" + (f" [{detail}]" if detail else "")
    return OSError(err, msg)


_CDEF = """
int open(const char *pathname, int flags, ...);
int close(int fd);
int ioctl(int fd, unsigned long request, ...);
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
long read(int fd, void *buf, size_t count);
"""


class LibcOS:
    """OSInterface backed by the C library through cffi (ABI mode, no compiler needed)."""

    def __init__(self) -> None:
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self.lib: Any = self.ffi.dlopen(None)

    def open(self, path: str, flags: int) -> int:
        fd = self.lib.open(path.encode(), self.ffi.cast("int", flags), self.ffi.cast("int", 0))
        if fd < 0:
            raise os_error(f"open({path})", self.ffi.errno)
        return int(fd)

    def close(self, fd: int) -> None:
        if self.lib.close(fd) != 0:
            raise os_error(f"close({fd})", self.ffi.errno)

    def ioctl(self, fd: int, request: int, buf: Any) -> int:
        ret = self.lib.ioctl(fd, self.ffi.cast("unsigned long", request), self.ffi.cast("void *", buf))
        if ret < 0:
            raise os_error(f"ioctl(fd={fd}, request={request:#x})", self.ffi.errno)
        return int(ret)

    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
        if offset >= 1 << 63:  # device offsets with bit 63 set (KFD doorbells): same bits, as a signed long
            offset -= 1 << 64
        ptr = self.lib.mmap(self.ffi.cast("void *", addr), length, prot, flags, fd, offset)
        res = int(self.ffi.cast("uintptr_t", ptr))
        if res == MAP_FAILED:
            raise os_error(f"mmap(addr={addr:#x}, length={length:#x}, fd={fd})", self.ffi.errno)
        return res

    def munmap(self, addr: int, length: int) -> None:
        if self.lib.munmap(self.ffi.cast("void *", addr), length) != 0:
            raise os_error(f"munmap({addr:#x}, {length:#x})", self.ffi.errno)

    def read(self, fd: int, n: int) -> bytes:
        buf = self.ffi.new("char[]", max(n, 1))
        got = self.lib.read(fd, buf, n)
        if got < 0:
            raise os_error(f"read(fd={fd})", self.ffi.errno)
        return bytes(self.ffi.buffer(buf, got))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mmio_read32(self, addr: int) -> int:
        return int(self.ffi.cast("volatile uint32_t *", addr)[0])

    def gpfifo_publisher(self, ring: int, entries: int, put_word: int, doorbell: int,
                         token: int) -> Callable[[int, int], None]:
        return native_mmio().gpfifo_publisher(ring, entries, put_word, doorbell, token)

    def doorbell_publisher(self, write_pointer: int, doorbell: int) -> Callable[[int], None]:
        # Two plain 64-bit stores. Ordering: x86 never reorders stores with older stores, and KFD maps the
        # doorbell slice uncached, not write-combined (kfd_doorbell.c, pgprot_noncached; UNSURE until run on
        # hardware), so no SFENCE is needed between them. Other CPUs need a store fence that Python cannot
        # emit: refuse rather than publish unordered.
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise RuntimeError(f"doorbell_publisher: no ordered 64-bit doorbell store for "
                               f"{platform.machine()!r} (it needs a native fenced store sequence)")
        wp = self.ffi.cast("volatile uint64_t *", write_pointer)
        db = self.ffi.cast("volatile uint64_t *", doorbell)

        def publish(value: int) -> None:
            wp[0] = value
            db[0] = value
        return publish
