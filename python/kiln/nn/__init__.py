# python/kiln/nn/__init__.py: kiln.nn, libkiln-nn for Python: Fashion-MNIST and the batch loader, safetensors, the tape, layers, Sequential models, optimizers, the training loop, and torch-style Modules.
"""Training on kiln's devices.

As PyTorch users write it: ``class Net(kiln.nn.Module)`` with layers as
attributes, ``loss.backward()`` (autograd on tensors, recorded on
libkiln-nn's tape), ``kiln.optim.SGD(net.parameters(), ...)``,
``net.state_dict()``; see python/README.md and examples/oci_net.py. Below,
the same machinery used directly:

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
from .. import _kiln
from .. import no_grad

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

Sigmoid = _c.Sigmoid
Tanh = _c.Tanh


# ---- PyTorch's way: subclassed modules, loss.backward(), optimizers over parameters() ----------

_LAYER_TYPES = (Layer, Sequential)


def _tensor_of(p):
    """A registered parameter as a tensor that requires grad (a kiln.nn.Parameter reads through its value)."""
    return _kiln._param_tensor(p) if isinstance(p, Parameter) else p


class Module:
    """The base of models written as ``torch.nn.Module`` subclasses::

        class Net(kiln.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = kiln.nn.Linear(784, 100)
                self.fc2 = kiln.nn.Linear(100, 10)

            def forward(self, x):
                return self.fc2(kiln.relu(self.fc1(x.flatten(1))))

    Attributes register as in PyTorch: kiln.nn layers, Sequentials and Modules
    as submodules; kiln.nn.Parameter objects and float32 tensors that require
    grad as parameters (reading one gives a tensor that requires grad).
    Calling the module runs ``forward``; ops on tensors that require grad are
    recorded (on libkiln-nn's tape) unless inside ``kiln.no_grad()``, and
    ``loss.backward()`` fills each parameter's ``.grad``.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def _registry(self):
        d = self.__dict__
        if "_parameters" not in d:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() before assigning "
                                 "layers or parameters")
        return d["_parameters"], d["_modules"]

    def __setattr__(self, name, value):
        params, modules = self._registry()
        params.pop(name, None)
        modules.pop(name, None)
        self.__dict__.pop(name, None)
        if isinstance(value, Parameter) or (isinstance(value, _kiln.Tensor) and value.requires_grad and value.is_leaf):
            params[name] = value
        elif isinstance(value, (Module,) + _LAYER_TYPES):
            modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        if name in d.get("_parameters", ()):
            return _tensor_of(d["_parameters"][name])
        if name in d.get("_modules", ()):
            return d["_modules"][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        params, modules = self._registry()
        if params.pop(name, None) is None and modules.pop(name, None) is None:
            object.__delattr__(self, name)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward(): define forward(self, x) in the subclass")

    def named_children(self):
        return iter(self._registry()[1].items())

    def children(self):
        return (m for _, m in self.named_children())

    def named_parameters(self, prefix=""):
        """(name, tensor) pairs, with state_dict's names ('fc1.weight'); each tensor requires grad."""
        params, modules = self._registry()
        for name, p in params.items():
            yield prefix + name, _tensor_of(p)
        for name, m in modules.items():
            if isinstance(m, Module):
                yield from m.named_parameters(prefix + name + ".")
            elif isinstance(m, Layer):
                for kind in ("weight", "bias"):
                    p = getattr(m, kind)
                    if p is not None:
                        yield f"{prefix}{name}.{kind}", _kiln._param_tensor(p)
            else:
                for p in m.parameters():
                    yield f"{prefix}{name}.{p.name}", _kiln._param_tensor(p)

    def parameters(self):
        return (p for _, p in self.named_parameters())

    def state_dict(self):
        """{name: tensor}: the values themselves (detached; a later step changes them), as torch's state_dict."""
        return {name: p.detach() for name, p in self.named_parameters()}

    def load_state_dict(self, state_dict, strict=True):
        """Copy values into the parameters by name (each converted to the parameter's device). With strict,
        a missing or unexpected name is a KeyError naming them all; a shape differing is a ValueError."""
        own = dict(self.named_parameters())
        missing = [n for n in own if n not in state_dict]
        unexpected = [n for n in state_dict if n not in own]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing {missing}, unexpected {unexpected} (strict=False loads the "
                           "names both have)")
        with no_grad():
            for name, p in own.items():
                if name not in state_dict:
                    continue
                src = state_dict[name]
                if not isinstance(src, _kiln.Tensor):
                    src = _kiln.tensor(src, device=p.device)
                if tuple(src.shape) != tuple(p.shape):
                    raise ValueError(f"load_state_dict: '{name}' has shape {tuple(src.shape)} in the state_dict, "
                                     f"{tuple(p.shape)} in the model")
                p.copy_from(src.to(p.device, dtype=_kiln.float32).contiguous())
        return self

    def to(self, device):
        """Move every parameter to ``device`` and return the module. Make the optimizer after, as in PyTorch."""
        params, modules = self._registry()
        for m in modules.values():
            m.to(device)
        for name, p in list(params.items()):
            if isinstance(p, Parameter):
                p.to(device)
            else:
                moved = p.detach().to(device)
                if moved.device is not p.device:
                    params[name] = moved.requires_grad_()
        return self

    def train(self, mode=True):
        """Set ``training`` here and in the Module children (kiln's layers have no train/eval difference:
        no dropout or batch norm yet)."""
        object.__setattr__(self, "training", bool(mode))
        for m in self._registry()[1].values():
            if isinstance(m, Module):
                m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            p.grad = None

    def __repr__(self):
        lines = [f"  ({name}): {m!r}".replace("\n", "\n  ") for name, m in self.named_children()]
        return f"{type(self).__name__}(" + ("\n" + "\n".join(lines) + "\n" if lines else "") + ")"


class CrossEntropyLoss(Module):
    """torch.nn.CrossEntropyLoss (mean over the batch): logits [N, C] float32, labels [N] int64 or int32."""

    def forward(self, logits, labels):
        return _kiln.cross_entropy(logits, labels)


class MSELoss(Module):
    """torch.nn.MSELoss (the mean of the squared differences)."""

    def forward(self, input, target):
        return ((input - target) ** 2).mean()


__all__ = [
    "Dataset", "Loader", "Parameter", "Tape", "Layer", "Sequential", "Optimizer",
    "FashionMNIST", "load_idx", "save_safetensors", "load_safetensors", "load_safetensors_into",
    "fashion_mnist_label_name", "shuffle_order", "FASHION_MNIST_DIR", "FASHION_MNIST_LABELS",
    "Linear", "Conv2d", "MaxPool2d", "ReLU", "Flatten", "preset",
    "SGD", "Adam", "optimizer_preset", "lr_cosine",
    "train_epoch", "evaluate", "seed_derive", "providers_used", "providers_reset",
    "Sigmoid", "Tanh", "Module", "CrossEntropyLoss", "MSELoss", "functional",
]

from . import functional  # noqa: E402
