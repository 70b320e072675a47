#!/usr/bin/env python3
# examples/train.py: train kiln-train's MLP (784-1000-10, SGD with momentum) or LeNet on Fashion-MNIST from Python, on any kiln device.
"""Train on Fashion-MNIST with kiln.nn, on whatever device is there.

The step is written out in Python (a tape records the forward pass, backward
fills the gradients, the optimizer updates in place); --loop c runs the same
epoch inside libkiln-nn (kiln.nn.train_epoch) instead. Nothing is read back to
the host during an epoch except the two sums at its end.

    python3 examples/train.py                       # the default device, 10 epochs
    python3 examples/train.py --device opencl:0 --epochs 2
    python3 examples/train.py --limit 6000 --epochs 1 --model lenet
"""
import argparse
import sys
import time

import kiln
from kiln import nn


def parse_args():
    p = argparse.ArgumentParser(description="Train an MLP or a LeNet on Fashion-MNIST with kiln")
    p.add_argument("--model", choices=["mlp", "lenet"], default="mlp",
                   help="mlp: 784-1000-10, ReLU, SGD lr 0.05 momentum 0.9 (default); lenet: Adam lr 0.002")
    p.add_argument("--device", default=None, help="a selector such as cpu:0 or opencl:0 (default: kiln's default)")
    p.add_argument("--epochs", type=int, default=10, help="passes over the training set (default 10)")
    p.add_argument("--batch", type=int, default=100, help="images per step (default 100)")
    p.add_argument("--seed", type=int, default=42, help="initialisation and shuffle (default 42)")
    p.add_argument("--lr", type=float, default=None, help="learning rate instead of the preset's")
    p.add_argument("--limit", type=int, default=0, help="train on the first N images only")
    p.add_argument("--loop", choices=["python", "c"], default="python",
                   help="the step loop: written out in Python with a tape (default), or kiln.nn.train_epoch")
    p.add_argument("--save", default=None, help="write the trained parameters as safetensors (PyTorch's names)")
    return p.parse_args()


def python_epoch(model, optimizer, loader, tape):
    """One epoch, step by step: forward on the tape, loss, backward, update."""
    device = model.device
    loss_sum = kiln.zeros((), device=device)
    correct = kiln.zeros((), kiln.int32, device=device)
    images_seen = steps = 0
    start = time.perf_counter()
    for images, labels in loader:
        logits = model(images, tape)
        loss = tape.cross_entropy(logits, labels)
        tape.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        # Kept on the device: reading them every step would make the host wait.
        loss_sum = loss_sum + loss
        # kiln.eq's hits are int32 (== would give bool), summed to a 0-d shape:
        # sum() would make an int64; not every device serves bool or int64.
        correct = correct + kiln.sum_to(kiln.eq(logits.argmax(axis=1), labels), ())
        images_seen += labels.shape[0]
        steps += 1
    loss_mean = loss_sum.item() / steps  # the one wait of the epoch
    seconds = time.perf_counter() - start
    return {"steps": steps, "images": images_seen, "loss": loss_mean, "accuracy": correct.item() / images_seen,
            "seconds": seconds, "images_per_s": images_seen / seconds}


def main():
    args = parse_args()
    device = kiln.device(args.device)
    try:
        train = nn.FashionMNIST("train")
        test = nn.FashionMNIST("test")
    except kiln.Error as e:
        sys.exit(f"train.py: {e}")
    if args.limit:
        pixels, labels = train.arrays()
        train = nn.Dataset.from_arrays(pixels[:args.limit], labels[:args.limit], train.classes)

    model = nn.preset(args.model, device, seed=args.seed)
    optimizer = nn.optimizer_preset(args.model, model)
    if args.lr:
        optimizer.lr = args.lr
    base_lr = optimizer.lr
    layout = "nchw"
    loader = nn.Loader(train, device, batch_size=args.batch, seed=args.seed, layout=layout)
    test_loader = nn.Loader(test, device, batch_size=1000, shuffle=False, layout=layout)
    print(f"kiln {kiln.__version__}: {args.model} ({sum(p.value.numel() for p in model.parameters()):,} parameters) "
          f"on {device.selector} ({device.name}), {optimizer}, batch {args.batch}, {len(train)} images, "
          f"{args.loop} loop")

    tape = nn.Tape()
    nn.providers_reset()
    for epoch in range(args.epochs):
        optimizer.lr = nn.lr_cosine(base_lr, epoch, args.epochs)
        if args.loop == "python":
            stats = python_epoch(model, optimizer, loader, tape)
        else:
            stats = nn.train_epoch(model, optimizer, loader)
        test_loss, test_accuracy = nn.evaluate(model, test_loader)
        print(f"epoch {epoch + 1:2d}: loss {stats['loss']:.4f}, train accuracy {stats['accuracy']:.4f}, "
              f"test accuracy {test_accuracy:.4f}, {stats['seconds']:.2f} s, {stats['images_per_s']:,.0f} images/s")
    used = {}
    for op, provider, calls in nn.providers_used():
        used.setdefault(op, []).append(f"{provider} x{calls}")
    print("providers: " + "; ".join(f"{op}: {', '.join(v)}" for op, v in used.items()))
    if args.save:
        model.save(args.save)
        print(f"saved the parameters to {args.save} (torch.nn.Sequential names)")


if __name__ == "__main__":
    main()
