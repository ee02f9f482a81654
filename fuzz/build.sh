#!/usr/bin/env bash
# Build the libFuzzer target over segment attach/validation (clang,
# -fsanitize=fuzzer,address,undefined) and its seed corpus.
#   fuzz/build.sh [OUTDIR]          default OUTDIR: build-fuzz
# Produces OUTDIR/fuzz_attach, OUTDIR/gen_seeds and OUTDIR/corpus/seed-*.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:-$root/build-fuzz}"
mkdir -p "$out/corpus"
CC="${CC:-clang}"
cat > "$out/umbp_config.h" <<'CFG'
#pragma once
#define UMBP_HAVE_CUDA 0
#define UMBP_VERSION "fuzz"
CFG
srcs=("$root"/src/common/common.c "$root"/src/modules.c "$root"/src/shm/segment.c "$root"/src/shm/registry.c "$root"/src/shm/ring.c "$root"/src/shm/sigbus.c
      "$root"/src/shm/daemon.c "$root"/src/shm/admin.c "$root"/src/index/*.c)
flags=(-std=gnu11 -D_GNU_SOURCE -DUMBP_BUILDING_LIB -g -O1 -fno-omit-frame-pointer
       -I"$out" -I"$root/include" -I"$root/src" -I"$root" -Wall -Wextra -Wno-unused-parameter)
# the seed generator: the library without instrumentation
"$CC" "${flags[@]}" -o "$out/gen_seeds" "$here/gen_seeds.c" "${srcs[@]}" -lnuma -lpthread
# the fuzz target: everything instrumented
"$CC" "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -o "$out/fuzz_attach" "$here/fuzz_attach.c" "${srcs[@]}" -lnuma -lpthread
"$out/gen_seeds" "$out/corpus"
