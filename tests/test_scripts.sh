#!/usr/bin/env bash
# tests/test_scripts.sh: what a newcomer runs besides the suites: the README's install-and-link recipe, run.sh's caches, kiln-demo's output, the KILN_* names.
#
# usage: tests/test_scripts.sh all | install | caches | variables | demo KILN_DEMO DEVINFO | train KILN_TRAIN
#   install    run the README's blocks marked "<!-- test: ... -->" as written, with HOME a
#              temporary folder (the build folder they name goes there too): install under
#              $HOME/kiln, then link examples/embed.c against it with the shared line and
#              the static one, and run both programs
#   caches     run scripts/run.sh with HOME a temporary folder: PoCL and kiln must leave
#              nothing in its ~/.cache
#   variables  every KILN_* variable kiln reads (getenv in the sources, the tables of
#              docs/environment.md) is one that runtime/config.c knows, so none is ever
#              reported as a misspelling
#   demo       kiln-demo's --help, the chapter it names, the provider it reports under
#              each policy (as the debug log shows it), its hints
#   train      kiln-train's refusals before any training (numbers, --precision, --save's folder, --losses),
#              --precision bf16 and f16 and the summary of the steps the loss scaler skipped,
#              a diverged run (--lr 1e6) that fails and leaves the checkpoint alone, Ctrl-C
#              that saves and exits 130; needs Fashion-MNIST (skipped without it)
#   all        install, caches, variables (test.sh), and train when build/examples/kiln-train
#              exists; demo and train run under meson (examples)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
failures=0

fail() {
  printf 'FAIL: %s\n' "$*"
  failures=$((failures + 1))
}

section() { printf '\n---- %s ----\n' "$*"; }

# The fenced sh block that follows the line "<!-- test: NAME" in README.md.
readme_block() {
  awk -v name="$1" '
    index($0, "<!-- test: " name) == 1 { armed = 1; next }
    armed && /^```sh/ { inside = 1; next }
    inside && /^```/ { exit }
    inside { print }
  ' "$root/README.md"
}

test_install() {
  section "README: install under a prefix, link shared and static"
  local tmp
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/kiln-test-install-XXXXXX")"
  local install_block shared_block static_block
  install_block="$(readme_block install-prefix)"
  shared_block="$(readme_block link-shared)"
  static_block="$(readme_block link-static)"
  if [ -z "$install_block" ] || [ -z "$shared_block" ] || [ -z "$static_block" ]; then
    fail "README.md lacks a block marked install-prefix, link-shared or link-static"
    rm -rf "$tmp"
    return
  fi
  mkdir -p "$tmp/home" "$tmp/app"
  # The one change to the text: the build folder it names goes below $tmp,
  # so a run leaves nothing in the repository.
  install_block="${install_block//build-prefix/$tmp/build-prefix}"
  local env_run=(env -u PKG_CONFIG_PATH -u KILN_BACKEND -u KILN_DEVICE -u KILN_BACKEND_PATH
                 HOME="$tmp/home" KILN_CACHE_DIR="$tmp/cache" POCL_CACHE_DIR="$tmp/pocl")
  if ! (cd "$root" && "${env_run[@]}" bash -euo pipefail -c "$install_block") >"$tmp/install.log" 2>&1; then
    tail -40 "$tmp/install.log"
    fail "the README's install block failed (log above)"
    rm -rf "$tmp"
    return
  fi
  [ -n "$(find "$tmp/home/kiln" -name 'libkiln.so*' -print -quit 2>/dev/null)" ] ||
    fail "the install block installed no libkiln under \$HOME/kiln"
  cp "$root/examples/embed.c" "$tmp/app/app.c"
  local kind block
  for kind in shared static; do
    block="$shared_block"
    [ "$kind" = static ] && block="$static_block"
    # The static block relies on PKG_CONFIG_PATH from the shared one, as a
    # reader who follows the page has it.
    [ "$kind" = static ] && block="$(printf '%s\n' "$shared_block" | grep '^export ')"$'\n'"$block"
    rm -f "$tmp/app/app"
    if ! (cd "$tmp/app" && "${env_run[@]}" bash -euo pipefail -c "$block") >"$tmp/link-$kind.log" 2>&1; then
      cat "$tmp/link-$kind.log"
      fail "the README's $kind link line failed (output above)"
      continue
    fi
    local out
    if ! out="$(cd "$tmp/app" && "${env_run[@]}" ./app 2>&1)"; then
      fail "the program linked by the $kind line failed: $out"
      continue
    fi
    case "$out" in
      *": 10 11 12 13") echo "$kind: $out" ;;
      *) fail "the program linked by the $kind line printed '$out', expected '...: 10 11 12 13'" ;;
    esac
    local libs
    libs="$(ldd "$tmp/app/app" | grep libkiln || true)"
    if [ "$kind" = static ] && [ -n "$libs" ]; then
      fail "the static line linked the shared libkiln: $libs"
    fi
    if [ "$kind" = shared ] && ! grep -q "$tmp/home/kiln/.*libkiln\.so" <<<"$libs"; then
      fail "the shared line's program does not use the libkiln under the prefix: $libs"
    fi
  done
  rm -rf "$tmp"
}

