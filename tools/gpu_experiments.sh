#!/usr/bin/env bash
# One device call that tests and times the Gluon kernels (the Hopper defaults: warp-specialised MLA decode and fp8
# block-scaled mm; the MLA kernel without warp specialisation) on a lent H200, each part in its own process under
# its own time limit (a hung kernel stops only its part; worst case ~560 s, ~530 s with TV, which runs only the MLA parts).
# Usage, from the project root, carrying .gpu/core:  bash tools/gpu_experiments.sh   (results: $OUT/experiments.tgz)
# TV=39 bash tools/gpu_experiments.sh: the same on the Triton 3.9 bundle stashed by an earlier call
# (tools/triton_bundle.sh, tools/gpu_triton.sh), where the tests and sweeps include the 2-CTA MLA kernel.
set -u
OUT=${OUT:-/tmp/ksb-out}
mkdir -p "$OUT/exp"
export PYTHONUNBUFFERED=1 KSB_TEST_DEVICE=cuda
source .gpu/core/setup.sh > "$OUT/exp/setup.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e packages/core -e packages/backend-triton \
  > "$OUT/exp/install.txt" 2>&1
TV=${TV:-}
[ -z "$TV" ] || source tools/gpu_triton.sh
on_triton() { if [ -n "$TV" ]; then tv "$TV" "$@"; else "$@"; fi; }  # the command on the chosen Triton
on_triton python3 -c "import triton; print('triton', triton.__version__)"
echo "[experiments $(date +%T)] GPU tests: MLA decode (every kernel), then the Gluon fp8 mm"
T=packages/backend-triton/tests
run_tests() {  # name, time limit, pytest selection...
  local name=$1 limit=$2; shift 2
  on_triton timeout -s INT -k 10 "$limit" python3 -m pytest -v -m gpu -p no:cacheprovider "$@" > "$OUT/exp/tests-$name.txt" 2>&1
  echo "$name: exit $?"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/exp/tests-$name.txt" | tail -14
}
if [ -n "$TV" ]; then  # the 2-CTA cluster kernel first, on its own: a barrier mistake hangs rather than fails
  run_tests mla-2cta 90 $T/test_attention_gpu.py -k 2cta  # six variants, ~9 s of compile each on the device
  grep -q " passed" "$OUT/exp/tests-mla-2cta.txt" && ! grep -qE "failed|error" "$OUT/exp/tests-mla-2cta.txt" \
    || { export KSB_SWEEP_CLUSTER=0; echo "2-CTA tests did not pass: the sweeps leave its rows out"; }
fi
run_tests mla $([ -n "$TV" ] && echo 160 || echo 120) $T/test_attention_gpu.py -k "mla and not 2cta"  # 3.9: ~6 s a variant
[ -n "$TV" ] || run_tests fp8 60 $T/test_gemm.py -k gluon  # (on a bundle: the MLA parts only)
if [ -z "$TV" ]; then
  echo "[experiments $(date +%T)] gemm benchmark (the Gluon sweep rows last)"
  timeout -k 10 150 python3 packages/backend-triton/benchmarks/gemm.py > "$OUT/exp/gemm.txt" 2> "$OUT/exp/gemm-progress.txt"
  grep fp8 "$OUT/exp/gemm.txt" || grep -E "fp8.*(tflops|error)" "$OUT/exp/gemm-progress.txt"; tail -1 "$OUT/exp/gemm-progress.txt"
fi
echo "[experiments $(date +%T)] MLA sweeps: B=128 L=8192 (128, then 16 heads), B=16 L=4096 eager and in CUDA graphs"
on_triton timeout -s INT -k 10 $([ -n "$TV" ] && echo 250 || echo 200) python3 tools/gpu_sweep.py "$OUT/exp/sweep.json" mla mla-tp8 mla-small > "$OUT/exp/sweep.txt" 2>&1
grep -E "mla" "$OUT/exp/sweep.txt" | cut -c1-260
tar czf /tmp/experiments.tgz -C "$OUT" exp && rm -rf "$OUT/exp" && mv /tmp/experiments.tgz "$OUT/"
echo "[experiments $(date +%T)] done: $OUT/experiments.tgz"
