#!/usr/bin/env python3
"""tests/cuda/kernel_checks.py: what nvcc and ptxas made of kiln's CUDA kernels, checked without a GPU.

  kernel_checks.py PTXAS ARCH KILN_PTX strict|report

KILN_PTX is kernels/cuda/kiln.cu compiled to PTX for ARCH (sm_90) as the
fatbin's kernels are (-O3, no fast math). Checks:
  - kiln_random_uniform_f32 (the uniform transform kiln_random_f32 calls)
    holds no fused multiply-add: its transform is
    low + (high - low) * u rounded twice, as the CPU computes it, so that
    uniform numbers are bit-identical on every backend (kernels/philox.h);
  - the random kernels (kiln_random_f32, _f16, _bf16, _f64), whose normal
    path inlines philox.h's own log, sqrt and cos, hold no fused
    multiply-add in f32 or f64 either: normal numbers are bit-identical too;
  - the fused updates (kiln_accumulate_f32_f32, kiln_sgd_update_f32_f32,
    kiln_adam_update_f32_f32)
    hold no fused multiply-add either: each operation rounds on its own, as
    on the CPU, so an update gives the same bits on every backend
    (kernels/cuda/train.cuh);
  - ptxas allocates every native SGEMM kernel without spilling registers to
    local memory at the plugin's launch bounds (kernels/cuda/gemm.cuh):
    required with `strict` (sm_90), reported otherwise.
It prints ptxas's register report for the SGEMM, reduction and training
kernels (the tables in backends/cuda/README.md).
"""
import re
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"^\.visible \.entry (\w+)\(", re.M)
RANDOMS = ("kiln_random_f32", "kiln_random_f16", "kiln_random_bf16", "kiln_random_f64")
UPDATES = ("kiln_accumulate_f32_f32", "kiln_sgd_update_f32_f32", "kiln_adam_update_f32_f32")
# The kernels whose registers and spills the report shows.
SHOWN = ("kiln_sgemm_", "kiln_reduce_", "kiln_softmax_backward", "kiln_cross_entropy_backward", "kiln_col2im",
         "kiln_im2col_rows", "kiln_pack_dy", "kiln_max_pool2d_", "kiln_accumulate", "kiln_sgd_update",
         "kiln_adam_update", "kiln_unary_backward_")


def entry_body(ptx, name, kind="entry"):
    """The text of one .entry (or .func), from its name to the closing brace at column 0."""
    if kind == "entry":
        match = re.search(r"^\.visible \.entry " + re.escape(name) + r"\(", ptx, re.M)
    else:
        match = re.search(r"^(?:\.visible |\.weak )?\.func\s*(?:\([^)]*\)\s*)?" + re.escape(name) + r"\(", ptx, re.M)
    if not match:
        return None
    end = ptx.find("\n}\n", match.end())
    return ptx[match.start():end if end >= 0 else len(ptx)]


def ptxas_report(ptxas, arch, ptx_path):
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([ptxas, "-v", "-O3", "-arch=" + arch, ptx_path, "-o", tmp + "/kiln.cubin"],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError("ptxas failed: " + done.stderr[-2000:])
    report, current = {}, None
    for line in done.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
            report[current] = {"regs": None, "spill_stores": 0, "spill_loads": 0, "stack": 0}
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            report[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                   spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            report[current]["regs"] = int(m.group(1))
    return report


def main():
    ptxas, arch, ptx_path = sys.argv[1], sys.argv[2], sys.argv[3]
    strict = len(sys.argv) < 5 or sys.argv[4] == "strict"
    with open(ptx_path) as f:
        ptx = f.read()
    failures = []

    # kiln_random_f32 branches on the record (uniform or normal); the uniform
    # transform is its own function, kiln_random_uniform_f32, checked alone.
    body = entry_body(ptx, "kiln_random_uniform_f32", "func")
    if body is None or not re.search(r"call\.uni[^;]*kiln_random_uniform_f32", entry_body(ptx, "kiln_random_f32") or ""):
        failures.append("kiln_random_uniform_f32 is not in the PTX, or kiln_random_f32 does not call it")
    else:
        fused = re.findall(r"^\s*(?:fma|mad)\.\S*f32\b.*$", body, re.M)
        if fused:
            failures.append("kiln_random_uniform_f32 fuses a multiply-add (%s): uniform numbers would differ from the "
                            "CPU's in the last bit" % fused[0].strip())
        if not re.search(r"\bmul\.rn\.f32\b", body) or not re.search(r"\badd\.rn\.f32\b", body):
            failures.append("kiln_random_uniform_f32 lacks the separately rounded mul.rn.f32 and add.rn.f32")
        else:
            print("kiln_random_uniform_f32: mul.rn.f32 then add.rn.f32, no fma")

    for name in RANDOMS:
        body = entry_body(ptx, name)
        if body is None:
            failures.append(name + " is not in the PTX")
            continue
        fused = re.findall(r"^\s*(?:fma|mad)\.\S*f(?:32|64)\b.*$", body, re.M)
        if fused:
            failures.append("%s fuses a multiply-add (%s): normal numbers would differ from the CPU's in the last bits"
                            % (name, fused[0].strip()))
    print("%s: no fma" % ", ".join(RANDOMS))

    for name in UPDATES:
        body = entry_body(ptx, name)
        if body is None:
            failures.append(name + " is not in the PTX")
            continue
        fused = re.findall(r"^\s*(?:fma|mad)\.\S*f32\b.*$", body, re.M)
        if fused:
            failures.append("%s fuses a multiply-add (%s): its updates would differ from the CPU's in the last bit"
                            % (name, fused[0].strip()))
    print("%s: no fma" % ", ".join(UPDATES))

    report = ptxas_report(ptxas, arch, ptx_path)
    shown = sorted(k for k in report if k.startswith(SHOWN))
    print("ptxas -v, %s:" % arch)
    print("  %-30s %9s %12s %11s" % ("kernel", "registers", "spill stores", "spill loads"))
    for name in shown:
        r = report[name]
        print("  %-30s %9s %12d %11d" % (name, r["regs"], r["spill_stores"], r["spill_loads"]))
    sgemm = [k for k in report if k.startswith("kiln_sgemm_")]
    if len(sgemm) != 8:
        failures.append("expected 8 kiln_sgemm_* kernels, ptxas compiled %d" % len(sgemm))
    for name in sgemm:
        r = report[name]
        if (r["spill_stores"] or r["spill_loads"]) and strict:
            failures.append("%s spills on %s: %d bytes stored, %d loaded (see kernels/cuda/gemm.cuh, Registers)"
                            % (name, arch, r["spill_stores"], r["spill_loads"]))
    for failure in failures:
        print("FAIL: " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
