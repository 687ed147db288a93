"""Finding the tensors of a model: walk its attributes, lists, tuples and dicts (any plain object tree)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rawgrad.nn.safetensors import SafetensorsError, SafetensorsFile, safe_load, safe_metadata, safe_save
from rawgrad.tensor.tensor import Tensor

__all__ = ["get_state_dict", "get_parameters", "load_state_dict", "safe_load", "safe_save", "safe_metadata",
           "SafetensorsFile", "SafetensorsError"]


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every Tensor reachable from obj, by dotted path ("layers.0.weight"); a tensor reachable twice
    keeps its first path. Attributes starting with '_' are private and skipped."""
    out: dict[str, Tensor] = {}
    seen_tensors: set[int] = set()
    visiting: set[int] = set()

    def walk(x: Any, path: str) -> None:
        if isinstance(x, Tensor):
            if id(x) not in seen_tensors:
                seen_tensors.add(id(x))
                out[path] = x
            return
        if id(x) in visiting:  # a cycle (a layer pointing back at its parent)
            return
        if isinstance(x, dict):
            children: list[tuple[str, Any]] = [(str(k), v) for k, v in x.items()]
        elif isinstance(x, (list, tuple)):
            children = [(str(i), v) for i, v in enumerate(x)]
        elif hasattr(x, "__dict__") and not isinstance(x, type):
            children = [(k, v) for k, v in vars(x).items() if not k.startswith("_")]
        else:
            return
        visiting.add(id(x))
        for name, child in children:
            walk(child, f"{path}.{name}" if path else name)
        visiting.discard(id(x))

    walk(obj, prefix.rstrip("."))
    return out


def get_parameters(obj: Any) -> list[Tensor]:
    """Every Tensor in obj's tree, once each (running statistics too: optimizers realize those)."""
    return list(get_state_dict(obj).values())


def load_state_dict(obj: Any, state_dict: Mapping[str, Any], strict: bool = True,
                    allow_cast: bool = False) -> None:
    """Copy values (Tensors or arrays) into obj's tensors by path.

    strict: the key sets must match. A value whose shape differs, or whose dtype differs (unless
    `allow_cast`), is an error. Every problem is collected and reported in one exception, and
    nothing is written unless all entries are valid.
    """
    own = get_state_dict(obj)
    problems: list[str] = []
    if strict:
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if missing:
            problems.append(f"missing keys {_short_list(missing)}")
        if unexpected:
            problems.append(f"unexpected keys {_short_list(unexpected)}")
    updates: list[tuple[Tensor, Tensor]] = []
    for name, t in own.items():
        if name not in state_dict:
            continue
        v = state_dict[name]
        v = v if isinstance(v, Tensor) else Tensor(np.asarray(v), device=t.device)
        if tuple(v.shape) != tuple(t.shape):
            problems.append(f"{name}: model has shape {tuple(t.shape)}, the value has {tuple(v.shape)}")
        elif v.dtype != t.dtype and not allow_cast:
            problems.append(f"{name}: model has dtype {t.dtype}, the value has {v.dtype} "
                            "(pass allow_cast=True to convert)")
        else:
            updates.append((t, v))
    if problems:
        kind = KeyError if all("keys" in p for p in problems) else ValueError
        raise kind("load_state_dict: " + "; ".join(problems))
    changed = [t.assign(v.to(t.device).cast(t.dtype)) for t, v in updates]
    if changed:
        Tensor.realize(*changed)


def _short_list(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return f"[{shown}{f', ... ({len(names) - limit} more)' if len(names) > limit else ''}]"
