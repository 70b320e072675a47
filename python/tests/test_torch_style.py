# python/tests/test_torch_style.py: what PyTorch users write: shapes as varargs, keyword-only distribution parameters, size()/numel()/dim(), casts, views, reductions with dim=, cat/stack, comparisons, **, logical and in-place operators.
import operator

import pytest

import kiln


def test_creation_takes_sizes_as_varargs_or_one_sequence():
    assert kiln.rand(2, 3, 4).shape == (2, 3, 4)
    assert kiln.zeros((2, 3)).shape == (2, 3) and kiln.zeros([2, 3]).shape == (2, 3)
    assert kiln.zeros(2, 3).tolist() == [[0.0] * 3] * 2
    t = kiln.ones(2, 3, dtype=kiln.float64, device="cpu:0")
    assert t.dtype is kiln.float64 and t.device == "cpu:0" and t.tolist() == [[1.0] * 3] * 2
    assert kiln.empty(4).shape == (4,) and kiln.zeros().shape == () and kiln.zeros(size=(1, 2)).shape == (1, 2)
    assert kiln.zeros((2,), kiln.int32).dtype is kiln.int32  # NumPy's (shape, dtype)
    assert kiln.randn(3, 2, seed=1).shape == (3, 2) and kiln.randn(5, dtype=kiln.float64).dtype is kiln.float64
    u = kiln.rand(1000, low=5, high=6, seed=3)
    assert 5.0 <= u.min().item() and u.max().item() < 6.0
    assert kiln.rand(2, 3, seed=9).tolist() == kiln.rand((2, 3), seed=9).tolist() == kiln.uniform((2, 3), seed=9).tolist()
    assert kiln.randn(4, mean=10.0, std=0.0, seed=2).tolist() == [10.0] * 4


@pytest.mark.parametrize("call, words", [
    (lambda: kiln.rand(2, 3, 0.5), "keyword-only (low=, high="),
    (lambda: kiln.randn(2, 3, 1.0), "keyword-only (mean=, std="),
    (lambda: kiln.rand(2, 3, lo=1), "'lo' is an invalid keyword"),
    (lambda: kiln.ones(2, 3.0), "argument 2 (3.0) is not an int"),
    (lambda: kiln.zeros("2"), "the size must be ints"),
    (lambda: kiln.rand(2, dtype=kiln.int32), "float dtype"),
])
def test_creation_misuse_names_the_keyword(call, words):
    with pytest.raises(TypeError, match=None) as e:
        call()
    assert words in str(e.value)


def test_sizes_and_casts():
    t = kiln.tensor([[1.5, -2.0, 0.0], [3.0, 4.0, 5.0]])
    assert t.size() == (2, 3) == t.shape and t.size(1) == 3 and t.size(-2) == 2 and t.size(dim=0) == 2
    assert t.numel() == 6 and t.dim() == 2 == t.ndim
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        t.size(2)
    assert t.float() is t and t.double().dtype is kiln.float64 and t.half().dtype is kiln.float16
    assert t.long().tolist() == [[1, -2, 0], [3, 4, 5]] and t.long().dtype is kiln.int64
    assert t.int().dtype is kiln.int32 and t.bool().tolist() == [[True, True, False], [True, True, True]]
    assert t.to(kiln.float64).dtype is kiln.float64 and t.to("float64").dtype is kiln.float64
    assert t.to("cpu:0") is t and t.to(t) is t and t.to(dtype=kiln.int64, device="cpu:0").dtype is kiln.int64
    assert t.to("cpu:1", kiln.float64).device == "cpu:1" and t.to(kiln.float64, "cpu:1").dtype is kiln.float64
    c = t.clone()
    assert c is not t and c.tolist() == t.tolist() and c.__dlpack_device__() == t.__dlpack_device__()
    d = t.detach()
    assert d is not t and d.tolist() == t.tolist()
    with pytest.raises(TypeError, match="needs a device, a dtype"):
        t.to()


