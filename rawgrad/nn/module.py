"""`Module`: torch's model API over rawgrad's plain-object layers.

rawgrad layers are ordinary objects holding Tensors, and nn.state finds a model's tensors by walking its
attributes (tinygrad's way). `Module` adds the methods PyTorch code calls on a model, built on that walk,
so `class Net(nn.Module)` with `super().__init__()` and a `forward` works as in torch. The layers in
nn.layers are Modules too.

Training mode: rawgrad's dropout and batch norm read the process-wide `Tensor.training`, so `train()` and
`eval()` set it (and each module's `training` attribute, for code that reads that).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rawgrad.nn.state import get_state_dict, load_state_dict
from rawgrad.tensor.tensor import Tensor


class Module:
    training: bool = False

    def __init__(self) -> None:
        self.training = Tensor.training

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # ---------------------------------------------------------------- tensors of the model
    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Every tensor of the model by dotted path (parameters and buffers such as running means)."""
        return get_state_dict(self, prefix)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Copy values in by path; every mismatch is reported at once and nothing is written then."""
        load_state_dict(self, state_dict, strict=strict)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """The tensors that take gradients (requires_grad=True), by path: buffers are left out, as in
        torch."""
        for name, t in self.state_dict(prefix).items():
            if t.requires_grad:
                yield name, t

    def parameters(self) -> Iterator[Tensor]:
        for _, t in self.named_parameters():
            yield t

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every Module below it, once each, by dotted path."""
        seen: set[int] = set()
        stack: list[tuple[str, Any]] = [(prefix, self)]
        while stack:
            path, obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, Module):
                yield path, obj
                children = [(k, v) for k, v in vars(obj).items() if not k.startswith("_")]
            elif isinstance(obj, (list, tuple)):
                children = [(str(i), v) for i, v in enumerate(obj)]
            elif isinstance(obj, dict):
                children = [(str(k), v) for k, v in obj.items()]
            else:
                continue
            for name, child in reversed(children):
                if isinstance(child, (Module, list, tuple, dict)):
                    stack.append((f"{path}.{name}" if path else name, child))

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    # ---------------------------------------------------------------- modes and gradients
    def train(self, mode: bool = True) -> Module:
        Tensor.training = mode
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None
