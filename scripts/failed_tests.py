#!/usr/bin/env python3
"""scripts/failed_tests.py BUILD_DIR: the lines that say why, for each test that failed in BUILD_DIR's last `meson test`.

Printed last by scripts/test.sh, so that a log cut to its tail still shows
which check failed, the sanitizer's first report, and the exit status.
"""
import json
import os
import re
import sys

WHY = re.compile(
    r"runtime error|ERROR: \w+Sanitizer|SUMMARY: |:[FE]:|FAIL|Assert|assert|Error|error:|"
    r"Traceback|Timeout|timed out|Killed|Aborted|signal \d+|\bleak of\b|#[0-9] 0x")


def main():
    path = os.path.join(sys.argv[1], "meson-logs", "testlog.json")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            records = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        print(f"no test log to digest ({e})")
        return
    bad = [r for r in records if r.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL")]
    for r in bad:
        print(f"=== {r.get('name')}: {r.get('result')} (exit status {r.get('returncode')}, "
              f"{r.get('duration', 0):.1f} s)")
        out = (r.get("stdout") or "") + (r.get("stderr") or "")
        lines = [l for l in out.splitlines() if WHY.search(l)]
        for line in lines[:30]:
            print("   ", line[:300])
        if len(lines) > 30:
            print(f"    ... {len(lines) - 30} more such lines in {path}")
        if not lines:
            for line in out.splitlines()[-15:]:
                print("   ", line[:300])


if __name__ == "__main__":
    main()
