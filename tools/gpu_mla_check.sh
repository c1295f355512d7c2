#!/usr/bin/env bash
# MLA decode on a lent GPU (issue 3) in two calls, each step with its own time limit so that each part fits the
# device's 600 s a call. Part 1, the measurement: tools/mla_probe.py (the default and FlashInfer timed in turn, three
# L2 flush modes and CUDA graphs) at 128 and 16 heads, and the bench preset. Part 2, the confirmations: the MLA GPU
# tests (fewer heads, CUDA graphs), the MTP line (two new tokens per request), the plan tests and the first call's
# compile by stage. Usage, from the project root (the two calls back to back, so the machine stays warm):
#   source .gpu/core/setup.sh && export OUT && bash tools/gpu_mla_check.sh 1
#   source .gpu/core/setup.sh && export OUT && bash tools/gpu_mla_check.sh 2
set -u
PART=${1:?usage: gpu_mla_check.sh 1|2}
OUT=${OUT:-/tmp/ksb-out}
R=$OUT/mla$PART; mkdir -p "$R"
export KSB_TEST_DEVICE=cuda PYTHONUNBUFFERED=1
log() { echo "[gpu_mla_check $(date +%T)] $*"; }
step() {  # step NAME SECONDS cmd...: run with a time limit (SIGINT first: pytest prints its summary), log to $R/NAME.txt
  local name=$1 limit=$2; shift 2
  log "$name"
  timeout -s INT -k 10 "$limit" "$@" > "$R/$name.txt" 2>&1
  echo "  exit $? :: $(grep -E '(passed|failed|error)' "$R/$name.txt" | tail -1)"
}
pack() { tar czf "$OUT/mla$PART.tgz" -C "$OUT" "mla$PART"; }
bash tools/gpu_check.sh install > "$R/install.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$PART" = 1 ]; then
  step probe-h128 150 python3 tools/mla_probe.py  # FlashInfer's MLA module JIT-compiles here (~20 s) the first time
  tail -8 "$R/probe-h128.txt"
  pack
  step probe-h16 70 python3 tools/mla_probe.py --heads 16 --rounds 1
  tail -8 "$R/probe-h16.txt"
  step bench 100 switchboard bench --preset deepseek-v3-mla
  grep -hE "mla|MLA" "$R"/bench.txt | grep -v "^bench \[" | cut -c1-200
else
  step tests 220 python3 -m pytest -q -m gpu --no-header -rA -p no:cacheprovider \
    packages/backend-triton/tests/test_attention_gpu.py -k "mla and not 2cta"
  step bench-mtp 60 switchboard bench --op attention.mla_decode --param batch=128 --param kv_len=8192 \
    --param num_heads=128 --param page_size=64 --param q_len=2
  grep -hE "mla|MLA" "$R"/bench-mtp.txt | grep -v "^bench \[" | cut -c1-200
  pack
  step tests-plan 60 python3 -m pytest -q -m gpu --no-header -rA -p no:cacheprovider tests/test_attention_plan.py -k mla
  step first-call 60 switchboard bench --preset first-call --op attention.mla_decode --cache cold \
    --out "$R/first-call"  # first result in a fresh process; triton_kernels: compile seconds by stage
  cat "$R/first-call/first-call.json" 2>/dev/null
fi
pack
log done
