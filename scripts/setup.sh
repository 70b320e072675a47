#!/usr/bin/env bash
# scripts/setup.sh: shared by run.sh, test.sh and bench.sh: install the missing Debian packages, configure and build kiln, keep caches private.
# Sourced, not run: it defines functions and KILN_ROOT, and changes nothing by itself.

KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Everything kiln builds and tests against on Debian 12. The CUDA toolkit is
# optional and not installed here: the build says when nvcc is missing.
# libkiln-nn needs zlib and json-c; its tests read Debian's Fashion-MNIST.
KILN_PACKAGES=(
  build-essential meson ninja-build pkg-config check libopenblas-dev
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd oclgrind libclblast-dev
  clinfo python3 valgrind
  zlib1g-dev libjson-c-dev dataset-fashion-mnist libdlpack-dev
  libopenmpi-dev openmpi-bin
)

kiln_section() {
  printf '\n==== %s ====\n' "$*"
}

kiln_die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# What the benchmark's report needs beyond the build: matplotlib draws its
# plots (test.sh proves they are drawn); PyTorch is a peer in its tables
# (bench.sh installs it; without it those rows say torch is missing).
KILN_PLOT_PACKAGES=(python3-matplotlib)
KILN_BENCH_PACKAGES=(python3-matplotlib python3-torch)

# kiln_install_deps [PACKAGE...]: install whatever of KILN_PACKAGES and the
# packages named is missing, as root or through sudo.
kiln_install_deps() {
  kiln_section "Dependencies"
  local wanted=("${KILN_PACKAGES[@]}" "$@")
  if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "not a Debian-like system (no dpkg-query/apt-get): install the equivalents of"
    echo "  ${wanted[*]}"
    echo "yourself; continuing with what is there."
    return 0
  fi
  local missing=() pkg
  for pkg in "${wanted[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$pkg")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "all ${#wanted[@]} packages present"
    return 0
  fi
  echo "missing: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "not root and no sudo: install them with"
      echo "  apt-get install ${missing[*]}"
      echo "continuing; the build says what it lacks."
      return 0
    fi
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
    kiln_die "apt-get update failed; fix the package sources and run again"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" ||
    kiln_die "apt-get install ${missing[*]} failed"
}

# nvcc lives outside PATH in a default toolkit install; the CUDA backend needs it.
kiln_find_cuda() {
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
  fi
}

# kiln_configure DIR [meson options...]: meson setup DIR unless it is already
# configured (ninja re-runs meson itself when a meson.build changed); on a
# configured DIR the options are applied with meson configure.
kiln_configure() {
  local dir="$1"
  shift
  kiln_section "Configure ${dir}"
  kiln_find_cuda
  if [ -f "$KILN_ROOT/$dir/build.ninja" ]; then
    echo "$dir is configured already"
    if [ "$#" -gt 0 ]; then
      meson configure "$KILN_ROOT/$dir" "$@" >/dev/null || kiln_die "meson configure $dir $* failed"
    fi
  else
    meson setup "$KILN_ROOT/$dir" "$KILN_ROOT" "$@" || kiln_die "meson setup $dir failed (see the message above)"
  fi
}

# kiln_build DIR: compile everything in DIR.
kiln_build() {
  kiln_section "Build $1"
  ninja -C "$KILN_ROOT/$1" || kiln_die "the build in $1 failed (see the compiler output above)"
}

# kiln_meson_test DIR [ARGS...]: `meson test -C DIR ARGS`; when a test fails,
# a digest of each failure (scripts/failed_tests.py) is printed last, where a
# log cut to its tail still shows it, and the script stops.
kiln_meson_test() {
  local dir="$1"
  shift
  if ! meson test -C "$KILN_ROOT/$dir" "$@"; then
    kiln_section "Why the tests in $dir failed (a digest of each failed test's log)"
    /usr/bin/python3 "$KILN_ROOT/scripts/failed_tests.py" "$KILN_ROOT/$dir" || true
    kiln_die "tests failed in $dir (the digest above; the full log: $dir/meson-logs/testlog.txt)"
  fi
}

# Warnings are errors in CI (CI=true), and always when test.sh asks.
kiln_werror_option() {
  if [ "${CI:-}" = "true" ] || [ "${KILN_WERROR:-}" = "1" ]; then
    echo "-Dwerror=true"
  fi
}

# kiln_private_caches: point kiln's kernel cache, PoCL's own (which PoCL
# otherwise keeps in ~/.cache/pocl) and matplotlib's (the benchmark's plots;
# ~/.cache/matplotlib) at one temporary folder, removed when the script exits,
# so that a script leaves nothing in the user's cache. Sets KILN_SCRIPT_CACHE
# to the folder.
kiln_private_caches() {
  KILN_SCRIPT_CACHE="$(mktemp -d "${TMPDIR:-/tmp}/kiln-script-cache-XXXXXX")"
  # shellcheck disable=SC2064 # the folder is fixed now, on purpose
  trap "rm -rf '$KILN_SCRIPT_CACHE'" EXIT
  export KILN_CACHE_DIR="$KILN_SCRIPT_CACHE/kiln"
  export POCL_CACHE_DIR="$KILN_SCRIPT_CACHE/pocl"
  export MPLCONFIGDIR="$KILN_SCRIPT_CACHE/matplotlib"
  mkdir -p "$KILN_CACHE_DIR" "$POCL_CACHE_DIR" "$MPLCONFIGDIR"
}
