# python/kiln/__init__.py: the kiln package: devices, tensors and their operations from the C extension kiln._kiln, DLPack exchange, and kiln.nn.
"""kiln from Python.

Every tensor lives on one device; operations run there, asynchronously, and
operands on two devices raise kiln.DeviceMismatchError instead of copying::

    import kiln
    x = kiln.ones((2, 3), device=kiln.try_gpu())
    print(x + x)

np.asarray(t) and t.numpy() copy to host memory; kiln.from_dlpack(a) and
np.from_dlpack(t) / torch.from_dlpack(t) share memory without a copy.

The dtypes: kiln.bool, int8, uint8, int16, int32, int64, float16, bfloat16,
float32, float64 (docs/dtypes.md). NumPy has no bfloat16: t.numpy() of one
raises TypeError; t.astype(kiln.float32).numpy() or np.asarray(t,
dtype=np.float32) convert it exactly.
"""
import os as _os

if _os.environ.get("KILN_PYTHON_EXTENSION_DIR"):
    # Development: the extension built by meson in kiln's build tree
    # (tests/meson.build), used with this source package.
    __path__.insert(0, _os.environ["KILN_PYTHON_EXTENSION_DIR"])

from . import _kiln  # noqa: E402
from ._kiln import *  # noqa: E402,F401,F403
from ._kiln import (  # noqa: E402,F401
    Device, DType, Error, Tensor, from_dlpack, kiln_version, HAS_NN,
    bool, int8, uint8, int16, int32, int64, float16, bfloat16, float32, float64,
)

__version__ = "0.1.0"

# kiln.bool is not star-exported: `from kiln import *` must not hide Python's bool.
__all__ = [name for name in dir(_kiln) if not name.startswith("_") and name not in ("nn", "HAS_NN", "bool")]


class no_grad:
    """``with kiln.no_grad():`` (or ``@kiln.no_grad()``): nothing is recorded, so
    results require no grad and in-place updates of parameters are allowed
    (``p -= lr * p.grad``), as in PyTorch. The mode is process-wide, not per
    thread; the previous one comes back on exit."""

    mode = False

    def __enter__(self):
        self._prev = _kiln._set_grad_enabled(self.mode)
        return self

    def __exit__(self, *exc):
        _kiln._set_grad_enabled(self._prev)
        return False

    def __call__(self, fn):
        import functools

        mode = self.mode

        @functools.wraps(fn)
        def run(*args, **kwargs):
            prev = _kiln._set_grad_enabled(mode)
            try:
                return fn(*args, **kwargs)
            finally:
                _kiln._set_grad_enabled(prev)

        return run


class enable_grad(no_grad):
    """Recording on again inside a ``kiln.no_grad()`` block (a context manager or decorator)."""

    mode = True


class set_grad_enabled(no_grad):
    """``torch.set_grad_enabled(mode)``: takes effect at the call, and as a context
    manager or decorator puts the previous mode back after."""

    def __init__(self, mode=True):
        self.mode = True if mode else False  # (kiln.bool is the dtype here)
        self._prev = _kiln._set_grad_enabled(self.mode)

    def __enter__(self):
        return self

    def __call__(self, fn):
        _kiln._set_grad_enabled(self._prev)  # as a decorator it applies per call only
        return super().__call__(fn)


__all__ += ["set_grad_enabled", "no_grad", "enable_grad"]


class trace:
    """Record every operation, copy and allocation into Trace Event Format JSON (docs/trace.md)::

        with kiln.trace("run.json") as t:
            y = x @ w
        print(t.summary)

    The file is created on entry (kiln.Error when it cannot be); the exit waits
    for the traced work, writes it and keeps the summary in ``t.summary``. One
    trace at a time in the process.
    """

    def __init__(self, path):
        self.path = _os.fspath(path)
        self.summary = None

    def __enter__(self):
        _kiln._trace_start(self.path)
        return self

    def __exit__(self, *exc):
        _kiln._trace_stop()
        self.summary = _kiln.trace_summary()
        return False


__all__.append("trace")


class trace_span:
    """A span of your own work on the trace's host track, like ``torch.profiler.record_function``::

        with kiln.trace("run.json"):
            with kiln.trace_span("load batch", category="phase"):
                x = load()

    The summary totals spans per category and name (docs/trace.md). Costs a
    clock read and nothing is recorded when no trace is on. ``bytes`` (the
    data the work moved) and ``detail`` (free text) show with the span.
    """

    def __init__(self, name, category="phase", bytes=0, detail=None):
        self.name, self.category, self.bytes, self.detail = name, category, int(bytes), detail
        self._t0 = 0

    def __enter__(self):
        self._t0 = _kiln._trace_clock_ns()
        return self

    def __exit__(self, *exc):
        _kiln._trace_span(self.category, self.name, self._t0, self.bytes, self.detail)
        return False


__all__.append("trace_span")


def _format_tensor(t):
    """repr(t): the values (read from the device: this waits for it) and where they live."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional
        return f"tensor({t.tolist()}, device='{t.device}')"
    values = np.asarray(t, dtype=np.float32) if t.dtype == bfloat16 else t.numpy()
    suffix = f", device='{t.device}'" + ("" if t.dtype == float32 else f", dtype={t.dtype.name}")
    body = np.array2string(values, separator=", ", prefix="tensor(", suffix=suffix)
    return f"tensor({body}{suffix})"


_kiln._set_repr_hook(_format_tensor)


def _rebuild_tensor(array, selector, dtype=None):
    """Unpickling: a tensor copied from host data onto the device named when it was pickled, in its dtype."""
    return tensor(array, dtype=dtype, device=selector)  # noqa: F405


# The star import bound `nn` to the extension's C submodule; kiln.nn is the
# Python module that wraps it.
globals().pop("nn", None)
if HAS_NN:
    from . import nn, optim  # noqa: E402,F401
