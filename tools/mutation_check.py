#!/usr/bin/env python3
"""Apply each mutation in .ci/mutations.toml to a scratch copy of the tree and require its tests to fail.

A mutation is one small source edit that reproduces a class of bug the suite must catch (an install failure
CI ignores, a wrong QMD register count, a misplaced barrier, SASS assembled from other PTX, a missing
wait-for-idle, swapped release words). For each one this script:

1. copies rawgrad/, tests/, tools/, .ci/ and pyproject.toml into a fresh temporary directory;
2. checks that the mutation's `old` text occurs exactly once in its file, and replaces it with `new`;
3. runs `python3 -m pytest -x` on the mutation's tests inside the copy (the copy's rawgrad is imported:
   the script checks `rawgrad.__file__`), with the mutation's extra environment;
4. requires pytest's exit code 1 (tests failed). Exit code 0 means the mutation survived: the suite no
   longer catches that class of bug. Any other code (no such test, collection error, timeout) is an error
   of the check itself. Both fail this script.

Usage: python3 tools/mutation_check.py [--list] [NAME ...]   (no names: every mutation)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MUTATIONS_FILE = REPO / ".ci" / "mutations.toml"
COPIED = ("rawgrad", "tests", "tools", ".ci", "pyproject.toml")
PYTEST_TESTS_FAILED = 1  # pytest.ExitCode.TESTS_FAILED
DEFAULT_TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutation:
    name: str
    bug_class: str
    file: str
    old: str
    new: str
    tests: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: int = DEFAULT_TIMEOUT_S


def load_mutations(path: Path = MUTATIONS_FILE) -> list[Mutation]:
    with open(path, "rb") as f:
        table = tomllib.load(f)
    out = []
    for entry in table.get("mutation", []):
        unknown = set(entry) - {"name", "bug_class", "file", "old", "new", "tests", "env", "timeout_s"}
        if unknown:
            raise ValueError(f"{path}: mutation {entry.get('name')!r} has unknown keys {sorted(unknown)}")
        out.append(Mutation(**entry))
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate mutation names")
    return out


def _ignore(_: str, names: list[str]) -> set[str]:
    return {n for n in names if n in ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache")}


def run_one(m: Mutation) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix=f"rawgrad-mut-{m.name}-") as tmp:
        root = Path(tmp)
        for item in COPIED:
            src = REPO / item
            if src.is_dir():
                shutil.copytree(src, root / item, ignore=_ignore, symlinks=True)
            elif src.exists():
                shutil.copy2(src, root / item)
        target = root / m.file
        text = target.read_text()
        count = text.count(m.old)
        if count != 1:
            return False, f"`old` occurs {count} times in {m.file} (must be once; update .ci/mutations.toml)"
        target.write_text(text.replace(m.old, m.new))
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", **m.env}
        env.pop("RAWGRAD_ALLOWED_SKIPS", None)
        env.pop("RAWGRAD_REQUIRE_DEVICE_KERNELS", None)
        where = subprocess.run([sys.executable, "-c", "import rawgrad; print(rawgrad.__file__)"], cwd=root,
                               env=env, capture_output=True, text=True, timeout=60)
        if not where.stdout.strip().startswith(str(root)):
            return False, f"the copy's rawgrad is not imported: {where.stdout.strip() or where.stderr}"
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests]
        try:
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=m.timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {m.timeout_s} s"
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        if proc.returncode == PYTEST_TESTS_FAILED:
            return True, tail.splitlines()[-1] if tail else "failed"
        if proc.returncode == 0:
            return False, f"SURVIVED: every test passed with the mutation applied\n{tail}"
        return False, f"pytest exit code {proc.returncode} (not a test failure)\n{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutations to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = ap.parse_args(argv)
    mutations = load_mutations()
    if args.list:
        for m in mutations:
            print(f"{m.name:28s} {m.bug_class:40s} {m.file}  ->  {' '.join(m.tests)}")
        return 0
    chosen = [m for m in mutations if not args.names or m.name in args.names]
    missing = set(args.names) - {m.name for m in mutations}
    if missing:
        print(f"no such mutation: {', '.join(sorted(missing))}", file=sys.stderr)
        return 2
    bad = 0
    for m in chosen:
        t0 = time.monotonic()
        ok, detail = run_one(m)
        bad += not ok
        took = time.monotonic() - t0
        verdict = "caught " if ok else "FAILED "
        print(f"{verdict} {m.name:28s} ({m.bug_class}; {took:.1f} s): {detail}", flush=True)
    print(f"mutation check: {len(chosen) - bad} of {len(chosen)} mutations caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
