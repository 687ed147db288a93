"""Parse PTX text into entries of instructions for the interpreter (ptx_interp.py).

What is understood: module directives (`.version`, `.target`, `.address_size`), module-level `.shared`
arrays, `.entry` functions (`.visible`/`.weak`) with `.param` lists (scalars and `.b8` arrays, `.align`,
`.ptr` qualifiers) and performance directives (`.maxntid`, `.reqntid`, `.minnctapersm`, `.maxnreg`),
and inside a body: `.reg` declarations (also `%r<N>` ranges), `.shared` and `.local` arrays, labels, `{ }`
blocks, and instructions `[@[!]p] opcode.mods operands;` whose operands are registers, special registers,
immediates (decimal, hex, `0f`/`0d` floats, decimal floats), addresses `[reg+off]`/`[symbol+off]`,
vectors `{a, b}`, `!p` and `p|q`. Anything else raises PTXError naming the line.
"""
from __future__ import annotations

import bisect
import re
import struct
from dataclasses import dataclass, field
from typing import Any

MAX_THREADS_PER_BLOCK = 1024  # CUDA limit for every compute capability >= 2.0


class PTXError(Exception):
    """Bad or unsupported PTX, or a fault while running it; the message names kernel, line and text."""


# PTX fundamental types: name -> (kind, bits); kind: b/u/s integers, f float, bf bfloat16, pred
TYPES: dict[str, tuple[str, int]] = {
    "pred": ("pred", 1),
    "b8": ("b", 8), "b16": ("b", 16), "b32": ("b", 32), "b64": ("b", 64),
    "u8": ("u", 8), "u16": ("u", 16), "u32": ("u", 32), "u64": ("u", 64),
    "s8": ("s", 8), "s16": ("s", 16), "s32": ("s", 32), "s64": ("s", 64),
    "f16": ("f", 16), "bf16": ("bf", 16), "f32": ("f", 32), "f64": ("f", 64),
}

SPECIAL_REGISTERS = {f"%{base}.{c}" for base in ("tid", "ntid", "ctaid", "nctaid") for c in "xyz"} | \
    {"%laneid", "%warpid", "%nwarpid"}

_IDENT = r"[A-Za-z_$%][\w$]*"
_LABEL_RE = re.compile(r"([A-Za-z_$][\w$]*)\s*:(?!:)")
_RANGE_RE = re.compile(rf"({_IDENT})\s*<\s*(\d+)\s*>$")
_ARRAY_RE = re.compile(rf"({_IDENT})\s*(?:\[\s*(\d*)\s*\])?$")
_INT_RE = re.compile(r"[-+]?(0[xX][0-9a-fA-F]+|0[bB][01]+|0[0-7]*|[1-9]\d*)[uU]?$")
_FLOAT_HEX_RE = re.compile(r"[-+]?0([fFdD])([0-9a-fA-F]+)$")
_FLOAT_DEC_RE = re.compile(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class Operand:
    """One instruction operand. kind: reg, sreg, imm, sym, addr, vec, not, pair, sink."""

    kind: str
    name: str = ""  # register / special register / symbol name
    value: Any = None  # immediate value (int or float), address offset
    fkind: str = ""  # immediates: "int", "f32bits", "f64bits", "float"
    parts: tuple[Operand, ...] = ()  # vec / pair elements, not / addr base


@dataclass
class Instr:
    line: int
    text: str
    base: str  # "ld", "add", ...
    mods: tuple[str, ...]  # the dot-separated modifiers after the base, without dots
    operands: list[Operand]
    guard: tuple[str, bool] | None = None  # (predicate register, negated)


@dataclass
class Param:
    name: str
    offset: int
    size: int


@dataclass
class Entry:
    name: str
    line: int
    params: list[Param] = field(default_factory=list)
    param_size: int = 0
    regs: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (kind, bits)
    shared: dict[str, int] = field(default_factory=dict)  # symbol -> offset in the block's shared memory
    shared_size: int = 0
    local: dict[str, int] = field(default_factory=dict)  # symbol -> offset in each thread's local memory
    local_size: int = 0
    instrs: list[Instr] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)
    maxntid: tuple[int, ...] | None = None


@dataclass
class Module:
    version: str = ""
    target: str = ""
    address_size: int = 64
    entries: dict[str, Entry] = field(default_factory=dict)


def _strip_comments(src: str) -> str:
    """Blank out comments, keeping every newline so offsets still map to lines."""
    out = []
    i, n = 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(c if c == "\n" else " " for c in src[i:j]))
            i = j
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


