"""torch.nn.functional's names and argument orders over the Tensor methods that do the work (transposed
convolution, pooling, interpolation, padding, the usual losses)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rawgrad.tensor.ops_nn import reduce_loss
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


# ---------------------------------------------------------------------- activations and softmax
def relu(x: Tensor, inplace: bool = False) -> Tensor:
    return x.relu()


def relu6(x: Tensor, inplace: bool = False) -> Tensor:
    return x.relu6()


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return x.gelu(approximate)


def silu(x: Tensor, inplace: bool = False) -> Tensor:
    return x.silu()


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return x.leaky_relu(negative_slope)


def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return x.elu(alpha)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    return x.softplus(beta, threshold)


def mish(x: Tensor, inplace: bool = False) -> Tensor:
    return x.mish()


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    return x.hardtanh(min_val, max_val)


def hardswish(x: Tensor, inplace: bool = False) -> Tensor:
    return x.hardswish()


def hardsigmoid(x: Tensor, inplace: bool = False) -> Tensor:
    return x.hardsigmoid()


def logsigmoid(x: Tensor) -> Tensor:
    return x.logsigmoid()


def softmax(x: Tensor, dim: int = -1, dtype: Any = None) -> Tensor:
    """dim defaults to -1 (torch's implicit choice is deprecated)."""
    return x.softmax(dim, dtype)


def log_softmax(x: Tensor, dim: int = -1, dtype: Any = None) -> Tensor:
    return x.log_softmax(dim, dtype)


def softmin(x: Tensor, dim: int = -1, dtype: Any = None) -> Tensor:
    return x.softmin(dim, dtype)


def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    return x.normalize(p, dim, eps)


# ---------------------------------------------------------------------- layers as functions
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias, weight (out_features, in_features) as torch (Tensor.linear takes (in, out))."""
    y = x.matmul(weight.transpose(-1, -2)) if weight.ndim >= 2 else x * weight
    return y if bias is None else y + bias


def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Identity unless training (the flag, not Tensor.training, decides here, as torch)."""
    if not training or p == 0:
        return x
    was = Tensor.training
    Tensor.training = True
    try:
        return x.dropout(p)
    finally:
        Tensor.training = was


def one_hot(x: Tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot; num_classes=-1 takes max(x) + 1 (reads x back to the host)."""
    if num_classes < 0:
        num_classes = int(x.max().item()) + 1 if x.numel() else 0
    return x.one_hot(num_classes)


def embedding(x: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """weight[x] (padding_idx only matters for gradients in torch; it is accepted and ignored)."""
    return x.embedding(weight)


def layer_norm(x: Tensor, normalized_shape: IntOrSeq, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    return x.layer_norm(normalized_shape, weight, bias, eps)


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize each of num_groups groups of channels (dim 1) together with all positions, then scale
    and shift per channel (what nn.GroupNorm computes)."""
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise ValueError(f"group_norm: input of shape {x.shape} does not split into {num_groups} groups "
                         "along dim 1")
    y = x.reshape(x.shape[0], num_groups, -1).layernorm(-1, eps).reshape(x.shape)
    bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * weight.reshape(bshape)
    return y if bias is None else y + bias.reshape(bshape)


def _realize_pending(*ts: Tensor) -> None:
    """Run assigns nobody realized yet, so that a new update does not chain every step's graph."""
    from rawgrad.compiler.ir import Ops
    stale = [t for t in ts if t.uop.op is Ops.ASSIGN]
    if stale:
        Tensor.realize(*stale)


def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Batch normalization over every dim but 1 (what nn.BatchNorm computes). training: normalize with
    the batch's statistics and, where running stats are given, move them by momentum in place with
    `assign` (running_var takes the unbiased variance, as torch); otherwise use the running stats."""
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if training:
        mean = x.mean(axes)
        var = (x - mean.reshape(bshape)).square().mean(axes)  # biased: what normalizes the batch
        if running_mean is not None and running_var is not None:
            _realize_pending(running_mean, running_var)
            n = x.numel() // x.shape[1]
            unbiased = var * (n / max(n - 1, 1))
            running_mean.assign(running_mean * (1 - momentum) + mean.detach() * momentum)
            running_var.assign(running_var * (1 - momentum) + unbiased.detach() * momentum)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm outside training needs running_mean and running_var")
        mean, var = running_mean, running_var
    y = (x - mean.reshape(bshape)) * (var + eps).rsqrt().reshape(bshape)
    if weight is not None:
        y = y * weight.reshape(bshape)
    return y if bias is None else y + bias.reshape(bshape)


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    return x.adaptive_avg_pool2d(output_size)


def adaptive_max_pool2d(x: Tensor, output_size: Any) -> Tensor:
    """Values only: return_indices is not supported."""
    return x.adaptive_max_pool2d(output_size)


def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
           padding: Any = 0, dilation: IntOrSeq = 1, groups: int = 1) -> Tensor:
    """torch.nn.functional.conv1d's argument order over `Tensor.conv2d` (tinygrad's order)."""
    return x.conv2d(weight, bias, groups, stride, dilation, padding)


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
           padding: Any = 0, dilation: IntOrSeq = 1, groups: int = 1) -> Tensor:
    """torch.nn.functional.conv2d: (input, weight, bias, stride, padding, dilation, groups)."""
    return x.conv2d(weight, bias, groups, stride, dilation, padding)


def conv3d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrSeq = 1,
           padding: Any = 0, dilation: IntOrSeq = 1, groups: int = 1) -> Tensor:
    return x.conv2d(weight, bias, groups, stride, dilation, padding)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False) -> Tensor:
    return q.scaled_dot_product_attention(k, v, attn_mask, dropout_p, is_causal)


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
    return reduce_loss((x - target).square(), reduction)


def l1_loss(x: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return reduce_loss((x - target).abs(), reduction)


def binary_cross_entropy(p: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)), logs clamped at -100 as torch."""
    return p.binary_crossentropy(target, reduction)


def binary_cross_entropy_with_logits(logits: Tensor, target: Tensor, reduction: str = "mean", *,
                                     pos_weight: Tensor | None = None) -> Tensor:
    """BCE on sigmoid(logits), computed as softplus so large logits stay finite."""
    return logits.binary_crossentropy_logits(target, reduction, pos_weight)


def smooth_l1_loss(x: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    d = (x - target).abs()
    loss = d * 0.5 * d / beta if beta > 0 else d
    return reduce_loss((d < beta).where(loss, d - 0.5 * beta), reduction)


def huber_loss(x: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    d = (x - target).abs()
    return reduce_loss((d < delta).where(0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


def kl_div(log_q: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """sum target * (log target - log_q); 'batchmean' divides the sum by the batch size."""
    loss = target.exp() * (target - log_q) if log_target else target.xlogy(target) - target * log_q
    if reduction == "batchmean":
        return loss.sum() / log_q.shape[0]
    return reduce_loss(loss, reduction)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    n = (x1.square().sum(dim) * x2.square().sum(dim)).sqrt().maximum(eps)
    return (x1 * x2).sum(dim) / n


def glu(x: Tensor, dim: int = -1) -> Tensor:
    a, b = x.chunk(2, dim)
    return a * b.sigmoid()
