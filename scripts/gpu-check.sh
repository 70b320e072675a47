#!/usr/bin/env bash
# scripts/gpu-check.sh: on a machine with an NVIDIA GPU and no package registry: set up, build, run every test and kiln-bench on the GPU devices, all logs in one folder, a summary last.
#
#   scripts/gpu-check.sh [--debs DIR] [--out DIR] [--quick-bench] [--skip-bench]
#
# --debs DIR     .deb files to take what is missing from (scripts/gpu-debs.sh
#                downloads them on a machine with Debian's registry); they are
#                unpacked into build-gpu/deps, never installed into /.
# --out DIR      the output folder (default: build-gpu/gpu-check-out, or $OUT
#                when set); every log goes there.
# --quick-bench  kiln-bench --quick instead of the full run.
# --skip-bench   no benchmark.
#
# Steps: what the build needs (check, the OpenCL ICD loader and headers,
# CLBlast, OpenBLAS, json-c, zlib, DLPack's header) from the system or the
# .deb folder; where cuBLAS and cuDNN are (the CUDA toolkit's folders,
# CUDNN_PATH / CUDNN_HOME, the nvidia-* Python wheels); NVIDIA's OpenCL
# driver registered through an ICD file of our own when the driver ships
# libnvidia-opencl.so.1; a build with every core; devinfo -v; the whole
# test suite (conformance on cuda:0 and on NVIDIA's OpenCL device
# included); kiln-bench; the summary table.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
DEBS="" OUTDIR="${OUT:-}" BENCH=full
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) DEBS="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    --quick-bench) BENCH=quick; shift ;;
    --skip-bench) BENCH=none; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
BUILD="$ROOT/build-gpu"
[ -n "$OUTDIR" ] || OUTDIR="$BUILD/gpu-check-out"
mkdir -p "$OUTDIR" "$BUILD"
SUMMARY="$OUTDIR/summary.txt"
: > "$SUMMARY"
note() { printf '%-28s %s\n' "$1" "$2" | tee -a "$SUMMARY"; }
section() { printf '\n==== %s ====\n' "$*"; }
export KILN_CACHE_DIR="$BUILD/kiln-cache" POCL_CACHE_DIR="$BUILD/pocl-cache"

