# python/tests/test_ops.py: operators with broadcasting and scalars, unary functions, matmul, reductions and the neural-network operations, against NumPy and PyTorch.
import numpy as np
import pytest

import kiln
from conftest import host

rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op", ["+", "-", "*", "/"])
def test_operators_broadcast_like_numpy(op):
    for sa, sb in [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (2, 1)), ((), (2, 2))]:
        a, b = rand(*sa), rand(*sb) + (3.0 if op == "/" else 0.0)
        expected = eval(f"a {op} b")
        got = host(eval(f"kiln.tensor(a) {op} kiln.tensor(b)"))
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["+", "-", "*", "/"])
def test_scalars_on_either_side(op):
    a = rand(3, 2) + 4.0
    t = kiln.tensor(a)
    for s in (2, 0.5, np.float32(1.5), True):
        np.testing.assert_allclose(host(eval(f"t {op} s")), eval(f"a {op} np.float32(s)"), rtol=1e-6)
        np.testing.assert_allclose(host(eval(f"s {op} t")), eval(f"np.float32(s) {op} a"), rtol=1e-6)


def test_int32_arithmetic():
    a = kiln.tensor([7, -7, 3])
    assert (a + 1).tolist() == [8, -6, 4] and (a * 2).dtype == kiln.int32
    assert (a / 2).tolist() == [3, -3, 1], "int32 division truncates toward zero, as in C"
    assert (a / kiln.tensor([0, 1, 1])).tolist() == [0, -7, 3]
    with pytest.raises(kiln.DtypeMismatchError):
        a * 0.5
    # An int32 and a float32 tensor promote to float32 (docs/dtypes.md).
    assert (a + kiln.ones(3)).dtype == kiln.float32 and (a + kiln.ones(3)).tolist() == [8, -6, 4]


