"""A folder of compiled artefacts keyed by content hash, shared by the LLVM and NV compilers.

Each entry is the sha256 digest of the payload followed by the payload, written to a temporary file and
renamed into place: a reader sees the old entry or the whole new one, and a torn or corrupt file is
detected (and reported as a miss) instead of being handed to a loader.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable

__all__ = ["CACHE_DIR_ENV", "CompileCache", "DiskCache", "cache_folder", "content_key"]

# Environment variable naming the cache root; an empty value disables the disk cache.
CACHE_DIR_ENV = "RAWGRAD_CACHE_DIR"
DEFAULT_CACHE_ROOT = os.path.join("~", ".cache", "rawgrad")
_DIGEST_SIZE = hashlib.sha256().digest_size


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

    def path(self, key: str) -> str | None:
        return os.path.join(self.folder, key + self.suffix) if self.folder else None

    def get(self, key: str) -> bytes | None:
        path = self.path(key)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError:
            return None
        digest, payload = blob[:_DIGEST_SIZE], blob[_DIGEST_SIZE:]
        if len(blob) <= _DIGEST_SIZE or hashlib.sha256(payload).digest() != digest:
            self.corrupt_entries += 1
            return None
        return payload

    def put(self, key: str, payload: bytes) -> None:
        path = self.path(key)
        if path is None:
            return
        assert self.folder is not None
        tmp = None
        try:
            os.makedirs(self.folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.folder)
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)  # atomic on POSIX
            tmp = None
        except OSError:
            pass  # an unwritable cache only costs a recompile next time
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


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
