#!/usr/bin/env bash
# scripts/gpu-debs.sh: on a Debian machine with its registry: download the .deb files scripts/gpu-check.sh needs on a GPU machine that has none.
#
#   scripts/gpu-debs.sh [DIR]     (default DIR: .deb, which git ignores)
#
# Downloads (never installs) the development packages kiln builds against and
# the libraries they need at run time, without the ones every Linux system
# has (libc, libgcc, libstdc++). gpu-check.sh unpacks them into its build
# folder only where the GPU machine lacks them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.deb}"
mkdir -p "$DIR"
cd "$DIR"
packages=(
  check libsubunit0 libsubunit-dev
  ocl-icd-opencl-dev ocl-icd-libopencl1 opencl-c-headers opencl-clhpp-headers
  libclblast-dev libclblast1
  libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libblas3 libgfortran5 liblapack3
  libjson-c-dev libjson-c5 zlib1g-dev libdlpack-dev
)
apt-get download "${packages[@]}"
ls -l "$DIR"
echo "carry $DIR to the GPU machine and run: scripts/gpu-check.sh --debs ${DIR#$ROOT/}"
