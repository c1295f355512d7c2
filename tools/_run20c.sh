set -u
export PYTHONUNBUFFERED=1 KSB_TEST_DEVICE=cuda
source .gpu/core/setup.sh > $OUT/setup.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e packages/core -e packages/backend-triton -e packages/backend-cutlass > $OUT/install.txt 2>&1
T=packages/backend-triton/tests
echo "[$(date +%T)] triton gpu tests"
timeout -s INT -k 10 240 python3 -m pytest -m gpu -p no:cacheprovider -q -rs $T/test_gemm.py $T/test_attention_gpu.py > $OUT/tests.txt 2>&1; echo exit $?
grep -E "FAILED|ERROR|passed|failed" $OUT/tests.txt | tail -12
echo "[$(date +%T)] gemm bench"
timeout -k 10 150 python3 packages/backend-triton/benchmarks/gemm.py > $OUT/gemm.txt 2> $OUT/gemm-progress.txt
grep -E "fp8" $OUT/gemm.txt | cut -c1-220
echo "[$(date +%T)] mla bench"
timeout -s INT -k 10 150 switchboard bench --preset deepseek-v3-mla --out $OUT/mla > $OUT/mla.txt 2>&1; echo exit $?
tail -25 $OUT/mla.txt | cut -c1-200
echo "[$(date +%T)] done"
