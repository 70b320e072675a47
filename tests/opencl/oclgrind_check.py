#!/usr/bin/env python3
"""tests/opencl/oclgrind_check.py: register PoCL and Oclgrind side by side, and run a suite on the Oclgrind device with its checks on.

Two modes:
  --make-icd-dir DIR [--extra-icd LIB] [--no-oclgrind]
                       write DIR/*.icd: every ICD of /etc/OpenCL/vendors plus
                       Oclgrind's (which Debian does not register) and LIB;
                       print "oclgrind" when Oclgrind's ICD library was found.
  --icd-dir DIR --devinfo EXE [--uninitialized] -- SUITE [ARGS]
                       run SUITE with OCL_ICD_VENDORS=DIR and KILN_DEVICE set
                       to the Oclgrind device (found with devinfo --json) and
                       the CPU, Oclgrind's checks on; fail if Oclgrind reports
                       any invalid access or data race (and, with
                       --uninitialized, uninitialised value), even when the
                       suite itself passed. 77 passes through.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77

ICD_LIBRARY_CANDIDATES = [
    "/usr/lib/oclgrind/liboclgrind-rt-icd.so",
    "/usr/local/lib/oclgrind/liboclgrind-rt-icd.so",
    "/usr/lib64/oclgrind/liboclgrind-rt-icd.so",
    "/usr/local/lib/liboclgrind-rt-icd.so",
    "/usr/lib/x86_64-linux-gnu/liboclgrind-rt-icd.so",
]

# Oclgrind's diagnostics (its src/plugins/*.cpp wording): every one is a
# kernel bug that other devices would turn into wrong results or crashes.
DIAGNOSTICS = re.compile(
    r"Invalid (read|write) of size"
    r"|Invalid (read from|write to) .*buffer"
    r"|data race at"
    r"|[Uu]ninitiali[sz]ed (value|address)|depends on uninitiali[sz]ed"
    r"|out[- ]of[- ]bounds"
    r"|Work-group divergence detected"
    r"|Unaligned address"
)
# OCLGRIND_CHECK_API: an OpenCL call the plugin made wrongly.
API_ERROR = re.compile(r"OpenCL runtime error detected")


def find_oclgrind_icd():
    for path in ICD_LIBRARY_CANDIDATES:
        if os.path.isfile(path):
            return path
    exe = shutil.which("oclgrind")
    if exe:
        guess = os.path.join(os.path.dirname(os.path.realpath(exe)), "..", "lib", "oclgrind", "liboclgrind-rt-icd.so")
        if os.path.isfile(guess):
            return os.path.normpath(guess)
    return None


def make_icd_dir(directory, extra=None, oclgrind=True):
    os.makedirs(directory, exist_ok=True)
    for old in glob.glob(os.path.join(directory, "*.icd")):
        os.unlink(old)
    registered = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    if os.path.isdir(registered):
        for icd in sorted(glob.glob(os.path.join(registered, "*.icd"))):
            shutil.copyfile(icd, os.path.join(directory, os.path.basename(icd)))
    if extra:
        # The library need not exist yet (it is built after configuring).
        with open(os.path.join(directory, "extra.icd"), "w") as f:
            f.write(extra + "\n")
    library = find_oclgrind_icd() if oclgrind else None
    if library and not any("oclgrind" in open(f).read() for f in glob.glob(os.path.join(directory, "*.icd"))):
        with open(os.path.join(directory, "oclgrind.icd"), "w") as f:
            f.write(library + "\n")
    print("oclgrind" if library else "no-oclgrind", end="")
    return 0


def oclgrind_selector(devinfo, env):
    """'opencl:N' of the Oclgrind device, or None with the reason."""
    out = subprocess.run([devinfo, "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=120)
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        return None, "devinfo --json printed no JSON (exit %d): %s" % (out.returncode, out.stderr.strip()[-400:])
    for device in doc.get("devices", []):
        if device.get("backend") == "opencl" and "Oclgrind" in (device.get("platform") or ""):
            return device.get("selector"), ""
    return None, "no Oclgrind device among the OpenCL devices devinfo lists"


def run_checked(args):
    env = dict(os.environ)
    env["OCL_ICD_VENDORS"] = args.icd_dir
    env.pop("KILN_DEVICE", None)
    selector, why = oclgrind_selector(args.devinfo, env)
    if not selector:
        print("skipped: %s (Oclgrind not installed or not loadable; ICD dir %s)" % (why, args.icd_dir))
        return SKIP
    env["KILN_DEVICE"] = selector + ";cpu:*"
    env.setdefault("KILN_CONFORMANCE_SMALL", "1")
    env["OCLGRIND_CHECK_API"] = "1"
    env["OCLGRIND_DATA_RACES"] = "1"
    # Oclgrind's uninitialised-value checker (21.10, marked experimental by
    # Oclgrind) flags correct reads once a buffer is used a second time: a
    # pooled buffer that held a 1-element tensor, then written in full for
    # 5 elements and read by the next kernel, reports elements 1..4 as
    # uninitialised while every value is right (and the same buffer never
    # reused reports nothing). It cannot tell kiln's kernels' mistakes from
    # its own, so it is off by default; --uninitialized turns it on for a
    # manual look. Out-of-bounds accesses (always checked), data races and
    # API misuse fail the test.
    if args.uninitialized:
        env["OCLGRIND_UNINITIALIZED"] = "1"
    print("running %s on %s (Oclgrind) with OCL_ICD_VENDORS=%s" % (" ".join(args.suite), selector, args.icd_dir))
    sys.stdout.flush()
    proc = subprocess.run(args.suite, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          errors="replace")
    sys.stdout.write(proc.stdout)
    lines = proc.stderr.splitlines()
    found = [i for i, line in enumerate(lines) if DIAGNOSTICS.search(line)]
    api = [i for i, line in enumerate(lines) if API_ERROR.search(line)]
    # Oclgrind's report spans the lines after the headline (kernel, work-item,
    # the source line). Show the first report of each (diagnostic, kernel)
    # whole, and how often each came: hundreds of work-items repeat one bug.
    groups = {}
    for i in found + api:
        block = lines[i:i + 8]
        kernel = next((l.strip() for l in block[1:] if l.strip().startswith(("Kernel:", "Function:"))), "")
        headline = re.sub(r"0x[0-9a-fA-F]+", "ADDR", lines[i].strip())
        key = (headline, kernel)
        if key not in groups:
            groups[key] = [0, block]
        groups[key][0] += 1
    for (headline, kernel), (count, block) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        sys.stderr.write("%dx %s [%s]\n%s\n\n" % (count, headline, kernel or "-", "\n".join(block)))
    if not groups and lines:
        sys.stderr.write("\n".join(lines[-40:]) + "\n")
    if proc.returncode == SKIP:
        return SKIP
    if found or api:
        print("FAIL: Oclgrind reported %d kernel diagnostic(s) and %d API error(s) (above)" % (len(found), len(api)))
        return 1
    if proc.returncode != 0:
        print("FAIL: the suite exited %d" % proc.returncode)
        return 1
    print("Oclgrind reported nothing")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make-icd-dir")
    parser.add_argument("--extra-icd")
    parser.add_argument("--no-oclgrind", action="store_true")
    parser.add_argument("--icd-dir")
    parser.add_argument("--devinfo")
    parser.add_argument("--uninitialized", action="store_true",
                        help="also turn on Oclgrind's uninitialised-value checker (see run_checked)")
    parser.add_argument("suite", nargs="*")
    args = parser.parse_args()
    if args.make_icd_dir:
        return make_icd_dir(args.make_icd_dir, args.extra_icd, not args.no_oclgrind)
    if not args.icd_dir or not args.devinfo or not args.suite:
        parser.error("give --make-icd-dir DIR, or --icd-dir DIR --devinfo EXE -- SUITE [ARGS]")
    return run_checked(args)


if __name__ == "__main__":
    sys.exit(main())
