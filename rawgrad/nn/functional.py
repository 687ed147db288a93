"""torch.nn.functional's names and argument orders over the Tensor methods that do the work (transposed
convolution, pooling, interpolation, padding, the usual losses)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rawgrad.tensor.tensor import Tensor

IntOrSeq = int | Sequence[int]


def conv_transpose1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
                     padding: IntOrSeq = 0, output_padding: IntOrSeq = 0, groups: int = 1,
                     dilation: IntOrSeq = 1) -> Tensor:
    """torch.nn.functional.conv_transpose1d: weight (Cin, Cout // groups, k)."""
    return x.conv_transpose1d(weight, bias, groups, stride, dilation, padding, output_padding)


def conv_transpose2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
                     padding: IntOrSeq = 0, output_padding: IntOrSeq = 0, groups: int = 1,
                     dilation: IntOrSeq = 1) -> Tensor:
    """torch.nn.functional.conv_transpose2d (any number of spatial dims): weight (Cin, Cout // groups,
    *kernel); `Tensor.conv_transpose2d` (tinygrad's argument order) does the work."""
    return x.conv_transpose2d(weight, bias, groups, stride, dilation, padding, output_padding)


def conv_transpose3d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
                     padding: IntOrSeq = 0, output_padding: IntOrSeq = 0, groups: int = 1,
                     dilation: IntOrSeq = 1) -> Tensor:
    """torch.nn.functional.conv_transpose3d: weight (Cin, Cout // groups, kd, kh, kw)."""
    return x.conv_transpose3d(weight, bias, groups, stride, dilation, padding, output_padding)


# ---------------------------------------------------------------------- pooling (torch's argument order)
def max_pool1d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               dilation: IntOrSeq = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return x.max_pool1d(kernel_size, stride, dilation, padding, ceil_mode, return_indices)


def max_pool2d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               dilation: IntOrSeq = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return x.max_pool2d(kernel_size, stride, dilation, padding, ceil_mode, return_indices)


def max_pool3d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               dilation: IntOrSeq = 1, ceil_mode: bool = False, return_indices: bool = False) -> Any:
    return x.max_pool3d(kernel_size, stride, dilation, padding, ceil_mode, return_indices)


def avg_pool1d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    return x.avg_pool1d(kernel_size, stride, 1, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool2d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    return x.avg_pool2d(kernel_size, stride, 1, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(x: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None, padding: IntOrSeq = 0,
               ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    return x.avg_pool3d(kernel_size, stride, 1, padding, ceil_mode, count_include_pad, divisor_override)


def max_unpool1d(x: Tensor, indices: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None,
                 padding: IntOrSeq = 0, output_size: Sequence[int] | None = None) -> Tensor:
    return x.max_unpool1d(indices, kernel_size, stride, padding, output_size)


def max_unpool2d(x: Tensor, indices: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None,
                 padding: IntOrSeq = 0, output_size: Sequence[int] | None = None) -> Tensor:
    return x.max_unpool2d(indices, kernel_size, stride, padding, output_size)


def max_unpool3d(x: Tensor, indices: Tensor, kernel_size: IntOrSeq, stride: IntOrSeq | None = None,
                 padding: IntOrSeq = 0, output_size: Sequence[int] | None = None) -> Tensor:
    return x.max_unpool3d(indices, kernel_size, stride, padding, output_size)


def interpolate(x: Tensor, size: IntOrSeq | None = None, scale_factor: float | Sequence[float] | None = None,
                mode: str = "nearest", align_corners: bool | None = None,
                recompute_scale_factor: bool | None = None) -> Tensor:
    """torch.nn.functional.interpolate (see Tensor.interpolate for the modes)."""
    return x.interpolate(size, scale_factor, mode, align_corners, recompute_scale_factor)


def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """torch.nn.functional.pad: flat (left, right) pairs from the last dim backwards; negative ones crop."""
    return x.pad(pad, 0.0 if value is None else value, mode)


# ---------------------------------------------------------------------- losses (Tensor methods do the work)
def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def nll_loss(log_probs: Tensor, target: Tensor, reduction: str = "mean", ignore_index: int = -100, *,
             weight: Tensor | None = None) -> Tensor:
    """-log_probs[i, target[i]] over (N, C) (or (N, C, *extra) with target (N, *extra))."""
    return log_probs.nll_loss(target, weight, ignore_index, reduction)


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100, *, weight: Tensor | None = None) -> Tensor:
    """Softmax cross-entropy of (N, C, *extra) logits against class indices or class probabilities."""
    return logits.cross_entropy(target, reduction, label_smoothing, weight=weight, ignore_index=ignore_index)


def sparse_categorical_crossentropy(logits: Tensor, target: Tensor, ignore_index: int = -1,
                                    label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """tinygrad's name: softmax cross-entropy of (..., C) logits against integer labels (...)."""
    return logits.sparse_categorical_crossentropy(target, ignore_index, label_smoothing, reduction)


def mse_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce((x - target).square(), reduction)


def l1_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce((x - target).abs(), reduction)


def binary_cross_entropy(p: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)), logs clamped at -100 as torch."""
    return p.binary_crossentropy(target, reduction)


def binary_cross_entropy_with_logits(logits: Tensor, target: Tensor, reduction: str = "mean", *,
                                     pos_weight: Tensor | None = None) -> Tensor:
    """BCE on sigmoid(logits), computed as softplus so large logits stay finite."""
    return logits.binary_crossentropy_logits(target, reduction, pos_weight)
