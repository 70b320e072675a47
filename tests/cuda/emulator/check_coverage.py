#!/usr/bin/env python3
"""tests/cuda/emulator/check_coverage.py: the CUDA plugin on emulated devices of several compute capabilities: which ones the fatbin covers, the warning devinfo shows, and whether kernels run.

  check_coverage.py DEVINFO ARCHS

ARCHS is the build's nvcc_archs ("75,80,86,89,90": SASS for each, PTX for the
last). For each compute capability tried, the expectation follows CUDA's
rule, written here independently of the plugin and of the test driver: SASS
for sm_XY runs on X.Z with Z >= Y; PTX for compute_XY is compiled by the
driver for any later capability. Then:
  - covered by SASS: no warning, and `devinfo --check` passes on cuda:0;
  - by PTX only: a warning that names the PTX, and the check passes;
  - not at all: a warning that kiln's kernels cannot run, and the check fails
    with UNAVAILABLE (without crashing, and without any call the test driver
    refuses).
"""
import json
import os
import subprocess
import sys

MARK = "kiln-fakecuda: error:"


def expectation(cc, archs):
    major, minor = cc // 10, cc % 10
    if any(a // 10 == major and a % 10 <= minor for a in archs):
        return "sass"
    if cc >= archs[-1]:
        return "ptx"
    return "none"


def run(devinfo, cc, *args):
    env = dict(os.environ, KILN_FAKECUDA_CC=f"{cc // 10}.{cc % 10}")
    done = subprocess.run([devinfo, *args], env=env, capture_output=True, text=True)
    return done


def main() -> int:
    devinfo, archs = sys.argv[1], [int(a) for a in sys.argv[2].split(",")]
    failures = []
    for cc in sorted({70, archs[0], archs[-1], archs[-1] + 1 if archs[-1] % 10 < 9 else archs[-1], 87, 100, 121}):
        expected = expectation(cc, archs)
        listing = run(devinfo, cc, "--json")
        check = run(devinfo, cc, "--check")
        label = f"compute capability {cc // 10}.{cc % 10} ({expected})"
        for done in (listing, check):
            for line in done.stderr.splitlines():
                if MARK in line:
                    failures.append(f"{label}: {line}")
        try:
            devices = json.loads(listing.stdout)["devices"]
        except (ValueError, KeyError) as e:
            failures.append(f"{label}: devinfo --json gave no device list ({e}): {listing.stderr.strip()}")
            continue
        cuda = [d for d in devices if d["backend"] == "cuda"]
        if len(cuda) != 1:
            failures.append(f"{label}: {len(cuda)} CUDA devices listed, expected 1")
            continue
        warning = cuda[0].get("properties", {}).get("warning", "")
        if expected == "sass" and warning:
            failures.append(f"{label}: unexpected warning: {warning}")
        if expected == "ptx" and "covered only by compute_" not in warning:
            failures.append(f"{label}: expected a PTX-only warning, got '{warning}'")
        if expected == "none" and "cannot run" not in warning:
            failures.append(f"{label}: expected a warning that the kernels cannot run, got '{warning}'")
        # One line per device: "cuda:0 (name): PASS" or "...: FAIL: STATUS: why".
        verdict = next((line for line in check.stdout.splitlines() if line.startswith("cuda:0 ")), "")
        passed = verdict.endswith(": PASS")
        if expected != "none" and not passed:
            failures.append(f"{label}: devinfo --check failed: '{verdict}' {check.stderr.strip()}")
        if expected == "none" and (passed or "FAIL: UNAVAILABLE" not in verdict):
            failures.append(f"{label}: devinfo --check should fail with UNAVAILABLE: '{verdict}'")
        print(f"{label}: warning '{warning[:80]}{'...' if len(warning) > 80 else ''}'; check "
              f"{'passed' if passed else 'failed'}")
    for failure in failures:
        print("FAIL: " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
