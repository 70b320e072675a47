#!/usr/bin/env python3
"""scripts/failed_tests.py BUILD_DIR [--lsan-tracer-crashes]: the lines that say why, for each test that failed in BUILD_DIR's last `meson test`.

Printed last by scripts/test.sh, so that a log cut to its tail still shows
which check failed, the sanitizer's first report, and the exit status.

With --lsan-tracer-crashes: when every failed test failed only because
LeakSanitizer's own tracer crashed at exit ("Tracer caught signal", then
"LeakSanitizer has encountered a fatal error"; its suite had passed), print
their names, one per line, and exit 0; otherwise exit 1. That crash is the
sanitizer's, not a finding about kiln (seen at the exit of processes with
PoCL's or Oclgrind's threads, now and then, under load), and test.sh runs
those tests once more.
"""
import json
import os
import re
import sys

WHY = re.compile(
    r"runtime error|ERROR: \w+Sanitizer|SUMMARY: |:[FE]:|FAIL|Assert|assert|Error|error:|"
    r"Traceback|Timeout|timed out|Killed|Aborted|signal \d+|\bleak of\b|#[0-9] 0x")


LSAN_TRACER = ("Tracer caught signal", "LeakSanitizer has encountered a fatal error")
# What else in a log would be a finding: a sanitizer's report, a failed
# check, a test that erred other than by the abort the tracer's crash makes
# in Check's forked child ("Received signal 6 (Aborted)").
FINDING = re.compile(r"runtime error|ERROR: \w+Sanitizer|:F:|Checks: \d+, Failures: [1-9]")
ERRED = re.compile(r":E:.*")


def lsan_tracer_only(records):
    bad = [r for r in records if r.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL")]
    names = []
    for r in bad:
        out = (r.get("stdout") or "") + (r.get("stderr") or "")
        erred = [m.group(0) for m in ERRED.finditer(out)]
        if not all(s in out for s in LSAN_TRACER) or FINDING.search(out) or \
                any("Received signal 6 (Aborted)" not in e for e in erred):
            return None
        names.append(r.get("name", "").split(" / ")[-1])
    return names or None


def main():
    path = os.path.join(sys.argv[1], "meson-logs", "testlog.json")
    if "--lsan-tracer-crashes" in sys.argv[2:]:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                names = lsan_tracer_only([json.loads(line) for line in f if line.strip()])
        except OSError:
            names = None
        if not names:
            sys.exit(1)
        print("\n".join(names))
        return
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
