# python/tests/test_indexing.py: basic indexing (ints, slices with steps, None, ...) as views without copies, advanced indexing (integer tensors, lists, arrays, boolean masks) as NumPy does it, and assignment through both.
import numpy as np
import pytest

import kiln


def grid():
    return kiln.arange(12).float().view(3, 4)


def shares_memory(view, base):
    # The view's first element lies inside the base's memory: a view, not a copy.
    start, v = np.from_dlpack(base).ctypes.data, np.from_dlpack(view).ctypes.data
    return start <= v < start + base.nbytes


def test_reading_matches_numpy_and_makes_views():
    x, a = grid(), np.arange(12, dtype=np.float32).reshape(3, 4)
    for key in [0, -1, (1, 2), (slice(1, 3), slice(None, None, 2)), (Ellipsis, 1), (None, 1), (slice(None), None, 0),
                (slice(None, None, 2), Ellipsis, None), slice(5, 9), (slice(0, 3, 2), slice(1, None, 3)), (),
                (Ellipsis,), (0, Ellipsis, 3)]:
        got = x[key]
        assert got.shape == a[key].shape and got.tolist() == a[key].tolist(), key
    v = x[1:3, ::2]
    assert v.strides == (4, 2) and not v.is_contiguous and shares_memory(v, x)
    assert x[1].is_contiguous and shares_memory(x[2], x) and x[2, 3].item() == 11.0
    assert x[kiln.tensor(1)].tolist() == [4.0, 5.0, 6.0, 7.0]  # a 0-d integer tensor is an int
    assert x[2:1].shape == (0, 4) and x[:, 10:].shape == (3, 0)


def test_views_see_later_writes():
    x = grid()
    row = x[1]
    x += 1
    assert row.tolist() == [5.0, 6.0, 7.0, 8.0]


def test_assignment_copies_into_the_view():
    x = grid()
    x[0] = 7
    x[1:3, ::2] = kiln.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    x[2, 1] = 0.5
    x[..., 3] = kiln.tensor([30, 31, 32])  # int32 into float32: converted
    assert x.tolist() == [[7.0, 7.0, 7.0, 30.0], [-1.0, 5.0, -2.0, 31.0], [-3.0, 0.5, -4.0, 32.0]]
    x[:, ::2] += 100  # read, add, write back through the strided view
    assert x[:, 0].tolist() == [107.0, 99.0, 97.0] and x[:, 1].tolist() == [7.0, 5.0, 0.5]
    x[1:] = x[:2]  # overlapping: read before written
    assert x[2].tolist() == [-1.0 + 100, 5.0, -2.0 + 100, 31.0]
    x[0] = [1.0, 2.0, 3.0, 4.0]
    assert x[0].tolist() == [1.0, 2.0, 3.0, 4.0]
    i = kiln.zeros(4, dtype=kiln.int32)
    i[1:3] = 5
    assert i.tolist() == [0, 5, 5, 0]


@pytest.mark.parametrize("key, error, words", [
    ((0, [0, 1]), TypeError, "the advanced indices come first"),
    ((slice(None), np.array([0, 1])), TypeError, "index_select(dim, idx)"),
    (([0, 1], 1), TypeError, "the advanced indices come first"),
    (kiln.tensor([0.5]), IndexError, "must be integer or bool"),
    (([0, 1], [True, False]), IndexError, "a boolean mask goes alone"),
    (np.array([True, False]), IndexError, "the shape of the tensor's first 1 dims"),
    (([0, 5], [0, 1]), IndexError, "index 5 is out of range for dim 0 of size 3"),
    (([0, 1], [0, 1, 2]), IndexError, "do not broadcast"),
    (True, TypeError, "an int, a slice, None or ..."),
    (1.5, TypeError, "an int, a slice, None or ..."),
    (slice(None, None, -1), ValueError, "steps >= 1"),
    (5, IndexError, "index 5 is out of range for dim 0 of size 3"),
    ((0, 0, 0), IndexError, "too many indices"),
    ((Ellipsis, Ellipsis), IndexError, "single ellipsis"),
])
def test_index_errors_name_the_fix(key, error, words):
    x = grid()
    with pytest.raises(error) as e:
        x[key]
    assert words in str(e.value)
    with pytest.raises(error):
        x[key] = 0


def test_assignment_errors():
    x, i = grid(), kiln.zeros(3, dtype=kiln.int32)
    with pytest.raises(kiln.ShapeMismatchError):
        x[0] = kiln.ones(3)
    with pytest.raises(kiln.DtypeMismatchError, match="convert the tensor first"):
        i[0] = 2.5
    with pytest.raises(kiln.DeviceMismatchError):
        x[0] = kiln.ones(4, device="cpu:1")
    with pytest.raises(OverflowError, match="300 does not fit in uint8"):
        kiln.zeros(2, dtype=kiln.uint8)[0] = 300
    with pytest.raises(TypeError, match="cannot be deleted"):
        del x[0]