def test_views():
    x = kiln.arange(6).float()
    v = x.view(2, 3)
    assert v.shape == (2, 3) and v.view(-1).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert v.transpose(0, 1).tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]] and v.T.shape == (3, 2)
    assert v.permute(1, 0).tolist() == v.transpose(0, 1).tolist() and v.transpose().shape == (3, 2)
    with pytest.raises(kiln.InvalidArgumentError, match=r"use \.reshape"):
        v.T.view(6)
    assert v.T.reshape(6).tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0] and v.T.contiguous().view(6).shape == (6,)
    u = v.unsqueeze(0)
    assert u.shape == (1, 2, 3) and v.unsqueeze(-1).shape == (2, 3, 1) and u.squeeze().shape == (2, 3)
    assert u.squeeze(0).shape == (2, 3) and u.squeeze(1).shape == (1, 2, 3) and kiln.zeros(1, 1).squeeze().shape == ()
    assert kiln.tensor([1.0, 2.0]).expand(3, -1).tolist() == [[1.0, 2.0]] * 3


def test_reductions_with_dim_and_keepdim():
    t = kiln.tensor([[1.0, 5.0, 3.0], [7.0, 2.0, 9.0]])
    assert t.sum().item() == 27.0 and t.sum(dim=0).tolist() == [8.0, 7.0, 12.0] and t.sum(1).tolist() == [9.0, 18.0]
    assert t.sum(dim=(0, 1)).item() == 27.0 and t.sum((0, 1), keepdim=True).tolist() == [[27.0]]
    assert t.sum(axis=1, keepdims=True).tolist() == [[9.0], [18.0]] and kiln.sum(t, dim=-1).tolist() == [9.0, 18.0]
    assert t.mean(dim=1).tolist() == [3.0, 6.0] and t.mean((0, 1)).item() == 4.5
    values, indices = t.max(dim=1)
    assert values.tolist() == [5.0, 9.0] and indices.tolist() == [1, 2] and t.max(1).values.tolist() == [5.0, 9.0]
    assert t.max(axis=1).tolist() == [5.0, 9.0] and t.max().item() == 9.0  # NumPy's axis=: the values
    assert t.min().item() == 1.0 and t.min(dim=0).values.tolist() == [1.0, 2.0, 3.0]
    assert t.min(dim=0).indices.tolist() == [0, 1, 0] and t.argmin(1).tolist() == [0, 1]
    assert t.argmax(dim=1).tolist() == [1, 2] and kiln.min(t, axis=1).tolist() == [1.0, 2.0]
    u8 = kiln.tensor([[3, 250], [7, 0]], dtype=kiln.uint8)
    assert u8.min().item() == 0 and u8.min(axis=0).tolist() == [3, 0] and u8.min().dtype is kiln.uint8
    with pytest.raises(kiln.InvalidArgumentError, match="appears twice"):
        t.sum(dim=(1, -1))
    with pytest.raises(TypeError, match="pass dim= or axis="):
        t.sum(dim=0, axis=0)


def test_cat_and_stack():
    a, b = kiln.tensor([[1.0, 2.0]]), kiln.tensor([[3.0, 4.0], [5.0, 6.0]])
    assert kiln.cat([a, b]).tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert kiln.cat((b, b), dim=1).tolist() == [[3.0, 4.0, 3.0, 4.0], [5.0, 6.0, 5.0, 6.0]]
    assert kiln.cat([b.T, b.T], dim=-1).tolist() == [[3.0, 5.0, 3.0, 5.0], [4.0, 6.0, 4.0, 6.0]]
    assert kiln.stack([a.view(2), kiln.tensor([5.0, 6.0])]).tolist() == [[1.0, 2.0], [5.0, 6.0]]
    assert kiln.stack([a.view(2), kiln.tensor([5.0, 6.0])], dim=1).tolist() == [[1.0, 5.0], [2.0, 6.0]]
    with pytest.raises(kiln.ShapeMismatchError, match="tensor 1 has shape"):
        kiln.cat([a, b], dim=1)
    with pytest.raises(TypeError, match="element 1 is list"):
        kiln.cat([a, [1.0]])


def test_comparisons_are_bool_tensors():
    x = kiln.tensor([-1.0, 0.0, 2.5])
    assert (x > 0).tolist() == [False, False, True] and (x > 0).dtype is kiln.bool
    assert (x >= 0).tolist() == [False, True, True] and (x < 0).tolist() == [True, False, False]
    assert (x <= 0).tolist() == [True, True, False] and (x == 0).tolist() == [False, True, False]
    assert (x != 0).tolist() == [True, False, True] and (0 < x).tolist() == [False, False, True]
    i = kiln.tensor([0, 1, 2])
    assert (i > 0.5).tolist() == [False, True, True]  # 0.5 itself, not 0
    assert (i == kiln.tensor([0.0, 1.5, 2.0])).tolist() == [True, False, True]
    m = x > 0
    assert (~m).tolist() == [True, True, False] and (m & (x > 1)).tolist() == [False, False, True]
    assert (m | (x < 0)).tolist() == [True, False, True] and (m ^ True).tolist() == [True, True, False]
    with pytest.raises(kiln.DtypeMismatchError, match="bool tensors only"):
        ~i
    with pytest.raises(kiln.DtypeMismatchError, match=r"compare first \(x > 0\)"):
        i & i
    assert (x == None) is False and (x != "a") is True  # noqa: E711: not operands: Python's identity


