#!/usr/bin/env bash
# One device call that tests and times the Gluon kernels (the opt-in fp8 block mm and warp-specialised MLA decode,
# the default MLA decode) on a lent H200, each part in its own process under its own time limit (a hung kernel
# stops only its part; worst case ~560 s).
# Usage, from the project root, carrying .gpu/core:  bash tools/gpu_experiments.sh   (results: $OUT/experiments.tgz)
set -u
OUT=${OUT:-/tmp/ksb-out}
mkdir -p "$OUT/exp"
export PYTHONUNBUFFERED=1 KSB_TEST_DEVICE=cuda
source .gpu/core/setup.sh > "$OUT/exp/setup.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e packages/core -e packages/backend-triton \
  > "$OUT/exp/install.txt" 2>&1
echo "[experiments $(date +%T)] GPU tests of the Gluon kernels"
timeout -s INT -k 10 120 python3 -m pytest -v -m gpu -p no:cacheprovider packages/backend-triton/tests/test_gemm.py \
  packages/backend-triton/tests/test_attention_gpu.py -k "gluon or mla" > "$OUT/exp/tests.txt" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/exp/tests.txt" | tail -20
echo "[experiments $(date +%T)] gemm benchmark (rows 'gluon block 128x128 stages=...')"
timeout -k 10 180 python3 packages/backend-triton/benchmarks/gemm.py > "$OUT/exp/gemm.txt" 2> "$OUT/exp/gemm-progress.txt"
grep fp8 "$OUT/exp/gemm.txt"; tail -1 "$OUT/exp/gemm-progress.txt"
echo "[experiments $(date +%T)] MLA sweep (rows 'gluon=True')"
timeout -s INT -k 10 200 python3 tools/gpu_sweep.py "$OUT/exp/sweep.json" mla > "$OUT/exp/sweep.txt" 2>&1
grep -E "mla" "$OUT/exp/sweep.txt" | cut -c1-260
tar czf /tmp/experiments.tgz -C "$OUT" exp && rm -rf "$OUT/exp" && mv /tmp/experiments.tgz "$OUT/"
echo "[experiments $(date +%T)] done: $OUT/experiments.tgz"