def test_advanced_indexing_matches_numpy():
    a = np.arange(60, dtype=np.float32).reshape(5, 4, 3)
    x = kiln.tensor(a)
    idx = np.array([4, 0, -1, 2, 2])
    for key in [idx, idx.reshape(5, 1), [1, 3], kiln.tensor(idx), (idx, np.array([0, 3, 1, 2, 2])),
                (np.array([[0], [4]]), np.array([1, 2, 3])), ([0, 1], [1, 2], [2, 0]), (idx, slice(None)),
                (idx, Ellipsis)]:
        np_key = tuple(k.numpy() if isinstance(k, kiln.Tensor) else k for k in key) if isinstance(key, tuple) \
            else (key.numpy() if isinstance(key, kiln.Tensor) else key)
        want = a[np_key]
        got = x[key]
        assert got.shape == want.shape, key
        assert np.array_equal(got.numpy(), want), key
    mask = a[:, 0, 0] > 20
    assert np.array_equal(x[mask].numpy(), a[mask])
    assert np.array_equal(x[kiln.tensor(mask)].numpy(), a[mask])
    m2 = a[..., 0] % 2 == 0
    assert np.array_equal(x[m2].numpy(), a[m2])
    assert x[np.zeros(5, dtype=bool)].shape == (0, 4, 3)
    # Every dtype reads through the gather.
    for dt in [kiln.int64, kiln.float16, kiln.bfloat16, kiln.bool, kiln.uint8]:
        y = x.to(dtype=dt)
        assert np.array_equal(y[idx].to(dtype=kiln.float32).numpy(), y.to(dtype=kiln.float32).numpy()[idx])


def test_advanced_index_out_of_range_on_the_device():
    x = kiln.tensor(np.arange(6, dtype=np.float32))
    with pytest.raises(IndexError, match="index 9 at position 1"):
        x[kiln.tensor([1, 9])].numpy()
    assert x[kiln.tensor([-6])].item() == 0.0


def test_advanced_assignment():
    a = np.zeros((4, 3), dtype=np.float32)
    x = kiln.tensor(a)
    x[[0, 2]] = 7.0
    a[[0, 2]] = 7.0
    x[np.array([1, -1]), np.array([2, 0])] = kiln.tensor([5.0, 6.0])
    a[np.array([1, -1]), np.array([2, 0])] = [5.0, 6.0]
    mask = a > 6
    x[mask] = -1.0
    a[mask] = -1.0
    x[kiln.tensor([3])] = np.array([[1, 2, 3]], dtype=np.float32)
    a[[3]] = [1, 2, 3]
    assert np.array_equal(x.numpy(), a)
    # Repeated indices: the last write wins, as in PyTorch and NumPy.
    y = kiln.zeros(3)
    y[[1, 1, 1]] = kiln.tensor([1.0, 2.0, 3.0])
    assert y.tolist() == [0.0, 3.0, 0.0]
    with pytest.raises(kiln.InvalidArgumentError, match="contiguous"):
        x[:, 1:][[0]] = 1.0


def test_advanced_indexing_on_every_device(all_devices):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    for d in all_devices:
        x = kiln.tensor(a, device=d)
        assert np.array_equal(x[[3, 0, -1]].numpy(), a[[3, 0, -1]]), d
        assert np.array_equal(x[a[:, 0] > 2].numpy(), a[a[:, 0] > 2]), d
        x[[1, 2], [0, 2]] = 0.0
        b = a.copy()
        b[[1, 2], [0, 2]] = 0.0
        assert np.array_equal(x.numpy(), b), d


def test_index_methods_match_pytorch():
    torch = pytest.importorskip("torch")
    a = np.arange(15, dtype=np.float32).reshape(5, 3)
    src = np.ones((4, 3), dtype=np.float32)
    idx = np.array([0, 2, 2, 4])
    x, t = kiln.tensor(a), torch.from_numpy(a.copy())
    assert np.array_equal(x.index_select(0, idx).numpy(), t.index_select(0, torch.from_numpy(idx)).numpy())
    assert np.array_equal(x.index_select(1, [2, 0]).numpy(), a[:, [2, 0]])
    x.index_add_(0, idx, src, alpha=2.0)
    t.index_add_(0, torch.from_numpy(idx), torch.from_numpy(src), alpha=2.0)
    assert np.array_equal(x.numpy(), t.numpy())
    x.index_put_((kiln.tensor([1, 1, 3]),), kiln.tensor(5.0), accumulate=True)
    t.index_put_((torch.tensor([1, 1, 3]),), torch.tensor(5.0), accumulate=True)
    assert np.array_equal(x.numpy(), t.numpy())
    x.index_copy_(0, [4], np.zeros((1, 3), dtype=np.float32))
    t.index_copy_(0, torch.tensor([4]), torch.zeros(1, 3))
    assert np.array_equal(x.numpy(), t.numpy())
    with pytest.raises(IndexError, match="integer"):
        x.index_select(0, [0.5])
