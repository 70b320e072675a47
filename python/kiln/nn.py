# python/kiln/nn.py: kiln.nn, libkiln-nn for Python: Fashion-MNIST and the batch loader, safetensors, the tape, layers, Sequential models, optimizers and the training loop.
"""Training on kiln's devices.

Data: ``FashionMNIST('train')`` (Debian's dataset-fashion-mnist), ``Loader``,
``save_safetensors`` / ``load_safetensors``. Training: ``Tape`` records
differentiable operations; ``Linear``, ``Conv2d``, ``MaxPool2d``, ``ReLU``,
``Flatten`` and ``Sequential`` build models whose parameters (``Parameter``)
get gradients from ``tape.backward(loss)``; ``SGD`` and ``Adam`` update them in
place; ``train_epoch`` runs a whole epoch in C.

A step written out::

    tape = kiln.nn.Tape()
    for images, labels in loader:
        logits = model(images, tape)
        loss = tape.cross_entropy(logits, labels)
        tape.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""
from . import _kiln

if not _kiln.HAS_NN:  # pragma: no cover - depends on the build
    raise ImportError("kiln was built without libkiln-nn (kiln.nn): build kiln with zlib and json-c "
                      "(meson setup -Dnn=enabled) and reinstall the package")

_c = _kiln.nn

Dataset = _c.Dataset
Loader = _c.Loader
Parameter = _c.Parameter
Tape = _c.Tape
Layer = _c.Layer
Sequential = _c.Sequential
Optimizer = _c.Optimizer

FashionMNIST = _c.FashionMNIST
load_idx = _c.load_idx
save_safetensors = _c.save_safetensors
load_safetensors = _c.load_safetensors
load_safetensors_into = _c.load_safetensors_into
fashion_mnist_label_name = _c.fashion_mnist_label_name
shuffle_order = _c.shuffle_order
FASHION_MNIST_DIR = _c.FASHION_MNIST_DIR
FASHION_MNIST_LABELS = [_c.fashion_mnist_label_name(i) for i in range(10)]

Linear = _c.Linear
Conv2d = _c.Conv2d
MaxPool2d = _c.MaxPool2d
ReLU = _c.ReLU
Flatten = _c.Flatten
preset = Sequential.preset

SGD = _c.SGD
Adam = _c.Adam
optimizer_preset = _c.optimizer_preset
lr_cosine = _c.lr_cosine

train_epoch = _c.train_epoch
evaluate = _c.evaluate
seed_derive = _c.seed_derive
providers_used = _c.providers_used
providers_reset = _c.providers_reset

__all__ = [
    "Dataset", "Loader", "Parameter", "Tape", "Layer", "Sequential", "Optimizer",
    "FashionMNIST", "load_idx", "save_safetensors", "load_safetensors", "load_safetensors_into",
    "fashion_mnist_label_name", "shuffle_order", "FASHION_MNIST_DIR", "FASHION_MNIST_LABELS",
    "Linear", "Conv2d", "MaxPool2d", "ReLU", "Flatten", "preset",
    "SGD", "Adam", "optimizer_preset", "lr_cosine",
    "train_epoch", "evaluate", "seed_derive", "providers_used", "providers_reset",
]
