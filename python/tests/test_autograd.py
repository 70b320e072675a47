# python/tests/test_autograd.py: autograd on tensors (requires_grad, loss.backward(), .grad, no_grad), kiln.nn.Module subclasses and optimizers over parameters(), checked against PyTorch.
import gc
import os

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
import kiln.optim as optim

from conftest import host

torch = pytest.importorskip("torch")


def rnd(seed, *shape):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def leaf(a, device=None):
    return kiln.tensor(a, device=device).requires_grad_()


def tleaf(a):
    return torch.tensor(a, requires_grad=True)


def close(kt, tt, tol=1e-5):
    np.testing.assert_allclose(host(kt), tt.detach().numpy(), rtol=tol, atol=tol)


@pytest.fixture(autouse=True)
def recording_ends():
    """Each test leaves no recording behind (the record ends with the last tensor of it)."""
    yield
    gc.collect()
    assert kiln._kiln._autograd_record_size() == 0
    assert kiln.is_grad_enabled()


def test_elementwise_reductions_and_views_match_pytorch(all_devices):
    a0, b0, c0 = rnd(1, 3, 4), rnd(2, 3, 4), rnd(3, 4)
    ta, tb, tc = tleaf(a0), tleaf(b0), tleaf(c0)
    tl = (((ta * tb - 0.5) / 2 + (1 - tc)).tanh() ** 2).sum(dim=(0, 1)) \
        + (3 / (ta.abs() + 1)).sqrt().mean() + torch.sigmoid(-tb).exp().sum(dim=1, keepdim=True).log().sum() \
        + (tc.relu().reshape(2, 2).unsqueeze(0).flatten(1).squeeze() * 2).sum() \
        + torch.log_softmax(tb.clone(), -1)[:, 1].sum()
    tl.backward()
    for d in all_devices:
        a, b, c = leaf(a0, d), leaf(b0, d), leaf(c0, d)
        loss = (((a * b - 0.5) / 2 + (1 - c)).tanh() ** 2).sum(dim=(0, 1)) \
            + (3 / (a.abs() + 1)).sqrt().mean() + kiln.sigmoid(-b).exp().sum(dim=1, keepdim=True).log().sum() \
            + (c.relu().reshape(2, 2).unsqueeze(0).flatten(1).squeeze() * 2).sum() \
            + b.clone().log_softmax().index_select(1, [1]).sum()
        assert loss.requires_grad and not loss.is_leaf and a.is_leaf
        loss.backward()
        close(loss, tl, 1e-4)
        for k, t in ((a, ta), (b, tb), (c, tc)):
            close(k.grad, t.grad, 1e-4)
        del loss


def test_matmul_of_matrices_and_vectors():
    a0, b0, v0 = rnd(4, 5, 3), rnd(5, 3, 2), rnd(6, 3)
    a, b, v = leaf(a0), leaf(b0), leaf(v0)
    ta, tb, tv = tleaf(a0), tleaf(b0), tleaf(v0)
    ((a @ b).sum() + (a @ v).sum() + (v @ b).sum() + (a[[4, 0, 4]] * 3).sum()).backward()
    ((ta @ tb).sum() + (ta @ tv).sum() + (tv @ tb).sum() + (ta[[4, 0, 4]] * 3).sum()).backward()
    for k, t in ((a, ta), (b, tb), (v, tv)):
        close(k.grad, t.grad, 1e-4)


def test_nn_operations_and_int64_labels_match_pytorch():
    x0, w0, b0 = rnd(7, 2, 1, 8, 8), rnd(8, 3, 1, 3, 3), rnd(9, 3)
    fw0, fb0 = rnd(10, 4, 27), rnd(11, 4)
    labels = np.array([3, 0], dtype=np.int64)
    x, w, b, fw, fb = (leaf(v) for v in (x0, w0, b0, fw0, fb0))
    tx, tw, tb, tfw, tfb = (tleaf(v) for v in (x0, w0, b0, fw0, fb0))
    h = F.max_pool2d(F.relu(F.conv2d(x, w, b, padding=1)), 2).flatten(1)
    loss = F.cross_entropy(F.linear(h.view(2, 48).index_select(1, list(range(27))), fw, fb), kiln.tensor(labels))
    th = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(tx, tw, tb, padding=1)), 2).flatten(1)
    tl = torch.nn.functional.cross_entropy(torch.nn.functional.linear(th[:, :27], tfw, tfb), torch.tensor(labels))
    loss.backward()
    tl.backward()
    close(loss, tl, 1e-5)
    for k, t in ((x, tx), (w, tw), (b, tb), (fw, tfw), (fb, tfb)):
        close(k.grad, t.grad, 1e-4)


def test_gradients_accumulate_until_cleared_and_take_an_upstream_gradient():
    w = leaf(rnd(12, 3))
    (w * 2).sum().backward()
    (w * 3).sum().backward()
    np.testing.assert_allclose(host(w.grad), np.full(3, 5.0))
    w.grad = None
    assert w.grad is None
    y = w * w
    y.backward(kiln.tensor(np.array([1, 2, 3], np.float32)))
    np.testing.assert_allclose(host(w.grad), 2 * host(w) * np.array([1, 2, 3]), rtol=1e-6)


