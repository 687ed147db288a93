"""Is the SASS of a kernel image the code of the PTX the mock interprets?

The mock GPU runs an image's ``.rawgrad.ptx``, never its SASS, so nothing else would notice a cubin whose
code came from other PTX (a renderer or driver bug that assembles one text and embeds another, a cache
entry under the wrong key). `verify_image` checks, for an image with SASS:

(a) the embedded PTX hashes to the PTX digest in ``.rawgrad.bind``, and (b) each ``.text.<kernel>`` to
    its recorded digest (``cubin.check_binding``: the driver's own record, cheap);
(c) the record is true: the embedded PTX, assembled here by the same assembler (same build, same options)
    gives the same code, byte for byte, relocated fields aside. This does not trust the driver's
    bookkeeping: it runs ptxas itself on the bytes the mock will interpret.

(c) costs one assembler run (~15-25 ms) per distinct PTX: memoized per process (images already verified
are remembered by content) and on disk next to the NV compile cache (``<cache>/sass-check``, off when
``RAWGRAD_CACHE_DIR`` is empty). The disk memo holds only what this module's own ptxas run produced, keyed
by this module (PTX digest, architecture, assembler identity) and checksummed; the driver never reads or
writes it, so a driver bug (wrong key, wrong PTX fed) cannot make a wrong entry. Images without SASS (the
PTX-only fallback when no assembler exists) have nothing to check; ``cubin.ptx_only_fallbacks`` counts them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass

from rawgrad.compiler import elf
from rawgrad.compiler.cache import DiskCache, cache_folder, content_key
from rawgrad.drivers.nv import cubin
from rawgrad.drivers.nv.cubin import PTX_SECTION, TEXT_PREFIX, Binding, BindingError

__all__ = ["BindingError", "SASSCheckStats", "SASSMismatchError", "SASSUncheckableError", "stats",
           "verify_image"]

_DIFF_CONTEXT = 16  # bytes shown around the first difference
MEMO_FOLDER = "sass-check"  # under the NV compile cache's folder


class SASSMismatchError(BindingError):
    """An image's code is not what its embedded PTX assembles to (the message names the kernel)."""


class SASSUncheckableError(BindingError):
    """The assembler that made an image is not available to re-assemble its PTX (the message says which)."""


@dataclass
class SASSCheckStats:
    """Process-wide counters: `assembled` are assembler runs made by this check."""

    verified: int = 0  # images checked by (c) now
    repeats: int = 0  # images already verified before (by content)
    assembled: int = 0
    memo_hits: int = 0  # references found in this process's memo
    disk_hits: int = 0  # references found in the on-disk memo
    no_sass: int = 0  # PTX-only images passed through


stats = SASSCheckStats()
_lock = threading.Lock()
_reference: dict[tuple[str, str, str], elf.ElfFile] = {}  # (ptx sha256, arch, assembler sha256) -> cubin
_verified: set[bytes] = set()  # sha256 of image bytes already verified


def verify_image(image_bytes: bytes, sm: int) -> None:
    """Check the image (as built, or as uploaded: relocated, padded) for a GPU of SM `sm` (e.g. 90, 86).

    Raises BindingError (or its subclasses SASSMismatchError / SASSUncheckableError) naming the kernel when
    the code, the embedded PTX and the binding record disagree; returns quietly for an image without SASS.
    """
    key = hashlib.sha256(image_bytes).digest()
    with _lock:
        if key in _verified:
            stats.repeats += 1
            return
    f = elf.ElfFile.parse(image_bytes)
    record = cubin.check_binding(image_bytes, f)  # (a) and (b)
    if record is None:
        with _lock:
            stats.no_sass += 1
        return
    kernels = ", ".join(sorted(name for name, _ in record.code))
    if cubin.sm_number(record.arch) != sm:
        raise BindingError(f"{kernels}: assembled for {record.arch}, loaded on an sm_{sm} GPU")
    ptx = f.section(PTX_SECTION).data
    ref = _reference_cubin(ptx, record, kernels)
    want = cubin.code_sections(ref)
    got = cubin.code_sections(f, masks_from=ref)
    for name in sorted(set(want) | set(got)):
        kernel = name[len(TEXT_PREFIX):]
        if name not in got or name not in want:
            where = "the image" if name not in got else f"what {record.assembler} makes of the embedded PTX"
            raise SASSMismatchError(f"kernel {kernel}: {name} is missing from {where}")
        if got[name] != want[name]:
            diff = _first_difference(got[name], want[name])
            raise SASSMismatchError(f"kernel {kernel}: its SASS is not what {record.assembler} makes of the "
                                    f"embedded {PTX_SECTION} for {record.arch} ({diff}); the code came from "
                                    f"other PTX, so the mock would interpret a different kernel than the GPU "
                                    f"would run")
    with _lock:
        stats.verified += 1
        _verified.add(key)


