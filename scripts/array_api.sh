#!/usr/bin/env bash
# scripts/array_api.sh: the Python Array API standard's own test suite (array-api-tests) against kiln.array_api on each device given; prints the pass counts.
#
#   scripts/array_api.sh [BUILD_DIR [DEVICE...]]      (default: build, cpu:0 and opencl:0 where there is one)
#
# It needs kiln's Python extension built in BUILD_DIR (meson builds it with
# the tests) and, in a venv it makes there, pytest, pytest-json-report,
# hypothesis >= 6.151 and ndindex from PyPI (Debian's hypothesis is too old).
# The suite comes from ARRAY_API_TESTS_DIR (a checkout with its array-api
# submodule), from shared/array-api-tests beside kiln's checkout, or is
# fetched at the commits pinned below into BUILD_DIR. Tests
# kiln cannot pass yet are in python/tests/array_api/xfails.txt, each group
# with its reason. Exit 0 when every other test passed on every device; 3
# when the suite or its packages could not be had (nothing was run).
# ARRAY_API_EXAMPLES sets hypothesis's examples per test (default 2;
# derandomized, so a run is the same run); ARRAY_API_REPORTS, a folder
# to keep each device's JSON report in (scripts/array_api_xfails.py reads
# them to write xfails.txt afresh: run with an empty xfails file for that).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"

build="$KILN_ROOT/${1:-build}"
shift || true
devices=("$@")
suite_commit=55fcc60179efa2680ddd6cd926ddf17b83530e2b
spec_commit=5f847a3858875c682ae901aa22b0413bf24be9da
examples="${ARRAY_API_EXAMPLES:-2}"

ls "$build"/tests/_kiln.*.so >/dev/null 2>&1 ||
  kiln_die "no kiln Python extension in $build/tests: build kiln's tests first (meson setup $build && ninja -C $build)"

venv="$build/array-api-venv"
if ! "$venv/bin/python" -c 'import hypothesis, ndindex, pytest_jsonreport' 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv" ||
    { echo "array_api.sh: cannot make a venv (Debian: apt install python3-venv)" >&2; exit 3; }
  "$venv/bin/pip" install -q pytest pytest-json-report "hypothesis>=6.151" "ndindex>=1.8" ||
    { echo "array_api.sh: pip could not install pytest-json-report, hypothesis and ndindex (no network?): not run" >&2
      exit 3; }
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/kiln-array-api-XXXXXX")"
trap 'rm -rf "$work"' EXIT
# The suite: ARRAY_API_TESTS_DIR, else an unmodified copy in shared/ beside
# kiln's checkout (where a workspace keeps read-only references), else fetched.
[ -n "${ARRAY_API_TESTS_DIR:-}" ] || [ ! -d "$KILN_ROOT/../shared/array-api-tests/array_api_tests" ] ||
  ARRAY_API_TESTS_DIR="$KILN_ROOT/../shared/array-api-tests"
if [ -n "${ARRAY_API_TESTS_DIR:-}" ]; then
  cp -r "$ARRAY_API_TESTS_DIR" "$work/suite"
else
  cache="$build/array-api-tests"
  if [ ! -f "$cache/.kiln-$suite_commit" ]; then
    rm -rf "$cache"
    fetch() { # dir url commit
      git init -q "$1" && git -C "$1" fetch -q --depth 1 "$2" "$3" && git -C "$1" checkout -q FETCH_HEAD
    }
    if ! fetch "$cache" https://github.com/data-apis/array-api-tests "$suite_commit" ||
       ! { rm -rf "$cache/array-api" && fetch "$cache/array-api" https://github.com/data-apis/array-api "$spec_commit"; }; then
      rm -rf "$cache"
      echo "array_api.sh: cannot fetch array-api-tests (no network?); set ARRAY_API_TESTS_DIR to a checkout: not run" >&2
      exit 3
    fi
    touch "$cache/.kiln-$suite_commit"
  fi
  cp -r "$cache" "$work/suite"
fi

if [ ${#devices[@]} -eq 0 ]; then
  devices=(cpu:0)
  if KILN_PYTHON_EXTENSION_DIR="$build/tests" PYTHONPATH="$KILN_ROOT/python" /usr/bin/python3 -c \
      'import kiln, sys; sys.exit(0 if any(str(d) == "opencl:0" for d in kiln.devices()) else 1)' 2>/dev/null; then
    devices+=(opencl:0)
  fi
fi

status=0
for device in "${devices[@]}"; do
  report="$work/report-${device//:/_}.json"
  echo "== array-api-tests on $device (revision 2021.12, $examples examples per test, derandomized)"
  set +e
  (cd "$work/suite" &&
   env KILN_CACHE_DIR="$work/cache" POCL_CACHE_DIR="$work/pocl" KILN_DEVICE="$device" \
     PYTHONPATH="$KILN_ROOT/python:$KILN_ROOT/python/tests/array_api" KILN_PYTHON_EXTENSION_DIR="$build/tests" \
     PYTHONDONTWRITEBYTECODE=1 ARRAY_API_TESTS_MODULE=kiln_aat ARRAY_API_TESTS_VERSION=2021.12 \
     "$venv/bin/python" -m pytest -q -p no:cacheprovider array_api_tests --max-examples="$examples" --derandomize \
       --disable-deadline --xfails-file "$KILN_ROOT/python/tests/array_api/xfails.txt" \
       --json-report --json-report-file="$report" -W ignore::UserWarning > "$work/log.txt" 2>&1)
  rc=$?
  set -e
  if [ -n "${ARRAY_API_REPORTS:-}" ] && [ -f "$report" ]; then
    mkdir -p "$ARRAY_API_REPORTS" && cp "$report" "$ARRAY_API_REPORTS/"
  fi
  tail -n 25 "$work/log.txt" | grep -E "^(FAILED|ERROR)|passed|failed" || true
  /usr/bin/python3 - "$report" "$device" <<'PY' || status=1
import collections, json, sys
r = json.load(open(sys.argv[1]))
n = collections.Counter(t["outcome"] for t in r["tests"])
print("%s: %d passed, %d xfailed (kiln cannot yet; xfails.txt), %d xpassed, %d skipped, %d failed"
      % (sys.argv[2], n["passed"], n["xfailed"], n["xpassed"], n["skipped"], n["failed"] + n["error"]))
sys.exit(1 if n["failed"] + n["error"] else 0)
PY
  [ $rc -eq 0 ] || [ $rc -eq 1 ] || { echo "pytest ended with status $rc"; tail -n 40 "$work/log.txt"; status=1; }
done
exit $status