test_caches() {
  section "scripts/run.sh leaves the user's ~/.cache alone"
  local tmp
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/kiln-test-caches-XXXXXX")"
  mkdir -p "$tmp/home"
  if ! env -u XDG_CACHE_HOME -u KILN_CACHE_DIR -u POCL_CACHE_DIR HOME="$tmp/home" "$root/scripts/run.sh" \
      >"$tmp/run.log" 2>&1; then
    tail -40 "$tmp/run.log"
    fail "scripts/run.sh failed (log above)"
  else
    grep -q '^## Computing devices' "$tmp/run.log" || fail "scripts/run.sh did not run the demo"
    grep -q 'CU: compute units' "$tmp/run.log" || fail "scripts/run.sh did not run devinfo"
    local left
    left="$(cd "$tmp/home" && find . -path './.cache/*' 2>/dev/null | head -5)"
    [ -z "$left" ] || fail "scripts/run.sh left files in ~/.cache: $left"
  fi
  rm -rf "$tmp"
}

test_variables() {
  section "every KILN_* variable kiln reads is known to runtime/config.c"
  local names name
  names="$( (grep -rhoE 'getenv\("KILN_[A-Z0-9_]+"' "$root"/runtime "$root"/backends "$root"/nn "$root"/tools \
              "$root"/bench "$root"/examples "$root"/tests "$root"/kernels 2>/dev/null | sed 's/getenv("//; s/"//'
             grep -hoE '^\| \[?`KILN_[A-Z0-9_]+`' "$root/docs/environment.md" | grep -oE 'KILN_[A-Z0-9_]+') | sort -u)"
  [ -n "$names" ] || fail "no KILN_* variable found in the sources (the search is broken)"
  for name in $names; do
    # Test and tool families (internal_prefixes in config.c) are never reported.
    case "$name" in KILN_TEST_*|KILN_FAKE_*|KILN_FAKECUDA_*|KILN_GRAD_*|KILN_CONFORMANCE_*|KILN_NN_TEST_*|KILN_BENCH_CORETYPE_*) continue ;; esac
    grep -q "\"$name\"" "$root/runtime/config.c" ||
      fail "$name is read (or documented) but runtime/config.c does not know it: kiln warns that it is misspelled"
  done
  echo "$(echo "$names" | wc -l) variables checked"
}

