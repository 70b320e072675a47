#!/usr/bin/env python3
"""tests/cuda/emulator/run_emulated.py: run a suite against the test driver (libcuda.so.1 of this folder), failing where a plain run would only skip or pass.

  run_emulated.py [--min-launches N] [--list-idle] -- SUITE [ARGS]

The environment (LD_LIBRARY_PATH, KILN_BACKEND, ...) comes from meson. The
suite fails here when
  - it skips (exit 77): the emulated device must be found, and the reason it
    was not (a driver entry point the plugin imports and the test driver
    lacks, say) is the message to read;
  - the test driver reported an error on stderr ("kiln-fakecuda: error:"): a
    call it refused (no current context, a launch over the device's limits,
    a pointer outside every allocation), a kernel fault, a leak, even when
    the suite itself passed;
  - fewer than N kernels were launched (proof that kernels really ran).
It prints what the driver did (launches, blocks, threads) and, with
--list-idle, the kernels the suite never launched.
"""
import argparse
import os
import subprocess
import sys
import tempfile

SKIP = 77
MARK = "kiln-fakecuda: error:"


def read_report(path):
    totals, kernels = {}, {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[0] == "kernel":
                    kernels[parts[1]] = int(parts[2])
                elif len(parts) == 2:
                    totals[parts[0]] = int(parts[1])
    except OSError:
        pass
    return totals, kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-launches", type=int, default=1)
    parser.add_argument("--list-idle", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no suite to run")

    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.txt")
        env = dict(os.environ, KILN_FAKECUDA_REPORT=report)
        done = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
        sys.stderr.write(done.stderr)
        totals, kernels = read_report(report)

    failures = []
    if done.returncode == SKIP:
        failures.append("the suite skipped (exit 77), but the emulated CUDA device must be found here: see its "
                        "reason above")
    elif done.returncode != 0:
        failures.append(f"the suite failed (exit {done.returncode})")
    errors = [line for line in done.stderr.splitlines() if MARK in line]
    if errors:
        failures.append(f"the test driver reported {len(errors)} error(s); the first: {errors[0]}")
    launches = totals.get("launches", 0)
    if done.returncode == 0 and launches < args.min_launches:
        failures.append(f"only {launches} kernel launch(es) ran, fewer than {args.min_launches}")

    # The test driver's own test kernels are not kiln's.
    kernels = {name: count for name, count in kernels.items() if not name.startswith("fakecuda_test_")}
    ran = sorted(name for name, count in kernels.items() if count)
    idle = sorted(name for name, count in kernels.items() if not count)
    print(f"test driver: {launches} launches of {len(ran)} of its {len(kernels)} kernels, "
          f"{totals.get('blocks', 0)} blocks, {totals.get('threads', 0)} threads, "
          f"{totals.get('rejected', 0)} errors reported")
    if idle and args.list_idle:
        print("kernels never launched: " + " ".join(idle))
    for failure in failures:
        print("FAIL: " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
