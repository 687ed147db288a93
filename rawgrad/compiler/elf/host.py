"""This process's side of loading: anonymous mappings, page protections and symbol lookup through libc (cffi).
"""

from __future__ import annotations

import mmap
import os
import platform
import threading

from rawgrad import mappings
from rawgrad.compiler.elf.consts import EM_AARCH64, EM_X86_64, ElfError

_CDEF = """
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int mprotect(void *addr, size_t len, int prot);
int munmap(void *addr, size_t length);
void *dlopen(const char *filename, int flags);
void *dlsym(void *handle, const char *symbol);
"""
_MAP_FAILED = -1  # (void *)-1, sys/mman.h
_LIBM_NAME = "libm.so.6"  # glibc's math library soname
_LIBGCC_NAME = "libgcc_s.so.1"  # holds __clear_cache (instruction-cache flush) on aarch64 hosts
_HOST_MACHINES = {"x86_64": EM_X86_64, "amd64": EM_X86_64, "aarch64": EM_AARCH64, "arm64": EM_AARCH64}


class _Libc:
    """mmap/mprotect/munmap and dlsym through cffi (ABI mode, no compiler needed)."""

    def __init__(self) -> None:
        import cffi

        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self.lib = self.ffi.dlopen(None)
        self.handles = [self.ffi.NULL]  # RTLD_DEFAULT (NULL in glibc's dlfcn.h): every loaded library
        libm = self.lib.dlopen(_LIBM_NAME.encode(), os.RTLD_NOW | os.RTLD_LOCAL)
        if libm != self.ffi.NULL:
            self.handles.append(libm)
        self._lock = threading.Lock()

    def resolve(self, name: str) -> int:
        for h in self.handles:
            p = self.lib.dlsym(h, name.encode())
            if p != self.ffi.NULL:
                return int(self.ffi.cast("uintptr_t", p))
        return 0

    def _fail(self, call: str) -> OSError:
        err = self.ffi.errno
        return OSError(err, f"{call} failed: {os.strerror(err)}")

    def map(self, size: int) -> int:
        p = self.lib.mmap(self.ffi.NULL, size, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        addr = int(self.ffi.cast("intptr_t", p))
        if addr == _MAP_FAILED:
            raise self._fail(f"mmap({size} bytes)")
        return int(self.ffi.cast("uintptr_t", p))

    def protect(self, addr: int, size: int, prot: int) -> None:
        if self.lib.mprotect(self.ffi.cast("void *", addr), size, prot) != 0:
            raise self._fail(f"mprotect({addr:#x}, {size}, {prot})")

    def unmap(self, addr: int, size: int) -> None:
        if self.lib.munmap(self.ffi.cast("void *", addr), size) != 0:
            raise self._fail(f"munmap({addr:#x}, {size})")

    def write(self, addr: int, data: bytes | bytearray) -> None:
        self.ffi.memmove(self.ffi.cast("void *", addr), bytes(data), len(data))

    def flush_icache(self, addr: int, size: int) -> None:
        """aarch64 needs the instruction cache synchronised with freshly written code (x86 does not)."""
        fn = self.resolve("__clear_cache")
        if not fn:
            h = self.lib.dlopen(_LIBGCC_NAME.encode(), os.RTLD_NOW | os.RTLD_LOCAL)
            p = self.lib.dlsym(h, b"__clear_cache") if h != self.ffi.NULL else self.ffi.NULL
            fn = int(self.ffi.cast("uintptr_t", p))
        if not fn:
            raise ElfError("cannot flush the instruction cache: __clear_cache not found in libgcc_s")
        clear = self.ffi.cast("void(*)(void *, void *)", fn)
        clear(self.ffi.cast("void *", addr), self.ffi.cast("void *", addr + size))


_libc_lock = threading.Lock()
_libc_instance: _Libc | None = None


def _libc() -> _Libc:
    global _libc_instance
    if _libc_instance is None:
        with _libc_lock:
            if _libc_instance is None:
                _libc_instance = _Libc()
    return _libc_instance


def _unmap(addr: int, size: int) -> None:
    if mappings.pinned():  # an abandoned worker may still run this code (rawgrad/mappings.py)
        return
    _libc().unmap(addr, size)


def host_machine() -> int:
    """The ELF e_machine of this process's CPU (ElfError if the loader does not support it)."""
    m = platform.machine().lower()
    if m not in _HOST_MACHINES:
        raise ElfError(f"the ELF loader does not support host CPU {m!r}")
    return _HOST_MACHINES[m]



def process_symbol(name: str) -> int:
    """Address of ``name`` in this process's C library or libm; 0 when it is not there."""
    return _libc().resolve(name)