# kiln-demo, run with the environment meson gives it (plugins, caches).
test_demo() {
  local demo="$1" devinfo="$2"
  section "kiln-demo: --help, the chapter, the provider, the hints"
  local out
  out="$("$demo" --help)" || fail "kiln-demo --help exited $?"
  case "$out" in *"usage: kiln-demo"*"Dive into Deep Learning"*) ;; *) fail "kiln-demo --help prints no usage: $out" ;; esac
  case "$out" in *"## Computing devices"*) fail "kiln-demo --help runs the demo" ;; esac
  if "$demo" --bogus >/dev/null 2>&1; then fail "kiln-demo --bogus exits 0"; fi

  out="$(KILN_BACKEND=cpu KILN_POLICY=portable "$demo")" || fail "kiln-demo (portable) exited $?"
  case "$out" in *'"GPUs" section of Dive into Deep Learning'*) ;; *) fail "kiln-demo does not name the chapter" ;; esac
  case "$out" in *"matmul ran with provider 'native' (policy portable"*) ;;
    *) fail "KILN_POLICY=portable kiln-demo: $(grep 'matmul ran' <<<"$out")" ;; esac
  case "$out" in *"no two products are alike"*) ;; *) fail "kiln-demo does not say why exercise 3's norms grow" ;; esac
  case "$out" in *"run with KILN_CPU_DEVICES=2 to see two"*) ;;
    *) fail "one CPU device and no KILN_DEVICE: the demo does not suggest KILN_CPU_DEVICES=2" ;; esac

  # Under vendor the demo reports what ran, as the debug log shows it.
  local log said ran
  log="$(KILN_BACKEND=cpu KILN_POLICY=vendor KILN_LOG=debug "$demo" 2>&1 >/dev/null)" || fail "kiln-demo (vendor) failed"
  out="$(KILN_BACKEND=cpu KILN_POLICY=vendor "$demo")" || fail "kiln-demo (vendor) exited $?"
  said="$(sed -n "s/^matmul ran with provider '\([a-z]*\)'.*/\1/p" <<<"$out")"
  # The first matmul is the dense layer's, the one the line reports.
  ran="$(grep -m1 -oE 'matmul f32 \[[0-9x]+\] on cpu:0 -> [a-z]+' <<<"$log" | sed 's/.*-> //' || true)"
  if [ -z "$ran" ] || [ "$said" != "$ran" ]; then
    fail "KILN_POLICY=vendor: the demo says matmul ran with '$said', the debug log says '$ran'"
  fi
  # (Outputs are read whole before grep: with pipefail, a grep -q that stops
  # early would fail the pipe with SIGPIPE.)
  local listing
  listing="$(KILN_BACKEND=cpu "$devinfo" -v)"
  if grep -q 'providers.matmul: native,blas' <<<"$listing"; then
    [ "$said" = blas ] || fail "KILN_POLICY=vendor with a BLAS: the demo says '$said', expected blas"
  fi

  # Two CPU devices, one hidden by KILN_DEVICE: the hint names KILN_DEVICE.
  out="$(KILN_BACKEND=cpu KILN_CPU_DEVICES=2 KILN_DEVICE=cpu:0 "$demo")" || fail "kiln-demo (cpu:0 of 2) exited $?"
  case "$out" in *"KILN_DEVICE='cpu:0' hides 1 other"*) ;;
    *) fail "KILN_DEVICE hid cpu:1, and the demo says: $(grep 'only one device' <<<"$out")" ;; esac
  case "$out" in *"KILN_CPU_DEVICES=2 to see two"*) fail "the demo suggests KILN_CPU_DEVICES=2 although it is set" ;; esac

  # The first build of OpenCL kernels is announced once, on stderr.
  listing="$(KILN_BACKEND=opencl,cpu "$devinfo" --json 2>/dev/null || true)"
  if grep -q '"selector": "opencl:0"' <<<"$listing"; then
    local cache err
    cache="$(mktemp -d "${TMPDIR:-/tmp}/kiln-test-demo-XXXXXX")"
    err="$(KILN_BACKEND=opencl,cpu KILN_DEVICE='opencl:0' KILN_CACHE_DIR="$cache" "$demo" 2>&1 >/dev/null)" ||
      fail "kiln-demo on opencl:0 exited $?: $err"
    [ "$(grep -c '^kiln-demo: building OpenCL kernels for opencl:0 (.*(first run; cached afterwards)$' <<<"$err")" = 1 ] ||
      fail "kiln-demo on opencl:0 with an empty cache does not say once that it builds kernels: $err"
    err="$(KILN_BACKEND=opencl,cpu KILN_DEVICE='opencl:0' KILN_CACHE_DIR="$cache" "$demo" 2>&1 >/dev/null)" || true
    grep -q 'building OpenCL kernels' <<<"$err" && fail "kiln-demo builds the kernels again with a warm cache: $err"
    rm -rf "$cache"
  else
    echo "note: no OpenCL device; the first-build line is not checked here"
  fi
}

