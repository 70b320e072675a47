# python/tests/test_array_api.py: kiln.array_api's own rules, quickly (the standard's whole suite runs in scripts/array_api.sh).
import numpy as np
import pytest

import kiln
import kiln.array_api as xp

from conftest import host


def test_the_namespace_of_every_tensor():
    x = xp.asarray([1.0, 2.0])
    assert x.__array_namespace__() is xp and x.__array_namespace__(api_version="2021.12") is xp
    with pytest.raises(ValueError, match="2021.12 revision, not '2023.12'"):
        x.__array_namespace__(api_version="2023.12")
    assert xp.__array_api_version__ == "2021.12"
    info = xp.__array_namespace_info__()
    assert info.default_dtypes()["real floating"] == xp.float32 and info.default_device() in info.devices()
    assert set(info.dtypes(kind="integral")) == {"int8", "int16", "int32", "int64", "uint8"}


def test_dtype_rules():
    assert xp.asarray(3).dtype == xp.int64 and xp.asarray(3.0).dtype == xp.float32
    assert xp.asarray(True).dtype == xp.bool and xp.asarray([1, 2.5]).dtype == xp.float32
    assert xp.result_type(xp.int8, xp.int16) == xp.int16 and xp.result_type(xp.float32, xp.float64) == xp.float64
    with pytest.raises(TypeError, match="do not promote"):
        xp.result_type(xp.int32, xp.float32)
    assert xp.can_cast(xp.int8, xp.int64) and not xp.can_cast(xp.int64, xp.int8)
    assert not xp.can_cast(xp.float32, xp.int32) and xp.can_cast(xp.float32, xp.float64)
    assert xp.finfo(xp.float32).eps == 2.0 ** -23 and xp.finfo(xp.float64).max == np.finfo(np.float64).max
    assert (xp.iinfo(xp.int8).min, xp.iinfo(xp.int8).max, xp.iinfo(xp.uint8).max) == (-128, 127, 255)
    assert xp.isdtype(xp.int32, "signed integer") and xp.isdtype(xp.float64, ("bool", "real floating"))
    with pytest.raises(ValueError, match="unknown kind"):
        xp.isdtype(xp.int32, "whole")


def test_functions_follow_the_standard():
    x = xp.asarray([[1.0, -2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(host(xp.sum(x, axis=())), host(x))  # () reduces nothing, as NumPy's
    np.testing.assert_array_equal(host(xp.sum(x, axis=1, keepdims=True)), [[-1.0], [7.0]])
    np.testing.assert_array_equal(host(xp.where(x > 0, x, 0.0)), [[1.0, 0.0], [3.0, 4.0]])
    np.testing.assert_array_equal(host(xp.eye(2, 3, k=1)), np.eye(2, 3, k=1))
    np.testing.assert_allclose(host(xp.linspace(0.0, 1.0, 5)), np.linspace(0, 1, 5))
    np.testing.assert_array_equal(host(xp.tril(x)), np.tril(host(x)))
    np.testing.assert_allclose(host(xp.std(x, axis=0, correction=1)), np.std(host(x), axis=0, ddof=1), rtol=1e-6)
    assert host(xp.all(x > -3)) and not host(xp.any(x > 5))
    assert xp.concat([x, x], axis=None).shape == (8,) and xp.expand_dims(x, 0).shape == (1, 2, 2)
    assert x.to_device("cpu:0").device is kiln.device("cpu:0")
    with pytest.raises(NotImplementedError, match="kiln.array_api.sin: no kiln operation computes it yet"):
        xp.sin(x)