def test_power():
    x = kiln.tensor([-2.0, 3.0, 0.5])
    assert (x ** 2).tolist() == [4.0, 9.0, 0.25] and (x ** 3).tolist() == [-8.0, 27.0, 0.125]
    assert (x ** 0).tolist() == [1.0, 1.0, 1.0] and (x ** -1).tolist() == [-0.5, 0.3333333432674408, 2.0]
    assert (kiln.tensor([4.0, 9.0]) ** 0.5).tolist() == [2.0, 3.0]
    assert (2 ** kiln.tensor([1.0, 3.0])).tolist() == [2.0, 8.0]
    assert (kiln.tensor([2, -3]) ** 3).tolist() == [8, -27]
    with pytest.raises(kiln.DtypeMismatchError, match=r"x.float\(\) \*\* -2"):
        kiln.tensor([2]) ** -2


def test_inplace_operators_write_the_tensors_memory():
    p = kiln.tensor([1.0, 2.0, 3.0])
    alias, g = p, kiln.tensor([10.0, 20.0, 30.0])
    view = p.view(3)
    p -= 0.5 * g  # float32 of one shape: the fused accumulate
    assert p is alias and view.tolist() == [-4.0, -8.0, -12.0]
    p += 1
    p *= kiln.tensor([2.0])
    p /= 2
    assert p is alias and view.tolist() == [-3.0, -7.0, -11.0]
    i = kiln.tensor([1, 2, 3])
    i += 1
    i *= 2
    assert i.tolist() == [4, 6, 8] and i.dtype is kiln.int32
    with pytest.raises(kiln.DtypeMismatchError, match="PyTorch refuses that cast"):
        i += kiln.tensor([0.5, 0.5, 0.5])
    with pytest.raises(kiln.ShapeMismatchError, match="cannot grow the tensor"):
        p += kiln.ones(2, 3)


def test_one_element_conversions():
    assert bool(kiln.tensor([1.0])) is True and float(kiln.tensor(2.5)) == 2.5 and int(kiln.tensor([7])) == 7
    assert operator.index(kiln.tensor(3)) == 3 and [10, 20, 30, 40][kiln.tensor(2)] == 30
    with pytest.raises(TypeError, match="one-element integer"):
        operator.index(kiln.tensor(2.0))
    with pytest.raises(kiln.InvalidArgumentError, match="ambiguous"):
        bool(kiln.tensor([1.0, 2.0]))


def test_every_signature_reads_in_help():
    import inspect
    for owner in (kiln, kiln.Tensor):
        for name in dir(owner):
            fn = getattr(owner, name)
            if callable(fn) and getattr(fn, "__text_signature__", None):
                inspect.signature(fn)  # ValueError when help() could not show it
    assert str(inspect.signature(kiln.rand)) == "(*size, low=0.0, high=1.0, seed=None, dtype=None, device=None, requires_grad=False)"


def test_repr_shows_values_dtype_and_device():
    assert repr(kiln.tensor([1.0, 2.0])) == "tensor([1., 2.], device='cpu:0')"
    assert repr(kiln.tensor([1, 2], dtype=kiln.int64)) == "tensor([1, 2], device='cpu:0', dtype=int64)"
    assert repr(kiln.tensor([True])) == "tensor([ True], device='cpu:0', dtype=bool)"


def test_host_reads_see_every_pending_operation():
    # A blocking read of a few bytes runs a short pending queue on the reading
    # thread (backends/cpu/queue.c): the values must still follow every op.
    a = kiln.zeros(16, device="cpu:0")
    one = kiln.ones(16, device="cpu:0")
    for i in range(1, 301):
        a += one
        assert float(a.sum()) == 16.0 * i and a.max().item() == i
    big = kiln.ones(4096, device="cpu:0")  # 16 KiB: read through the queue as before
    for _ in range(3):
        big += one.sum() * 0 + 1
    assert float(big.sum()) == 4 * 4096.0 and a.numpy().tolist() == [300.0] * 16
