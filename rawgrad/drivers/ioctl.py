"""Linux ioctl request numbers: the `_IOC` encoding of include/uapi/asm-generic/ioctl.h.

Shared by every driver that talks to a kernel module (NV's RM/UVM escapes, AMD's KFD) and by their mocks,
which decode requests the way the kernel does."""
from __future__ import annotations

_IOC_NRBITS = 8  # asm-generic/ioctl.h _IOC_NRBITS
_IOC_TYPEBITS = 8  # asm-generic/ioctl.h _IOC_TYPEBITS
_IOC_SIZEBITS = 14  # asm-generic/ioctl.h _IOC_SIZEBITS
_IOC_DIRBITS = 2  # asm-generic/ioctl.h _IOC_DIRBITS
_IOC_NRSHIFT = 0
_IOC_TYPESHIFT = _IOC_NRSHIFT + _IOC_NRBITS
_IOC_SIZESHIFT = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT = _IOC_SIZESHIFT + _IOC_SIZEBITS
IOC_NONE = 0  # asm-generic/ioctl.h _IOC_NONE
IOC_WRITE = 1  # asm-generic/ioctl.h _IOC_WRITE (user -> kernel, "IOC_IN" in the kernel's ioctl code)
IOC_READ = 2  # asm-generic/ioctl.h _IOC_READ (kernel -> user, "IOC_OUT")


def ioc(direction: int, type_char: int, nr: int, size: int) -> int:
    """Linux ``_IOC(dir, type, nr, size)``."""
    if not 0 <= size < (1 << _IOC_SIZEBITS):
        raise ValueError(f"ioctl size {size} does not fit the {_IOC_SIZEBITS}-bit size field")
    if not 0 <= nr < (1 << _IOC_NRBITS):
        raise ValueError(f"ioctl nr {nr} does not fit the {_IOC_NRBITS}-bit nr field")
    return ((direction << _IOC_DIRSHIFT) | (size << _IOC_SIZESHIFT) | (type_char << _IOC_TYPESHIFT)
            | (nr << _IOC_NRSHIFT))


def iowr(type_char: int, nr: int, size: int) -> int:
    """Linux ``_IOWR(type, nr, size)``."""
    return ioc(IOC_READ | IOC_WRITE, type_char, nr, size)


def ioc_nr(request: int) -> int:
    """``_IOC_NR``: the field the NVIDIA module and amdkfd dispatch on."""
    return (request >> _IOC_NRSHIFT) & ((1 << _IOC_NRBITS) - 1)


def ioc_size(request: int) -> int:
    """``_IOC_SIZE``: the byte count the module copies in from (and back to) the caller."""
    return (request >> _IOC_SIZESHIFT) & ((1 << _IOC_SIZEBITS) - 1)


def ioc_type(request: int) -> int:
    return (request >> _IOC_TYPESHIFT) & ((1 << _IOC_TYPEBITS) - 1)


def ioc_dir(request: int) -> int:
    return (request >> _IOC_DIRSHIFT) & ((1 << _IOC_DIRBITS) - 1)
