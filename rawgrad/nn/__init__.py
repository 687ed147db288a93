"""Neural-network layers, losses, optimizers and state helpers on the lazy Tensor."""
from rawgrad.nn import optim, state
from rawgrad.nn.functional import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    conv_transpose2d,
    cross_entropy,
    l1_loss,
    mse_loss,
    nll_loss,
    sparse_categorical_crossentropy,
)
from rawgrad.nn.layers import (
    GELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    ConvTranspose2d,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool2d,
    ReLU,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from rawgrad.nn.module import Module
from rawgrad.tensor.autograd import enable_grad, no_grad

__all__ = ["optim", "state", "binary_cross_entropy", "binary_cross_entropy_with_logits", "conv_transpose2d",
           "cross_entropy", "l1_loss", "mse_loss", "nll_loss", "sparse_categorical_crossentropy",
           "BatchNorm", "BatchNorm1d", "BatchNorm2d", "Conv2d", "ConvTranspose2d", "Dropout", "Embedding",
           "GroupNorm", "LayerNorm", "Linear", "Module", "RMSNorm", "Sequential", "enable_grad", "no_grad",
           "AdaptiveAvgPool2d", "AvgPool2d", "Flatten", "GELU", "Identity", "LeakyReLU", "LogSoftmax",
           "MaxPool2d", "ReLU", "SiLU", "Sigmoid", "Softmax", "Tanh"]