# kiln-train on the CPU, on a few hundred images of Fashion-MNIST.
test_train() {
  local train="$1"
  section "kiln-train: refusals before training, a diverged run, Ctrl-C"
  local data="${KILN_DATA_DIR:+$KILN_DATA_DIR/fashion-mnist}"
  data="${data:-/usr/share/datasets/fashion-mnist}"
  if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    echo "note: no Fashion-MNIST in $data; kiln-train is not checked here"
    return
  fi
  local tmp out rc
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/kiln-test-train-XXXXXX")"
  local run=(env KILN_BACKEND=cpu KILN_CACHE_DIR="$tmp/cache" POCL_CACHE_DIR="$tmp/pocl" "$train" --no-progress)

  # Numbers: empty, trailing junk, out of range, negative; all refused at once.
  local bad
  for bad in "--seed|" "--seed|99999999999999999999999" "--seed|-1" "--seed|12abc" "--epochs|" "--epochs|3x" \
             "--epochs|99999999999999999999" "--batch|-5" "--limit| 5" "--losses|+3" "--lr|" "--lr|1e400" \
             "--lr|inf" "--lr|nan" "--lr|0.1x" "--precision|f64" "--precision|BF16" "--precision|"; do
    rc=0
    out="$("${run[@]}" "${bad%%|*}" "${bad#*|}" 2>&1)" || rc=$?
    [ "$rc" = 2 ] || fail "kiln-train ${bad%%|*} '${bad#*|}' exited $rc, expected 2: $out"
    case "$out" in *"kiln-train: ${bad%%|*} takes "*"not '${bad#*|}'"*) ;;
      *) fail "kiln-train ${bad%%|*} '${bad#*|}' does not say what it takes: $out" ;; esac
  done

  # --save into a folder that does not exist: refused before any epoch.
  rc=0
  out="$("${run[@]}" --epochs 3 --limit 300 --save "$tmp/missing/m.safetensors" 2>&1)" || rc=$?
  [ "$rc" = 2 ] || fail "kiln-train --save into a missing folder exited $rc, expected 2"
  case "$out" in *"--save $tmp/missing/m.safetensors: the folder $tmp/missing does not exist; create it first"*) ;;
    *) fail "kiln-train --save into a missing folder: $out" ;; esac
  case "$out" in *"epoch 1/"*) fail "kiln-train trained before finding --save's folder missing" ;; esac

  # --losses past the steps of an epoch: refused, not silently empty or huge.
  rc=0
  out="$("${run[@]}" --epochs 1 --limit 300 --losses 99999999999999 2>&1)" || rc=$?
  [ "$rc" = 2 ] || fail "kiln-train --losses 99999999999999 exited $rc, expected 2"
  case "$out" in *"--losses 99999999999999 is more than the 3 steps of an epoch (300 images in batches of 100)"*) ;;
    *) fail "kiln-train --losses 99999999999999: $out" ;; esac

  # --precision: the summary names it and the steps the loss scaler skipped
  # (f16 only; the scale starts at 2^16 and nothing overflows in 3 steps).
  for p in bf16 f16; do
    rc=0
    out="$("${run[@]}" --epochs 1 --limit 300 --precision "$p" 2>&1)" || rc=$?
    [ "$rc" = 0 ] || fail "kiln-train --precision $p exited $rc: $out"
    case "$out" in *"seed 42, precision $p"*) ;; *) fail "kiln-train --precision $p: no precision in the header: $out" ;; esac
  done
  case "$out" in *"precision f16: 0 of 3 steps skipped by the loss scaler, final scale 65536"*) ;;
    *) fail "kiln-train --precision f16: no scaler summary: $out" ;; esac

  # A rate that makes the loss NaN: an error naming the step and the rate, and
  # the good checkpoint is left as it was.
  local ckpt="$tmp/m.safetensors"
  if ! out="$("${run[@]}" --epochs 1 --limit 300 --save "$ckpt" 2>&1)"; then
    fail "kiln-train --save failed: $out"
  fi
  cp "$ckpt" "$tmp/good.safetensors"
  chmod 600 "$ckpt"
  rc=0
  out="$("${run[@]}" --epochs 1 --limit 1000 --lr 1e6 --save "$ckpt" 2>&1)" || rc=$?
  [ "$rc" = 1 ] || fail "kiln-train --lr 1e6 exited $rc, expected 1: $out"
  case "$out" in *"kiln-train: training: "*"kiln_nn_train_epoch: the loss is "*" at step "*"training diverged; lower the learning rate (it is 1e+06)"*) ;;
    *) fail "kiln-train --lr 1e6 does not name the step and the rate: $out" ;; esac
  cmp -s "$ckpt" "$tmp/good.safetensors" || fail "kiln-train --lr 1e6 overwrote the checkpoint"

  # Ctrl-C after a few epochs: the step finishes, the file is saved, status 130.
  rm -f "$ckpt"
  "${run[@]}" --epochs 100000 --limit 200 --save "$ckpt" >"$tmp/int.log" 2>&1 &
  local pid=$! waited=0
  while ! grep -q '^epoch 3/' "$tmp/int.log" && [ "$waited" -lt 600 ] && kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    waited=$((waited + 1))
  done
  kill -INT "$pid" 2>/dev/null || true
  rc=0
  wait "$pid" || rc=$?
  [ "$rc" = 130 ] || fail "kiln-train interrupted with SIGINT exited $rc, expected 130: $(tail -5 "$tmp/int.log")"
  grep -q "^saved $ckpt\$" "$tmp/int.log" || fail "kiln-train interrupted with SIGINT did not save: $(tail -5 "$tmp/int.log")"
  [ -s "$ckpt" ] || fail "kiln-train interrupted with SIGINT left no $ckpt"
  local left
  left="$(find "$tmp" -maxdepth 1 -name 'm.safetensors.tmp-*')"
  [ -z "$left" ] || fail "kiln-train left temporaries: $left"
  rm -rf "$tmp"
}

case "${1:-}" in
  install) test_install ;;
  caches) test_caches ;;
  variables) test_variables ;;
  demo)
    [ "$#" -eq 3 ] || { echo "usage: $0 demo KILN_DEMO DEVINFO" >&2; exit 2; }
    test_demo "$2" "$3"
    ;;
  train)
    [ "$#" -eq 2 ] || { echo "usage: $0 train KILN_TRAIN" >&2; exit 2; }
    test_train "$2"
    ;;
  all)
    test_variables
    test_install
    test_caches
    if [ -x "$root/build/examples/kiln-train" ]; then
      test_train "$root/build/examples/kiln-train"
    else
      echo "note: no build/examples/kiln-train; kiln-train is not checked here"
    fi
    ;;
  *)
    sed -n '3,24p' "$0"
    exit 2
    ;;
esac

if [ "$failures" -gt 0 ]; then
  echo "test_scripts.sh ${1}: $failures check(s) failed"
  exit 1
fi
echo "test_scripts.sh ${1}: all checks passed"
