# python/tests/test_errors.py: kiln's errors as Python exceptions: the class per status, its built-in base, kiln's message, the device mismatch of the chapter.
import numpy as np
import pytest

import kiln


def test_the_mismatch_is_an_exception_with_kiln_message(cpu, cpu1):
    x = kiln.ones((2, 3), device=cpu)
    y = kiln.rand((2, 3), device=cpu1)
    with pytest.raises(kiln.DeviceMismatchError) as e:
        x + y
    err = e.value
    assert isinstance(err, kiln.Error) and isinstance(err, RuntimeError)
    assert err.status == 3 and err.status_name == "DEVICE_MISMATCH"
    message = str(err)
    assert "cpu:0" in message and "cpu:1" in message and "kiln never copies implicitly" in message
    assert "to(" in message
    # The fix the message names works.
    assert (x.to(cpu1) + y).device is cpu1
    for fn in (lambda: x @ y.T, lambda: kiln.maximum(x, y), lambda: kiln.conv2d(x.reshape(1, 1, 2, 3),
                                                                                   y.reshape(1, 1, 2, 3))):
        with pytest.raises(kiln.DeviceMismatchError):
            fn()


def test_every_status_has_a_class():
    classes = {name: getattr(kiln, name) for name in dir(kiln) if name.endswith("Error") and name != "Error"}
    assert len(classes) == 16
    assert {c.status for c in classes.values()} == set(range(1, 17))
    for c in classes.values():
        assert issubclass(c, kiln.Error) and c.__module__ == "kiln"
    assert issubclass(kiln.ShapeMismatchError, ValueError)
    assert issubclass(kiln.DtypeMismatchError, TypeError)
    assert issubclass(kiln.NotFoundError, LookupError)
    assert issubclass(kiln.OutOfMemoryError, MemoryError)
    assert issubclass(kiln.IOError, OSError)
    assert issubclass(kiln.UnsupportedError, NotImplementedError)
    assert issubclass(kiln.IndexOutOfRangeError, IndexError)
    assert kiln.Error.status is None


def test_shape_and_dtype_errors_name_the_values():
    with pytest.raises(kiln.ShapeMismatchError) as e:
        kiln.ones((2, 3)) + kiln.ones((4,))
    assert "[2, 3]" in str(e.value) or "2, 3" in str(e.value)
    # Two dtypes promote (docs/dtypes.md); one without kernels is refused.
    assert (kiln.ones(3) + kiln.ones(3, kiln.int32)).dtype == kiln.float32
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.zeros((-1, 2))
    with pytest.raises(kiln.DtypeMismatchError, match="'complex64' is not one kiln has"):
        kiln.zeros(2, dtype="complex64")


def test_foreign_operands_are_type_errors():
    t = kiln.ones(3)
    with pytest.raises(TypeError):
        t + "a"
    with pytest.raises(TypeError):
        t + [1, 2, 3]
    # NumPy arrays are not converted behind the user's back (a copy is explicit).
    with pytest.raises(TypeError):
        t + np.ones(3, np.float32)
    with pytest.raises(TypeError):
        np.ones(3, np.float32) + t
    with pytest.raises(TypeError):
        kiln.exp(np.ones(3))
    with pytest.raises(TypeError):
        kiln.ones(3, device=3.5)


def test_errors_do_not_leak_between_calls():
    with pytest.raises(kiln.Error):
        kiln.device("nosuchbackend:0")
    assert kiln.ones(2).tolist() == [1.0, 1.0]


def test_users_can_raise_and_catch_kiln_errors():
    with pytest.raises(kiln.Error):
        raise kiln.NotFoundError("mine")
    try:
        kiln.device("cpu:9")
    except LookupError as e:
        assert isinstance(e, kiln.NotFoundError)


def test_a_label_out_of_range_is_an_index_error(all_devices):
    # As PyTorch: cross_entropy with a label outside [0, C) raises IndexError
    # naming the first bad label, at the next read (the check is made on the
    # device), on every device and through the tape.
    logits = np.linspace(-1, 1, 40, dtype=np.float32).reshape(4, 10)
    for dev in all_devices:
        labels = np.array([1, 12, -1, 3], dtype=np.int32)
        loss = kiln.cross_entropy(kiln.tensor(logits, device=dev), kiln.tensor(labels, device=dev))
        with pytest.raises(IndexError) as e:
            float(loss)
        assert isinstance(e.value, kiln.IndexOutOfRangeError)
        assert "label 12 at position 1 is outside [0, 10)" in str(e.value)
        good = kiln.cross_entropy(kiln.tensor(logits, device=dev), kiln.tensor(np.array([1, 2, 3, 4], dtype=np.int32),
                                                                               device=dev))
        assert np.isfinite(float(good))
    tape = kiln.nn.Tape()
    h = kiln.tensor(logits)
    with pytest.raises(IndexError, match="label -1 at position 2"):
        tape.cross_entropy(h, kiln.tensor(np.array([0, 1, -1, 3], dtype=np.int32))).item()
