# python/tests/test_nn.py: kiln.nn: data sets and the loader, safetensors, the tape's gradients against PyTorch's, layers, models, optimizers, the training loop.
import os
import subprocess
import sys
import textwrap
import threading

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


def test_tape_index_select_is_an_embedding_lookup():
    # An embedding table read at token ids (one repeated): its gradient is
    # PyTorch's, the repeated row getting both slices.
    torch = pytest.importorskip("torch")
    table0 = rng.standard_normal((6, 4)).astype(np.float32)
    ids = np.array([3, 1, 3, 5], np.int64)
    labels = np.array([0, 3, 2, 1], np.int32)
    table = nn.Parameter(kiln.tensor(table0), "embedding")
    tape = nn.Tape()
    rows = tape.index_select(tape.watch(table), 0, kiln.tensor(ids))
    loss = tape.cross_entropy(rows, kiln.tensor(labels))
    tape.backward(loss)
    tt = torch.tensor(table0, requires_grad=True)
    tl = torch.nn.functional.cross_entropy(torch.nn.functional.embedding(torch.from_numpy(ids), tt),
                                           torch.from_numpy(labels).long())
    tl.backward()
    assert abs(loss.item() - tl.item()) < 1e-5
    np.testing.assert_allclose(host(table.grad), tt.grad.numpy(), rtol=1e-5, atol=1e-7)


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
    assert sum(p.value.numel() for p in other.parameters()) == 795010
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


def run_child(code):
    """Run `code` in a fresh interpreter whose freed memory is overwritten
    (MALLOC_PERTURB_), so that a read after free faults there rather than
    passing unseen; returns its stdout."""
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=240,
                           env=dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165"))
    assert child.returncode == 0, child.stderr[-2000:]
    return child.stdout


def test_a_tape_keeps_what_it_recorded_alive():
    # The C tape holds the addresses of the parameters a model or layer ran
    # with; freeing the model before backward used to leave it reading freed
    # memory (kiln_nn__param_add_grad).
    out = run_child("""
        import gc, kiln, kiln.nn as nn
        x = kiln.rand((4, 20), seed=1)
        for make in (lambda: nn.Sequential(nn.Linear(20, 8, seed=1), nn.ReLU(), nn.Linear(8, 3, seed=2)),
                     lambda: nn.Linear(20, 3, seed=1)):
            tape = nn.Tape()
            model = make()
            loss = tape.mean(tape.relu(model(x, tape)))
            del model
            gc.collect()
            junk = [nn.Linear(20, 8) for _ in range(50)]  # reuse what was freed
            tape.backward(loss)
            print(len(tape))
        # A watched parameter of a freed layer, too.
        tape = nn.Tape()
        w = tape.watch(nn.Linear(20, 3, seed=1).weight)
        loss = tape.sum(tape.matmul(x, w, transpose_b=True))
        gc.collect()
        tape.backward(loss)
        print("ok")
    """)
    assert out.split() == ["0", "0", "ok"]
    # The gradients are those of the live model, and the record lets go after.
    x = kiln.rand((4, 20), seed=1)
    model = nn.Sequential(nn.Linear(20, 3, seed=1))
    tape = nn.Tape()
    loss = tape.mean(model(x, tape))
    tape.backward(loss)
    np.testing.assert_allclose(host(model.parameters()[1].grad), np.full(3, 1 / 3), rtol=1e-6)


def train_setup():
    ds, _, _ = small_dataset(40, classes=3)
    model = nn.Sequential(nn.Flatten(), nn.Linear(20, 8, seed=1), nn.ReLU(), nn.Linear(8, 3, seed=2))
    return model, nn.SGD(model, 0.05), nn.Loader(ds, batch_size=4, seed=0)


def test_two_threads_on_one_model_get_an_error_not_a_crash():
    model, opt, loader = train_setup()
    inside, release = threading.Event(), threading.Event()
    errors = {}

    def progress(_):
        inside.set()
        release.wait(60)  # without the GIL: the other thread runs now

    def first():
        try:
            nn.train_epoch(model, opt, loader, report_every=1, max_steps=2, progress=progress)
        except Exception as e:  # pragma: no cover - reported below
            errors["first"] = e

    a = threading.Thread(target=first, daemon=True)
    a.start()
    assert inside.wait(60)
    x = kiln.rand((4, 1, 4, 5), seed=2)
    ident = a.ident
    try:
        # The other thread's whole epoch, and each object alone.
        for call, name in [(lambda: nn.train_epoch(model, opt, loader), "kiln.nn.Sequential"),
                           (lambda: nn.evaluate(model, loader), "kiln.nn.Sequential"),
                           (lambda: model(x), "kiln.nn.Sequential"),
                           (lambda: model[1](x.reshape(4, 20)), "kiln.nn.Layer"),
                           (lambda: model.parameters()[0].grad, "kiln.nn.Parameter"),
                           (lambda: model.reset_parameters(1), "kiln.nn.Sequential"),
                           (opt.step, "kiln.nn.Optimizer"),
                           (opt.zero_grad, "kiln.nn.Optimizer"),
                           (lambda: setattr(opt, "lr", 0.1), "kiln.nn.Optimizer"),
                           (lambda: next(iter(loader)), "kiln.nn.Loader"),
                           (lambda: loader.reset(0), "kiln.nn.Loader")]:
            with pytest.raises(RuntimeError) as e:
                call()
            text = str(e.value)
            assert f"this {name} is in use by train_epoch" in text and f"on thread {ident}" in text, text
            assert "single-threaded" in text
    finally:
        release.set()
        a.join(60)
    assert not a.is_alive() and not errors
    # Free again once the epoch returned.
    assert model(x).shape == (4, 3)
    nn.train_epoch(model, opt, loader, max_steps=1)