# ---- 1. what the build needs ---------------------------------------------------------
section "Dependencies"
DEPS="$BUILD/deps"
have_header() { printf '#include <%s>\n' "$1" | cc -E ${CPATH:+-I"$CPATH"} -x c - >/dev/null 2>&1; }
missing=()
have_header check.h || missing+=(check)
have_header CL/cl.h || missing+=("OpenCL headers")
have_header clblast_c.h || missing+=(CLBlast)
have_header cblas.h || missing+=(OpenBLAS)
have_header json-c/json.h || missing+=(json-c)
have_header zlib.h || missing+=(zlib)
have_header dlpack/dlpack.h || missing+=(DLPack)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "missing: ${missing[*]}"
  if [ -n "$DEBS" ] && ls "$DEBS"/*.deb >/dev/null 2>&1; then
    mkdir -p "$DEPS"
    for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$DEPS"; done
    multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
    export CPATH="$DEPS/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$DEPS/usr/lib/$multiarch:$DEPS/usr/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$DEPS/usr/lib/$multiarch:$DEPS/usr/lib/$multiarch/openblas-pthread:$DEPS/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_PATH="$DEPS/usr/lib/$multiarch/pkgconfig:$DEPS/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    # pkg-config files name /usr as their prefix: point them at the copy.
    export PKG_CONFIG_SYSROOT_DIR=""
    for pc in "$DEPS"/usr/lib/"$multiarch"/pkgconfig/*.pc "$DEPS"/usr/share/pkgconfig/*.pc; do
      [ -f "$pc" ] && sed -i "s|^prefix=/usr|prefix=$DEPS/usr|" "$pc"
    done
    note "dependencies" "unpacked $(ls "$DEBS"/*.deb | wc -l) .deb files into build-gpu/deps"
  else
    note "dependencies" "MISSING: ${missing[*]} (pass --debs DIR; scripts/gpu-debs.sh fetches them)"
  fi
else
  note "dependencies" "all present"
fi

# ---- 2. cuBLAS, cuDNN --------------------------------------------------------------------
section "CUDA libraries"
export PATH="$PATH:/usr/local/cuda/bin"
libdirs=()
for d in "${CUDNN_PATH:-}" "${CUDNN_HOME:-}" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /usr/lib/x86_64-linux-gnu; do
  [ -n "$d" ] && libdirs+=("$d" "$d/lib" "$d/lib64")
done
# The nvidia-* wheels (nvidia-cublas, nvidia-cudnn-cu13) keep theirs in site-packages/nvidia/*/lib.
for py in python3 /usr/bin/python3; do
  wheel_root="$($py -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]) + "/nvidia")' 2>/dev/null)" || continue
  for d in "$wheel_root"/*/lib; do [ -d "$d" ] && libdirs+=("$d"); done
done
find_lib() {
  for d in "${libdirs[@]}"; do
    for f in "$d"/$1; do [ -e "$f" ] && { echo "$f"; return 0; }; done
  done
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 ~ n {print $NF; exit}'
}
cublas="$(find_lib 'libcublas.so.1[0-9]*')"
cudnn="$(find_lib 'libcudnn.so.[0-9]*')"
for lib in "$cublas" "$cudnn"; do
  if [ -n "$lib" ]; then
    libdir="$(dirname "$lib")"
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
note "cuBLAS" "${cublas:-not found (the cublas provider will be absent)}"
note "cuDNN" "${cudnn:-not found (the cudnn provider will be absent)}"
if [ -n "$cudnn" ]; then
  cudnn_root="$(dirname "$(dirname "$cudnn")")"
  [ -f "$cudnn_root/include/cudnn.h" ] && export CUDNN_PATH="$cudnn_root"
fi
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1
note "GPU" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi failed')"

# ---- 3. NVIDIA's OpenCL driver -------------------------------------------------------------
section "OpenCL"
icd_dir="$BUILD/icd"
mkdir -p "$icd_dir"
rm -f "$icd_dir"/*.icd
nv_ocl="$(ldconfig -p 2>/dev/null | awk '/libnvidia-opencl\.so\.1/ {print $NF; exit}')"
[ -n "$nv_ocl" ] || nv_ocl="$(find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libnvidia-opencl.so.1' 2>/dev/null | head -1)"
if [ -n "$nv_ocl" ]; then
  echo "$nv_ocl" > "$icd_dir/nvidia.icd"
  note "NVIDIA OpenCL" "registered $nv_ocl"
else
  note "NVIDIA OpenCL" "not shipped by this driver (no libnvidia-opencl.so.1): OpenCL rows are skipped"
fi
# Keep the system's own ICD files (PoCL, when installed) beside ours.
for f in /etc/OpenCL/vendors/*.icd; do [ -f "$f" ] && cp "$f" "$icd_dir/"; done
export OCL_ICD_VENDORS="$icd_dir"

# ---- 4. build -----------------------------------------------------------------------------------
section "Build"
jobs="$(nproc)"
if [ ! -f "$BUILD/build.ninja" ]; then
  meson setup "$BUILD" "$ROOT" -Dbuildtype=release -Dnvcc_archs=90 > "$OUTDIR/meson-setup.txt" 2>&1
fi
if ninja -C "$BUILD" -j "$jobs" > "$OUTDIR/build.txt" 2>&1; then
  note "build" "ok ($jobs jobs; log build.txt)"
else
  note "build" "FAILED (see build.txt)"
  tail -40 "$OUTDIR/build.txt"
  cat "$SUMMARY"
  exit 1
fi
grep -A12 "Backends" "$OUTDIR/meson-setup.txt" 2>/dev/null | head -14

# ---- 5. devinfo, tests, bench ------------------------------------------------------------------
section "devinfo -v"
"$BUILD/tools/devinfo" -v > "$OUTDIR/devinfo.txt" 2>&1
cat "$OUTDIR/devinfo.txt"
"$BUILD/tools/devinfo" --json > "$OUTDIR/devinfo.json" 2>&1
"$BUILD/tools/devinfo" --check > "$OUTDIR/devinfo-check.txt" 2>&1
note "devinfo --check" "$(tail -1 "$OUTDIR/devinfo-check.txt")"

section "Tests"
meson test -C "$BUILD" --print-errorlogs --timeout-multiplier 3 --num-processes "$jobs" > "$OUTDIR/tests.txt" 2>&1
cp "$BUILD/meson-logs/testlog.txt" "$OUTDIR/testlog.txt" 2>/dev/null
grep -E "^ *[0-9]+/[0-9]+ " "$OUTDIR/tests.txt" | tee "$OUTDIR/tests-lines.txt" | grep -Ev " OK " || true
note "tests" "$(grep -E '^(Ok|Fail|Skipped|Timeout):' "$OUTDIR/tests.txt" | tr -s ' ' | paste -sd ' ')"
for t in cuda conformance-cuda conformance-opencl; do
  line="$(grep -E " $t +" "$OUTDIR/tests-lines.txt" | head -1 | awk '{print $(NF-1), $NF}')"
  note "  $t" "${line:-not run}"
done

if [ "$BENCH" != none ]; then
  section "kiln-bench ($BENCH)"
  args=(--out "$OUTDIR/bench")
  [ "$BENCH" = quick ] && args+=(--quick)
  env -u OPENBLAS_CORETYPE "$BUILD/bench/kiln-bench" "${args[@]}" > "$OUTDIR/bench.txt" 2> "$OUTDIR/bench-progress.txt"
  note "kiln-bench" "exit $? (bench.txt, bench/report.md, bench/results.json)"
fi

section "Summary"
cat "$SUMMARY"
echo "every log is in $OUTDIR"
