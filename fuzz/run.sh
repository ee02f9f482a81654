#!/usr/bin/env bash
# Bounded fuzz run for CI: build, then run fuzz_attach for SECONDS (default 60;
# env UMBP_FUZZ_SECONDS or the first argument) from the generated seeds. Exits
# non-zero on any crash or sanitizer report (the reproducer is left in OUTDIR).
# The seed is fixed (env UMBP_FUZZ_SEED, default 1) so that a CI run is
# reproducible; set another one to explore further.
#   fuzz/run.sh [SECONDS] [OUTDIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
secs="${1:-${UMBP_FUZZ_SECONDS:-60}}"
out="${2:-$(cd "$here/.." && pwd)/build-fuzz}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
bash "$here/build.sh" "$out" >/dev/null
mkdir -p "$out/work"
cd "$out"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ./fuzz_attach -seed="${UMBP_FUZZ_SEED:-1}" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
  -artifact_prefix="$out/" -print_final_stats=1 work corpus
