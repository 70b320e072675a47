# python/tests/test_tensors.py: creation functions, attributes, views, conversions to and from host data, .to and .copy, printing and pickling.
import pickle

import numpy as np
import pytest

import kiln
from conftest import host


def test_creation_functions(cpu1):
    assert host(kiln.zeros((2, 3))).tolist() == [[0.0] * 3] * 2
    assert host(kiln.ones(4)).tolist() == [1.0] * 4
    assert host(kiln.full((2, 2), 7.5)).tolist() == [[7.5, 7.5], [7.5, 7.5]]
    assert kiln.empty((3, 0)).shape == (3, 0)
    t = kiln.ones((2, 3), kiln.int32, device=cpu1)
    assert t.dtype == kiln.int32 and t.device is cpu1 and host(t).dtype == np.int32
    assert kiln.zeros(()).shape == () and kiln.zeros(()).item() == 0.0
    like = kiln.full_like(t, 3)
    assert like.dtype == kiln.int32 and like.device is cpu1 and like.tolist() == [[3] * 3] * 2
    assert kiln.zeros_like(t, dtype="float32").dtype == kiln.float32
    assert kiln.ones_like(t).tolist() == [[1] * 3] * 2
    assert kiln.empty_like(t).shape == (2, 3)


def test_arange_follows_numpy():
    assert kiln.arange(5).tolist() == list(range(5)) and kiln.arange(5).dtype == kiln.int32
    assert kiln.arange(2, 11, 3).tolist() == [2, 5, 8]
    np.testing.assert_allclose(host(kiln.arange(0.0, 1.0, 0.25)), np.arange(0.0, 1.0, 0.25))
    assert kiln.arange(0.5, 3).dtype == kiln.float32
    assert kiln.arange(4, dtype=kiln.float32).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_tensor_from_host_data(cpu1):
    assert kiln.tensor([[1, 2], [3, 4]]).dtype == kiln.int32
    assert kiln.tensor([[1, 2.5], [3, 4]]).dtype == kiln.float32
    assert kiln.tensor(3.0).shape == () and kiln.tensor(3.0).item() == 3.0
    assert kiln.tensor([]).shape == (0,)
    # Arrays keep their dtype (a float64 array stays float64).
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    t = kiln.tensor(a, device=cpu1)
    assert t.dtype == kiln.float64 and t.device is cpu1 and t.shape == (3, 4)
    np.testing.assert_array_equal(host(t), a)
    # Non-contiguous ones go through NumPy, still in their dtype.
    np.testing.assert_array_equal(host(kiln.tensor(a.T)), a.T)
    assert kiln.tensor(a.T).dtype == kiln.float64
    assert kiln.tensor(np.arange(5, dtype=np.int64)).tolist() == [0, 1, 2, 3, 4]
    assert kiln.tensor(np.array([True, False])).tolist() == [True, False]
    assert kiln.tensor(np.arange(3, dtype=np.uint8)).dtype == kiln.uint8
    assert kiln.tensor(a, dtype=kiln.float32).dtype == kiln.float32
    assert kiln.tensor([1, 2], dtype="float32").tolist() == [1.0, 2.0]
    assert kiln.asarray(np.float32(2.5)).item() == 2.5
    with pytest.raises(kiln.ShapeMismatchError):
        kiln.tensor([[1, 2], [3]])
    with pytest.raises(TypeError):
        kiln.tensor(["a"])
    with pytest.raises(OverflowError):
        kiln.tensor(np.array([2**40]), dtype=kiln.int32)


def test_attributes():
    t = kiln.zeros((2, 3, 4))
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and len(t) == 2
    assert t.strides == (12, 4, 1) and t.is_contiguous and t.itemsize == 4 and t.nbytes == 96
    assert t.dtype == kiln.float32 and t.dtype == "float32" and str(t.dtype) == "float32"
    assert repr(kiln.int32) == "kiln.int32" and kiln.int32.itemsize == 4
    assert t.device is kiln.default_device()
    with pytest.raises(TypeError):
        len(kiln.zeros(()))


def test_views_and_layout():
    a = kiln.arange(6, dtype=kiln.float32)
    m = a.reshape(2, 3)
    assert m.shape == (2, 3) and a.reshape((3, -1)).shape == (3, 2)
    assert m.T.shape == (3, 2) and not m.T.is_contiguous
    np.testing.assert_array_equal(host(m.T), np.arange(6).reshape(2, 3).T)
    assert m.T.contiguous().is_contiguous
    assert m.contiguous() is m
    c = kiln.zeros((2, 3, 4))
    assert c.permute(2, 0, 1).shape == (4, 2, 3) and c.transpose().shape == (4, 3, 2)
    assert c.transpose((1, 0, 2)).shape == (3, 2, 4) and c.swapaxes(0, 2).shape == (4, 3, 2)
    assert c.flatten().shape == (24,) and kiln.reshape(c, (6, 4)).shape == (6, 4)
    with pytest.raises(kiln.ShapeMismatchError):
        a.reshape(4, 2)
    with pytest.raises(kiln.InvalidArgumentError):
        c.permute(0, 1)


