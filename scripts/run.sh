#!/usr/bin/env bash
# scripts/run.sh: the quick start: install what is missing, build into build/, then run devinfo and the demo on the default device.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$KILN_ROOT"

kiln_install_deps
werror="$(kiln_werror_option)"
kiln_configure build ${werror:+"$werror"}
kiln_build build

# The demo compiles kernels; keep them out of the user's cache.
cache_dir="$(mktemp -d "${TMPDIR:-/tmp}/kiln-run-XXXXXX")"
trap 'rm -rf "$cache_dir"' EXIT
export KILN_CACHE_DIR="$cache_dir"

kiln_section "devinfo"
build/tools/devinfo

kiln_section "kiln-demo (the GPU chapter) on the default device"
build/examples/kiln-demo

kiln_section "Done"
echo "Next: ./scripts/test.sh runs every test; build/tools/devinfo -v shows every property."
