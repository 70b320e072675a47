#!/usr/bin/env python3
"""bench/torch_train.py: PyTorch on the CPU training kiln-train's models, kiln-bench's peer for the training section.

The recipe is kiln-train's (examples/kiln_train.c): Fashion-MNIST scaled to
[0, 1], batches drawn from a fresh permutation each epoch, the last smaller
one kept; PyTorch's default initialisation (kaiming-uniform weights, biases
uniform in +-1/sqrt(fan_in)), which kiln copies;
  mlp:   784-1000-10, ReLU, cross-entropy, SGD (lr 0.05, momentum 0.9);
  lenet: conv 1->6 5x5 pad 2, ReLU, max-pool 2; conv 6->16 5x5, ReLU,
         max-pool 2; linear 400-120-84-10 with ReLU; Adam (lr 0.002);
  both with the learning rate annealed once per epoch by a cosine
  (CosineAnnealingLR with T_max = epochs, set by hand at each epoch's start).
Per epoch it prints one JSON object: {"model", "epoch", "loss" (mean over the
epoch's batches), "train_acc" (running, as the batches were trained),
"test_acc", "seconds" (training only), "images_per_s", "threads", "info"};
then {"model", "done": true, "threads", "cores", "probe_one", "probe_all"}
with the thread probe's images per second (-1 where not probed). With --serve
it prints {"ready": true} after the set-up and trains one epoch per line
"epoch" it reads, so that kiln-bench can alternate PyTorch's epochs with kiln's
on a machine whose load changes. With --threads best
(the default) it first trains a throwaway copy for a few steps on one thread
and on every usable core and keeps the faster count: PyTorch's OpenMP threads
cost more than they give on steps this small, so a fixed count would flatter
or wrong it. With --autocast bf16 the forward and the loss run under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's mixed precision (the
peer of kiln's bf16 training). Errors come back as {"ok": false, "error"}.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time


def read_idx(path, ndim):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 + 4 * ndim or data[2] != 8 or data[3] != ndim:
        raise ValueError("%s is not an IDX file of %d dimensions of unsigned bytes" % (path, ndim))
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(torch, folder, split, limit):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(folder, prefix + "-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(folder, prefix + "-labels-idx1-ubyte.gz"), 1)
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype("float32") / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype("int64"))
    return x, y


def make_model(torch, name):
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 10))
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    raise ValueError("unknown model %r (mlp, lenet)" % name)


def make_optimizer(torch, args, model):
    if args.model == "mlp":
        return torch.optim.SGD(model.parameters(), lr=args.lr or 0.05, momentum=args.momentum)
    return torch.optim.Adam(model.parameters(), lr=args.lr or 0.002)


def autocast(torch, mode):
    """torch.autocast on the CPU in bf16, or a context that does nothing."""
    import contextlib
    if mode == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def steps(torch, model, opt, x, y, batch, order, count, mode="none"):
    """Train on the first `count` batches of `order`; returns (sum of batch
    losses, correct, images, batches)."""
    loss_fn = torch.nn.functional.cross_entropy
    loss_sum = torch.zeros(())
    correct = torch.zeros((), dtype=torch.int64)
    seen = nb = 0
    n = len(order)
    for start in range(0, n, batch):
        if nb == count:
            break
        idx = order[start:start + batch]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        with autocast(torch, mode):
            out = model(xb)
            loss = loss_fn(out, yb)
        loss.backward()
        opt.step()
        with torch.no_grad():
            loss_sum += loss.detach()
            correct += (out.argmax(1) == yb).sum()
        seen += len(idx)
        nb += 1
    return float(loss_sum), int(correct), seen, nb


def evaluate(torch, model, x, y, batch, mode="none"):
    correct = 0
    with torch.no_grad(), autocast(torch, mode):
        for start in range(0, len(y), batch):
            out = model(x[start:start + batch])
            correct += int((out.argmax(1) == y[start:start + batch]).sum())
    return correct / len(y)


def probe(torch, args, x, y, threads):
    """Images per second of a throwaway copy trained on `threads` threads."""
    torch.set_num_threads(threads)
    model = make_model(torch, args.model)
    opt = make_optimizer(torch, args, model)
    gen = torch.Generator().manual_seed(1)
    order = torch.randperm(len(y), generator=gen)
    steps(torch, model, opt, x, y, args.batch, order, 5, args.autocast)
    count = args.probe_steps
    t0 = time.perf_counter()
    _, _, seen, _ = steps(torch, model, opt, x, y, args.batch, order[5 * args.batch:], count, args.autocast)
    return seen / (time.perf_counter() - t0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.0, help="0: the recipe's")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD's (the mlp)")
    parser.add_argument("--schedule", default="cosine", help="cosine (per epoch) or none")
    parser.add_argument("--threads", default="best", help="a count, or best (probe 1 and all cores)")
    parser.add_argument("--probe-steps", type=int, default=60)
    parser.add_argument("--limit", type=int, default=0, help="use the first N training images only")
    parser.add_argument("--test-limit", type=int, default=0, help="use the first N test images only")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--autocast", default="none", choices=["none", "bf16"],
                        help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    parser.add_argument("--serve", action="store_true",
                        help="after the set-up, train one epoch per line 'epoch' read from stdin (any other line or "
                             "the end of input stops), so a caller can interleave its own epochs")
    parser.add_argument("--data", default=os.environ.get("KILN_DATA_DIR") and
                        os.path.join(os.environ["KILN_DATA_DIR"], "fashion-mnist") or
                        "/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    try:
        import torch
    except Exception as exc:
        print(json.dumps({"model": args.model, "ok": False,
                          "error": "PyTorch unavailable in %s: %s" % (sys.executable, exc)}))
        return 0
    try:
        x, y = load(torch, args.data, "train", args.limit)
        tx, ty = load(torch, args.data, "test", args.test_limit)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        rates = {}
        if args.threads == "best":
            for t in sorted({1, cores}):
                rates[t] = probe(torch, args, x, y, t)
            threads = max(rates, key=rates.get)
        else:
            threads = int(args.threads)
        torch.set_num_threads(threads)
        torch.manual_seed(args.seed)
        model = make_model(torch, args.model)
        opt = make_optimizer(torch, args, model)
        gen = torch.Generator().manual_seed(args.seed)
        base_lr = opt.param_groups[0]["lr"]
        info = "torch %s, %d thread%s%s" % (torch.__version__, threads, "" if threads == 1 else "s",
                                            ", autocast bf16" if args.autocast == "bf16" else "")
        if args.serve:
            print(json.dumps({"model": args.model, "ok": True, "ready": True, "threads": threads, "info": info}),
                  flush=True)
        for epoch in range(args.epochs):
            if args.serve:
                command = sys.stdin.readline().strip()
                if command != "epoch":
                    break
            if args.schedule == "cosine":
                for group in opt.param_groups:
                    group["lr"] = base_lr * 0.5 * (1 + math.cos(math.pi * epoch / args.epochs))
            order = torch.randperm(len(y), generator=gen)
            t0 = time.perf_counter()
            loss_sum, correct, seen, nb = steps(torch, model, opt, x, y, args.batch, order, -1, args.autocast)
            seconds = time.perf_counter() - t0
            test_acc = evaluate(torch, model, tx, ty, 1000, args.autocast)
            print(json.dumps({"model": args.model, "ok": True, "epoch": epoch + 1, "loss": loss_sum / nb,
                              "train_acc": correct / seen, "test_acc": test_acc, "seconds": seconds,
                              "images_per_s": seen / seconds, "threads": threads, "info": info}), flush=True)
        print(json.dumps({"model": args.model, "ok": True, "done": True, "threads": threads, "info": info,
                          "cores": cores, "probe_one": rates.get(1, -1),
                          "probe_all": rates.get(cores, -1) if cores > 1 else -1}), flush=True)
    except Exception as exc:
        print(json.dumps({"model": args.model, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
