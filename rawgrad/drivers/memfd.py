"""Host pages a mock kernel driver hands out as device memory: a memfd and the mock's shared mapping of it.

The NV and AMD mock kernel drivers both back every allocation this way, so the bytes the "GPU" sees and the
bytes the driver maps at the caller's address are the same pages (a second mmap of the same memfd)."""
from __future__ import annotations

from typing import Any

import cffi

from rawgrad.drivers import osapi

ffi = cffi.FFI()
ffi.cdef("""
int memfd_create(const char *name, unsigned int flags);
int ftruncate(int fd, long length);
int close(int fd);
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
""")
libc: Any = ffi.dlopen(None)
MFD_CLOEXEC = 0x1  # linux/memfd.h MFD_CLOEXEC


class Memfd:
    """Host pages for one allocation: a memfd plus the mock's own shared mapping of it."""

    live = 0  # memfds not yet released, over all mocks (leak checks)

    def __init__(self, size: int, name: str):
        self.size = size
        self.fd = libc.memfd_create(name.encode(), MFD_CLOEXEC)
        if self.fd < 0:
            raise osapi.os_error("memfd_create", ffi.errno)
        if libc.ftruncate(self.fd, size) != 0:
            err = ffi.errno
            libc.close(self.fd)
            raise osapi.os_error("ftruncate", err)
        ptr = libc.mmap(ffi.NULL, size, osapi.PROT_READ | osapi.PROT_WRITE, osapi.MAP_SHARED, self.fd, 0)
        self.addr = int(ffi.cast("uintptr_t", ptr))
        if self.addr == osapi.MAP_FAILED:
            err = ffi.errno
            libc.close(self.fd)
            raise osapi.os_error("mmap(memfd)", err)
        self.released = False
        Memfd.live += 1

    def release(self) -> None:
        if not self.released:
            libc.munmap(ffi.cast("void *", self.addr), self.size)
            libc.close(self.fd)
            self.released = True
            Memfd.live -= 1