def test_layers_record_without_a_tape_and_reach_the_input():
    lin = nn.Linear(4, 2, seed=3)
    x0 = rnd(13, 5, 4)
    x = leaf(x0)
    out = nn.Sigmoid()(lin(x)).sum() + nn.Tanh()(lin(x)).mean()
    out.backward()
    tw, tb, tx = tleaf(host(lin.weight.value)), tleaf(host(lin.bias.value)), tleaf(x0)
    ty = torch.nn.functional.linear(tx, tw, tb)
    (torch.sigmoid(ty).sum() + torch.tanh(ty).mean()).backward()
    close(x.grad, tx.grad, 1e-5)
    close(lin.weight.grad, tw.grad, 1e-5)
    close(lin.bias.grad, tb.grad, 1e-5)
    with pytest.raises(TypeError, match="tape must be a kiln.nn.Tape or None"):
        lin(x, 3)
    assert not lin(x, None).requires_grad  # an explicit None: evaluation, as before


def test_no_grad_enable_grad_and_in_place_updates():
    w = leaf(np.ones(3, np.float32))
    with kiln.no_grad():
        assert not kiln.is_grad_enabled()
        y = w * 2
        assert not y.requires_grad
        with kiln.enable_grad():
            assert (w * 2).requires_grad
        w -= 0.5 * kiln.ones(3)  # the optimizer's in-place update is allowed here
    np.testing.assert_allclose(host(w), np.full(3, 0.5))
    assert w.requires_grad and w.is_leaf

    @kiln.no_grad()
    def evaluate(t):
        return t * 3

    assert not evaluate(w).requires_grad and kiln.is_grad_enabled()
    with kiln.set_grad_enabled(False):
        assert not (w + 1).requires_grad
    assert kiln.is_grad_enabled()


@pytest.mark.parametrize("what, op", [
    ("x.T", lambda w: w.T),
    ("transpose", lambda w: w.transpose(0, 1)),
    ("basic indexing", lambda w: w[0]),
    ("in-place operator", lambda w: w.__iadd__(1.0)),
    ("max", lambda w: w.max()),
    ("cat", lambda w: kiln.cat([w, w])),
    ("norm", lambda w: w.norm()),
    (r"x \*\* \(an exponent", lambda w: w ** 3),
    ("assignment", lambda w: w.__setitem__(0, 1.0)),
    ("index_add_", lambda w: kiln.zeros(2, 2).index_add_(0, [0, 1], w)),
    ("x\\[rows, cols\\]", lambda w: w[[0, 1], [1, 0]]),
    ("copy", lambda w: w.copy()),
    ("broadcast_to", lambda w: kiln.broadcast_to(w, (3, 2, 2))),
    ("sgd_update", lambda w: kiln.sgd_update(w, kiln.ones(2, 2), None, lr=0.1)),
])
def test_an_op_without_a_gradient_is_refused_not_cut(what, op):
    w = leaf(rnd(14, 2, 2))
    with pytest.raises(RuntimeError, match=what + ".*requires grad.*detach"):
        op(w)
    with kiln.no_grad():
        op(w)  # a constant then: allowed
    op(w.detach())


def test_backward_errors_name_the_fix():
    w = leaf(rnd(15, 3))
    with pytest.raises(RuntimeError, match="does not require grad.*requires_grad=True"):
        kiln.ones(3).sum().backward()
    loss = (w * w).sum()
    with pytest.raises(NotImplementedError, match="retain_graph"):
        loss.backward(retain_graph=True)
    h = w * 2
    loss.backward()
    with pytest.raises(RuntimeError, match="backward\\(\\) has ended.*detach"):
        loss.backward()
    with pytest.raises(RuntimeError, match="backward\\(\\) has ended"):
        h + 1
    assert not (h.detach() + 1).requires_grad and not (w.data * 2).requires_grad
    with pytest.raises(kiln.DtypeMismatchError, match="only float32 tensors can require grad.*int32"):
        kiln.ones(3, dtype=kiln.int32).requires_grad_()
    with pytest.raises(RuntimeError, match="only change requires_grad of leaf"):
        (w * 2).requires_grad_(False)
    with pytest.raises(TypeError, match="can only be set to None"):
        w.grad = kiln.ones(3)
    with pytest.raises(kiln.Error, match="non-scalar|one element|dy"):
        (w * 2).backward()
    with pytest.raises(kiln.DtypeMismatchError, match="pass dy of y's dtype"):
        (w * 2).backward(kiln.ones(3, dtype=kiln.int32))
    with pytest.raises(RuntimeError, match="backward\\(\\) of a leaf"):
        w.backward()


