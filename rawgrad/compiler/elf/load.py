"""Map a relocatable object for this CPU into executable memory (W^X, see ``rawgrad.compiler.elf``).
"""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Callable

from rawgrad.compiler.elf.consts import EM_AARCH64, ElfError
from rawgrad.compiler.elf.host import _libc, _unmap, host_machine
from rawgrad.compiler.elf.link import LinkedImage, _align_up, _Layout, link
from rawgrad.compiler.elf.parse import ElfFile


class LoadedImage:
    """A relocated object mapped into executable memory; ``symbols`` maps names to absolute addresses."""

    base: int
    size: int
    symbols: dict[str, int]

    def __init__(self, base: int, size: int, symbols: dict[str, int], linked: LinkedImage) -> None:
        self.base, self.size, self.symbols = base, size, symbols
        self.section_addresses = linked.section_addresses
        self.stubs = linked.stubs
        self.used_stubs = linked.used_stubs
        self._finalizer = weakref.finalize(self, _unmap, base, size)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def symbol(self, name: str) -> int:
        """Absolute address of a defined symbol; ElfError listing the defined names when missing."""
        if self.closed:
            raise ElfError(f"image at {self.base:#x} is closed; cannot look up {name!r}")
        try:
            return self.symbols[name]
        except KeyError:
            raise ElfError(f"symbol {name!r} is not defined in the loaded image "
                           f"(defined: {', '.join(sorted(self.symbols)) or 'none'})") from None

    def close(self) -> None:
        """Unmap the image (idempotent; also runs when the object is garbage collected)."""
        self._finalizer()

    def __enter__(self) -> LoadedImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.symbols)} symbols"
        return f"LoadedImage(base={self.base:#x}, size={self.size}, {state})"


def load(obj: bytes, resolve: Callable[[str], int] | None = None, *,
         force_stubs: bool = False) -> LoadedImage:
    """Map a relocatable object for this CPU into executable memory and relocate it (W^X, see module doc)."""
    elf = ElfFile.parse(obj)
    host = host_machine()
    if elf.machine != host:
        raise ElfError(f"object is for ELF machine {elf.machine}, but this host is machine {host}")
    libc = _libc()
    page = mmap.PAGESIZE
    size = _Layout(elf, page).size
    size = _align_up(size, page)
    base = libc.map(size)
    try:
        linked = link(elf, base, resolve if resolve is not None else libc.resolve, force_stubs=force_stubs,
                      page_size=page)
        libc.write(base, linked.data)
        if host == EM_AARCH64:
            libc.flush_icache(base, size)
        for off, length, prot in linked.segments:
            libc.protect(base + off, length, prot)
    except BaseException:
        libc.unmap(base, size)
        raise
    return LoadedImage(base, size, linked.symbols, linked)
