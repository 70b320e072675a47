# python/kiln/optim.py: kiln.optim, torch.optim's spelling of kiln.nn's optimizers (SGD, Adam over model.parameters()).
"""``import kiln.optim as optim; optim.SGD(net.parameters(), lr=0.001, momentum=0.9)``: kiln.nn.SGD and
kiln.nn.Adam, which update the parameters in place with one fused kernel each (libkiln-nn's optimizers)."""
from .nn import SGD, Adam  # noqa: F401

__all__ = ["SGD", "Adam"]
