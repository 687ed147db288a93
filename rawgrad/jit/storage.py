"""Saved graphs: a TinyJit capture on disk, replayable in a fresh process without tracing or compiling.

File layout (little-endian):

    magic        8 bytes  b"RGJITGRF"
    version      u32      FORMAT_VERSION; any other version is refused
    reserved     u32      zero
    sha256      32 bytes  of the body
    body length  u64
    body         u64 manifest length, the manifest (UTF-8 JSON), then the blobs it points into

The manifest holds the target description (device, queue encoder, compiler target key), the guards
(argument structure, input shapes/dtypes/devices, constant arguments), the buffer plan (arena sizes, fresh
outputs, external buffers whose contents are blobs), the return value's shape and, per device, the queue
template: its words (a blob), how many of them are the queue's data region, and its patch list, which is
also the relocation table (every address that differs between processes is a `reloc.*` variable, every
per-call value a `jit.*`/`graph.*` variable; see hcq/graph.py). Kernel binaries (the ELF objects the
compiler produced) are blobs. No pickle: nothing in a file is executed except the kernels, and those only
after the ownership and hash checks passed.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from typing import Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, dtypes
from rawgrad.hcq.device import Device
from rawgrad.hcq.graph import QueueTemplate
from rawgrad.hcq.queue import PatchPoint
from rawgrad.jit.jit import CapturedGraph, DeviceGraph, JitError, TensorGuard
from rawgrad.tensor.buffers import buffer_from_numpy, buffer_numpy

__all__ = ["FORMAT_VERSION", "GraphFileError", "load_capture", "save_capture"]

MAGIC = b"RGJITGRF"
# 2: a queue template may end in a data region (`data_words`; NV keeps its QMDs and constant banks there
# instead of inline behind NO_OPERATION methods)
FORMAT_VERSION = 2
_HEADER = struct.Struct("<8sII32sQ")
_U64 = struct.Struct("<Q")


class GraphFileError(JitError):
    """A saved graph that cannot be loaded: truncated, corrupted, wrong version, wrong target, untrusted."""


# ---------------------------------------------------------------------------------------------- values
def _enc(x: Any) -> Any:
    """A JSON value that `_dec` turns back into an equal (and equally hashable) Python value."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, TensorGuard):  # before tuple: a guard is a NamedTuple
        return {"guard": [_enc(x.shape), x.dtype.name, x.device, x.buffer_size]}
    if isinstance(x, tuple):
        return {"tuple": [_enc(y) for y in x]}
    if isinstance(x, list):
        return {"list": [_enc(y) for y in x]}
    if isinstance(x, dict):
        return {"dict": [[_enc(k), _enc(v)] for k, v in x.items()]}
    if isinstance(x, UOp):
        return {"uop": [x.op.name, x.dtype.name if x.dtype is not None else None, _enc(x.arg),
                        [_enc(s) for s in x.src]]}
    if isinstance(x, DType):
        return {"dtype": x.name}
    raise GraphFileError(f"cannot save a value of type {type(x).__name__} ({x!r:.60}) in a graph file; "
                         f"non-Tensor arguments and returned values must be None, bool, int, float, str "
                         f"or containers of those")


def _dec(x: Any) -> Any:
    if not isinstance(x, dict):
        return x
    (tag, body), = x.items()
    if tag == "tuple":
        return tuple(_dec(y) for y in body)
    if tag == "list":
        return [_dec(y) for y in body]
    if tag == "dict":
        return {_dec(k): _dec(v) for k, v in body}
    if tag == "uop":
        op, dt, arg, src = body
        return UOp(Ops[op], dtypes.from_name(dt) if dt is not None else None,
                   tuple(_dec(s) for s in src), _dec(arg))
    if tag == "dtype":
        return dtypes.from_name(body)
    if tag == "guard":
        shape, dt, device, size = body
        return TensorGuard(_dec(shape), dtypes.from_name(dt), device, size)
    raise GraphFileError(f"unknown value tag {tag!r} in graph manifest")


class _Blobs:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> list[int]:
        ref = [self.size, len(data)]
        self.parts.append(data)
        self.size += len(data)
        return ref


# ---------------------------------------------------------------------------------------------- save
def _target(dev_name: str) -> dict[str, Any]:
    dev = Device[dev_name]
    return {"device": dev_name, "target_key": getattr(dev.compiler, "target_key", None)}


