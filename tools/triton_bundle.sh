#!/usr/bin/env bash
# Pack a Triton release to test on an offline GPU machine whose torch ships another Triton (torch 2.11: Triton 3.6),
# small enough to copy over in one file (under 64 MiB): .gpu/t<MAJOR><MINOR>/t<MAJOR><MINOR>.tar.xz, the cp312
# wheel's `triton` package with libtriton.so stripped of debug info, and without the AMD backend, CUPTI, Proton,
# plugins and ptxas-blackwell (sm_90 takes the bundled ptxas, or the machine's CUDA 13.0 ptxas where a release uses
# ptxas-blackwell for every arch).
#
#   tools/triton_bundle.sh 3.7.1 3.9.0     from the project root; needs the wheels from pip's index (or its cache)
#
# On the GPU machine: copy .gpu/tNN to /tmp/gpu-stash/tNN, then `source tools/gpu_triton.sh` and run commands as
# `tv NN cmd ...`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
for version in "$@"; do
  tag=$(echo "$version" | cut -d. -f1-2 | tr -d .)
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$work" "triton==$version" 2>&1 | grep -v -i warning || true
  (cd "$work" && unzip -q triton-*.whl 'triton/*')
  t=$work/triton
  rm -rf "$t/backends/amd" "$t/backends/nvidia/lib/cupti" "$t/backends/nvidia/lib/cupti-blackwell" "$t/_C/libproton.so" \
    "$t/plugins" "$t/FileCheck" "$t/backends/nvidia/bin/ptxas-blackwell" "$t/backends/nvidia/bin/cuobjdump" \
    "$t/backends/nvidia/bin/nvdisasm"
  rm -f "$t"/instrumentation/*.so
  strip --strip-unneeded "$t/_C/libtriton.so"
  mkdir -p ".gpu/t$tag"
  tar -C "$work" -cf - triton | xz -T0 -6 > ".gpu/t$tag/t$tag.tar.xz"
  rm -rf "$work"
  du -h ".gpu/t$tag/t$tag.tar.xz" | sed 's/^/triton_bundle: /'
done
