"""The safetensors file format: read (validated, copied into our own memory) and write.

Layout of a file: an 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data
section. The JSON maps each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` with
offsets relative to the data section; the optional `"__metadata__"` entry maps strings to strings.
Tensors are little-endian and C-contiguous.

Everything in the header is checked before any data is touched: the header length is bounded
(`MAX_HEADER_BYTES`), it must be a JSON object, every dtype must be in the allow-list `DTYPE_BY_CODE`,
shapes are lists of non-negative ints (not bools) of at most `MAX_RANK` dimensions, data offsets lie
within the file, the byte length of each tensor is exactly its element count times the item size, and no
two tensors overlap. A file that lies raises `SafetensorsError` (a ValueError) naming the file and the
problem; nothing is read outside the file. The path is opened with O_NONBLOCK and must be a regular file
(a FIFO or a device is refused, so a load never hangs on one); a symlink to a regular file is followed,
because model caches (the Hugging Face hub's snapshots) are made of them.

Decision: no memory mapping. A mapped file that another process truncates turns every access to the
lost pages into SIGBUS, which kills the process instead of raising; nothing can be checked "before the
access" of a mapping because the truncation can happen between the check and the access, and advisory
locks do not stop a writer that does not take them. So tensors are read with pread into arrays this
process owns (`SafetensorsFile.raw` returns a fresh, writable array), and a file that shrank since it was
opened is a `SafetensorsError` ("truncated while open") at the read that finds the bytes missing. The cost
is one extra host copy per tensor (page cache -> our array -> device buffer) and holding one tensor at a
time in host memory while loading; after `safe_load` returns nothing refers to the file any more, so
truncating or replacing it cannot affect the tensors.

Writing goes through `rawgrad.fileio.atomic_write`: an exclusively created temporary file in the
destination folder, fsynced and renamed into place (a planted symlink is never followed).
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from rawgrad.dtype import DType, dtypes
from rawgrad.fileio import UnsafeFileError, atomic_write, open_regular_readonly, read_exactly, read_into

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor

__all__ = ["SafetensorsError", "SafetensorsFile", "TensorInfo", "safe_load", "safe_save", "safe_metadata"]

HEADER_LENGTH_BYTES = 8  # the u64 that precedes the JSON header
# The reference implementation refuses headers above 100 MB; a larger one is a corrupt or hostile file.
MAX_HEADER_BYTES = 100 * 1024 * 1024
METADATA_KEY = "__metadata__"
# More dimensions than this is a corrupt or hostile header (real tensors have a handful).
MAX_RANK = 64
# The data section starts at a multiple of this when we write (readers do not require it; it keeps
# every tensor of a written file aligned for mapped access).
WRITE_ALIGNMENT = 8

# safetensors dtype code <-> rawgrad dtype
DTYPE_BY_CODE: dict[str, DType] = {
    "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "I16": dtypes.int16, "U16": dtypes.uint16,
    "I32": dtypes.int32, "U32": dtypes.uint32, "I64": dtypes.int64, "U64": dtypes.uint64,
    "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64,
}
CODE_BY_DTYPE: dict[DType, str] = {dt: code for code, dt in DTYPE_BY_CODE.items()}
# Codes defined by the format that have no rawgrad dtype yet: named in the error instead of "unknown".
UNSUPPORTED_CODES = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64")


class SafetensorsError(ValueError):
    """The file is not a valid safetensors file (the message names the file and what is wrong)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry, validated; `begin`/`end` are absolute file offsets."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # Python ints: a huge shape cannot wrap around to a small count


