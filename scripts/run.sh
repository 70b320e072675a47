#!/usr/bin/env bash
# scripts/run.sh: the quick start: install what is missing, build into build/, then run devinfo and the demo on the default device.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$KILN_ROOT"

kiln_install_deps
werror="$(kiln_werror_option)"
kiln_configure build ${werror:+"$werror"}
kiln_build build

# The demo compiles kernels, and PoCL compiles its own as soon as it starts:
# both caches go to a temporary folder, never into the user's ~/.cache.
kiln_private_caches

kiln_section "devinfo"
build/tools/devinfo

kiln_section "kiln-demo (the \"GPUs\" section of Dive into Deep Learning) on the default device"
build/examples/kiln-demo

kiln_section "Done"
echo "Next: ./scripts/test.sh runs every test; build/tools/devinfo -v shows every property;"
echo "./scripts/bench.sh runs the full benchmark (and installs PyTorch and matplotlib for it)."
