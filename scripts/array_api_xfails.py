#!/usr/bin/env python3
"""scripts/array_api_xfails.py: python/tests/array_api/xfails.txt from array-api-tests JSON reports (scripts/array_api.sh's, run without xfails): each failed test under the reason its error gives.

    scripts/array_api_xfails.py REPORT.json [REPORT.json ...] > python/tests/array_api/xfails.txt

A test that fails on any device is listed. The reasons come from the rules
below (the first whose pattern the error's first line matches); a failure no
rule explains is listed under "unexplained", with its message, to be looked
at rather than hidden.
"""
import collections
import json
import re
import sys

RULES = [
    (r"pow_*\(|test_pow", "x ** y with a tensor exponent computes exp(y * log(x)) (kiln has no pow operation yet): NaN for "
     "x <= 0 where pow is defined, and the signs of zeros and infinities lost"),
    (r"boolean mask of 0 dims", "a 0-d boolean mask (x[True], x[xp.asarray(False)]) is not supported by kiln's indexing"),
    (r"index_copy does not support dtype bool", "assignment through a mask into a bool array: index_copy has no "
     "bool kernels yet"),
    (r"an element is a kiln\.Tensor", "kiln.tensor / asarray of a list of 0-d arrays is not supported (stack them)"),
    (r"from_dlpack\(\) got an unexpected keyword|_array_module' has no attribute '__array_namespace_info__'",
     "the suite's DLPack test reads __array_namespace_info__ from its own wrapper module"),
    (r"NotImplementedError: kiln\.array_api\.(\w+)",
     "no kiln operation computes {0} yet (it needs a row in kernels/ops.def or an op kind on every backend)"),
    (r"has no attribute 'linalg'|has no attribute 'fft'", "the linalg and fft extensions are not provided"),
    (r"unsupported operand type\(s\) for (//|%|<<|>>)=?",
     "the operator {0} (floor division, remainder, shifts) has no kiln operation yet"),
    (r"missing the method (__\w+__)|(__\w+__) not found in array object",
     "the array method {0} is missing: its kiln operation does not exist yet"),
    (r"missing the attribute (\w+)", "the array attribute {0} is missing"),
    (r'kiln_device_find\("cpu"\): no visible device', "a DLPack export of an OpenCL tensor goes through the CPU "
     "device, which KILN_DEVICE=opencl:0 hides"),
    (r"complex64|complex128|dtype=complex", "the test draws complex dtypes, which kiln does not have"),
    (r"Argument '\w+' missing from signature|Expected argument '\w+' to be named",
     "the function is a placeholder (kiln has no operation for it yet), so its signature is not the standard's"),
    (r"out=nan, but should be|xN?=.*nan.*but should be", "x ** y with a tensor exponent computes exp(y * log(x)): "
     "NaN for x <= 0 where pow is defined (no pow operation yet)"),
    (r"does not support dtype u?int|does not support dtype", "the operation has no kernels for that dtype yet"),
    (r"reduced axis is empty", "max/min of an empty axis is an error in kiln (the standard leaves it to the library)"),
]


def reason_of(message, nodeid):
    for pattern, reason in RULES:
        m = re.search(pattern, nodeid if pattern.startswith("pow") else message)
        if m:
            return reason.format(*[g for g in m.groups() if g])
    return None


def main(paths):
    groups = collections.defaultdict(set)
    unexplained = {}
    for path in paths:
        for t in json.load(open(path))["tests"]:
            if t["outcome"] not in ("failed", "error"):
                continue
            stage = t.get("call") or t.get("setup") or {}
            message = (stage.get("crash") or {}).get("message", "") or stage.get("longrepr", "") or ""
            nodeid = t["nodeid"].removeprefix("array-api-tests/")
            why = reason_of(message, nodeid)
            if not why:  # hypothesis's ExceptionGroup: the sub-exceptions are in the long report
                why = reason_of(stage.get("longrepr", "") or "", nodeid)
            if why:
                groups[why].add(nodeid)
            else:
                unexplained[nodeid] = " ".join(message.split())[:160]
    print("# python/tests/array_api/xfails.txt: the tests of array-api-tests that kiln.array_api cannot pass yet,")
    print("# grouped under their reason (written by scripts/array_api_xfails.py from the suite's reports on cpu:0")
    print("# and PoCL; scripts/array_api.sh passes it as --xfails-file). A test that starts passing shows as XPASS.")
    listed = set()
    for why in sorted(groups):
        ids = sorted(groups[why] - listed)
        if not ids:
            continue
        print(f"\n# {why}")
        for i in ids:
            print(i)
        listed.update(ids)
    rest = sorted(set(unexplained) - listed)
    if rest:
        print("\n# unexplained yet (the first line of each error):")
        for i in rest:
            print(f"#   {i}: {unexplained[i]}")
            print(i)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
