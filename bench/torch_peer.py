#!/usr/bin/env python3
"""bench/torch_peer.py: PyTorch on the CPU as kiln-bench's peer; prints one JSON object per task on stdout.

Tasks: matmul:N (torch.mm of N x N), add16 (eager add of 16 floats), add:N,
softmax:R,C (along the last axis), conv2d:N,C,K,H,W,R,PAD (RxR, stride 1),
conv2d_bwd_input:... and conv2d_bwd_weight:... (the same shapes; one gradient),
sgd:N and adam:N (torch.optim's step on one parameter of N floats).
Each answer: {"task", "ok", "median_s", "min_s", "max_s", "q1_s", "q3_s",
"samples", "iters", "info"} with seconds per operation, or {"task", "ok": false,
"error"}. Timing mirrors kiln-bench's: warm-ups, samples of at least
--min-time seconds, the median and the spread.
"""
import argparse
import json
import os
import statistics
import sys
import time


def quantile(sorted_values, q):
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def measure(fn, reps, warmup, min_time):
    one = 0.0
    for _ in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn(1)
        one = time.perf_counter() - t0
    iters = 1
    if one < min_time:
        probe = max(1, min(1000000, int(min_time / 10 / one) if one > 0 else 1000))
        t0 = time.perf_counter()
        fn(probe)
        per = (time.perf_counter() - t0) / probe
        iters = max(1, int(min_time / per + 0.999)) if per > 0 else 1000000
    samples = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn(iters)
        samples.append((time.perf_counter() - t0) / iters)
    samples.sort()
    return {
        "median_s": statistics.median(samples),
        "min_s": samples[0],
        "max_s": samples[-1],
        "q1_s": quantile(samples, 0.25),
        "q3_s": quantile(samples, 0.75),
        "samples": len(samples),
        "iters": iters,
    }


def make_task(torch, task):
    name, _, arg = task.partition(":")
    nums = [int(x) for x in arg.split(",")] if arg else []
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=gen) * 2 - 1

    if name == "matmul" and len(nums) == 1:
        n = nums[0]
        a, b = rand(n, n), rand(n, n)

        def run(iters):
            for _ in range(iters):
                torch.mm(a, b)
        return run
    if name in ("matmul_bf16", "matmul_f16") and len(nums) == 1:
        # PyTorch 1.13 has a bf16 mm on the CPU (oneDNN) but no f16 one: the
        # f16 task fails with PyTorch's own message, which the row reports.
        dtype = torch.bfloat16 if name == "matmul_bf16" else torch.float16
        a, b = rand(nums[0], nums[0]).to(dtype), rand(nums[0], nums[0]).to(dtype)
        torch.mm(a, b)

        def run(iters):
            for _ in range(iters):
                torch.mm(a, b)
        return run
    if name == "add16" and not nums:
        a, b = rand(16), rand(16)

        def run(iters):
            for _ in range(iters):
                torch.add(a, b)
        return run
    if name == "add" and len(nums) == 1:
        a, b = rand(nums[0]), rand(nums[0])
        c = torch.empty(nums[0])

        def run(iters):
            # out= keeps the allocation out of a bandwidth figure, as the C loop does.
            for _ in range(iters):
                torch.add(a, b, out=c)
        return run
    if name == "softmax" and len(nums) == 2:
        x = rand(nums[0], nums[1])

        def run(iters):
            for _ in range(iters):
                torch.softmax(x, dim=-1)
        return run
    if name == "conv2d" and len(nums) == 7:
        n, c, k, h, w, r, pad = nums
        x, wt, bias = rand(n, c, h, w), rand(k, c, r, r) * 0.1, rand(k) * 0.1

        def run(iters):
            with torch.no_grad():
                for _ in range(iters):
                    torch.nn.functional.conv2d(x, wt, bias, padding=pad)
        return run
    if name in ("conv2d_bwd_input", "conv2d_bwd_weight") and len(nums) == 7:
        # One gradient alone, as autograd asks aten for it.
        n, c, k, h, w, r, pad = nums
        x, wt = rand(n, c, h, w), rand(k, c, r, r) * 0.1
        p, q = h + 2 * pad - r + 1, w + 2 * pad - r + 1
        dy = rand(n, k, p, q)
        mask = [name == "conv2d_bwd_input", name == "conv2d_bwd_weight", False]

        def run(iters):
            with torch.no_grad():
                for _ in range(iters):
                    torch.ops.aten.convolution_backward(dy, x, wt, None, [1, 1], [pad, pad], [1, 1], False, [0, 0],
                                                        1, mask)
        return run
    if name in ("sgd", "adam") and len(nums) == 1:
        param = torch.nn.Parameter(rand(nums[0]))
        param.grad = rand(nums[0]) * 1e-3
        if name == "sgd":
            opt = torch.optim.SGD([param], lr=1e-3, momentum=0.9, weight_decay=1e-4)
        else:
            opt = torch.optim.Adam([param], lr=1e-3)

        def run(iters):
            for _ in range(iters):
                opt.step()
        return run
    raise ValueError("unknown task %r (matmul:N, matmul_bf16:N, matmul_f16:N, add16, add:N, softmax:R,C, conv2d:N,C,K,H,W,R,PAD, "
                     "conv2d_bwd_input:N,C,K,H,W,R,PAD, conv2d_bwd_weight:..., sgd:N, adam:N)" % task)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=0.05)
    parser.add_argument("tasks", nargs="*")
    args = parser.parse_args()
    try:
        import torch
    except Exception as exc:  # torch missing or broken: every row says so
        for task in args.tasks:
            print(json.dumps({"task": task, "ok": False,
                              "error": "PyTorch unavailable in %s: %s (on Debian: apt install python3-torch, "
                                       "or run scripts/bench.sh, which installs it)" % (sys.executable, exc)}))
        return 0
    # Every usable core, as kiln and OpenBLAS use.
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    info = "torch %s, %d threads" % (torch.__version__, torch.get_num_threads())
    for task in args.tasks:
        try:
            result = measure(make_task(torch, task), args.reps, args.warmup, args.min_time)
            result.update({"task": task, "ok": True, "info": info})
        except Exception as exc:
            result = {"task": task, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc), "info": info}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