def test_creation_takes_requires_grad():
    x = kiln.randn(2, 3, requires_grad=True)
    assert x.requires_grad and x.is_leaf and not kiln.zeros(2, requires_grad=False).requires_grad
    assert kiln.tensor([1.0, 2.0], requires_grad=True).requires_grad
    with pytest.raises(kiln.DtypeMismatchError, match="int32"):
        kiln.ones(3, dtype=kiln.int32, requires_grad=True)


def test_the_record_ends_with_its_last_tensor():
    w = leaf(rnd(16, 3))
    y = (w * 2).exp()
    assert kiln._kiln._autograd_record_size() == 2
    del y
    gc.collect()
    assert kiln._kiln._autograd_record_size() == 0
    for _ in range(100):  # an evaluation loop without no_grad does not grow the record
        (w * 2).sum().item()
    assert kiln._kiln._autograd_record_size() == 0


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, seed=1)
        self.body = nn.Sequential(nn.Linear(2 * 3 * 3, 5, seed=2), nn.ReLU())
        self.scale = nn.Parameter(kiln.ones(5), "scale")
        self.shift = kiln.zeros(5).requires_grad_()
        self.note = "not a parameter"

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1)
        return self.body(h) * self.scale + self.shift


def test_module_registers_attributes_and_trains_like_pytorch(tmp_path):
    net = TinyNet()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["scale", "shift", "conv.weight", "conv.bias", "body.0.weight", "body.0.bias"]
    assert all(p.requires_grad for p in net.parameters()) and net.note == "not a parameter"
    tnet = torch.nn.Module()
    tconv = torch.nn.Conv2d(1, 2, 3)
    tlin = torch.nn.Linear(18, 5)
    sd = net.state_dict()
    with torch.no_grad():
        tconv.weight.copy_(torch.tensor(host(sd["conv.weight"])))
        tconv.bias.copy_(torch.tensor(host(sd["conv.bias"])))
        tlin.weight.copy_(torch.tensor(host(sd["body.0.weight"])))
        tlin.bias.copy_(torch.tensor(host(sd["body.0.bias"])))
    tscale, tshift = torch.ones(5, requires_grad=True), torch.zeros(5, requires_grad=True)
    tnet.conv, tnet.lin = tconv, tlin
    tparams = [tscale, tshift, tconv.weight, tconv.bias, tlin.weight, tlin.bias]
    opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(tparams, lr=0.1, momentum=0.9)
    crit = nn.CrossEntropyLoss()
    x0, y0 = rnd(17, 4, 1, 8, 8), np.array([1, 4, 0, 2], np.int64)
    for _ in range(3):
        opt.zero_grad()
        loss = crit(net(kiln.tensor(x0)), kiln.tensor(y0))
        loss.backward()
        opt.step()
        topt.zero_grad()
        th = torch.nn.functional.max_pool2d(torch.relu(tconv(torch.tensor(x0))), 2).flatten(1)
        tl = torch.nn.functional.cross_entropy(torch.relu(tlin(th)) * tscale + tshift, torch.tensor(y0))
        tl.backward()
        topt.step()
        close(loss, tl, 1e-5)
    for (name, p), t in zip(net.named_parameters(), tparams):
        close(p, t, 1e-5)

    path = str(tmp_path / "tiny.safetensors")
    nn.save_safetensors(path, net.state_dict())
    other = TinyNet()
    other.load_state_dict(nn.load_safetensors(path))
    for (n1, p1), (n2, p2) in zip(net.named_parameters(), other.named_parameters()):
        assert n1 == n2 and np.array_equal(host(p1), host(p2))
    with pytest.raises(KeyError, match="missing \\['shift'\\], unexpected \\['bogus'\\]"):
        other.load_state_dict({**{k: v for k, v in net.state_dict().items() if k != "shift"}, "bogus": kiln.ones(1)})
    with pytest.raises(ValueError, match="'scale' has shape \\(4,\\) in the state_dict, \\(5,\\) in the model"):
        other.load_state_dict({"scale": kiln.ones(4)}, strict=False)
    assert other.eval() is other and not other.training and other.train().training


def test_module_to_moves_every_parameter(cpu1):
    net = TinyNet().to(cpu1)
    assert {str(p.device) for p in net.parameters()} == {str(cpu1)}
    out = net(kiln.ones(1, 1, 8, 8, device=cpu1)).sum()
    out.backward()
    assert all(p.grad is not None and p.grad.device is cpu1 for p in net.parameters())


def test_module_mistakes_are_named():
    class NoInit(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match="must call super\\(\\).__init__\\(\\)"):
        NoInit()

    class NoForward(nn.Module):
        pass

    with pytest.raises(NotImplementedError, match="define forward"):
        NoForward()(kiln.ones(2))
    with pytest.raises(TypeError, match="tensors that require grad.*requires_grad_"):
        optim.SGD([kiln.ones(2)], lr=0.1)
    layer = nn.Sequential(nn.Linear(2, 2))[0]
    with pytest.raises(kiln.Error, match="belongs to a Sequential.*model.to"):
        layer.to("cpu:0")