def test_unary_and_comparison():
    a = rand(5)
    t = kiln.tensor(a)
    np.testing.assert_allclose(host(-t), -a)
    np.testing.assert_allclose(host(abs(t)), np.abs(a))
    assert +t is t
    pos = kiln.tensor(np.abs(a) + 0.1)
    np.testing.assert_allclose(host(kiln.exp(t)), np.exp(a), rtol=1e-6)
    np.testing.assert_allclose(host(pos.log()), np.log(np.abs(a) + 0.1), rtol=1e-6)
    np.testing.assert_allclose(host(kiln.sqrt(pos)), np.sqrt(np.abs(a) + 0.1), rtol=1e-6)
    np.testing.assert_allclose(host(t.relu()), np.maximum(a, 0))
    np.testing.assert_allclose(host(kiln.sigmoid(t)), 1 / (1 + np.exp(-a)), rtol=1e-6)
    np.testing.assert_allclose(host(kiln.tanh(t)), np.tanh(a), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(host(kiln.maximum(t, 0.0)), np.maximum(a, 0))
    np.testing.assert_allclose(host(kiln.minimum(t, kiln.zeros(5))), np.minimum(a, 0))
    b = kiln.tensor([1.0, 2.0, 3.0])
    # Comparisons are bool tensors (kiln.eq is the binary op: 1.0 / 0.0 in the operands' dtype).
    assert (b == kiln.tensor([1.0, 0.0, 3.0])).tolist() == [True, False, True]
    assert (b != 2.0).tolist() == [True, False, True]
    assert kiln.eq(b, 2).tolist() == [0.0, 1.0, 0.0]
    assert (b < 2).tolist() == [True, False, False] and (b <= 2).tolist() == [True, True, False]
    assert (b > 2).tolist() == [False, False, True] and (2 >= b).tolist() == [True, True, False]
    assert (b == 2).dtype == kiln.bool


def test_matmul():
    a, b = rand(4, 5), rand(5, 3)
    np.testing.assert_allclose(host(kiln.tensor(a) @ kiln.tensor(b)), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(kiln.matmul(kiln.tensor(a), kiln.tensor(a), transpose_b=True)), a @ a.T,
                               rtol=1e-5, atol=1e-5)
    v = rand(5)
    np.testing.assert_allclose(host(kiln.tensor(a) @ kiln.tensor(v)), a @ v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(kiln.tensor(v) @ kiln.tensor(b)), v @ b, rtol=1e-5, atol=1e-5)
    assert (kiln.tensor(v) @ kiln.tensor(v)).shape == ()
    batch = rand(2, 4, 5)
    np.testing.assert_allclose(host(kiln.tensor(batch) @ kiln.tensor(b)), batch @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.ShapeMismatchError):
        kiln.tensor(a) @ kiln.tensor(a)


def test_reductions():
    a = rand(3, 4, 5)
    t = kiln.tensor(a)
    np.testing.assert_allclose(t.sum().item(), a.sum(), rtol=1e-5)
    for axis in (0, 1, -1):
        np.testing.assert_allclose(host(kiln.sum(t, axis)), a.sum(axis), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(host(t.mean(axis=axis, keepdims=True)), a.mean(axis, keepdims=True), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(host(kiln.max(t, axis=axis)), a.max(axis))
        np.testing.assert_array_equal(host(t.argmax(axis)), a.argmax(axis))
    assert kiln.argmax(t).item() == a.argmax()
    np.testing.assert_allclose(kiln.norm(t).item(), np.linalg.norm(a), rtol=1e-5)
    i = kiln.tensor([[1, 5], [7, 2]])
    assert i.sum(0).tolist() == [8, 7] and i.max().item() == 7
    assert i.sum(0).dtype == kiln.int64 and i.max().dtype == i.dtype  # integer sums are int64
    np.testing.assert_allclose(host(t.sum(axis=(0, 1))), a.sum((0, 1)), rtol=1e-5)
    assert i.sum(dim=(0, 1)).item() == 15 and i.sum(dim=(1, 0), keepdim=True).tolist() == [[15]]


def test_softmax_and_cross_entropy():
    torch = pytest.importorskip("torch")
    logits = rand(6, 10)
    labels = rng.integers(0, 10, 6).astype(np.int32)
    t = kiln.tensor(logits)
    tl = torch.from_numpy(logits)
    np.testing.assert_allclose(host(kiln.softmax(t)), torch.softmax(tl, -1).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(host(t.log_softmax(axis=1)), torch.log_softmax(tl, -1).numpy(), rtol=1e-5, atol=1e-6)
    loss = kiln.cross_entropy(t, kiln.tensor(labels))
    expected = torch.nn.functional.cross_entropy(tl, torch.from_numpy(labels).long()).item()
    assert loss.shape == () and abs(loss.item() - expected) < 1e-5
    with pytest.raises(kiln.UnsupportedError):
        kiln.softmax(t, axis=0)


def test_conv2d_and_pooling_match_pytorch():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    x, w, b = rand(2, 3, 9, 8), rand(4, 3, 3, 3), rand(4)
    for kw in ({}, {"stride": 2, "padding": 1}, {"padding": (1, 2), "dilation": 2}):
        got = host(kiln.conv2d(kiln.tensor(x), kiln.tensor(w), kiln.tensor(b), **kw))
        expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), **kw).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    got = host(kiln.max_pool2d(kiln.tensor(x), 2))
    np.testing.assert_allclose(got, F.max_pool2d(torch.from_numpy(x), 2).numpy())
    got = host(kiln.max_pool2d(kiln.tensor(x), 3, stride=2, padding=1))
    np.testing.assert_allclose(got, F.max_pool2d(torch.from_numpy(x), 3, stride=2, padding=1).numpy())
    with pytest.raises(kiln.ShapeMismatchError):
        kiln.conv2d(kiln.tensor(x), kiln.tensor(rand(4, 2, 3, 3)))


def test_gradient_operations_match_pytorch():
    torch = pytest.importorskip("torch")
    a = rand(3, 4)
    assert kiln.sum_to(kiln.tensor(a), (1, 4)).shape == (1, 4)
    np.testing.assert_allclose(host(kiln.sum_to(kiln.tensor(a), (4,))), a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(host(kiln.broadcast_to(kiln.tensor(a[0]), (3, 4))), np.broadcast_to(a[0], (3, 4)))
    x = torch.from_numpy(a).requires_grad_()
    dy = rand(3, 4)
    torch.tanh(x).backward(torch.from_numpy(dy))
    np.testing.assert_allclose(host(kiln.unary_backward("tanh", kiln.tensor(a), kiln.tensor(dy))), x.grad.numpy(),
                               rtol=1e-5, atol=1e-6)
    logits, labels = rand(5, 7), rng.integers(0, 7, 5).astype(np.int32)
    tl = torch.from_numpy(logits).requires_grad_()
    torch.nn.functional.cross_entropy(tl, torch.from_numpy(labels).long()).backward()
    got = host(kiln.cross_entropy_backward(kiln.tensor(logits), kiln.tensor(labels)))
    np.testing.assert_allclose(got, tl.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.unary_backward("cube", kiln.tensor(a), kiln.tensor(dy))


def test_updates_in_place_match_pytorch():
    torch = pytest.importorskip("torch")
    p0, g = rand(10), rand(10)
    p = kiln.tensor(p0)
    p.add_(kiln.tensor(g), alpha=0.5)
    np.testing.assert_allclose(host(p), p0 + 0.5 * g, rtol=1e-6)

    ref = torch.from_numpy(p0.copy()).requires_grad_()
    opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9)
    kp, buf = kiln.tensor(p0), kiln.zeros(10)
    for _ in range(3):
        ref.grad = torch.from_numpy(g)
        opt.step()
        kiln.sgd_update(kp, kiln.tensor(g), buf, lr=0.1, momentum=0.9)
    np.testing.assert_allclose(host(kp), ref.detach().numpy(), rtol=1e-5, atol=1e-6)

    ref = torch.from_numpy(p0.copy()).requires_grad_()
    opt = torch.optim.Adam([ref], lr=0.01)
    kp, m, v = kiln.tensor(p0), kiln.zeros(10), kiln.zeros(10)
    for step in range(1, 4):
        ref.grad = torch.from_numpy(g)
        opt.step()
        kiln.adam_update(kp, kiln.tensor(g), m, v, step, lr=0.01)
    np.testing.assert_allclose(host(kp), ref.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_mixed_precision_updates_and_unscale():
    # A bfloat16 gradient read as float32, and the new weights rounded into a
    # bfloat16 copy in the same step: the copy is the weights' cast, bit for bit.
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    p0 = rng.standard_normal(10).astype(np.float32)
    g = rng.standard_normal(10).astype(np.float32)
    g16 = kiln.tensor(g).to(dtype=kiln.bfloat16)
    ref = torch.from_numpy(p0.copy()).requires_grad_()
    opt = torch.optim.Adam([ref], lr=0.01)
    kp, m, v = kiln.tensor(p0), kiln.zeros(10), kiln.zeros(10)
    copy = kiln.zeros(10, dtype=kiln.bfloat16)
    for step in range(1, 4):
        ref.grad = torch.from_numpy(host(g16.to(dtype=kiln.float32)))
        opt.step()
        kiln.adam_update(kp, g16, m, v, step, lr=0.01, copy=copy)
    np.testing.assert_allclose(host(kp), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert host(copy.to(dtype=kiln.float32)).tolist() == host(kp.to(dtype=kiln.bfloat16).to(dtype=kiln.float32)).tolist()
    with pytest.raises(kiln.Error, match="copy"):
        kiln.sgd_update(kp, g16, None, lr=0.1, copy=kiln.zeros(10))

    found = kiln.zeros(())
    out = kiln.unscale(g16, 0.5, found)
    assert out.dtype == kiln.float32
    assert host(out).tolist() == (host(g16.to(dtype=kiln.float32)) * 0.5).tolist()
    assert host(found).item() == 0.0
    bad = np.array([1.0, np.inf, 2.0], dtype=np.float32)
    kiln.unscale(kiln.tensor(bad).to(dtype=kiln.float16), 1.0, found)
    assert host(found).item() == 1.0


def test_operations_run_on_every_device(all_devices):
    a, b = rand(8, 8), rand(8, 8)
    for d in all_devices:
        ta, tb = kiln.tensor(a, device=d), kiln.tensor(b, device=d)
        out = (ta @ tb + 1.0).relu().sum(axis=0)
        assert out.device is d
        np.testing.assert_allclose(host(out), np.maximum(a @ b + 1, 0).sum(0), rtol=1e-4, atol=1e-4)