def test_astype():
    f = kiln.tensor([1.7, -1.7, 2.5])
    assert f.astype(kiln.int32).tolist() == [1, -1, 2]
    assert f.astype(np.int32).dtype == kiln.int32
    assert kiln.astype(kiln.tensor([1, 2]), float).dtype == kiln.float32
    assert f.astype("float64").dtype == kiln.float64
    with pytest.raises(kiln.DtypeMismatchError):
        f.astype("uint16")


def test_reading_values():
    t = kiln.tensor([[1.5, 2.0]])
    assert t.tolist() == [[1.5, 2.0]]
    assert kiln.tensor([4]).item() == 4 and isinstance(kiln.tensor([4]).item(), int)
    assert float(kiln.tensor(2.5)) == 2.5 and int(kiln.tensor(7)) == 7
    assert bool(kiln.tensor(1.0)) and not bool(kiln.tensor(0))
    with pytest.raises(kiln.InvalidArgumentError):
        bool(t)
    with pytest.raises(kiln.InvalidArgumentError):
        t.item()


def test_asarray_is_a_copy():
    t = kiln.ones((2, 2))
    a = np.asarray(t)
    assert a.dtype == np.float32 and a.flags.writeable and a.flags.owndata
    a[0, 0] = 5
    assert t.tolist() == [[1.0, 1.0], [1.0, 1.0]], "np.asarray copies: writing the copy leaves the tensor alone"
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert t.numpy().tolist() == [[1.0, 1.0], [1.0, 1.0]]
    with pytest.raises(ValueError):
        t.__array__(copy=False)


def test_to_is_identity_on_the_same_device(cpu, cpu1):
    x = kiln.ones((2, 3), device=cpu)
    assert x.to(cpu) is x and x.to("cpu:0") is x and x.to(device=cpu) is x
    z = x.to(cpu1)
    assert z is not x and z.device is cpu1 and z.tolist() == x.tolist()
    assert z.to(cpu1) is z
    c = x.copy()
    assert c is not x and c.device is cpu and c.tolist() == x.tolist()
    c2 = x.copy(cpu1)
    assert c2.device is cpu1
    assert z.cpu() is not z and z.cpu().device is kiln.device("cpu")
    assert x.cpu() is x


def test_copy_from_keeps_work_on_the_device():
    log = kiln.zeros(4)
    for i in range(4):
        log.copy_from(kiln.full((), i + 0.5), i)
    assert log.tolist() == [0.5, 1.5, 2.5, 3.5]
    with pytest.raises(kiln.InvalidArgumentError):
        log.copy_from(kiln.ones(3), 2)
    with pytest.raises(kiln.DtypeMismatchError):
        log.copy_from(kiln.ones(1, kiln.int32))


def test_random_tensors_are_reproducible():
    a = kiln.rand((3, 4), seed=5)
    b = kiln.uniform((3, 4), seed=5)
    assert a.tolist() == b.tolist()
    v = host(kiln.uniform((1000,), -2.0, 3.0, seed=1))
    assert v.min() >= -2.0 and v.max() < 3.0
    n = host(kiln.normal((20000,), 1.0, 2.0, seed=2))
    assert abs(n.mean() - 1.0) < 0.1 and abs(n.std() - 2.0) < 0.1
    kiln.manual_seed(42)
    first = kiln.rand(4).tolist()
    kiln.manual_seed(42)
    assert kiln.rand(4).tolist() == first
    assert kiln.randn(4).tolist() != first


def test_random_tensors_in_every_float_dtype():
    f32 = kiln.uniform((1000,), -2.0, 3.0, seed=3)
    for dt in (kiln.float16, kiln.bfloat16):
        t = kiln.uniform((1000,), -2.0, 3.0, seed=3, dtype=dt)
        assert t.dtype == dt
        assert t.tolist() == f32.astype(dt).tolist()
    d = kiln.normal((1000,), 1.0, 2.0, seed=3, dtype=kiln.float64)
    assert d.dtype == kiln.float64
    assert d.tolist() == kiln.normal((1000,), 1.0, 2.0, seed=3, dtype=kiln.float64).tolist()
    with pytest.raises(kiln.DtypeMismatchError):
        kiln.uniform((4,), dtype=kiln.int32)