def _first_difference(got: bytes, want: bytes) -> str:
    if len(got) != len(want):
        return f"{len(got)} code bytes, expected {len(want)}"
    at = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    lo = at - at % _DIFF_CONTEXT
    return (f"first difference at byte {at:#x}: {got[lo:lo + _DIFF_CONTEXT].hex()} vs "
            f"{want[lo:lo + _DIFF_CONTEXT].hex()}")


def _reference_cubin(ptx: bytes, record: Binding, kernels: str) -> elf.ElfFile:
    key = (hashlib.sha256(ptx).hexdigest(), record.arch, record.assembler_sha256)
    with _lock:
        hit = _reference.get(key)
        if hit is not None:
            stats.memo_hits += 1
            return hit
    memo = _disk_memo()
    disk_key = content_key(MEMO_FOLDER, *key)
    stored = memo.get(disk_key)
    if stored is not None:
        try:
            ref = elf.ElfFile.parse(stored)
        except elf.ElfError:
            pass  # a checksummed entry that is no ELF: assemble again and overwrite it
        else:
            with _lock:
                stats.disk_hits += 1
                _reference[key] = ref
            return ref
    if record.assembler == "ptxas":
        image = _run_ptxas(_find_ptxas(record, kernels), ptx, record.arch, kernels)
    elif record.assembler == "nvjitlink":
        linker = cubin.find_nvjitlink()
        if linker is None or cubin.sha256(linker.identity) != record.assembler_sha256:
            raise SASSUncheckableError(f"{kernels}: linked by an nvJitLink this process does not have "
                                       f"({linker!r} here); cannot re-check its SASS")
        image = linker.link(ptx, record.arch)
    else:
        raise SASSUncheckableError(f"{kernels}: made by unknown assembler {record.assembler!r}")
    ref = elf.ElfFile.parse(image)
    memo.put(disk_key, image)
    with _lock:
        stats.assembled += 1
        _reference[key] = ref
    return ref


def _disk_memo() -> DiskCache:
    folder = cache_folder("nv")
    return DiskCache(os.path.join(folder, MEMO_FOLDER) if folder else None, ".cubin")


def _find_ptxas(record: Binding, kernels: str) -> str:
    """The ptxas build that made the image (same --version text), wherever it is installed here."""
    seen = []
    for path in cubin.ptxas_candidates():
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        try:
            identity = cubin.PTXAssembler(path).identity
        except cubin.NoAssemblerError:
            continue
        if cubin.sha256(identity) == record.assembler_sha256:
            return path
        seen.append(path)
    raise SASSUncheckableError(f"{kernels}: assembled by a ptxas whose --version this machine does not have "
                               f"(looked at {', '.join(seen) or 'no ptxas'}); cannot re-check its SASS")


def _run_ptxas(path: str, ptx: bytes, arch: str, kernels: str) -> bytes:
    """ptxas on exactly `ptx` with the driver's options; run here, not through the driver's assembler."""
    with tempfile.TemporaryDirectory(prefix="rawgrad-sass-check-") as folder:
        src, out = os.path.join(folder, "check.ptx"), os.path.join(folder, "check.cubin")
        with open(src, "wb") as fh:
            fh.write(ptx)
        try:
            proc = subprocess.run(cubin.ptxas_command(path, arch, src, out), capture_output=True, text=True,
                                  timeout=cubin.PTXAS_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise SASSUncheckableError(f"{kernels}: ptxas did not finish re-assembling the PTX") from e
        if proc.returncode != 0:
            log = (proc.stderr + proc.stdout).strip()[:500]
            raise SASSMismatchError(f"{kernels}: the embedded {PTX_SECTION} does not assemble (ptxas exit "
                                    f"{proc.returncode}: {log}), yet the image has SASS")
        with open(out, "rb") as fh:
            return fh.read()
