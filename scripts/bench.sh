#!/usr/bin/env bash
# scripts/bench.sh: install what the full benchmark compares with (PyTorch, matplotlib), build, and run kiln-bench into build/bench-out.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$KILN_ROOT"

usage() {
  echo "usage: scripts/bench.sh [kiln-bench options]"
  echo
  echo "Installs what is missing (the build's packages, python3-torch for the PyTorch rows,"
  echo "python3-matplotlib for the plots), builds build/, and runs the full kiln-bench with"
  echo "OPENBLAS_CORETYPE unset and private kernel caches. The report goes to build/bench-out"
  echo "unless the options give --out; other options (--only, --reps, --quick) go to kiln-bench."
}
out="$KILN_ROOT/build/bench-out"
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --out) out="" ;;
  esac
done

kiln_install_deps "${KILN_BENCH_PACKAGES[@]}"
werror="$(kiln_werror_option)"
kiln_configure build ${werror:+"$werror"}
kiln_build build
[ -x build/bench/kiln-bench ] || kiln_die "kiln-bench was not built (configure with -Dbench=true; it needs OpenBLAS)"

# Cold and warm runs of the kernel cache are measured inside kiln-bench; the
# caches of this run stay out of the user's ~/.cache.
kiln_private_caches

kiln_section "kiln-bench (the full run takes minutes)"
args=("$@")
if [ -n "$out" ]; then
  rm -rf "$out"
  args+=(--out "$out")
fi
env -u OPENBLAS_CORETYPE build/bench/kiln-bench "${args[@]}"

kiln_section "Done"
if [ -n "$out" ]; then
  echo "the report: $out/report.md (results.json and the plots beside it)"
fi