def test_threads_training_at_once_never_crash():
    # Both threads start epochs over the same objects; whichever finds them
    # in use gets RuntimeError; nothing crashes or waits forever.
    model, opt, loader = train_setup()
    results, start = [], threading.Barrier(2)

    def work():
        start.wait(30)
        for _ in range(20):
            try:
                nn.train_epoch(model, opt, loader)
                results.append("ran")
            except RuntimeError as e:
                assert "in use by train_epoch" in str(e)
                results.append("refused")

    threads = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and len(results) == 40 and "ran" in results


def test_a_progress_callback_cannot_use_the_model_it_trains():
    model, opt, loader = train_setup()
    x = kiln.rand((4, 1, 4, 5), seed=2)
    with pytest.raises(RuntimeError, match=r"this kiln.nn.Sequential is in use by train_epoch further up this "
                                           r"thread's stack"):
        nn.train_epoch(model, opt, loader, report_every=1, progress=lambda _: model(x))
    assert model(x).shape == (4, 3)
    # An optimizer made over a layer before the layer joined the model
    # follows it into the model.
    layer = nn.Linear(3, 3, seed=4)
    early = nn.SGD(layer.parameters(), 0.1)
    model.add(layer)
    with pytest.raises(RuntimeError, match=r"this kiln.nn.Optimizer is in use by train_epoch \(through its "
                                           r"kiln.nn.Sequential\) further up"):
        nn.train_epoch(model, opt, loader, report_every=1, progress=lambda _: early.step())
    early.step()


def test_optimizer_hyperparameters_are_checked_at_once():
    p = nn.Parameter(kiln.ones(3), "w")
    for call, text in [(lambda: nn.SGD([p], 1e300), "SGD: lr = 1e+300 is beyond what a float32 holds"),
                       (lambda: nn.SGD([p], 1e-50), "SGD: lr = 1e-50 is beyond what a float32 holds"),
                       (lambda: nn.SGD([p], float("nan")), "SGD: lr = nan; it must be finite and lie in (0, inf)"),
                       (lambda: nn.SGD([p], 0.1, momentum=-1), "SGD: momentum = -1"),
                       (lambda: nn.SGD([p], 0.1, dampening=2), "SGD: dampening = 2; it must be finite and lie in "
                                                               "[0, 1]"),
                       (lambda: nn.SGD([p], 0.1, weight_decay=float("inf")), "SGD: weight_decay = inf"),
                       (lambda: nn.SGD([p], 0.1, nesterov=True), "SGD: nesterov needs momentum > 0"),
                       (lambda: nn.Adam([p], lr=1e39), "Adam: lr = 1e+39 is beyond"),
                       (lambda: nn.Adam([p], betas=(1.0, 0.9)), "Adam: betas[0] = 1; it must be finite and lie in "
                                                                "[0, 1)"),
                       (lambda: nn.Adam([p], betas=(0.9, -0.1)), "Adam: betas[1] = -0.1"),
                       (lambda: nn.Adam([p], eps=0.0), "Adam: eps = 0; it must be finite and lie in (0, inf)")]:
        with pytest.raises(ValueError) as e:
            call()
        assert text in str(e.value)
    for opt in (nn.SGD([p], 0.1), nn.Adam([p])):
        for bad in (1e300, 0.0, -1.0, float("inf")):
            with pytest.raises(ValueError, match=r"lr = "):
                opt.lr = bad
        assert opt.lr == pytest.approx(0.1 if "SGD" in repr(opt) else 1e-3)
        opt.lr = 3e38
        p.value.add_(kiln.ones(3), alpha=0.0)
        with nn.Tape() as tape:
            tape.backward(tape.sum(tape.watch(p)))
        opt.lr = 1e-4
        opt.step()  # every step still runs


def test_safetensors_names_with_nul_are_refused(tmp_path):
    path = str(tmp_path / "n.safetensors")
    t = kiln.ones(2)
    for tensors, meta, text in [({"a\0b": t}, None, "tensor name 'a\\x00b'"),
                                ({"a": t}, {"k\0": "v"}, "metadata key 'k\\x00'"),
                                ({"a": t}, {"k": "v\0w"}, "metadata value 'v\\x00w'")]:
        with pytest.raises(ValueError) as e:
            nn.save_safetensors(path, tensors, meta)
        assert text in str(e.value) and "NUL" in str(e.value)
        assert not os.path.exists(path)
    with pytest.raises(ValueError, match=r"tensor name 'a\\x00'"):
        nn.load_safetensors_into(path, {"a\0": t})
    nn.save_safetensors(path, {"a": t}, {"k": "v"})
    assert nn.load_safetensors(path, metadata=True)[1] == {"k": "v"}


@pytest.mark.parametrize("name, call", [
    ("classes", lambda: nn.Dataset.from_arrays(np.zeros((2, 2, 2), np.uint8), np.zeros(2, np.uint8), 2**32 + 3)),
    ("classes", lambda: nn.load_idx("images", "labels", 2**32 + 10)),
    ("label", lambda: nn.fashion_mnist_label_name(2**32 + 1)),
    ("stride", lambda: nn.Conv2d(1, 1, 3, stride=2**32 + 1)),
    ("kernel_size[0]", lambda: nn.MaxPool2d((2**32 + 2, 2))),
])
def test_nn_int_arguments_past_32_bits_are_refused(name, call):
    with pytest.raises(OverflowError) as e:
        call()
    assert str(e.value).startswith(name + " ") and "is out of range" in str(e.value)
