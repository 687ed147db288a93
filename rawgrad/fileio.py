"""Files rawgrad writes and reads without trusting the file system: one mechanism for every writer and
reader of saved graphs, safetensors and the compile cache.

Writing (`atomic_write`): the data goes to a temporary file created exclusively (``O_CREAT | O_EXCL``,
by `tempfile.mkstemp`, mode 0600) in the destination's own directory, is fsynced, and is renamed over
the destination with `os.replace`. A symlink or file planted at a predictable temporary name cannot
redirect the write (no predictable name is used, and an existing name is never opened); a symlink at the
destination is replaced, not followed; a reader sees the old file or the whole new one, never a torn one.

Reading (`open_regular_readonly`): ``O_RDONLY | O_NONBLOCK | O_NOCTTY`` (and ``O_NOFOLLOW`` unless the
caller allows symlinks), then `os.fstat` on the open descriptor: anything but a regular file (a FIFO, a
socket, a device, a directory) is refused with `UnsafeFileError` before a byte is read, so a FIFO cannot
block the reader and a check cannot be raced by swapping the path afterwards.

`trust_problem` is the ownership rule (as ssh applies to its keys): a file or folder whose code or data
we run must be owned by the current user and not writable by group or others.
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["UnsafeFileError", "atomic_write", "file_kind", "open_regular_readonly", "read_exactly",
           "read_into", "trust_problem"]


class UnsafeFileError(OSError):
    """A path that must not be read as a regular file: a symlink where none is allowed, a FIFO, a socket,
    a device or a directory. `strerror` is the reason, `filename` the path."""


def file_kind(mode: int) -> str:
    """"a FIFO", "a directory", ... for messages."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return f"a special file (mode {mode:o})"


def open_regular_readonly(path: str | os.PathLike[str], *, follow_symlinks: bool = False) -> int:
    """A read-only descriptor for `path`, which must be a regular file (a symlink to one only with
    `follow_symlinks`). Never blocks (O_NONBLOCK: a FIFO opens at once and is then refused). The caller
    owns the descriptor."""
    name = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(name, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafeFileError(errno.ELOOP, "is a symbolic link; refusing to follow it", name) from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(errno.EINVAL, f"is {file_kind(st.st_mode)}, not a regular file", name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_exactly(fd: int, offset: int, nbytes: int) -> bytes:
    """`nbytes` from `offset` of `fd`; a shorter result means the file ended first (the caller decides
    what that means). Reads in pieces: one pread is capped by the kernel at about 2 GiB."""
    parts: list[bytes] = []
    done = 0
    while done < nbytes:
        chunk = os.pread(fd, min(nbytes - done, 1 << 30), offset + done)
        if not chunk:
            break
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def read_into(fd: int, offset: int, buf: memoryview) -> int:
    """Fill `buf` (a writable byte view) from `offset` of `fd`; returns the bytes read, fewer than
    `len(buf)` only if the file ended first."""
    done, total = 0, len(buf)
    while done < total:
        n = os.preadv(fd, [buf[done:done + (1 << 30)]], offset + done)
        if n <= 0:
            break
        done += n
    return done


def trust_problem(st: os.stat_result, what: str = "file") -> str | None:
    """Why a file or folder with this status must not be trusted, or None: it must be owned by the
    current (effective) user and not writable by group or others."""
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"the {what} is owned by uid {st.st_uid}, not by the current user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the {what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race with other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def atomic_write(path: str | os.PathLike[str], data: bytes | Callable[[BinaryIO], None], *,
                 mode: int = 0o600) -> None:
    """Replace `path` with `data` (bytes, or a function writing to the open binary file) atomically.

    `mode` is the new file's permission bits (masked by the umask; default: readable by its owner only).
    Raises what the file system raises; the temporary file is removed on any failure."""
    dest = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(dest))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", suffix=".tmp", dir=folder)
    pending: str | None = tmp
    try:
        with os.fdopen(fd, "wb") as f:
            if mode != 0o600:
                os.fchmod(f.fileno(), mode & ~_umask() & 0o777)
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
        pending = None
        _fsync_folder(folder)
    finally:
        if pending is not None:
            try:
                os.unlink(pending)
            except OSError:
                pass


def _fsync_folder(folder: str) -> None:
    """Make the rename durable (best effort: some file systems refuse fsync on a directory)."""
    try:
        dfd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
