"""A folder of compiled artefacts keyed by content hash, shared by the LLVM and NV compilers.

Each entry is the sha256 digest of the payload followed by the payload, written with
`rawgrad.fileio.atomic_write` (an exclusively created temporary file, fsynced, renamed into place): a
reader sees the old entry or the whole new one, and a torn or corrupt file is detected (and reported as a
miss) instead of being handed to a loader.

Trust: an entry is machine code this process will run, and its embedded hash only proves it is intact,
not who wrote it. So, as ssh does for its keys, the cache folder and every entry must be owned by the
current user and not writable by group or others, and an entry must be a regular file (not a symlink, a
FIFO, ...). Anything else is skipped with a one-time `UntrustedCacheWarning` naming the path and the
reason, and the artefact is compiled again (an untrusted folder is not written to either). The folder is
created with mode 0700.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from collections.abc import Callable

from rawgrad.fileio import UnsafeFileError, atomic_write, open_regular_readonly, read_exactly, trust_problem

__all__ = ["CACHE_DIR_ENV", "CompileCache", "DiskCache", "UntrustedCacheWarning", "cache_folder",
           "content_key"]

# Environment variable naming the cache root; an empty value disables the disk cache.
CACHE_DIR_ENV = "RAWGRAD_CACHE_DIR"
DEFAULT_CACHE_ROOT = os.path.join("~", ".cache", "rawgrad")
_DIGEST_SIZE = hashlib.sha256().digest_size
# An entry larger than this is not read (no compiled kernel comes near it): a corrupt or hostile file.
MAX_ENTRY_BYTES = 1 << 30


class UntrustedCacheWarning(UserWarning):
    """A cache folder or entry that is skipped: not owned by the current user, writable by others, or not
    a regular file. Given once per path and reason."""


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_untrusted(path: str, reason: str) -> None:
    with _warned_lock:
        if (path, reason) in _warned:
            return
        _warned.add((path, reason))
    warnings.warn(f"rawgrad compile cache: not using {path}: {reason}; compiling again instead (fix the "
                  f"ownership/permissions or remove it)", UntrustedCacheWarning, stacklevel=3)


def cache_folder(kind: str, explicit: str | None = None) -> str | None:
    """The folder for `kind` ("llvm", "nv"): `explicit` when given ('' = no disk cache), else
    ``$RAWGRAD_CACHE_DIR`` or ``~/.cache/rawgrad``, with `kind` appended to the default root only."""
    if explicit is None:
        root = os.environ.get(CACHE_DIR_ENV)
        if root is None:
            return os.path.expanduser(os.path.join(DEFAULT_CACHE_ROOT, kind))
        explicit = root
    return os.path.expanduser(explicit) if explicit else None


def content_key(*parts: str) -> str:
    """sha256 over `parts`, each terminated by a NUL so ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class DiskCache:
    """Entries ``<folder>/<key><suffix>``; `folder` None makes every lookup a miss and every store a no-op."""

    def __init__(self, folder: str | None, suffix: str) -> None:
        self.folder = folder
        self.suffix = suffix
        self.corrupt_entries = 0  # entries found torn or corrupt (then recompiled)
        self.untrusted_entries = 0  # entries (or lookups in an untrusted folder) skipped by the trust rule

    def path(self, key: str) -> str | None:
        return os.path.join(self.folder, key + self.suffix) if self.folder else None

    def _folder_trusted(self, create: bool) -> bool:
        """Whether the folder may be read from and written to (creating it, mode 0700, if asked)."""
        assert self.folder is not None
        try:
            if create:
                os.makedirs(self.folder, mode=0o700, exist_ok=True)
            st = os.stat(self.folder)
        except OSError:
            return False  # missing (a miss) or unusable (an unwritable cache only costs a recompile)
        problem = trust_problem(st, "cache folder")
        if problem is not None:
            _warn_untrusted(self.folder, problem)
            return False
        return True

    def get(self, key: str) -> bytes | None:
        path = self.path(key)
        if path is None or not self._folder_trusted(create=False):
            return None
        try:
            fd = open_regular_readonly(path)
        except FileNotFoundError:
            return None
        except UnsafeFileError as e:  # a symlink, a FIFO, a directory, ...
            self.untrusted_entries += 1
            _warn_untrusted(path, e.strerror or str(e))
            return None
        except OSError:
            return None  # unreadable: a miss
        try:
            st = os.fstat(fd)
            problem = trust_problem(st, "cache entry")
            if problem is not None:
                self.untrusted_entries += 1
                _warn_untrusted(path, problem)
                return None
            if st.st_size > MAX_ENTRY_BYTES:
                self.corrupt_entries += 1
                return None
            blob = read_exactly(fd, 0, st.st_size)
        except OSError:
            return None
        finally:
            os.close(fd)
        digest, payload = blob[:_DIGEST_SIZE], blob[_DIGEST_SIZE:]
        if len(blob) <= _DIGEST_SIZE or hashlib.sha256(payload).digest() != digest:
            self.corrupt_entries += 1
            return None
        return payload

    def put(self, key: str, payload: bytes) -> None:
        path = self.path(key)
        if path is None or not self._folder_trusted(create=True):
            return
        try:
            atomic_write(path, hashlib.sha256(payload).digest() + payload)  # mode 0600
        except OSError:
            pass  # an unwritable cache only costs a recompile next time


# Where CompileCache.get found an entry: the process's memory, the disk cache, or neither (built now).
MEMORY, DISK, BUILT = "memory", "disk", "built"


class CompileCache:
    """What every compiler does with a content key: memory, then disk, then `build` (stored in both)."""

    def __init__(self, folder: str | None, suffix: str) -> None:
        self.disk = DiskCache(folder, suffix)
        self._memory: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get(self, key: str, build: Callable[[], bytes]) -> tuple[bytes, str]:
        """(the artefact, where it came from: MEMORY, DISK or BUILT)."""
        with self._lock:
            hit = self._memory.get(key)
        if hit is not None:
            return hit, MEMORY
        data, source = self.disk.get(key), DISK
        if data is None:
            data, source = build(), BUILT
            self.disk.put(key, data)
        with self._lock:
            self._memory[key] = data
        return data, source
