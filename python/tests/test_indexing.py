# python/tests/test_indexing.py: basic indexing (ints, slices with steps, None, ...) as views without copies, and assignment through them.
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
    ((kiln.tensor([0, 1]),), TypeError, "advanced indexing"),
    ([0, 1], TypeError, "advanced indexing"),
    (np.array([0, 1]), TypeError, "advanced indexing"),
    (True, TypeError, "advanced indexing"),
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
