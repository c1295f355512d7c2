#!/usr/bin/env bash
# Carry compiled kernels from one GPU session to the next. The lent machine starts empty, and the GPU suite spends
# most of its time compiling: Triton variants (the Triton backend's folder outlasts 8 minutes on an H100), FA4's
# CuTe DSL kernels and the CUTLASS library, all under the switchboard's artefact root (kernel_switchboard/
# artefacts.py, keyed by an environment hash, so a cache from another GPU, driver or version is never opened), and
# FlashInfer's JIT modules (100-300 s each to build) under its own cache.
#   bash tools/gpu_cache.sh pack [flashinfer]   # GPU machine, after a run: $OUT/kcache.partNN (the artefact root),
#                                               # or $OUT/fcache.partNN (FlashInfer's cache); 15 MiB parts, and at
#                                               # most 4 come back from one call
#   mkdir -p .gpu/cache && cp <files_at>/?cache.part* .gpu/cache/         # here: .gpu/ is ignored
#   bash tools/gpu_cache.sh restore             # GPU machine, in a call that carries [".gpu/cache"], before the tests
set -eu
ksb_root=${KSB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kernel-switchboard}
fi_root=${FLASHINFER_WORKSPACE_BASE:-$HOME}/.cache/flashinfer
case "${1:-}" in
pack)
  OUT=${OUT:-/tmp/ksb-out}
  if [ "${2:-}" = flashinfer ]; then root=$fi_root name=fcache; else root=$ksb_root name=kcache; fi
  [ -d "$root" ] || { echo "gpu_cache: nothing at $root" >&2; exit 1; }
  mkdir -p "$OUT"
  du -sh "$root"/* 2>/dev/null | sed 's/^/gpu_cache: /'
  tar -C / -cf - "${root#/}" | xz -T0 -6 | split -b 15m -d -a 2 - "$OUT/$name.part"
  du -ch "$OUT/$name".part* | tail -1 | sed 's/^/gpu_cache: packed /'
  if [ "$(ls "$OUT/$name".part* | wc -l)" -gt 4 ]; then
    echo "gpu_cache: more than 4 parts: only 4 files of 16 MiB come back from a call" >&2
    exit 1
  fi ;;
restore)
  found=0
  for name in kcache fcache; do
    ls .gpu/cache/$name.part* > /dev/null 2>&1 || continue
    cat .gpu/cache/$name.part* | xz -d | tar -C / -xf -
    found=1
  done
  [ "$found" = 1 ] || { echo "gpu_cache: no .gpu/cache/?cache.part* carried" >&2; exit 1; }
  du -sh "$ksb_root" "$fi_root" 2>/dev/null | sed 's/^/gpu_cache: restored /' ;;
*)
  echo "usage: bash tools/gpu_cache.sh pack [flashinfer] | restore" >&2; exit 2 ;;
esac
