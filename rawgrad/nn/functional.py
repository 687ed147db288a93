"""Functions the layers and training loops need that the Tensor class does not have (yet): transposed
convolution and the usual losses, with torch.nn.functional's names and arguments."""
from __future__ import annotations

from collections.abc import Sequence

from rawgrad.tensor.tensor import Tensor

IntOrSeq = int | Sequence[int]


def _tuple(x: IntOrSeq, n: int, what: str) -> tuple[int, ...]:
    t = (x,) * n if isinstance(x, int) else tuple(x)
    if len(t) != n:
        raise ValueError(f"{what} needs 1 or {n} values, got {t}")
    return t


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
                     padding: IntOrSeq = 0, output_padding: IntOrSeq = 0, groups: int = 1,
                     dilation: IntOrSeq = 1) -> Tensor:
    """torch.nn.functional.conv_transpose2d (any number of spatial dims): weight (Cin, Cout // groups,
    *kernel). The gradient of a convolution with respect to its input, written as a convolution: spread
    the input by the stride, pad by dilation * (kernel - 1) - padding, then correlate with the flipped,
    in/out-swapped kernel."""
    nd = weight.ndim - 2
    if nd < 1 or x.ndim != nd + 2:
        raise ValueError(f"conv_transpose: input {x.shape} and weight {weight.shape} need (N, Cin, *spatial) "
                         "and (Cin, Cout/groups, *kernel) with the same number of spatial dims")
    cin, cout_g = weight.shape[:2]
    kernel = tuple(weight.shape[2:])
    if x.shape[1] != cin or cin % groups:
        raise ValueError(f"conv_transpose: input {x.shape} has {x.shape[1]} channels, weight {weight.shape} "
                         f"expects {cin} (divisible by groups={groups})")
    st, pd = _tuple(stride, nd, "stride"), _tuple(padding, nd, "padding")
    op, dl = _tuple(output_padding, nd, "output_padding"), _tuple(dilation, nd, "dilation")
    for o, s, d in zip(op, st, dl):
        if o >= max(s, d):
            raise ValueError(f"output_padding {op} must be smaller than stride {st} or dilation {dl}")
    y = x
    for j, s in enumerate(st):  # put s - 1 zeros between neighbours along each spatial axis
        if s == 1:
            continue
        ax = 2 + j
        n = y.shape[ax]
        pre, post = y.shape[:ax], y.shape[ax + 1:]
        y = y.reshape(pre + (n, 1) + post).pad([(0, 0)] * (ax + 1) + [(0, s - 1)] + [(0, 0)] * len(post))
        y = y.reshape(pre + (n * s,) + post).shrink([None] * ax + [(0, (n - 1) * s + 1)] + [None] * len(post))
    edge = [d * (k - 1) - p for k, d, p in zip(kernel, dl, pd)]
    y = y.pad([(0, 0), (0, 0)] + [(e, e + o) for e, o in zip(edge, op)])
    cin_g = cin // groups
    w = weight.reshape((groups, cin_g, cout_g) + kernel).transpose(1, 2)
    w = w.reshape((groups * cout_g, cin_g) + kernel).flip(tuple(range(2, 2 + nd)))
    return y.conv2d(w, bias, groups=groups, dilation=dl)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def nll_loss(log_probs: Tensor, target: Tensor, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """-log_probs[i, target[i]] over (N, C) (or (N, C, *extra) with target (N, *extra))."""
    if target.dtype.is_float:
        raise TypeError(f"nll_loss needs integer class indices, got {target.dtype}")
    # classes last: (N, C, *extra) -> (N, *extra, C), to line up with target (N, *extra)
    lp = log_probs.permute([0, *range(2, log_probs.ndim), 1]) if log_probs.ndim > 2 else log_probs
    tgt = target
    if tuple(lp.shape[:-1]) != tuple(tgt.shape):
        raise ValueError(f"nll_loss: input {log_probs.shape} and target {target.shape} do not match")
    valid = tgt != ignore_index
    picked = (lp * tgt.one_hot(lp.shape[-1])).sum(-1)
    loss = -valid.where(picked, 0)
    if reduction == "mean":
        return loss.sum() / valid.sum().maximum(1)
    return _reduce(loss, reduction)


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100) -> Tensor:
    """Softmax cross-entropy of (N, C) logits against class indices (N,) or class probabilities (N, C)."""
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    logp = logits.log_softmax(1)
    if target.dtype.is_float:  # probabilities
        if target.shape != logits.shape:
            raise ValueError(f"cross_entropy: probability target {target.shape} must match logits "
                             f"{logits.shape}")
        n_cls = logits.shape[1]
        t = target * (1 - label_smoothing) + label_smoothing / n_cls
        return _reduce(-(logp * t).sum(1), reduction)
    nll = nll_loss(logp, target, "none", ignore_index)
    if label_smoothing:
        smooth = -logp.mean(1)
        nll = (target != ignore_index).where(nll * (1 - label_smoothing) + smooth * label_smoothing, 0)
    if reduction == "mean":
        return nll.sum() / (target != ignore_index).sum().maximum(1)
    return _reduce(nll, reduction)


def sparse_categorical_crossentropy(logits: Tensor, target: Tensor, ignore_index: int = -1,
                                    label_smoothing: float = 0.0) -> Tensor:
    """tinygrad's name: mean softmax cross-entropy of (..., C) logits against integer labels (...)."""
    flat = logits.reshape(-1, logits.shape[-1])
    return cross_entropy(flat, target.reshape(-1), "mean", label_smoothing, ignore_index)


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce((x - target).square(), reduction)


def l1_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce((x - target).abs(), reduction)


def binary_cross_entropy(p: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)), logs clamped at -100 as torch."""
    return _reduce(-(target * p.log().maximum(-100) + (1 - target) * (1 - p).log().maximum(-100)),
                   reduction)


def binary_cross_entropy_with_logits(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """BCE on sigmoid(logits), computed as softplus so large logits stay finite."""
    return _reduce((1 - target) * logits - logits.logsigmoid(), reduction)
