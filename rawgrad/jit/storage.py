"""Saved graphs: a TinyJit capture on disk, replayable in a fresh process without tracing or compiling.

File layout (little-endian):

    magic        8 bytes  b"RGJITGRF"
    version      u32      FORMAT_VERSION; an older version is refused with "re-save", a newer one too
    reserved     u32      zero
    sha256      32 bytes  of the body
    body length  u64
    body         u64 manifest length, the manifest (UTF-8 JSON), then the blobs it points into

The manifest holds, per device, the device's label and its identity (the driver class, the compiler
target: CPU triple/cpu/features, NV sm architecture and compute class, the queue encoder and its word
size), the guards (argument structure, input shapes/dtypes/devices, constant arguments), the buffer plan
(arena sizes, fresh outputs, external buffers whose contents are blobs), the return value's shape and, per
device, the queue template: its words (a blob), how many of them are the queue's data region, and its
patch list, which is also the relocation table (every address that differs between processes is a
`reloc.*` variable, every per-call value a `jit.*`/`graph.*` variable; see hcq/graph.py). Kernel binaries
(the objects the compiler produced) are blobs. No pickle: nothing in a file is executed except the
kernels, and those only after every check passed.

Loading never trusts the file (docs/reliability.md, "Files"):

1. open: `rawgrad.fileio.open_regular_readonly` (O_NOFOLLOW | O_NONBLOCK; fstat: a regular file, so a
   symlink or FIFO is refused and never blocks), then the ownership rule (owned by the current user, not
   writable by group or others) unless `allow_untrusted`;
2. header: magic, version, exact body length, sha256 of the body. The identity of every device is in the
   body, so a rewritten device label or target fails this hash;
3. manifest: bounded size and nesting; every field is checked against the schema before anything is
   allocated, mapped or run (`_Validator`): types (exact ints, not bools or floats), ranges, blob
   references inside the blob section, sizes non-negative and bounded, patch indices inside the command
   words, program references inside the kernel table, arena offsets inside the arena, buffer/input/output
   references inside their tables and on the device whose queue uses them, patch expressions built only
   from integer operators over known variables, dtypes from an allow-list, shapes consistent with buffer
   sizes, counts bounded;
4. target: each device label must name an available device whose identity equals the saved one;
5. only then are kernels loaded and the queues linked; a failure there is a GraphFileError too.

Every refusal is a `GraphFileError` (a `JitError`, hence a `ValueError`) naming the file and the field.
What the validator cannot know: whether the kernels (native code) and the command words stay within
their buffers. A file that passes the hash and the ownership rule is trusted for that, as an executable
would be; the validator exists so that a damaged or inconsistent file is an exception, not a crash.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from collections.abc import Callable
from typing import Any, BinaryIO, NoReturn

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, dtypes
from rawgrad.fileio import UnsafeFileError, atomic_write, open_regular_readonly, read_exactly, trust_problem
from rawgrad.hcq.device import Device, HCQDevice
from rawgrad.hcq.graph import TIMELINE_ADDRESS, TIMELINE_SIGNAL, TIMELINE_WAIT, QueueTemplate, address_var
from rawgrad.hcq.patch import sym_eval
from rawgrad.hcq.queue import PatchPoint
from rawgrad.jit.capture import CapturedGraph, DeviceGraph, JitError, TensorGuard
from rawgrad.tensor.buffers import buffer_from_numpy, buffer_numpy

__all__ = ["FORMAT_VERSION", "GraphFileError", "device_identity", "load_capture", "save_capture"]

MAGIC = b"RGJITGRF"
# 2: a queue template may end in a data region (`data_words`; NV keeps its QMDs and constant banks there
# instead of inline behind NO_OPERATION methods)
# 3: each device carries its identity (driver class, compiler target, sm architecture, compute class);
# the manifest is validated field by field
# 4: a CPU launch record carries the 3-D global size (x in word 2, y and z in words 5 and 6; before, those
# words were zero, which now means an empty launch): the launch contract is 3-D
FORMAT_VERSION = 4
# A CPU launch record's last operand word: no field (drivers/cpu/records.py), so a file must hold 0 there.
EXEC_UNUSED_WORD = 7
_HEADER = struct.Struct("<8sII32sQ")
_U64 = struct.Struct("<Q")

# Bounds on what a manifest may claim (far above any real graph; a larger claim is a damaged file).
MAX_MANIFEST_BYTES = 64 << 20
MAX_VALUE_DEPTH = 48  # nesting of encoded values (containers, expressions)
MAX_VALUE_NODES = 1 << 22  # encoded values in the whole manifest
MAX_DEVICES = 16
MAX_PROGRAMS = 1 << 16  # per device
MAX_WORDS = 1 << 26  # command words per device
MAX_PATCHES = 1 << 24  # per device
MAX_BUFFERS = 1 << 20  # externals, outputs, Tensor arguments, arguments
MAX_BYTES = 1 << 40  # one arena or buffer
MAX_RANK = 64
MAX_SHIFT = 128
MAX_ABS_INT = 1 << 64  # constants and variable bounds in expressions
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")  # variable names
_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_RESERVED = re.compile(r"(reloc\.program|reloc\.buffer|reloc\.arena|jit\.input|jit\.output)"
                       r"(0|[1-9][0-9]{0,8})")
_RESERVED_PREFIXES = ("reloc.", "jit.", "graph.")

# dtypes a file may name: every rawgrad dtype (buffers), and the integer ones for expressions
DTYPE_BY_NAME: dict[str, DType] = {v.name: v for v in vars(dtypes).values() if isinstance(v, DType)}
_INT_DTYPES = {n for n, d in DTYPE_BY_NAME.items() if n == "bool" or n.startswith(("int", "uint"))}
# operators a patch expression may use (what hcq/patch.py evaluates), with their operand count
_EXPR_ARITY: dict[Ops, int] = {
    Ops.DEFINE_VAR: 0, Ops.CONST: 0, Ops.BIND: 2, Ops.NEG: 1, Ops.WHERE: 3, **{op: 2 for op in (
        Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR,
        Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)}}
_MANIFEST_KEYS = {"devices", "externals", "key", "consts", "baked", "outputs", "returned", "kernel_count",
                  "reuse_outputs"}
_DEVICE_KEYS = {"device", "device_kind", "target_key", "arch", "compute_class", "queue_kind", "word_bits",
                "words", "patches", "data_words", "programs", "arena_bytes"}
_IDENTITY_KEYS = ("device_kind", "target_key", "arch", "compute_class", "queue_kind", "word_bits")


class GraphFileError(JitError):
    """A saved graph that cannot be loaded: not a regular file, untrusted, truncated, corrupted, an old or
    unknown version, a manifest field out of bounds, or made for another device."""


# ---------------------------------------------------------------------------------------------- values
def _enc(x: Any) -> Any:
    """A JSON value that `_Decoder.value` turns back into an equal (and equally hashable) Python value."""
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


class _Blobs:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> list[int]:
        ref = [self.size, len(data)]
        self.parts.append(data)
        self.size += len(data)
        return ref


# ---------------------------------------------------------------------------------------------- identity
def device_identity(dev: HCQDevice) -> dict[str, Any]:
    """What makes a graph's code and command words valid on `dev`: the driver class, the compiler target
    (CPU: triple, cpu, features, optimisation and code model), the GPU architecture and compute class,
    and the queue encoder with its word size. Saved per device and compared on load."""
    q = dev.queue()
    return {"device_kind": type(dev).__name__, "target_key": getattr(dev.compiler, "target_key", None),
            "arch": getattr(dev, "arch", None),
            "compute_class": getattr(getattr(dev, "nv", None), "compute_class", None),
            "queue_kind": type(q).__name__, "word_bits": q.WORD_BITS}


# ---------------------------------------------------------------------------------------------- save
def save_capture(cap: CapturedGraph, path: str) -> None:
    """Write `cap` to `path` atomically (`rawgrad.fileio.atomic_write`: an exclusively created temporary
    file in the same folder, fsynced, renamed into place; a symlink at `path` is replaced, not followed),
    readable by its owner only."""
    blobs = _Blobs()
    devices = []
    for dg in cap.devices:
        t = dg.template
        identity = device_identity(Device[dg.device])
        if identity["queue_kind"] != t.queue_kind or identity["word_bits"] != t.word_bits:
            raise GraphFileError(f"the capture's queue for {dg.device} was encoded by {t.queue_kind}, but "
                                 f"the device uses {identity['queue_kind']}")
        devices.append({
            "device": dg.device, **identity,
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
    pack_graph(manifest, blobs.parts, path)


def pack_graph(manifest: dict[str, Any], blobs: list[bytes] | bytes, path: str | None = None) -> bytes:
    """The file bytes for `manifest` and its blob section (written atomically to `path` if given).
    Exposed so tests can re-encode an edited manifest with a valid hash."""
    text = json.dumps(manifest, separators=(",", ":")).encode()
    blob = blobs if isinstance(blobs, bytes) else b"".join(blobs)
    body = _U64.pack(len(text)) + text + blob
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, hashlib.sha256(body).digest(), len(body))

    def write(f: BinaryIO) -> None:
        f.write(header)
        f.write(body)

    if path is not None:
        atomic_write(path, write)  # mode 0600
    return header + body


# ---------------------------------------------------------------------------------------------- load
def _read_trusted(path: str, allow_untrusted: bool) -> bytes:
    """The file's bytes; refuses anything but a regular file (never following a symlink, never blocking on
    a FIFO) and, unless allowed, a file another user owns or others can write. The checks are on the open
    descriptor, so the file cannot be swapped between the check and the read."""
    try:
        fd = open_regular_readonly(path)
    except UnsafeFileError as e:
        raise GraphFileError(f"{path}: {e.strerror}") from None
    except OSError as e:
        raise GraphFileError(f"{path}: cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not allow_untrusted:
            problem = trust_problem(st, "graph file")
            if problem is not None:
                why = "writable by group or others" if "writable" in problem else "not yours"
                raise GraphFileError(f"{path}: {problem} ({why}); a graph file holds executable code; pass "
                                     f"allow_untrusted=True to load it anyway")
        return read_exactly(fd, 0, st.st_size)
    finally:
        os.close(fd)


def _parse(path: str, data: bytes) -> tuple[Any, bytes]:
    if len(data) < _HEADER.size:
        raise GraphFileError(f"{path}: truncated ({len(data)} bytes, the header alone is {_HEADER.size})")
    magic, version, _, digest, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise GraphFileError(f"{path}: not a rawgrad graph file (magic {magic!r})")
    if version < FORMAT_VERSION:
        raise GraphFileError(f"{path}: graph format version {version} is older than the version "
                             f"{FORMAT_VERSION} this rawgrad reads; re-save the graph (capture it again and "
                             f"call TinyJit.save)")
    if version != FORMAT_VERSION:
        raise GraphFileError(f"{path}: graph format version {version}, this rawgrad reads {FORMAT_VERSION} "
                             f"(written by a newer rawgrad?); re-save the graph with this version")
    body = data[_HEADER.size:]
    if len(body) != length:
        raise GraphFileError(f"{path}: truncated or padded (body of {len(body)} bytes, header says {length})")
    if hashlib.sha256(body).digest() != digest:
        raise GraphFileError(f"{path}: content hash mismatch (the file is corrupted)")
    if len(body) < _U64.size:
        raise GraphFileError(f"{path}: body too short")
    (mlen,) = _U64.unpack_from(body)
    if mlen > min(MAX_MANIFEST_BYTES, len(body) - _U64.size):
        raise GraphFileError(f"{path}: manifest length {mlen} exceeds the body or the "
                             f"{MAX_MANIFEST_BYTES}-byte limit")
    try:
        manifest = json.loads(body[_U64.size:_U64.size + mlen].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise GraphFileError(f"{path}: unreadable manifest ({type(e).__name__}: {e})") from None
    return manifest, body[_U64.size + mlen:]


def load_capture(path: str, *, allow_untrusted: bool = False) -> CapturedGraph:
    """Read, verify and link a saved graph. Nothing is allocated or run (and no kernel is loaded) unless
    every check passes (see the module docstring); any refusal is a GraphFileError."""
    path = os.fspath(path)
    manifest, blobs = _parse(path, _read_trusted(path, allow_untrusted))
    v = _Validator(path, blobs)
    try:
        plan = v.manifest(manifest)
    except RecursionError:
        raise GraphFileError(f"{path}: manifest nested too deeply") from None
    devices = []
    for d in plan["devices"]:
        dev: HCQDevice = d["dev"]
        programs = []
        for name, lib in d["programs"]:
            try:
                programs.append(dev.program(name, lib))
            except Exception as e:  # the binary is file content: any failure to load it is the file's
                raise GraphFileError(f"{path}: kernel {name!r} does not load on {d['device']} "
                                     f"({type(e).__name__}: {e})") from None
        devices.append(DeviceGraph(d["device"], d["template"], d["arena_bytes"], programs))
    try:
        externals = [buffer_from_numpy(data, dt, device) for device, dt, data in plan["externals"]]
    except Exception as e:  # the device named by the file cannot hold the buffer here
        raise GraphFileError(f"{path}: cannot create the graph's buffers ({type(e).__name__}: {e})") from None
    cap = CapturedGraph(plan["key"], plan["consts"], plan["baked"], devices, externals, plan["outputs"],
                        plan["returned"], plan["kernel_count"], plan["reuse_outputs"])
    try:
        cap.link()
    except GraphFileError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, MemoryError, OSError) as e:
        raise GraphFileError(f"{path}: cannot link the graph ({type(e).__name__}: {e})") from None
    return cap


# ---------------------------------------------------------------------------------------------- validation
class _Validator:
    """Checks a decoded manifest against the schema and returns the plan `load_capture` builds from.
    Every failure raises GraphFileError naming the file and the field (`where`)."""

    def __init__(self, path: str, blobs: bytes) -> None:
        self.path, self.blobs = path, blobs
        self.nodes = 0
        self.used: dict[str, set[int]] = {}  # output/external indices the return value refers to

    def fail(self, where: str, why: str) -> NoReturn:
        raise GraphFileError(f"{self.path}: manifest field {where}: {why}")

    # ------------------------------------------------------------------ primitives
    def int_(self, x: Any, where: str, lo: int = 0, hi: int = MAX_BYTES) -> int:
        if type(x) is not int:
            self.fail(where, f"expected an integer, got {type(x).__name__} {x!r:.40}")
        if not lo <= x <= hi:
            self.fail(where, f"{x} is outside [{lo}, {hi}]")
        return x

    def str_(self, x: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
        if type(x) is not str or len(x) > 4096:
            self.fail(where, f"expected a string, got {type(x).__name__} {x!r:.40}")
        if pattern is not None and not pattern.fullmatch(x):
            self.fail(where, f"{x!r:.60} is not a valid name")
        return x

    def list_(self, x: Any, where: str, max_len: int, length: int | None = None) -> list[Any]:
        if type(x) is not list:
            self.fail(where, f"expected a list, got {type(x).__name__}")
        if len(x) > max_len or (length is not None and len(x) != length):
            self.fail(where, f"{len(x)} entries ({length if length is not None else f'at most {max_len}'} "
                             f"expected)")
        return x

    def tuple_(self, x: Any, where: str, length: int | None = None,
               max_len: int = MAX_BUFFERS) -> tuple[Any, ...]:
        if type(x) is not tuple or len(x) > max_len or (length is not None and len(x) != length):
            self.fail(where, f"expected a tuple{f' of {length}' if length is not None else ''}, "
                             f"got {type(x).__name__} {x!r:.60}")
        return x

    def dict_(self, x: Any, where: str, keys: set[str]) -> dict[str, Any]:
        if type(x) is not dict:
            self.fail(where, f"expected an object, got {type(x).__name__}")
        if set(x) != keys:
            missing, extra = sorted(keys - set(x)), sorted(set(x) - keys)
            self.fail(where, f"fields missing {missing} / unexpected {extra}")
        return x

    def dtype(self, x: Any, where: str) -> DType:
        if type(x) is not DType or DTYPE_BY_NAME.get(x.name) is not x:
            self.fail(where, f"expected a dtype, got {x!r:.40}")
        return x

    def dtype_name(self, x: Any, where: str) -> DType:
        dt = DTYPE_BY_NAME.get(x) if type(x) is str else None
        if dt is None:
            self.fail(where, f"unknown dtype {x!r:.40} (known: {', '.join(sorted(DTYPE_BY_NAME))})")
        return dt

    def blob(self, ref: Any, where: str) -> bytes:
        off, n = self.list_(ref, where, 2, 2)
        self.int_(off, f"{where}[0]", 0, len(self.blobs))
        self.int_(n, f"{where}[1]", 0, len(self.blobs) - off)
        return self.blobs[off:off + n]

    # ------------------------------------------------------------------ encoded values
    def value(self, x: Any, where: str, depth: int = 0) -> Any:
        """An encoded value (see `_enc`) decoded with every tag checked; expressions through `uop`."""
        self.nodes += 1
        if self.nodes > MAX_VALUE_NODES:
            self.fail(where, f"more than {MAX_VALUE_NODES} encoded values")
        if depth > MAX_VALUE_DEPTH:
            self.fail(where, f"values nested deeper than {MAX_VALUE_DEPTH}")
        if x is None or type(x) in (bool, int, float, str):
            return x
        if type(x) is not dict or len(x) != 1:
            self.fail(where, f"not an encoded value: {x!r:.60}")
        (tag, body), = x.items()
        at = f"{where}.{tag}"
        if tag in ("tuple", "list"):
            items = [self.value(y, f"{at}[{i}]", depth + 1)
                     for i, y in enumerate(self.list_(body, at, MAX_BUFFERS))]
            return tuple(items) if tag == "tuple" else items
        if tag == "dict":
            out: dict[Any, Any] = {}
            for i, pair in enumerate(self.list_(body, at, MAX_BUFFERS)):
                k, val = self.list_(pair, f"{at}[{i}]", 2, 2)
                key = self.value(k, f"{at}[{i}][0]", depth + 1)
                try:
                    hash(key)
                except TypeError:
                    self.fail(f"{at}[{i}][0]", f"dict key {key!r:.40} is not hashable")
                out[key] = self.value(val, f"{at}[{i}][1]", depth + 1)
            return out
        if tag == "dtype":
            return self.dtype_name(body, at)
        if tag == "uop":
            return self.uop(x, where, depth)
        if tag == "guard":
            shape, dt, device, size = self.list_(body, at, 4, 4)
            return TensorGuard(self.value(shape, f"{at}[0]", depth + 1), self.dtype_name(dt, f"{at}[1]"),
                               self.str_(device, f"{at}[2]"), self.int_(size, f"{at}[3]", 0, MAX_BYTES))
        self.fail(where, f"unknown value tag {tag!r:.40}")

    def uop(self, x: Any, where: str, depth: int = 0) -> UOp:
        """An integer expression node: only the operators patch points evaluate, integer dtypes, exact-int
        constants and variable bounds, shifts by a constant, nesting and size bounded."""
        self.nodes += 1
        if self.nodes > MAX_VALUE_NODES or depth > MAX_VALUE_DEPTH:
            self.fail(where, "expression too large or nested too deeply")
        if type(x) is not dict or set(x) != {"uop"}:
            self.fail(where, f"expected an expression, got {x!r:.60}")
        at = f"{where}.uop"
        name, dt, arg, src = self.list_(x["uop"], at, 4, 4)
        op = Ops.__members__.get(name) if type(name) is str else None
        if op is None or op not in _EXPR_ARITY:
            self.fail(f"{at}[0]", f"operator {name!r:.40} is not allowed in an expression")
        if type(dt) is not str or dt not in _INT_DTYPES:
            self.fail(f"{at}[1]", f"dtype {dt!r:.40} is not an integer dtype")
        srcs = tuple(self.uop(s, f"{at}[3][{i}]", depth + 1)
                     for i, s in enumerate(self.list_(src, f"{at}[3]", _EXPR_ARITY[op], _EXPR_ARITY[op])))
        value: Any = None
        if op is Ops.DEFINE_VAR:
            t = self.value(arg, f"{at}[2]", depth + 1)
            self.tuple_(t, f"{at}[2]", 3)
            vname = self.str_(t[0], f"{at}[2][0]", _NAME)
            lo = self.int_(t[1], f"{at}[2][1]", -MAX_ABS_INT, MAX_ABS_INT)
            hi = self.int_(t[2], f"{at}[2][2]", lo, MAX_ABS_INT)
            value = (vname, lo, hi)
        elif op is Ops.CONST:
            value = self.int_(arg, f"{at}[2]", -MAX_ABS_INT, MAX_ABS_INT)
        elif arg is not None:
            self.fail(f"{at}[2]", f"{op.name} takes no argument, got {arg!r:.40}")
        if op in (Ops.SHL, Ops.SHR) and (srcs[1].op is not Ops.CONST or not 0 <= srcs[1].arg < MAX_SHIFT):
            self.fail(at, f"{op.name} must shift by a constant in [0, {MAX_SHIFT})")
        if op in (Ops.IDIV, Ops.MOD) and not _nonzero(srcs[1]):
            self.fail(at, f"{op.name} by something that may be zero")
        if op is Ops.BIND:
            var, val = srcs
            if (var.op is not Ops.DEFINE_VAR or val.op is not Ops.CONST
                    or not var.arg[1] <= val.arg <= var.arg[2]):
                self.fail(at, "BIND must bind a variable to a constant inside its range")
        return UOp(op, DTYPE_BY_NAME[dt], srcs, value)

    # ------------------------------------------------------------------ the manifest
    def manifest(self, m: Any) -> dict[str, Any]:
        self.dict_(m, "(top level)", _MANIFEST_KEYS)
        raw_devices = self.list_(m["devices"], "devices", MAX_DEVICES)
        labels = []
        for i, d in enumerate(raw_devices):
            self.dict_(d, f"devices[{i}]", _DEVICE_KEYS)
            labels.append(self.label(d["device"], f"devices[{i}].device"))
        if len(set(labels)) != len(labels):
            self.fail("devices", f"a device is listed twice ({labels})")

        # guards and arguments
        key = self.value(m["key"], "key")
        kinds, guards, aliases = self.tuple_(key, "key", 3)
        self.tuple_(kinds, "key[0]")
        user_vars: set[UOp] = set()
        const_paths = []
        for i, kind in enumerate(kinds):
            w = f"key[0][{i}]"
            self.tuple_(kind, w, max_len=3)
            if len(kind) < 2:
                self.fail(w, "an argument entry is (path, kind[, variable])")
            arg_path = self.arg_path(kind[0], f"{w}[0]")
            if kind[1:] == ("tensor",) or kind[1:] == ("const",):
                if kind[1] == "const":
                    const_paths.append(arg_path)
                continue
            if (len(kind) == 3 and kind[1] == "var" and isinstance(kind[2], UOp)
                    and kind[2].op is Ops.DEFINE_VAR):
                user_vars.add(self.user_var(kind[2], f"{w}[2]"))
                continue
            self.fail(w, f"unknown argument kind {kind[1:]!r:.60}")
        n_tensors = sum(1 for k in kinds if k[1] == "tensor")
        self.tuple_(guards, "key[1]", n_tensors)
        for i, g in enumerate(guards):
            w = f"key[1][{i}]"
            if type(g) is not TensorGuard:
                self.fail(w, "expected a tensor guard")
            shape = self.shape(g.shape, f"{w}.shape")
            for dim in shape:
                if isinstance(dim, UOp):
                    user_vars.update(self.user_var(var, f"{w}.shape") for var in dim.variables())
            fixed = [dim for dim in shape if not isinstance(dim, UOp)]
            if len(fixed) == len(shape) and math.prod(fixed) > g.buffer_size:
                self.fail(w, f"shape {shape} needs more than the {g.buffer_size} elements of its buffer")
            self.label(g.device, f"{w}.device", must_exist=False)
        self.tuple_(aliases, "key[2]", n_tensors)
        for i, a in enumerate(aliases):
            self.int_(a, f"key[2][{i}]", 0, i)
            if aliases[a] != a:
                self.fail(f"key[2][{i}]", "an alias must point at the first Tensor reading that buffer")

        consts = self.value(m["consts"], "consts")
        self.list_(consts, "consts", MAX_BUFFERS, len(const_paths))
        for i, (entry, arg_path) in enumerate(zip(consts, const_paths, strict=True)):
            self.tuple_(entry, f"consts[{i}]", 2)
            if entry[0] != arg_path:
                self.fail(f"consts[{i}]", f"path {entry[0]!r:.40} does not match the argument "
                                          f"{arg_path!r:.40}")

        baked: dict[UOp, int] = {}
        for i, entry in enumerate(self.list_(self.value(m["baked"], "baked"), "baked", MAX_BUFFERS)):
            var, val = self.tuple_(entry, f"baked[{i}]", 2)
            if not isinstance(var, UOp) or var.op is not Ops.DEFINE_VAR:
                self.fail(f"baked[{i}][0]", "expected a variable")
            self.user_var(var, f"baked[{i}][0]")
            baked[var] = self.int_(val, f"baked[{i}][1]", var.arg[1], var.arg[2])
        known_vars = user_vars | set(baked)

        outputs = self.value(m["outputs"], "outputs")
        self.list_(outputs, "outputs", MAX_BUFFERS)
        for i, out in enumerate(outputs):
            device, size, dt = self.tuple_(out, f"outputs[{i}]", 3)
            if self.label(device, f"outputs[{i}][0]", must_exist=False) not in labels:
                self.fail(f"outputs[{i}][0]", f"device {device!r} is not one of the graph's devices {labels}")
            itemsize = max(1, self.dtype(dt, f"outputs[{i}][2]").itemsize)
            self.int_(size, f"outputs[{i}][1]", 0, MAX_BYTES // itemsize)

        externals = []
        for i, e in enumerate(self.list_(m["externals"], "externals", MAX_BUFFERS)):
            w = f"externals[{i}]"
            self.dict_(e, w, {"device", "size", "dtype", "data"})
            device = self.label(e["device"], f"{w}.device")
            dt = self.dtype_name(e["dtype"], f"{w}.dtype")
            data = self.blob(e["data"], f"{w}.data")
            size = self.int_(e["size"], f"{w}.size", 0, MAX_BYTES)
            if len(data) != size * dt.itemsize:
                self.fail(w, f"{len(data)} bytes of data for {size} elements of {dt.name}")
            externals.append((device, dt, np.frombuffer(data, dtype=dt.np)))

        devices = []
        for i, d in enumerate(raw_devices):
            devices.append(self.device(i, d, labels, guards, outputs, externals, known_vars))
        words_total = sum(len(d["template"].words) for d in devices)
        returned = self.value(m["returned"], "returned")
        self.used = {"out": set(), "ext": set()}
        self.returned(returned, "returned", guards, outputs, externals, known_vars, 0)
        # a fresh output exists because it is returned; an external because a kernel or the caller uses it
        if self.used["out"] != set(range(len(outputs))):
            self.fail("returned", f"returns outputs {sorted(self.used['out'])}, but the graph makes "
                                  f"{len(outputs)}")
        used_ext = self.used["ext"] | {k for d in devices for k in d["externals_used"]}
        if used_ext != set(range(len(externals))):
            self.fail("externals", f"external buffers {sorted(set(range(len(externals))) - used_ext)} are "
                                   f"used by nothing")
        return {"devices": devices, "externals": externals, "key": key, "consts": consts, "baked": baked,
                "outputs": outputs, "returned": returned,
                "kernel_count": self.int_(m["kernel_count"], "kernel_count", 0, words_total),
                "reuse_outputs": self.bool_(m["reuse_outputs"], "reuse_outputs")}

    def bool_(self, x: Any, where: str) -> bool:
        if type(x) is not bool:
            self.fail(where, f"expected true or false, got {x!r:.40}")
        return x

    def label(self, x: Any, where: str, must_exist: bool = True) -> str:
        """A device label in canonical form ("CPU", "NV:1"); with `must_exist`, available here."""
        name = self.str_(x, where)
        try:
            canonical = Device.canonicalize(name)
        except (ValueError, TypeError) as e:
            if not must_exist:
                return name  # compared with the devices of a call: a guard that no call can match
            raise GraphFileError(f"{self.path}: saved for device {name!r}, which is not available here "
                                 f"({e})") from None
        if canonical != name:
            self.fail(where, f"device label {name!r} is not in canonical form ({canonical!r})")
        return name

    def arg_path(self, x: Any, where: str) -> tuple[Any, ...]:
        self.tuple_(x, where, max_len=2)
        if not x or (type(x[0]) is int and x[0] < 0) or type(x[0]) not in (int, str):
            self.fail(where, f"not an argument path: {x!r:.40}")
        return x

    def shape(self, x: Any, where: str) -> tuple[Any, ...]:
        self.tuple_(x, where, max_len=MAX_RANK)
        for i, dim in enumerate(x):
            if not isinstance(dim, UOp):
                self.int_(dim, f"{where}[{i}]", 0, MAX_BYTES)
        return x

    def user_var(self, var: UOp, where: str) -> UOp:
        if var.arg[0].startswith(_RESERVED_PREFIXES):
            self.fail(where, f"variable name {var.arg[0]!r} is reserved for the graph's own variables")
        return var

    def device(self, i: int, d: dict[str, Any], labels: list[str], guards: tuple[TensorGuard, ...],
               outputs: list[Any], externals: list[Any], known_vars: set[UOp]) -> dict[str, Any]:
        w = f"devices[{i}]"
        label = labels[i]
        word_bits = self.int_(d["word_bits"], f"{w}.word_bits", 8, 64)
        self.str_(d["device_kind"], f"{w}.device_kind")
        self.str_(d["queue_kind"], f"{w}.queue_kind")
        for field in ("target_key", "arch"):
            if d[field] is not None:
                self.str_(d[field], f"{w}.{field}")
        if d["compute_class"] is not None:
            self.int_(d["compute_class"], f"{w}.compute_class", 0, 1 << 32)
        raw = self.blob(d["words"], f"{w}.words")
        if len(raw) % 8 or not 0 < len(raw) // 8 <= MAX_WORDS:
            self.fail(f"{w}.words", f"{len(raw)} bytes is not a whole number of 1 to {MAX_WORDS} words")
        words = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
        if word_bits < 64 and int(words.max()) >> word_bits:
            self.fail(f"{w}.words", f"a word does not fit in {word_bits} bits")
        data_words = self.int_(d["data_words"], f"{w}.data_words", 0, len(words))
        arena_bytes = self.int_(d["arena_bytes"], f"{w}.arena_bytes", 0, MAX_BYTES)
        programs = []
        for k, entry in enumerate(self.list_(d["programs"], f"{w}.programs", MAX_PROGRAMS)):
            name, ref = self.list_(entry, f"{w}.programs[{k}]", 2, 2)
            programs.append((self.str_(name, f"{w}.programs[{k}][0]", _KERNEL_NAME),
                             self.blob(ref, f"{w}.programs[{k}][1]")))

        # the variables this device's queue may read: its own relocations, the per-call values of the
        # inputs/outputs/buffers that live on it, the timeline, the function's Variables, and what the live
        # device's queue class lays out itself (if it is the class the graph was encoded for; if not, the
        # graph is refused when it is instantiated)
        dev = self.target(label, d, w)
        queue_class = type(dev.queue())
        laid_out = queue_class.LAYOUT_VARIABLES if queue_class.__name__ == d["queue_kind"] else ()
        allowed: dict[str, UOp] = {v.arg[0]: v for v in (TIMELINE_ADDRESS, TIMELINE_WAIT, TIMELINE_SIGNAL,
                                                          *laid_out)}
        arena = address_var(f"reloc.arena{i}")
        tables: dict[str, tuple[int, Callable[[int], str]]] = {
            "reloc.program": (len(programs), lambda k: label),
            "reloc.buffer": (len(externals), lambda k: externals[k][0]),
            "reloc.arena": (i + 1, lambda k: label if k == i else "another device's arena"),
            "jit.input": (len(guards), lambda k: guards[k].device),
            "jit.output": (len(outputs), lambda k: outputs[k][0]),
        }
        patches = []
        externals_used: set[int] = set()
        for k, entry in enumerate(self.list_(d["patches"], f"{w}.patches", MAX_PATCHES)):
            at = f"{w}.patches[{k}]"
            index, enc, shift = self.list_(entry, at, 3, 3)
            self.int_(index, f"{at}[0]", 0, len(words) - 1)
            self.int_(shift, f"{at}[2]", 0, MAX_SHIFT - 1)
            expr = self.uop(enc, f"{at}[1]")
            for var in expr.variables():
                vname = var.arg[0]
                if vname.startswith(_RESERVED_PREFIXES):
                    m = _RESERVED.fullmatch(vname)
                    if m is not None:
                        size, owner = tables[m.group(1)]
                        n = int(m.group(2))
                        if n >= size:
                            self.fail(f"{at}[1]", f"{vname} refers past the end of its table "
                                                  f"({size} entries)")
                        if m.group(1) == "reloc.buffer":
                            externals_used.add(n)
                        if owner(n) != label:
                            self.fail(f"{at}[1]", f"{vname} is on {owner(n)}, but this queue runs on {label}")
                        expected = address_var(vname)
                    elif vname in allowed:
                        expected = allowed[vname]
                    else:
                        self.fail(f"{at}[1]", f"unknown graph variable {vname!r}")
                    if var is not expected:
                        self.fail(f"{at}[1]", f"{vname} has the wrong range or dtype")
                elif vname in allowed:  # a variable the queue's driver resolves when it lays the queue out
                    if var is not allowed[vname]:
                        self.fail(f"{at}[1]", f"{vname} has the wrong range or dtype")
                elif var not in known_vars and not _only_bound(expr, var):
                    self.fail(f"{at}[1]", f"variable {vname!r} (range [{var.arg[1]}, {var.arg[2]}]) is "
                                          f"neither an argument nor baked into the graph")
            free = [var for var in expr.variables() if not _only_bound(expr, var)]
            if free == [arena]:  # an address inside the arena: it must be inside
                off = sym_eval(expr, {arena: 0})
                if not 0 <= off < arena_bytes:
                    self.fail(f"{at}[1]", f"arena offset {off} outside the {arena_bytes}-byte arena")
            patches.append(PatchPoint(index, expr, shift))
        if len({(p.index, p.shift) for p in patches}) != len(patches):
            self.fail(f"{w}.patches", "two patch points write the same bits of a word")
        if d["queue_kind"] == "CPUQueue":
            self.cpu_records(words, patches, data_words, len(programs), w)
        template = QueueTemplate(d["queue_kind"], word_bits, words, patches, [n for n, _ in programs],
                                 data_words=data_words)
        return {"device": label, "dev": dev, "template": template, "programs": programs,
                "arena_bytes": arena_bytes, "externals_used": externals_used}

    def cpu_records(self, words: np.ndarray, patches: list[PatchPoint], data_words: int, n_programs: int,
                    where: str) -> None:
        """The CPU command records (drivers/cpu/records.py) as a graph template encodes them: known
        opcodes only, and every operand that the processor dereferences or jumps to (a kernel entry
        point, kernel arguments, signal and copy addresses) is a patch point, so no literal address from
        the file reaches the processor. Launch sizes and copy lengths are literals or patched values."""
        from rawgrad.drivers.cpu.records import RECORD_WORDS, Op
        if data_words or len(words) % RECORD_WORDS:
            self.fail(f"{where}.words", f"CPU queue words must be whole {RECORD_WORDS}-word records with no "
                                        f"data region ({len(words)} words, {data_words} data words)")
        patched = {p.index: p for p in patches}
        if len(patched) != len(patches):
            self.fail(f"{where}.patches", "two patch points write the same CPU queue word")
        entries = {address_var(f"reloc.program{k}") for k in range(n_programs)}

        def need(index: int, what: str, exact: set[UOp] | None = None) -> None:
            p = patched.get(index)
            if p is None or (exact is not None and p.expr not in exact):
                kind = "a kernel entry point" if exact is entries else "an address"
                self.fail(f"{where}.patches", f"CPU queue word {index} ({what}) must be patched with {kind}")

        records = len(words) // RECORD_WORDS
        r = 0
        while r < records:
            base = r * RECORD_WORDS
            if base in patched:
                self.fail(f"{where}.patches", f"CPU queue word {base} is an opcode and cannot be patched")
            op = int(words[base])
            if op == Op.EXEC:
                for k in (3, 4):
                    if base + k in patched:
                        self.fail(f"{where}.patches", f"CPU queue word {base + k} (argument count) is "
                                                      f"patched")
                if base + EXEC_UNUSED_WORD in patched or int(words[base + EXEC_UNUSED_WORD]) != 0:
                    self.fail(f"{where}.words", f"CPU launch record {r}: word {EXEC_UNUSED_WORD} is unused "
                                                f"and must be 0")
                need(base + 1, "kernel entry point", entries)
                nargs, narg_records = int(words[base + 3]), int(words[base + 4])
                if nargs > narg_records * RECORD_WORDS or r + 1 + narg_records > records:
                    self.fail(f"{where}.words", f"CPU launch record {r}: {nargs} arguments in {narg_records} "
                                                f"records past the end of the queue")
                for k in range(nargs):
                    need(base + RECORD_WORDS + k, f"argument {k} of the launch in record {r}")
                r += 1 + narg_records
                continue
            if op in (Op.WAIT, Op.SIGNAL):
                need(base + 1, "timeline signal address", {TIMELINE_ADDRESS})
            elif op == Op.COPY:
                need(base + 1, "copy destination")
                need(base + 2, "copy source")
            elif op not in (Op.NOP, Op.MEMORY_BARRIER):
                self.fail(f"{where}.words", f"CPU queue record {r} has opcode {op}, which a graph does not "
                                            f"use")
            r += 1

    def target(self, label: str, d: dict[str, Any], where: str) -> HCQDevice:
        """The live device for `label`, whose identity must be the saved one."""
        try:
            dev = Device[label]
        except Exception as e:  # a driver that cannot start here: the file cannot be used here
            raise GraphFileError(f"{self.path}: saved for device {label!r}, which is not available here "
                                 f"({type(e).__name__}: {e})") from None
        live = device_identity(dev)
        for field in _IDENTITY_KEYS:
            if live[field] != d[field]:
                if field == "target_key":
                    raise GraphFileError(f"{self.path}: kernels were compiled for target {d[field]!r}, but "
                                         f"{label} here is {live[field]!r}")
                raise GraphFileError(f"{self.path}: saved for a device with {field} {d[field]!r}, but "
                                     f"{label} here has {live[field]!r} ({where})")
        return dev

    def returned(self, enc: Any, where: str, guards: tuple[TensorGuard, ...], outputs: list[Any],
                 externals: list[Any], known_vars: set[UOp], depth: int) -> None:
        if depth > MAX_VALUE_DEPTH:
            self.fail(where, "return value nested too deeply")
        kind, body = self.tuple_(enc, where, 2)
        if kind == "const":
            return
        if kind in ("list", "tuple"):
            for i, item in enumerate(self.list_(body, f"{where}[1]", MAX_BUFFERS)):
                self.returned(item, f"{where}[1][{i}]", guards, outputs, externals, known_vars, depth + 1)
            return
        if kind == "dict":
            for i, pair in enumerate(self.list_(body, f"{where}[1]", MAX_BUFFERS)):
                self.tuple_(pair, f"{where}[1][{i}]", 2)
                try:
                    hash(pair[0])
                except TypeError:
                    self.fail(f"{where}[1][{i}]", "a dict key is not hashable")
                self.returned(pair[1], f"{where}[1][{i}][1]", guards, outputs, externals, known_vars,
                              depth + 1)
            return
        if kind != "tensor":
            self.fail(where, f"unknown return kind {kind!r:.40}")
        role, index, reshape, dt = self.tuple_(body, f"{where}[1]", 4)
        table: list[tuple[int, DType]] = (
            [(o[1], o[2]) for o in outputs] if role == "out" else
            [(g.buffer_size, g.dtype) for g in guards] if role == "in" else
            [(data.size, edt) for _, edt, data in externals] if role == "ext" else
            self.fail(f"{where}[1][0]", f"unknown buffer role {role!r:.40}"))
        self.int_(index, f"{where}[1][1]", 0, len(table) - 1)
        if role in self.used:
            self.used[role].add(index)
        elements, buf_dt = table[index]
        if self.dtype(dt, f"{where}[1][3]") is not buf_dt:
            self.fail(f"{where}[1][3]", f"dtype {dt.name} differs from its buffer's {buf_dt.name}")
        if reshape is not None:
            shape = self.shape(reshape, f"{where}[1][2]")
            for dim in shape:
                if isinstance(dim, UOp) and not set(dim.variables()) <= known_vars:
                    self.fail(f"{where}[1][2]", "a symbolic size uses a variable the graph does not know")
            fixed = [dim for dim in shape if not isinstance(dim, UOp)]
            if len(fixed) == len(shape) and math.prod(fixed) > elements:
                self.fail(f"{where}[1][2]", f"shape {shape} needs more than the {elements} elements of its "
                                            f"buffer")


def _nonzero(divisor: UOp) -> bool:
    """A divisor that cannot be zero: a non-zero constant or a variable whose range excludes zero."""
    if divisor.op is Ops.CONST:
        return bool(divisor.arg != 0)
    return divisor.op is Ops.DEFINE_VAR and not divisor.arg[1] <= 0 <= divisor.arg[2]


def _only_bound(expr: UOp, var: UOp) -> bool:
    """Whether `var` appears in `expr` only as the variable of a BIND (which carries its own value)."""
    stack, seen = [expr], set()
    while stack:
        node = stack.pop()
        if node in seen or node.op is Ops.BIND:
            continue
        seen.add(node)
        if node is var:
            return False
        stack.extend(node.src)
    return True
