"""A disk cache of compiled kernels keyed by the scheduled kernel itself (its AST), not by generated code.

The compiler's own cache (`cache.CompileCache`) is keyed by the rendered source, so a kernel first seen in
this process is lowered and rendered before that cache can answer (1.1-1.8 ms on the CPU device, issue 21).
An entry here holds what a launch needs from the lowered program (symbol name, Variables, global size, launch
contract) and the compiled object, under a key over:

- the AST's structure: its pickle (every node's op, dtype, sources and argument, constants bit for bit), so
  two ASTs that differ anywhere never share a key;
- the compiler's target key (triple, CPU, features, options) and the llvmlite version;
- a digest of the source files of every module that turns an AST into code (`code_version`), so editing
  the lowerer, a renderer or the toolchain never serves an object made by the old code.

Entries live in the compiler's cache folder with their own suffix and follow `cache.DiskCache`'s rules
(owner-only folder and files, regular files only, never through a symlink, a sha256 over the payload checked
before use). The header is read with an unpickler that builds only the few IR classes a launch contract holds;
anything else (a corrupt or hostile entry) is refused, counted and the kernel is built again.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any

from rawgrad.compiler.cache import DiskCache
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.target import LaunchSpec
from rawgrad.dtype import DType

__all__ = ["KERNEL_SUFFIX", "CachedKernel", "KernelDiskCache", "ast_key", "code_version"]

KERNEL_SUFFIX = ".kernel"
# Bumped when the entry layout changes; part of every key, so old entries are simply never asked for.
ENTRY_FORMAT = 1
_PICKLE_PROTOCOL = 5
_HEADER_LEN = struct.Struct("<Q")
# The only classes an entry's header may name (anything else refuses the entry).
_ALLOWED = {("rawgrad.compiler.ir", "UOp"): UOp, ("rawgrad.compiler.ir", "Ops"): Ops,
            ("rawgrad.dtype", "DType"): DType}


@dataclass(frozen=True)
class CachedKernel:
    """What a launch needs without lowering: the symbol, its Variables in argument order, the global size
    (int or UOp over the Variables), the launch contract and the compiled object."""

    name: str
    variables: tuple[UOp, ...]
    global_size: Any
    launch: LaunchSpec
    lib: bytes


class _IRUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        cls = _ALLOWED.get((module, name))
        if cls is None:
            raise pickle.UnpicklingError(f"kernel cache entry names {module}.{name}, which it may not")
        return cls


_version_lock = threading.Lock()
_versions: dict[tuple[str, ...], str] = {}


def code_version(*modules: str) -> str:
    """sha256 over the source of every module under rawgrad/compiler plus `modules` (by name), read once per
    process: any edit to the code that lowers, renders or compiles changes every key."""
    with _version_lock:
        hit = _versions.get(modules)
        if hit is not None:
            return hit
        here = os.path.dirname(os.path.abspath(__file__))
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(here) for f in fs if f.endswith(".py"))
        for mod in modules:
            path = getattr(sys.modules.get(mod), "__file__", None)
            if path:
                files.append(os.path.abspath(path))
        h = hashlib.sha256()
        for path in files:
            h.update(path.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        _versions[modules] = h.hexdigest()
        return _versions[modules]


def ast_key(ast: UOp, *context: str) -> str:
    """sha256 over the AST's pickle and `context` (target key, versions, ...), each part length-prefixed."""
    h = hashlib.sha256()
    for part in (pickle.dumps(ast, protocol=_PICKLE_PROTOCOL), *(c.encode() for c in context),
                 str(ENTRY_FORMAT).encode()):
        h.update(_HEADER_LEN.pack(len(part)))
        h.update(part)
    return h.hexdigest()


class KernelDiskCache:
    """Entries ``<folder>/<key>.kernel``: a length-prefixed pickled header, then the compiled object."""

    def __init__(self, folder: str | None) -> None:
        self.disk = DiskCache(folder, KERNEL_SUFFIX)
        self.refused_entries = 0  # intact (hash-valid) entries whose content was refused

    @property
    def folder(self) -> str | None:
        return self.disk.folder

    def get(self, key: str) -> CachedKernel | None:
        payload = self.disk.get(key)
        if payload is None:
            return None
        try:
            return _decode(payload)
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError, AttributeError, IndexError,
                KeyError, struct.error):
            self.refused_entries += 1
            return None

    def put(self, key: str, entry: CachedKernel) -> None:
        launch = entry.launch
        header = pickle.dumps((ENTRY_FORMAT, entry.name, tuple(entry.variables), entry.global_size,
                               (tuple(launch.global_size), tuple(launch.local_size), launch.buffers,
                                tuple(launch.scalars), launch.shared_bytes, launch.registers,
                                launch.exact_local)), protocol=_PICKLE_PROTOCOL)
        self.disk.put(key, _HEADER_LEN.pack(len(header)) + header + entry.lib)


def _int(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{what} is not an int")
    return v


def _size(v: Any, what: str) -> Any:
    if isinstance(v, UOp):
        return v
    return _int(v, what)


def _decode(payload: bytes) -> CachedKernel:
    """Parse and check an entry; raises ValueError (or an unpickling error) for anything malformed."""
    (n,) = _HEADER_LEN.unpack_from(payload, 0)
    start = _HEADER_LEN.size
    if n <= 0 or start + n >= len(payload):
        raise ValueError("header length out of range")
    header = _IRUnpickler(io.BytesIO(payload[start:start + n])).load()
    lib = payload[start + n:]
    if not isinstance(header, tuple) or len(header) != 5 or header[0] != ENTRY_FORMAT:
        raise ValueError("unknown entry format")
    _, name, variables, global_size, launch = header
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError("bad symbol name")
    if not isinstance(variables, tuple) or not all(isinstance(v, UOp) for v in variables):
        raise ValueError("bad variables")
    if not isinstance(launch, tuple) or len(launch) != 7:
        raise ValueError("bad launch contract")
    gsize, lsize, buffers, scalars, shared, registers, exact = launch
    if not isinstance(gsize, tuple) or not isinstance(lsize, tuple) or not isinstance(scalars, tuple):
        raise ValueError("bad launch sizes")
    if not all(isinstance(s, UOp) for s in scalars) or not isinstance(exact, bool):
        raise ValueError("bad launch contract")
    if len(gsize) != 3 or len(lsize) != 3:
        raise ValueError("a launch has 3-D sizes")
    g0, g1, g2 = (_size(g, "global size") for g in gsize)
    l0, l1, l2 = (_int(v, "local size") for v in lsize)
    regs = None if registers is None else _int(registers, "registers")
    spec = LaunchSpec((g0, g1, g2), (l0, l1, l2), _int(buffers, "buffers"), scalars,
                      _int(shared, "shared bytes"), regs, exact)
    return CachedKernel(name, variables, _size(global_size, "global size"), spec, lib)