def test_repr_shows_values_and_device(cpu1):
    t = kiln.ones((2, 3), device=cpu1)
    assert repr(t) == "tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='cpu:1')"
    assert "dtype=int32" in repr(kiln.arange(3))


def test_pickle_copies_through_the_host(cpu1):
    t = kiln.arange(6, dtype=kiln.float32, device=cpu1).reshape(2, 3)
    u = pickle.loads(pickle.dumps(t))
    assert u.device is cpu1 and u.tolist() == t.tolist() and u.dtype == t.dtype


def test_tensors_hash_by_identity():
    a, b = kiln.ones(2), kiln.ones(2)
    assert len({a, b}) == 2 and a in {a}


def test_many_tensors_are_freed():
    # The free list and kiln's pool: a loop of results neither grows memory nor breaks.
    d = kiln.default_device()
    a = kiln.ones(1024)
    d.synchronize()
    for _ in range(2000):
        a = a + 1
    assert a.tolist()[0] == 2001.0
    stats = d.memory_stats()
    assert stats["in_use_bytes"] < 64 * 1024 * 1024


def test_int32_overflow_names_the_value():
    # The message shows the value (not a literal %g, nor one read after it
    # was freed), and the dtype's range.
    for data in ([2**40], [1, -(2**40)], 2**40):
        with pytest.raises(OverflowError) as e:
            kiln.tensor(data)
        text = str(e.value)
        assert "%g" not in text and "1099511627776" in text and "int32" in text
    with pytest.raises(OverflowError, match=r"element 1 \(4294967296\) does not fit in int32"):
        kiln.tensor(np.array([1, 2**32], dtype=np.int64), dtype=kiln.int32)
    assert kiln.tensor([2**31 - 1, -(2**31)]).tolist() == [2**31 - 1, -(2**31)]


def test_creation_refuses_values_the_dtype_cannot_hold():
    with pytest.raises(OverflowError, match=r"full: fill_value 1099511627776 does not fit in int32"):
        kiln.full((2,), 2**40, dtype=kiln.int32)
    with pytest.raises(OverflowError, match=r"full_like: fill_value -2147483649 does not fit in int32"):
        kiln.full_like(kiln.zeros(2, dtype=kiln.int32), -(2**31) - 1)
    with pytest.raises(OverflowError, match=r"full: fill_value 1e\+300 does not fit in float32"):
        kiln.full((2,), 1e300)
    with pytest.raises(OverflowError, match=r"arange: the last value 2147483649 does not fit in int32"):
        kiln.arange(2**31 - 2, 2**31 + 2)
    with pytest.raises(OverflowError, match=r"arange: start -2147483649 does not fit in int32"):
        kiln.arange(-(2**31) - 1, 0, 2**30)
    # The edges still work, and float32 takes what int32 cannot.
    assert kiln.full((2,), 2**31 - 1, dtype=kiln.int32).tolist() == [2**31 - 1] * 2
    assert kiln.arange(2**31 - 3, 2**31 - 1).tolist() == [2**31 - 3, 2**31 - 2]
    assert kiln.full((1,), 2**40).tolist() == [2.0**40]
    assert kiln.full((1,), float("inf")).tolist() == [float("inf")]


@pytest.mark.parametrize("name, call", [
    ("axis", lambda t: t.sum(axis=2**32)),
    ("axis", lambda t: kiln.sum(t, axis=2**32 + 1)),
    ("axes[0]", lambda t: t.permute(2**32 + 1, 0)),
    ("axes[1]", lambda t: t.transpose((1, 2**32))),
    ("stride", lambda t: kiln.conv2d(t.reshape(1, 1, 2, 3), kiln.ones((1, 1, 1, 1)), stride=2**32 + 1)),
    ("padding[1]", lambda t: kiln.conv2d(t.reshape(1, 1, 2, 3), kiln.ones((1, 1, 1, 1)), padding=(0, 2**32))),
    ("dilation", lambda t: kiln.conv2d(t.reshape(1, 1, 2, 3), kiln.ones((1, 1, 1, 1)), dilation=2**32 + 1)),
    ("kernel_size", lambda t: kiln.max_pool2d(t.reshape(1, 1, 2, 3), 2**32 + 1)),
    ("stride", lambda t: kiln.max_pool2d(t.reshape(1, 1, 2, 3), 1, stride=-(2**32) + 1)),
])
def test_int_arguments_past_32_bits_are_refused(name, call):
    # 2**32 + 1 kept modulo 2**32 would be 1, a valid value: refused instead.
    t = kiln.ones((2, 3))
    with pytest.raises(OverflowError) as e:
        call(t)
    assert str(e.value).startswith(name + " ") and "must lie in [-2147483648, 2147483647]" in str(e.value)