def save_capture(cap: CapturedGraph, path: str) -> None:
    """Write `cap` to `path` atomically (a temporary file renamed into place), readable by its owner."""
    blobs = _Blobs()
    devices = []
    for dg in cap.devices:
        t = dg.template
        devices.append({
            **_target(dg.device), "queue_kind": t.queue_kind, "word_bits": t.word_bits,
            "words": blobs.add(np.ascontiguousarray(t.words, dtype="<u8").tobytes()),
            "patches": [[p.index, _enc(p.expr), p.shift] for p in t.patches], "data_words": t.data_words,
            "programs": [[name, blobs.add(bytes(prog.lib))] for name, prog in
                         zip(t.program_names, dg.programs, strict=True)],
            "arena_bytes": dg.arena_bytes,
        })
    externals = []
    for b in cap.externals:
        assert b.dtype is not None
        externals.append({"device": b.device, "size": b.arg[1], "dtype": b.dtype.name,
                          "data": blobs.add(buffer_numpy(b).tobytes())})
    manifest = {
        "devices": devices, "externals": externals,
        "key": _enc(cap.key), "consts": _enc(cap.consts), "baked": _enc(list(cap.baked.items())),
        "outputs": _enc(cap.outputs), "returned": _enc(cap.returned),
        "kernel_count": cap.kernel_count, "reuse_outputs": cap.reuse_outputs,
    }
    text = json.dumps(manifest, separators=(",", ":")).encode()
    body = _U64.pack(len(text)) + text + b"".join(blobs.parts)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, hashlib.sha256(body).digest(), len(body))
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------- load
def _read_trusted(path: str, allow_untrusted: bool) -> bytes:
    """The file's bytes; refuses (unless allowed) a file another user owns or others can write, checked on
    the open file itself so it cannot be swapped between the check and the read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not allow_untrusted:
            if st.st_uid != os.getuid():
                raise GraphFileError(f"{path}: owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                                     f"a graph file holds executable code; pass allow_untrusted=True to "
                                     f"load it anyway")
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise GraphFileError(f"{path}: writable by group or others (mode {st.st_mode & 0o777:o}); "
                                     f"a graph file holds executable code; pass allow_untrusted=True to "
                                     f"load it anyway")
        return f.read()


def _parse(path: str, data: bytes) -> tuple[dict[str, Any], bytes]:
    if len(data) < _HEADER.size:
        raise GraphFileError(f"{path}: truncated ({len(data)} bytes, the header alone is {_HEADER.size})")
    magic, version, _, digest, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise GraphFileError(f"{path}: not a rawgrad graph file (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise GraphFileError(f"{path}: graph format version {version}, this rawgrad reads {FORMAT_VERSION}")
    body = data[_HEADER.size:]
    if len(body) != length:
        raise GraphFileError(f"{path}: truncated or padded (body of {len(body)} bytes, header says {length})")
    if hashlib.sha256(body).digest() != digest:
        raise GraphFileError(f"{path}: content hash mismatch (the file is corrupted)")
    if len(body) < _U64.size:
        raise GraphFileError(f"{path}: body too short")
    (mlen,) = _U64.unpack_from(body)
    try:
        manifest = json.loads(body[_U64.size:_U64.size + mlen].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GraphFileError(f"{path}: unreadable manifest ({e})") from e
    return manifest, body[_U64.size + mlen:]


def load_capture(path: str, *, allow_untrusted: bool = False) -> CapturedGraph:
    """Read, verify and link a saved graph. Nothing runs (and no kernel is loaded) unless every check
    passes: trust, format version, hash, and each device's target."""
    manifest, blobs = _parse(path, _read_trusted(path, allow_untrusted))

    def blob(ref: list[int]) -> bytes:
        off, n = ref
        if off < 0 or n < 0 or off + n > len(blobs):
            raise GraphFileError(f"{path}: blob [{off}, {off + n}) outside the file")
        return blobs[off:off + n]

    try:
        for d in manifest["devices"]:
            _check_target(path, d)
        devices = []
        for d in manifest["devices"]:
            dev = Device[d["device"]]
            words = np.frombuffer(blob(d["words"]), dtype="<u8").astype(np.uint64)
            patches = [PatchPoint(i, _dec(e), s) for i, e, s in d["patches"]]
            names = [n for n, _ in d["programs"]]
            template = QueueTemplate(d["queue_kind"], d["word_bits"], words, patches, names,
                                     data_words=d["data_words"])
            programs = [dev.program(n, blob(ref)) for n, ref in d["programs"]]
            devices.append(DeviceGraph(d["device"], template, d["arena_bytes"], programs))
        externals = []
        for e in manifest["externals"]:
            dt = dtypes.from_name(e["dtype"])
            data = np.frombuffer(blob(e["data"]), dtype=dt.np)
            if data.size != e["size"]:
                raise GraphFileError(f"{path}: external buffer holds {data.size} elements, "
                                     f"expected {e['size']}")
            externals.append(buffer_from_numpy(data, dt, e["device"]))
        cap = CapturedGraph(_dec(manifest["key"]), _dec(manifest["consts"]), dict(_dec(manifest["baked"])),
                            devices, externals, _dec(manifest["outputs"]), _dec(manifest["returned"]),
                            int(manifest["kernel_count"]), bool(manifest["reuse_outputs"]))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, GraphFileError):
            raise
        raise GraphFileError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from e
    cap.link()
    return cap


def _check_target(path: str, d: dict[str, Any]) -> None:
    name = d["device"]
    try:
        dev = Device[name]
    except (ValueError, RuntimeError) as e:
        raise GraphFileError(f"{path}: saved for device {name!r}, which is not available here ({e})") from e
    key = getattr(dev.compiler, "target_key", None)
    if key != d["target_key"]:
        raise GraphFileError(f"{path}: kernels were compiled for target {d['target_key']!r}, but {name} here "
                             f"is {key!r}")
    kind = type(dev.queue()).__name__
    if kind != d["queue_kind"]:
        raise GraphFileError(f"{path}: queue encoded by {d['queue_kind']}, but {name} here uses {kind}")