class _Parser:
    def __init__(self, source: str):
        self.raw_lines = source.splitlines()
        self.src = _strip_comments(source)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", self.src)]
        self.pos = 0
        self.module = Module()
        self.module_shared: list[tuple[str, int, int]] = []  # (name, size, align)

    # ------------------------------------------------------------------ helpers
    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.line_starts, offset)

    def error(self, offset: int, why: str, entry: str = "<module>") -> PTXError:
        line = self.line_of(offset)
        text = self.raw_lines[line - 1].strip() if 0 < line <= len(self.raw_lines) else ""
        return PTXError(f"{entry}: line {line}: {text!r}: {why}")

    def skip_ws(self) -> None:
        while self.pos < len(self.src) and self.src[self.pos].isspace():
            self.pos += 1

    def word(self) -> str:
        m = re.compile(r"[.\w$%]+").match(self.src, self.pos)
        if not m:
            raise self.error(self.pos, "expected a word")
        self.pos = m.end()
        return m.group(0)

    def matching(self, open_at: int, open_c: str, close_c: str) -> int:
        depth = 0
        for i in range(open_at, len(self.src)):
            c = self.src[i]
            if c == open_c:
                depth += 1
            elif c == close_c:
                depth -= 1
                if depth == 0:
                    return i
        raise self.error(open_at, f"unbalanced {open_c!r}")

    # ------------------------------------------------------------------ module level
    def parse(self) -> Module:
        while True:
            self.skip_ws()
            if self.pos >= len(self.src):
                break
            start = self.pos
            w = self.word()
            if w in (".version", ".target", ".address_size"):
                end = self.src.find("\n", self.pos)
                end = len(self.src) if end < 0 else end
                arg = self.src[self.pos:end].strip()
                self.pos = end
                if w == ".version":
                    self.module.version = arg
                elif w == ".target":
                    self.module.target = arg
                else:
                    if arg != "64":
                        raise self.error(start, "only .address_size 64 is supported")
                    self.module.address_size = 64
            elif w in (".visible", ".weak", ".entry"):
                if w != ".entry":
                    self.skip_ws()
                    if self.word() != ".entry":
                        raise self.error(start, "only .entry functions are supported (no .func)")
                self.entry(start)
            elif w == ".shared":
                end = self.src.find(";", self.pos)
                if end < 0:
                    raise self.error(start, "missing ';'")
                self.module_shared.append(self.array_decl(self.src[self.pos:end], start))
                self.pos = end + 1
            else:
                raise self.error(start, f"unsupported module-level statement {w!r}")
        return self.module

    def array_decl(self, text: str, offset: int) -> tuple[str, int, int]:
        """`[.align N] .type name[count]` -> (name, size in bytes, alignment)."""
        toks = text.split()
        align = None
        tname = None
        rest: list[str] = []
        i = 0
        while i < len(toks):
            t = toks[i]
            if t == ".align":
                align = int(toks[i + 1])
                i += 2
                continue
            if t.startswith(".") and t[1:] in TYPES and tname is None:
                tname = t[1:]
            else:
                rest.append(t)
            i += 1
        if tname is None or tname == "pred":
            raise self.error(offset, "array declaration needs a data type")
        m = _ARRAY_RE.match("".join(rest))
        if not m:
            raise self.error(offset, "cannot parse the array declaration")
        count = int(m.group(2)) if m.group(2) else 1
        size = TYPES[tname][1] // 8
        return m.group(1), size * count, align or size

    def entry(self, start: int) -> None:
        self.skip_ws()
        name = self.word()
        entry = Entry(name, self.line_of(start))
        if name in self.module.entries:
            raise self.error(start, f"entry {name!r} defined twice")
        self.skip_ws()
        if self.src.startswith("(", self.pos):
            close = self.matching(self.pos, "(", ")")
            self.params(entry, self.src[self.pos + 1:close], self.pos)
            self.pos = close + 1
        while True:  # performance directives up to the body
            self.skip_ws()
            if self.src.startswith("{", self.pos):
                break
            at = self.pos
            d = self.word()
            if d not in (".maxntid", ".reqntid", ".minnctapersm", ".maxnreg", ".maxnctapersm", ".noreturn"):
                raise self.error(at, f"unsupported entry directive {d!r}", name)
            m = re.compile(r"\s*\d+(\s*,\s*\d+)*").match(self.src, self.pos)
            nums = [int(x) for x in re.findall(r"\d+", m.group(0))] if m else []
            if m:
                self.pos = m.end()
            if d in (".maxntid", ".reqntid"):
                entry.maxntid = tuple(nums)
        close = self.matching(self.pos, "{", "}")
        body_start = self.pos + 1
        for sname, size, align in self.module_shared:
            entry.shared_size = _align(entry.shared_size, align)
            entry.shared[sname] = entry.shared_size
            entry.shared_size += size
        self.body(entry, body_start, close)
        self.pos = close + 1
        self.module.entries[name] = entry

    def params(self, entry: Entry, text: str, offset: int) -> None:
        cursor = 0
        for chunk in text.split(","):
            toks = chunk.split()
            if not toks:
                continue
            if toks[0] != ".param":
                raise self.error(offset, f"kernel parameter must be .param, got {chunk.strip()!r}",
                                 entry.name)
            align = None
            tname = None
            decl = ""
            i = 1
            while i < len(toks):
                t = toks[i]
                if t == ".align":
                    align = int(toks[i + 1])
                    i += 2
                    continue
                if t.startswith(".") and t[1:] in TYPES:
                    tname = t[1:]
                elif t in (".ptr", ".global", ".shared", ".local", ".const"):
                    pass  # pointer qualifiers: an optimization hint, no change to the layout
                else:
                    decl += t
                i += 1
            if tname is None or tname == "pred":
                raise self.error(offset, f"parameter {decl!r} needs a data type", entry.name)
            m = _ARRAY_RE.match(decl)
            if not m:
                raise self.error(offset, f"cannot parse parameter {decl!r}", entry.name)
            elem = TYPES[tname][1] // 8
            count = int(m.group(2)) if m.group(2) else 1
            size = elem * count
            cursor = _align(cursor, align or elem)
            entry.params.append(Param(m.group(1), cursor, size))
            cursor += size
        entry.param_size = cursor

    # ------------------------------------------------------------------ body
    def body(self, entry: Entry, start: int, end: int) -> None:
        pos = start
        pending: list[tuple[str, int]] = []  # labels waiting for their instruction
        while pos < end:
            semi = self.src.find(";", pos, end)
            chunk_end = end if semi < 0 else semi
            # leading braces and labels
            i = pos
            while True:
                while i < chunk_end and self.src[i].isspace():
                    i += 1
                if i < chunk_end and self.src[i] in "{}":
                    i += 1
                    continue
                m = _LABEL_RE.match(self.src, i, chunk_end)
                if m:
                    pending.append((m.group(1), i))
                    i = m.end()
                    continue
                break
            text = self.src[i:chunk_end].strip()
            # a trailing block close belongs to no statement
            text = text.rstrip("}").strip() if semi < 0 else text
            if semi < 0 and text:
                raise self.error(i, "statement without ';'", entry.name)
            if text:
                lstrip = len(self.src[i:chunk_end]) - len(self.src[i:chunk_end].lstrip())
                at = i + lstrip
                if text.startswith("{"):  # block open glued to a statement
                    text = text.lstrip("{").strip()
                if text.startswith("."):
                    self.declaration(entry, text, at)
                else:
                    for label, lat in pending:
                        if label in entry.labels:
                            raise self.error(lat, f"label {label!r} defined twice", entry.name)
                        entry.labels[label] = len(entry.instrs)
                    pending = []
                    entry.instrs.append(self.instruction(entry, text, at))
            pos = chunk_end + 1
        for label, lat in pending:
            if label in entry.labels:
                raise self.error(lat, f"label {label!r} defined twice", entry.name)
            entry.labels[label] = len(entry.instrs)
        # an entry that runs off its end returns
        entry.instrs.append(Instr(self.line_of(end), "}", "ret", (), []))

    def declaration(self, entry: Entry, text: str, at: int) -> None:
        head = text.split()[0]
        if head == ".reg":
            m = re.match(r"\.reg\s+(?:\.v\d\s+)?\.(\w+)\s+(.*)$", text, re.S)
            if not m or m.group(1) not in TYPES:
                raise self.error(at, "cannot parse the register declaration", entry.name)
            tinfo = TYPES[m.group(1)]
            for name in (n.strip() for n in m.group(2).split(",")):
                r = _RANGE_RE.match(name)
                if r:
                    for k in range(int(r.group(2))):
                        entry.regs[f"{r.group(1)}{k}"] = tinfo
                elif re.fullmatch(_IDENT, name):
                    entry.regs[name] = tinfo
                else:
                    raise self.error(at, f"bad register name {name!r}", entry.name)
        elif head in (".shared", ".local"):
            name, size, align = self.array_decl(text[len(head):], at)
            if head == ".shared":
                entry.shared_size = _align(entry.shared_size, align)
                entry.shared[name] = entry.shared_size
                entry.shared_size += size
            else:
                entry.local_size = _align(entry.local_size, align)
                entry.local[name] = entry.local_size
                entry.local_size += size
        elif head == ".pragma":
            pass  # hints such as "nounroll"
        else:
            raise self.error(at, f"unsupported declaration {head!r}", entry.name)

    def instruction(self, entry: Entry, text: str, at: int) -> Instr:
        guard = None
        body = text
        if body.startswith("@"):
            m = re.match(rf"@\s*(!?)\s*({_IDENT})\s+", body)
            if not m:
                raise self.error(at, "bad predicate guard", entry.name)
            guard = (m.group(2), m.group(1) == "!")
            body = body[m.end():]
        m = re.match(r"([a-z][\w.:]*)\s*(.*)$", body, re.S)
        if not m:
            raise self.error(at, "cannot parse the instruction", entry.name)
        parts = m.group(1).split(".")
        ops_text = m.group(2).strip()
        try:
            operands = [self.operand(entry, t) for t in _split_operands(ops_text)] if ops_text else []
        except ValueError as e:
            raise self.error(at, str(e), entry.name) from None
        line = self.line_of(at)
        raw = self.raw_lines[line - 1].strip() if line <= len(self.raw_lines) else text
        if guard is not None and guard[0] not in entry.regs:
            raise self.error(at, f"undeclared predicate {guard[0]!r}", entry.name)
        return Instr(line, raw, parts[0], tuple(parts[1:]), operands, guard)

    def operand(self, entry: Entry, t: str) -> Operand:
        t = t.strip()
        if t == "_":
            return Operand("sink")
        if t.startswith("!"):
            return Operand("not", parts=(self.operand(entry, t[1:]),))
        if t.startswith("{"):
            if not t.endswith("}"):
                raise ValueError(f"bad vector operand {t!r}")
            return Operand("vec", parts=tuple(self.operand(entry, x) for x in _split_operands(t[1:-1])))
        if t.startswith("["):
            if not t.endswith("]"):
                raise ValueError(f"bad address operand {t!r}")
            return self.address(entry, t[1:-1].strip())
        if "|" in t:
            p, q = t.split("|", 1)
            return Operand("pair", parts=(self.operand(entry, p), self.operand(entry, q)))
        if t in entry.regs:
            return Operand("reg", t)
        if t in SPECIAL_REGISTERS:
            return Operand("sreg", t)
        imm = _immediate(t)
        if imm is not None:
            return imm
        if re.fullmatch(_IDENT, t):
            if t.startswith("%"):
                raise ValueError(f"undeclared register {t!r}")
            return Operand("sym", t)  # label, parameter or shared/local array: resolved when compiled
        raise ValueError(f"cannot parse operand {t!r}")

    def address(self, entry: Entry, t: str) -> Operand:
        m = re.fullmatch(rf"({_IDENT})?\s*(?:([-+])\s*([-+]?\s*\w+))?", t)
        if m and m.group(1) is not None:
            base = self.operand(entry, m.group(1))
            off = 0
            if m.group(2):
                v = _immediate(m.group(3).replace(" ", ""))
                if v is None or v.fkind != "int":
                    raise ValueError(f"bad address offset in [{t}]")
                off = v.value if m.group(2) == "+" else -v.value
            return Operand("addr", value=off, parts=(base,))
        v = _immediate(t)
        if v is not None and v.fkind == "int":
            return Operand("addr", value=v.value)
        raise ValueError(f"cannot parse address [{t}]")


