"""Finding the tensors of a model: walk its attributes, lists, tuples and dicts (any plain object tree)."""
from __future__ import annotations

from typing import Any

import numpy as np

from rawgrad.tensor.tensor import Tensor


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


def load_state_dict(obj: Any, state_dict: dict[str, Any], strict: bool = True) -> None:
    """Copy values (Tensors or arrays) into obj's tensors by path; strict: the key sets must match."""
    own = get_state_dict(obj)
    if strict:
        missing = sorted(set(own) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
    changed = []
    for name, t in own.items():
        if name not in state_dict:
            continue
        v = state_dict[name]
        v = v if isinstance(v, Tensor) else Tensor(np.asarray(v), device=t.device)
        if tuple(v.shape) != tuple(t.shape):
            raise ValueError(f"load_state_dict: {name} has shape {t.shape}, the value has {v.shape}")
        changed.append(t.assign(v.to(t.device).cast(t.dtype)))
    if changed:
        Tensor.realize(*changed)
