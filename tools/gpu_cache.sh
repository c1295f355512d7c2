#!/usr/bin/env bash
# Carry the switchboard's compiled kernels from one GPU session to the next. The lent machine starts empty, and
# the GPU suite spends most of its time compiling: Triton variants (the Triton backend's folder outlasts 8 minutes on
# an H100), FA4's CuTe DSL kernels and the CUTLASS library. They all live under the switchboard's artefact root
# (kernel_switchboard/artefacts.py), keyed by an environment hash, so a cache from another GPU, driver or version is
# never opened.
#   bash tools/gpu_cache.sh pack      # GPU machine, after a run: $OUT/kcache.partNN (15 MiB each, at most 4 come back)
#   mkdir -p .gpu/cache && cp <files_at>/kcache.part* .gpu/cache/          # here: .gpu/ is ignored
#   bash tools/gpu_cache.sh restore   # GPU machine, in a call that carries [".gpu/cache"], before the first kernel
set -eu
root=${KSB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kernel-switchboard}
case "${1:-}" in
pack)
  OUT=${OUT:-/tmp/ksb-out}
  mkdir -p "$OUT"
  [ -d "$root" ] || { echo "gpu_cache: no artefact root at $root" >&2; exit 1; }
  du -sh "$root"/compiled/*/* "$root"/cutlass 2>/dev/null | sed 's/^/gpu_cache: /'
  tar -C "$(dirname "$root")" -cf - "$(basename "$root")" | xz -T0 -6 | split -b 15m -d -a 2 - "$OUT/kcache.part"
  parts=$(ls "$OUT"/kcache.part* | wc -l)
  du -ch "$OUT"/kcache.part* | tail -1 | sed 's/^/gpu_cache: packed /'
  if [ "$parts" -gt 4 ]; then
    echo "gpu_cache: $parts parts: only 4 come back (64 MiB); pack fewer kernels (KSB_CACHE_DIR of one folder's run)" >&2
    exit 1
  fi ;;
restore)
  ls .gpu/cache/kcache.part* > /dev/null 2>&1 || { echo "gpu_cache: no .gpu/cache/kcache.part* carried" >&2; exit 1; }
  mkdir -p "$(dirname "$root")"
  cat .gpu/cache/kcache.part* | xz -d | tar -C "$(dirname "$root")" -xf -
  du -sh "$root" | sed 's/^/gpu_cache: restored /' ;;
*)
  echo "usage: bash tools/gpu_cache.sh pack | restore" >&2; exit 2 ;;
esac
