#!/usr/bin/env bash
# scripts/fuzz.sh: build libkiln-nn's libFuzzer targets with clang, ASan and UBSan in build-fuzz/, and fuzz each reader for a while.
# Usage: scripts/fuzz.sh [SECONDS per target, default 60] [TARGET...: safetensors idx]
# A crash leaves its input in build-fuzz/crashes/<target>/ and fails the script; the
# seeds are tests/nn/data/*.safetensors and a small IDX file, the corpus grows in build-fuzz/corpus/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$KILN_ROOT"

seconds="${1:-60}"
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(safetensors idx)

command -v clang >/dev/null 2>&1 || kiln_die "clang is missing (apt-get install clang): libFuzzer comes with it"
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized -Dcuda=disabled -Dopencl=disabled -Dtests=false -Dbench=false -Dexamples=false ||
    kiln_die "meson setup build-fuzz failed"
fi
ninja -C build-fuzz || kiln_die "the fuzz build failed"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$KILN_ROOT/tests/lsan.supp:print_suppressions=0"
for target in "${targets[@]}"; do
  corpus="build-fuzz/corpus/$target"
  crashes="build-fuzz/crashes/$target"
  mkdir -p "$corpus" "$crashes"
  dict=()
  case "$target" in
    safetensors)
      cp -n tests/nn/data/*.safetensors "$corpus/"
      dict=(-dict=nn/fuzz/safetensors.dict)
      ;;
    idx) printf '\0\0\10\1\0\0\0\3\1\2\3' >"$corpus/labels.idx" ;;
    *) kiln_die "unknown target $target (safetensors, idx)" ;;
  esac
  kiln_section "fuzz_$target for ${seconds} s"
  "build-fuzz/nn/fuzz/fuzz_$target" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$crashes/" "$corpus"
done
kiln_section "No crash in ${#targets[@]} target(s) x ${seconds} s"