def _split_operands(text: str) -> list[str]:
    """Split on commas outside brackets and braces."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for c in text:
        if c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    out.append("".join(cur))
    return [x.strip() for x in out]


def _immediate(t: str) -> Operand | None:
    m = _FLOAT_HEX_RE.match(t)
    if m:
        bits = int(m.group(2), 16)
        neg = t.startswith("-")
        if m.group(1) in "fF":
            if len(m.group(2)) != 8:
                return None
            val = struct.unpack("<f", struct.pack("<I", bits))[0]
            return Operand("imm", value=-val if neg else val, fkind="f32bits")
        if len(m.group(2)) != 16:
            return None
        val = struct.unpack("<d", struct.pack("<Q", bits))[0]
        return Operand("imm", value=-val if neg else val, fkind="f64bits")
    if _INT_RE.match(t):
        s = t.rstrip("uU")
        sign = -1 if s.startswith("-") else 1
        s = s.lstrip("+-")
        if s[:2] in ("0x", "0X"):
            v = int(s, 16)
        elif s[:2] in ("0b", "0B"):
            v = int(s[2:], 2)
        elif len(s) > 1 and s.startswith("0"):
            v = int(s, 8)
        else:
            v = int(s)
        return Operand("imm", value=sign * v, fkind="int")
    if _FLOAT_DEC_RE.match(t):
        return Operand("imm", value=float(t), fkind="float")
    return None


def parse(source: str) -> Module:
    """Parse PTX source; raises PTXError on anything it does not understand."""
    return _Parser(source).parse()
