set -u
export PYTHONUNBUFFERED=1 KSB_TEST_DEVICE=cuda
source .gpu/core/setup.sh > $OUT/setup.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e packages/core -e packages/backend-triton -e packages/backend-cutlass > $OUT/install.txt 2>&1
echo "[$(date +%T)] mla small sweep"
timeout -s INT -k 10 130 python3 tools/gpu_sweep.py $OUT/sweep.json mla-small > $OUT/sweep.txt 2>&1; echo exit $?
grep mla $OUT/sweep.txt | sed -E "s/'workload': //; s/'first_call_s'/fc/; s/'max_err': [0-9.e-]+, //" | cut -c1-230
echo "[$(date +%T)] cutlass fp8 tests"
timeout -s INT -k 10 220 python3 -m pytest -v -m gpu -p no:cacheprovider packages/backend-cutlass/tests/test_cutlass_gpu.py -k fp8 > $OUT/cutlass.txt 2>&1; echo exit $?
grep -E "FAILED|ERROR|passed|failed" $OUT/cutlass.txt | tail -8
echo "[$(date +%T)] cutlass bench"
timeout -k 10 200 python3 packages/backend-cutlass/benchmarks/gemm.py > $OUT/cbench.txt 2>&1; echo exit $?
grep -E "fp8|bf16|grouped|first" $OUT/cbench.txt | cut -c1-220 | tail -20
echo "[$(date +%T)] done"