def _parse_header(raw: bytes, path: str, file_size: int) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    def bad(why: str) -> SafetensorsError:
        return SafetensorsError(f"{path}: {why}")

    if len(raw) < HEADER_LENGTH_BYTES:
        raise bad(f"file is {file_size} bytes, too short for the {HEADER_LENGTH_BYTES}-byte header length")
    (header_len,) = struct.unpack("<Q", raw[:HEADER_LENGTH_BYTES])
    if header_len > MAX_HEADER_BYTES:
        raise bad(f"header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit")
    data_start = HEADER_LENGTH_BYTES + header_len
    if data_start > file_size:
        raise bad(f"header length {header_len} runs past the end of the {file_size}-byte file")
    try:
        header = json.loads(raw[HEADER_LENGTH_BYTES:data_start].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"header is not valid UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise bad(f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise bad(f"{METADATA_KEY} must map strings to strings")
    data_size = file_size - data_start
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise bad(f"tensor {name!r}: entry needs dtype, shape and data_offsets, got {entry!r}")
        code = entry["dtype"]
        if code not in DTYPE_BY_CODE:
            if code in UNSUPPORTED_CODES:
                raise bad(f"tensor {name!r}: dtype {code} is valid safetensors but rawgrad has no such dtype")
            raise bad(f"tensor {name!r}: unknown dtype {code!r}")
        dt = DTYPE_BY_CODE[code]
        shape, offsets = entry["shape"], entry["data_offsets"]
        if (not isinstance(shape, list) or len(shape) > MAX_RANK
                or not all(type(d) is int and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r}: shape must be a list of at most {MAX_RANK} non-negative ints, "
                      f"got {shape!r:.200}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int and o >= 0 for o in offsets)):
            raise bad(f"tensor {name!r}: data_offsets must be two non-negative ints, got {offsets!r}")
        begin, end = offsets
        if not begin <= end <= data_size:
            raise bad(f"tensor {name!r}: data_offsets [{begin}, {end}] outside the "
                      f"{data_size}-byte data section")
        info = TensorInfo(name, dt, tuple(shape), data_start + begin, data_start + end)
        if end - begin != info.numel * dt.itemsize:
            raise bad(f"tensor {name!r}: {end - begin} bytes of data for shape {tuple(shape)} of {code} "
                      f"({info.numel * dt.itemsize} expected)")
        infos[name] = info
    spans = sorted((i.begin, i.end, i.name) for i in infos.values() if i.end > i.begin)
    for (_, prev_end, prev_name), (begin, _, name) in zip(spans, spans[1:]):
        if begin < prev_end:
            raise bad(f"tensors {prev_name!r} and {name!r} overlap in the data section")
    return infos, metadata


class SafetensorsFile:
    """An open, validated safetensors file; `raw(name)` reads one tensor into a fresh array.

    Use as a context manager (or call `close`). Arrays handed out are the caller's own: they stay valid
    after the file is closed, truncated or replaced.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            fd = open_regular_readonly(self.path, follow_symlinks=True)
        except UnsafeFileError as e:
            raise SafetensorsError(f"{self.path}: {e.strerror}") from None
        self._fd: int | None = fd
        try:
            size = os.fstat(fd).st_size
            head = read_exactly(fd, 0, HEADER_LENGTH_BYTES)
            if len(head) == HEADER_LENGTH_BYTES:  # read no more than the file holds or the limit allows;
                # _parse_header judges whether what the length claims is all there
                head += read_exactly(fd, HEADER_LENGTH_BYTES,
                                     min(struct.unpack("<Q", head)[0], MAX_HEADER_BYTES, size))
            self.tensors, self.metadata = _parse_header(head, self.path, size)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def keys(self) -> list[str]:
        return list(self.tensors)

    def raw(self, name: str) -> np.ndarray:
        """Tensor `name` in rawgrad's host layout (bfloat16 as uint16 bits), read into a new array.

        Raises SafetensorsError if the file no longer holds the tensor's bytes (truncated while open)."""
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        host = info.dtype.np.newbyteorder("<")
        flat = np.empty(info.numel, dtype=host)
        view = memoryview(flat).cast("B")  # type: ignore[arg-type]
        got = read_into(self._fd, info.begin, view) if flat.nbytes else 0
        if got != flat.nbytes:
            raise SafetensorsError(f"{self.path}: truncated while open: tensor {name!r} needs bytes "
                                   f"[{info.begin}, {info.end}) but the file now ends at "
                                   f"{info.begin + got}")
        return flat.reshape(info.shape)


def _tensor_from_host_layout(arr: np.ndarray, dtype: DType, device: str | None) -> Tensor:
    """A Tensor on `device` filled from `arr` (already in dtype's host layout) with a single copy."""
    from rawgrad.compiler.ir import Ops, UOp
    from rawgrad.tensor.buffers import buffer_from_numpy
    from rawgrad.tensor.tensor import Tensor, _canon_device
    buf = buffer_from_numpy(arr, dtype, _canon_device(device))
    return Tensor(UOp(Ops.RESHAPE, dtype, (buf,), tuple(arr.shape)))


def safe_load(path: str | os.PathLike[str], device: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Tensor]:
    """Every tensor of the file on `device` (default device if None), in file order.

    `progress(bytes_done, bytes_total)` is called after each tensor (for a loading bar)."""
    out: dict[str, Tensor] = {}
    with SafetensorsFile(path) as f:
        total = sum(i.end - i.begin for i in f.tensors.values())
        done = 0
        for name, info in f.tensors.items():
            out[name] = _tensor_from_host_layout(f.raw(name), info.dtype, device)
            done += info.end - info.begin
            if progress is not None:
                progress(done, total)
    return out


def safe_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The file's `__metadata__` strings (empty if it has none)."""
    with SafetensorsFile(path) as f:
        return dict(f.metadata)


def _host_layout(t: Tensor) -> np.ndarray:
    """The tensor's data as stored on the device (bfloat16 as uint16 bits), C-contiguous."""
    if t.dtype == dtypes.bfloat16:
        return np.asarray(t.bitcast(dtypes.uint16).numpy(), order="C")  # (ascontiguousarray makes 0-d 1-d)
    return np.asarray(t.numpy(), order="C")


def safe_save(tensors: Mapping[str, Tensor], path: str | os.PathLike[str],
              metadata: Mapping[str, str] | None = None) -> None:
    """Write `tensors` to `path` in safetensors format, atomically (`rawgrad.fileio.atomic_write`: an
    exclusively created temporary file, fsynced, renamed into place; a symlink at `path` is replaced, not
    followed)."""
    from rawgrad.tensor.tensor import Tensor
    for name, t in tensors.items():
        if not isinstance(name, str) or name == METADATA_KEY:
            raise ValueError(f"safe_save: invalid tensor name {name!r}")
        if not isinstance(t, Tensor):
            raise TypeError(f"safe_save: {name!r} is a {type(t).__name__}, not a Tensor")
        if not all(isinstance(d, int) for d in t.shape):
            raise ValueError(f"safe_save: {name!r} has a symbolic shape {t.shape}")
        if t.dtype not in CODE_BY_DTYPE:
            raise TypeError(f"safe_save: {name!r} has dtype {t.dtype}, which safetensors cannot store")
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str)
                                        for k, v in metadata.items()):
        raise TypeError("safe_save: metadata must map strings to strings")
    arrays = {name: _host_layout(t) for name, t in tensors.items()}
    header: dict[str, object] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for name, arr in arrays.items():
        header[name] = {"dtype": CODE_BY_DTYPE[tensors[name].dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # pad the header with spaces so the data section starts aligned (the format allows trailing spaces)
    text += b" " * (-(HEADER_LENGTH_BYTES + len(text)) % WRITE_ALIGNMENT)

    def write(f: BinaryIO) -> None:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for arr in arrays.values():
            f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())

    # 0666 less the umask: what open() gives a new file (safetensors are meant to be shared)
    atomic_write(path, write, mode=0o666)
