# python/kiln/nn/functional.py: kiln.nn.functional, torch.nn.functional's spellings over kiln's operations (recorded for backward() like any op).
"""torch.nn.functional's names for kiln's operations::

    import kiln.nn.functional as F
    x = F.max_pool2d(F.relu(F.conv2d(x, w, b)), 2)
    loss = F.cross_entropy(F.linear(x.flatten(1), w2, b2), labels)

Each is the kiln operation of that name: recorded for ``backward()`` when an
operand requires grad, exactly as the method or operator spelling.
"""
from .. import _kiln

relu = _kiln.relu
sigmoid = _kiln.sigmoid
tanh = _kiln.tanh
softmax = _kiln.softmax
log_softmax = _kiln.log_softmax
cross_entropy = _kiln.cross_entropy
conv2d = _kiln.conv2d
max_pool2d = _kiln.max_pool2d


def linear(x, weight, bias=None):
    """x @ weight.T + bias, as torch.nn.functional.linear."""
    y = _kiln.matmul(x, weight, transpose_b=True)
    return y if bias is None else y + bias


def mse_loss(input, target):
    return ((input - target) ** 2).mean()


def flatten(x, start_dim=0):
    return x.flatten(start_dim)


__all__ = ["relu", "sigmoid", "tanh", "softmax", "log_softmax", "cross_entropy", "conv2d", "max_pool2d", "linear",
           "mse_loss", "flatten"]
