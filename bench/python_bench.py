#!/usr/bin/env python3
"""bench/python_bench.py: kiln from Python beside PyTorch and NumPy in one process; prints one JSON object per task on stdout.

Tasks (seconds per operation, timed as bench/torch_peer.py times):
  kiln_add16        `a + b` of two kiln tensors of 16 floats on --device (the
                    results are freed as the loop goes; one synchronize ends a sample)
  torch_add16       `a + b` of two PyTorch CPU tensors of 16 floats (eager)
  numpy_add16       `a + b` of two NumPy arrays of 16 floats
  kiln_roundtrip    np.from_dlpack(kiln.from_dlpack(x)): NumPy -> kiln -> NumPy, x 16 floats
  torch_roundtrip   np.from_dlpack(torch.from_dlpack(x)): NumPy -> PyTorch -> NumPy
  numpy_roundtrip   np.from_dlpack(x): NumPy -> NumPy
  kiln_import       kiln.from_dlpack(x) alone
  kiln_export       np.from_dlpack(t) of a kiln tensor alone
  kiln_xp_add16     xp.add(a, b) through the Array API namespace (kiln.array_api) on --device
  kiln_oci_net      one step of examples/oci_net.py's loop (the GPU tutorial's Net and
                    loop: zero_grad, forward, CrossEntropyLoss, loss.backward(),
                    SGD step, loss.item()) on Fashion-MNIST batches of 4 on --device
  torch_oci_net     the same step with PyTorch's same Net (torch.nn), batches
                    sliced from the data set in memory (no DataLoader workers)
Each answer: {"task", "ok", "median_s", "min_s", "max_s", "q1_s", "q3_s",
"samples", "iters", "info"}, or {"task", "ok": false, "error"}. The round
trip's answer also says whether it copied: "zero_copy" is true when the
result's data pointer is x's and a write through x is read through the result
and a write through kiln's tensor is read through x ("copied_bytes": 0).
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
    return {"median_s": statistics.median(samples), "min_s": samples[0], "max_s": samples[-1],
            "q1_s": quantile(samples, 0.25), "q3_s": quantile(samples, 0.75), "samples": len(samples),
            "iters": iters}


def zero_copy_check(kiln, np):
    """NumPy -> kiln -> NumPy: the same memory all along, proved by writes through each side."""
    x = np.arange(16, dtype=np.float32)
    t = kiln.from_dlpack(x)
    y = np.from_dlpack(t)
    same_pointer = y.__array_interface__["data"][0] == x.__array_interface__["data"][0]
    x[3] = 1234.0  # NumPy writes ...
    seen_by_result = float(y[3]) == 1234.0 and t.tolist()[3] == 1234.0  # ... the result and kiln read it
    t.add_(kiln.ones(16, device=t.device))  # kiln writes ...
    t.device.synchronize()
    seen_by_x = float(x[0]) == 1.0 and float(x[3]) == 1235.0  # ... NumPy reads it
    ok = same_pointer and seen_by_result and seen_by_x
    return {"zero_copy": ok, "copied_bytes": 0 if ok else x.nbytes,
            "check": "data pointer %s; a NumPy write %s through the result; a kiln write %s through NumPy"
                     % ("shared" if same_pointer else "differs", "read" if seen_by_result else "NOT read",
                        "read" if seen_by_x else "NOT read")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=0.05)
    parser.add_argument("--device", default="cpu:0", help="kiln's device for kiln_add16 (default cpu:0)")
    parser.add_argument("tasks", nargs="*")
    args = parser.parse_args()

    def fail_all(message):
        for task in args.tasks:
            print(json.dumps({"task": task, "ok": False, "error": message}), flush=True)
        return 0

    try:
        import numpy as np
    except Exception as exc:
        return fail_all("NumPy unavailable in %s: %s (apt install python3-numpy)" % (sys.executable, exc))
    try:
        import kiln
    except Exception as exc:
        return fail_all("the kiln Python package is not importable in %s: %s (build kiln's tests, which build the "
                        "extension, or pip install ./python)" % (sys.executable, exc))
    try:
        import torch
        # One thread: the fastest setting for a 16-element op, and the figure
        # the references quote.
        torch.set_num_threads(1)
        torch_info = "torch %s" % torch.__version__
    except Exception as exc:
        torch, torch_info = None, "PyTorch unavailable: %s" % exc
    where = os.path.dirname(kiln._kiln.__file__)
    info = "kiln %s from %s; numpy %s; %s; Python %s" % (kiln.__version__, where, np.__version__, torch_info,
                                                        sys.version.split()[0])

    def kiln_add16():
        d = kiln.device(args.device)
        a, b = kiln.ones(16, device=d), kiln.ones(16, device=d)

        def run(iters):
            for _ in range(iters):
                a + b
            d.synchronize()
        return run

    def kiln_xp_add16():
        import kiln.array_api as xp
        d = kiln.device(args.device)
        a, b = xp.ones(16, device=d), xp.ones(16, device=d)

        def run(iters):
            for _ in range(iters):
                xp.add(a, b)
            d.synchronize()
        return run

    def torch_add16():
        a, b = torch.ones(16), torch.ones(16)

        def run(iters):
            for _ in range(iters):
                a + b
        return run

    def numpy_add16():
        a, b = np.ones(16, np.float32), np.ones(16, np.float32)

        def run(iters):
            for _ in range(iters):
                a + b
        return run

    x = np.ones(16, np.float32)

    def roundtrip(via):
        def run(iters):
            for _ in range(iters):
                np.from_dlpack(via(x))
        return run

    def kiln_import():
        def run(iters):
            for _ in range(iters):
                kiln.from_dlpack(x)
        return run

    def kiln_export():
        t = kiln.from_dlpack(x)

        def run(iters):
            for _ in range(iters):
                np.from_dlpack(t)
        return run

    # Host reads of a small result: float(t.sum()) (an op then a blocking
    # read), t.item() of a 0-d tensor, np.asarray of 16 floats.
    def reads(lib):
        if lib == "kiln":
            d = kiln.device(args.device)
            a = kiln.ones(16, device=d)
        elif lib == "torch":
            a = torch.ones(16)
        else:
            a = np.ones(16, np.float32)
        s = a.sum()
        return a, s, s.item

    def read_sum(lib):
        a, _, _ = reads(lib)

        def run(iters):
            for _ in range(iters):
                float(a.sum())
        return run

    def read_item(lib):
        _, _, item = reads(lib)

        def run(iters):
            for _ in range(iters):
                item()
        return run

    def read_asarray(lib):
        a, _, _ = reads(lib)

        def run(iters):
            for _ in range(iters):
                np.asarray(a)
        return run

    # The GPU tutorial's training step, both ways; one operation = one step of 4 images.
    def oci_data():
        from kiln import nn
        train = nn.FashionMNIST("train")
        return nn, train

    def kiln_oci_net():
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
        import oci_net
        nn, train = oci_data()
        d = kiln.device(args.device)
        loader = nn.Loader(train, d, batch_size=4, shuffle=True, seed=1)
        net = oci_net.Net().to(d)
        criterion = nn.CrossEntropyLoss()
        optimizer = kiln.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
        batches = iter(loader)

        def run(iters):
            nonlocal batches
            for _ in range(iters):
                try:
                    inputs, labels = next(batches)
                except StopIteration:
                    batches = iter(loader)
                    inputs, labels = next(batches)
                optimizer.zero_grad()
                loss = criterion(net(inputs), labels)
                loss.backward()
                optimizer.step()
                loss.item()
        return run

    def torch_oci_net():
        import torch.nn as tnn
        import torch.nn.functional as tF
        _, train = oci_data()
        pixels, labels_np = train.arrays()
        images = torch.from_numpy(pixels.astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
        labels = torch.from_numpy(labels_np.astype(np.int64))

        class Net(tnn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = tnn.Conv2d(1, 6, 5)
                self.pool = tnn.MaxPool2d(2, 2)
                self.conv2 = tnn.Conv2d(6, 16, 5)
                self.fc1 = tnn.Linear(16 * 4 * 4, 120)
                self.fc2 = tnn.Linear(120, 84)
                self.fc3 = tnn.Linear(84, 10)

            def forward(self, x):
                x = self.pool(tF.relu(self.conv1(x)))
                x = self.pool(tF.relu(self.conv2(x)))
                x = x.view(-1, 16 * 4 * 4)
                x = tF.relu(self.fc1(x))
                x = tF.relu(self.fc2(x))
                return self.fc3(x)

        net = Net()
        criterion = tnn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
        order = torch.randperm(images.shape[0])
        at = 0

        def run(iters):
            nonlocal at
            for _ in range(iters):
                if at + 4 > images.shape[0]:
                    at = 0
                idx = order[at:at + 4]
                at += 4
                inputs, targets = images[idx], labels[idx]
                optimizer.zero_grad()
                loss = criterion(net(inputs), targets)
                loss.backward()
                optimizer.step()
                loss.item()
        return run

    tasks = {
        "kiln_add16": kiln_add16, "torch_add16": torch_add16, "numpy_add16": numpy_add16,
        "kiln_roundtrip": lambda: roundtrip(kiln.from_dlpack),
        "torch_roundtrip": lambda: roundtrip(torch.from_dlpack),
        "numpy_roundtrip": lambda: roundtrip(lambda a: a),
        "kiln_import": kiln_import, "kiln_export": kiln_export,
        "kiln_oci_net": kiln_oci_net, "torch_oci_net": torch_oci_net,
        "kiln_xp_add16": kiln_xp_add16,
    }
    for lib in ("kiln", "torch", "numpy"):
        tasks[lib + "_read_sum"] = lambda lib=lib: read_sum(lib)
        tasks[lib + "_read_item"] = lambda lib=lib: read_item(lib)
        tasks[lib + "_read_asarray"] = lambda lib=lib: read_asarray(lib)
    for task in args.tasks:
        try:
            if task not in tasks:
                raise ValueError("unknown task %r (%s)" % (task, ", ".join(tasks)))
            if task.startswith("torch") and torch is None:
                raise RuntimeError(torch_info)
            result = measure(tasks[task](), args.reps, args.warmup, args.min_time)
            if task == "kiln_roundtrip":
                result.update(zero_copy_check(kiln, np))
            result.update({"task": task, "ok": True, "info": info})
        except Exception as exc:
            result = {"task": task, "ok": False, "error": "%s: %s" % (type(exc).__name__, exc), "info": info}
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
