# python/tests/test_nn.py: kiln.nn: data sets and the loader, safetensors, the tape's gradients against PyTorch's, layers, models, optimizers, the training loop.
import os

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from conftest import host

FASHION = os.path.join(nn.FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")
needs_fashion = pytest.mark.skipif(not os.path.exists(FASHION),
                                   reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
rng = np.random.default_rng(1)


def small_dataset(n=10, classes=3):
    pixels = rng.integers(0, 256, (n, 4, 5), dtype=np.uint8)
    labels = (np.arange(n) % classes).astype(np.uint8)
    return nn.Dataset.from_arrays(pixels, labels, classes), pixels, labels


@needs_fashion
def test_fashion_mnist():
    test = nn.FashionMNIST("test")
    assert len(test) == 10000 and test.image_shape == (28, 28) and test.classes == 10
    images, labels = test.upload(layout="flat")
    assert images.shape == (10000, 784) and labels.shape == (10000,) and labels.dtype == kiln.int32
    pixels, raw = test.arrays()
    np.testing.assert_allclose(host(images)[:5], pixels[:5].reshape(5, 784) / 255.0, rtol=1e-6)
    assert host(labels)[:20].tolist() == raw[:20].tolist()
    assert nn.FASHION_MNIST_LABELS[9] == "Ankle boot" and nn.fashion_mnist_label_name(0) == "T-shirt/top"
    with pytest.raises(kiln.InvalidArgumentError):
        nn.FashionMNIST("validation")


def test_missing_data_names_the_fix(tmp_path):
    with pytest.raises(kiln.NotFoundError) as e:
        nn.FashionMNIST("train", dir=str(tmp_path))
    assert "dataset-fashion-mnist" in str(e.value)


def test_loader_batches_follow_shuffle_order():
    ds, pixels, labels = small_dataset(10)
    loader = nn.Loader(ds, batch_size=4, seed=3, layout="flat")
    assert len(loader) == 3
    batches = [(host(x).copy(), host(y).copy()) for x, y in loader]
    assert [len(y) for _, y in batches] == [4, 4, 2] and loader.epoch == 0
    order = nn.shuffle_order(3, 0, 10)
    got = np.concatenate([y for _, y in batches])
    assert got.tolist() == labels[order].tolist()
    np.testing.assert_allclose(np.concatenate([x for x, _ in batches]), pixels[order].reshape(10, 20) / 255.0,
                               rtol=1e-6)
    second = [host(y).copy() for _, y in loader]
    assert loader.epoch == 1 and np.concatenate(second).tolist() == labels[nn.shuffle_order(3, 1, 10)].tolist()
    loader.reset(0)
    again = np.concatenate([host(y).copy() for _, y in loader])
    assert again.tolist() == got.tolist()
    plain = nn.Loader(ds, batch_size=5, shuffle=False, drop_last=True, prefetch=False)
    shapes = [x.shape for x, _ in plain]
    assert shapes == [(5, 1, 4, 5), (5, 1, 4, 5)]


def test_safetensors_round_trip(tmp_path, cpu1):
    path = str(tmp_path / "t.safetensors")
    tensors = {"w": kiln.arange(6, dtype=kiln.float32).reshape(2, 3), "n": kiln.tensor([1, 2, 3])}
    nn.save_safetensors(path, tensors, {"note": "hello"})
    back, meta = nn.load_safetensors(path, cpu1, metadata=True)
    assert list(back) == ["w", "n"] or set(back) == {"w", "n"}
    assert back["w"].device is cpu1 and back["w"].tolist() == tensors["w"].tolist()
    assert back["n"].dtype == kiln.int32 and meta == {"note": "hello"}
    with open(path, "rb") as f:
        from_bytes = nn.load_safetensors(f.read())
    assert from_bytes["n"].tolist() == [1, 2, 3]
    into = {"w": kiln.zeros((2, 3)), "n": kiln.zeros(3, kiln.int32)}
    nn.load_safetensors_into(path, into)
    assert into["w"].tolist() == tensors["w"].tolist()
    with pytest.raises(kiln.ShapeMismatchError):
        nn.load_safetensors_into(path, {"w": kiln.zeros((3, 2))}, strict=False)
    with pytest.raises(kiln.NotFoundError):
        nn.load_safetensors(str(tmp_path / "missing.safetensors"))
    with pytest.raises(kiln.IOError):
        nn.load_safetensors(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")


def test_tape_gradients_match_pytorch():
    torch = pytest.importorskip("torch")
    x0, w0, b0 = rng.standard_normal((5, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    labels = np.array([0, 2, 1, 1, 0], np.int32)
    w = nn.Parameter(kiln.tensor(w0.astype(np.float32)), "w")
    b = nn.Parameter(kiln.tensor(b0.astype(np.float32)), "b")
    tape = nn.Tape()
    wv, bv = tape.watch(w), tape.watch(b)
    h = tape.linear(kiln.tensor(x0.astype(np.float32)), wv, bv)
    h = tape.tanh(h)
    h = tape.mul(h, 2.0)
    h = tape.sub(1.0, h)
    loss = tape.cross_entropy(h, kiln.tensor(labels))
    assert len(tape) > 0
    tape.backward(loss)
    assert len(tape) == 0

    tw = torch.tensor(w0, dtype=torch.float32, requires_grad=True)
    tb = torch.tensor(b0, dtype=torch.float32, requires_grad=True)
    th = 1.0 - 2.0 * torch.tanh(torch.tensor(x0, dtype=torch.float32) @ tw.T + tb)
    tl = torch.nn.functional.cross_entropy(th, torch.from_numpy(labels).long())
    tl.backward()
    assert abs(loss.item() - tl.item()) < 1e-5
    np.testing.assert_allclose(host(w.grad), tw.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(host(b.grad), tb.grad.numpy(), rtol=1e-4, atol=1e-6)
    w.zero_grad()
    assert w.grad is None
    with nn.Tape() as t2:
        t2.relu(t2.watch(w))
        assert len(t2) == 1
    assert len(t2) == 0


def test_tape_without_gradients_records_nothing():
    tape = nn.Tape()
    y = tape.add(kiln.ones(3), kiln.ones(3))
    assert y.tolist() == [2.0] * 3 and len(tape) == 0
    with pytest.raises(kiln.InvalidArgumentError):
        tape.backward(tape.sum(y))


def test_layers_and_sequential(cpu1):
    lin = nn.Linear(3, 1, device=cpu1, seed=7)
    assert [p.shape for p in lin.parameters()] == [(1, 3), (1,)]
    assert lin.weight.device is cpu1 and lin.bias.shape == (1,) and "linear(3, 1)" in repr(lin)
    bound = 1 / np.sqrt(3)
    assert np.abs(host(lin.weight.value)).max() < bound
    assert nn.Linear(3, 1, device=cpu1, seed=7).weight.value.tolist() == lin.weight.value.tolist()
    net = nn.Sequential(lin)
    assert net[0] is lin and len(net) == 1 and net.device is cpu1
    assert [p.name for p in net.parameters()] == ["0.weight", "0.bias"]
    x = kiln.ones((2, 3), device=cpu1)
    y = net(x)
    assert y.shape == (2, 1) and y.device is cpu1
    np.testing.assert_allclose(host(y), np.ones((2, 3)) @ host(lin.weight.value).T + host(lin.bias.value),
                               rtol=1e-5)
    with pytest.raises(kiln.DeviceMismatchError):
        net(kiln.ones((2, 3)))
    with pytest.raises(kiln.InvalidArgumentError):
        nn.Sequential(lin)
    conv = nn.Conv2d(1, 2, 3, padding=1, seed=1)
    model = nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * 2 * 2, 3))
    assert model(kiln.ones((4, 1, 4, 4))).shape == (4, 3)
    assert "conv2d" in repr(model)


def test_model_save_load(tmp_path):
    model = nn.preset("mlp", seed=1)
    path = str(tmp_path / "mlp.safetensors")
    model.save(path)
    other = nn.preset("mlp", seed=2)
    assert other.state_dict()["1.weight"].tolist() != model.state_dict()["1.weight"].tolist()
    other.load(path)
    assert other.state_dict()["1.bias"].tolist() == model.state_dict()["1.bias"].tolist()
    other.reset_parameters(2)
    assert sum(p.value.size for p in other.parameters()) == 795010
    with pytest.raises(kiln.NotFoundError):
        nn.preset("resnet")


def test_optimizers_match_pytorch():
    torch = pytest.importorskip("torch")
    w0, g0 = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    for make_k, make_t in [
        (lambda ps: nn.SGD(ps, 0.1, momentum=0.9, weight_decay=0.01),
         lambda ps: torch.optim.SGD(ps, 0.1, momentum=0.9, weight_decay=0.01)),
        (lambda ps: nn.Adam(ps, 0.01, betas=(0.8, 0.99)), lambda ps: torch.optim.Adam(ps, 0.01, betas=(0.8, 0.99))),
    ]:
        p = nn.Parameter(kiln.tensor(w0), "p")
        opt = make_k([p])
        ref = torch.tensor(w0, requires_grad=True)
        topt = make_t([ref])
        for _ in range(3):
            tape = nn.Tape()
            v = tape.watch(p)
            tape.backward(tape.sum(tape.mul(v, kiln.tensor(g0))))
            opt.step()
            opt.zero_grad()
            (ref * torch.from_numpy(g0)).sum().backward()
            topt.step()
            topt.zero_grad()
        np.testing.assert_allclose(host(p.value), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    opt.lr = 0.5
    assert opt.lr == 0.5 and "Adam" in repr(opt)
    with pytest.raises(kiln.InvalidArgumentError):
        nn.SGD([p], -1.0)
    assert abs(nn.lr_cosine(0.1, 5, 10) - 0.05) < 1e-12


def test_train_epoch_learns_and_reports():
    ds, _, _ = small_dataset(60, classes=3)
    model = nn.Sequential(nn.Flatten(), nn.Linear(20, 16, seed=1), nn.ReLU(), nn.Linear(16, 3, seed=2))
    opt = nn.SGD(model, 0.1, momentum=0.9)
    loader = nn.Loader(ds, batch_size=10, seed=0)
    seen = []
    first = nn.train_epoch(model, opt, loader, report_every=2, progress=seen.append, step_losses=6)
    assert first["steps"] == 6 and first["images"] == 60 and len(first["step_losses"]) == 6
    assert [p["step"] for p in seen][:3] == [2, 4, 6]
    for _ in range(15):
        last = nn.train_epoch(model, opt, loader)
    assert last["loss"] < first["loss"]
    loss, accuracy = nn.evaluate(model, nn.Loader(ds, batch_size=60, shuffle=False))
    assert 0.0 <= accuracy <= 1.0 and loss == pytest.approx(loss)

    def boom(progress):
        raise KeyError("from the callback")

    with pytest.raises(KeyError):
        nn.train_epoch(model, opt, loader, report_every=1, progress=boom)
    used = dict(((op, prov), n) for op, prov, n in nn.providers_used())
    assert any(op == "matmul" for op, _ in used)


def test_parameters_outlive_their_model():
    model = nn.preset("mlp", seed=0)
    params = model.parameters()
    layer = model[1]
    del model
    assert params[1].value.shape == (1000,) and layer.weight.shape == (1000, 784)
