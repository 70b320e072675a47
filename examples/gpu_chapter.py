#!/usr/bin/env python3
# examples/gpu_chapter.py: the "GPUs" section of Dive into Deep Learning, cell by cell, in Python with kiln in place of PyTorch.
"""The d2l.ai chapter "GPUs" with kiln.

Each cell of the chapter's PyTorch tab, in order, with the PyTorch line above
the kiln one. Runs on whatever is there: with no GPU, try_gpu() is the CPU and
the "second GPU" is a second CPU device when KILN_CPU_DEVICES=2 is set (the
chapter needs two GPUs; kiln lets the CPU stand in for them).

    python3 examples/gpu_chapter.py
    KILN_CPU_DEVICES=2 python3 examples/gpu_chapter.py
    KILN_DEVICE=opencl:0 python3 examples/gpu_chapter.py
"""
import argparse
import time

import kiln
from kiln import nn


def cell(title):
    print(f"\n## {title}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="matmuls in exercise 3 (default 1000)")
    args = parser.parse_args()
    print(f"# The \"GPUs\" section of Dive into Deep Learning, in Python with kiln {kiln.__version__}")

    # torch.device('cpu'), torch.cuda.device('cuda'), torch.cuda.device('cuda:1')
    cell("Computing devices")
    print(kiln.device("cpu"), kiln.try_gpu(), kiln.try_gpu(1))
    for d in kiln.devices():
        print(f"{'*' if d is kiln.default_device() else ' '} {d.selector:<10} {d.type:<4} {d.name}")

    # torch.cuda.device_count()
    print("GPUs:", kiln.num_gpus())

    # def try_gpu(i=0) ... def try_all_gpus() ...: kiln has both (kiln.try_gpu, kiln.try_all_gpus)
    cell("try_gpu(), try_gpu(10), try_all_gpus()")
    try_gpu, try_all_gpus = kiln.try_gpu, kiln.try_all_gpus
    print(try_gpu(), try_gpu(10), try_all_gpus())

    # x = torch.tensor([1, 2, 3]); x.device
    cell("Tensors and GPUs")
    x = kiln.tensor([1, 2, 3])
    print(x.device)

    # X = torch.ones(2, 3, device=try_gpu()); X
    cell("Storage on the GPU")
    X = kiln.ones((2, 3), device=try_gpu())
    print("X =", X)

    # Y = torch.rand(2, 3, device=try_gpu(1)); Y
    # The chapter needs two GPUs. Without them, try_gpu(1) would be the CPU
    # again, so the next device kiln sees stands in for it (a second CPU
    # device with KILN_CPU_DEVICES=2), as in kiln-demo.
    gpu1 = try_gpu(1) if kiln.num_gpus() >= 2 else next((d for d in kiln.devices() if d is not X.device), X.device)
    Y = kiln.rand((2, 3), device=gpu1)
    print(f"Y on {gpu1} =", Y)
    if gpu1 is X.device:
        print("(one device only: run with KILN_CPU_DEVICES=2 to see two)")

    # X + Y  -> an exception: the framework never copies behind your back
    cell("Copying")
    try:
        X + Y
        print("X + Y ran: X and Y share a device here, so there is nothing to refuse")
    except kiln.DeviceMismatchError as e:
        print(f"X + Y raised kiln.{type(e).__name__} (status {e.status_name}):\n  {e}")

    # Z = X.cuda(1); print(X); print(Z)
    Z = X.copy(gpu1)
    print("X =", X)
    print("Z =", Z)

    # Y + Z
    print("Y + Z =", Y + Z)

    # Z.cuda(1) is Z
    print("Z.to(gpu1) is Z:", Z.to(gpu1) is Z)

    # net = nn.Sequential(nn.Linear(3, 1)); net = net.to(device=try_gpu())
    cell("Neural networks and GPUs")
    net = nn.Sequential(nn.Linear(3, 1, device=try_gpu(), seed=0))
    # net(X)
    print("net(X) =", net(X))
    # net[0].weight.data.device
    print("net[0].weight.device:", net[0].weight.device)

    # Exercise 3: 1000 matrix-matrix multiplications of 100x100, logging the
    # Frobenius norm one result at a time vs keeping the log on the device.
    cell(f"Exercise 3: {args.steps} matmuls of 100x100, logging the Frobenius norm")
    device = try_gpu()
    A = kiln.uniform((100, 100), -1.0, 1.0, seed=1, device=device)
    B = kiln.uniform((100, 100), -1.0, 1.0, seed=2, device=device)

    def step_norm(i):
        return (A @ (B * (1.0 + i * 1e-3))).norm()

    for i in range(3):  # warm up: kernel builds and the memory pool stay out of the timing
        step_norm(i).item()

    t0 = time.perf_counter()
    host_log = [step_norm(i).item() for i in range(args.steps)]  # (a) the host waits at every step
    time_a = time.perf_counter() - t0

    t0 = time.perf_counter()
    log = kiln.empty((args.steps,), device=device)  # (b) the log stays on the device ...
    for i in range(args.steps):
        log.copy_from(step_norm(i), i)
    device_log = log.tolist()  # ... and is read once
    time_b = time.perf_counter() - t0

    diff = max(abs(p - q) for p, q in zip(host_log, device_log))
    print(f"device: {device.selector} ({device.name})")
    print(f"norms: first {host_log[0]:.4f}, last {host_log[-1]:.4f}; largest difference between (a) and (b): {diff:g}")
    print(f"(a) read each norm to the host : {time_a * 1e3:8.2f} ms  ({time_a * 1e6 / args.steps:.1f} us per step)")
    print(f"(b) log on the device, one read: {time_b * 1e3:8.2f} ms  ({time_b * 1e6 / args.steps:.1f} us per step)")
    print(f"ratio (a)/(b): {time_a / time_b:.2f}x")
    print("\ndone")


if __name__ == "__main__":
    main()
