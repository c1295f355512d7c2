#!/usr/bin/env bash
# MLA decode on a lent H200 in one call (issue 3), each step with its own time limit so that the whole fits the
# device's 600 s a call: the GPU tests (the default Gluon kernel, fewer heads, CUDA graphs; then the pair schedule's),
# tools/mla_probe.py (default / pairs / FlashInfer timed in turn, three L2 flush modes and CUDA graphs) at 128 and 16
# heads, the bench preset, the MTP line (two new tokens per request), the plan tests, then the first call's
# compile by stage. Usage, from the project root:
#   source .gpu/core/setup.sh && export OUT && bash tools/gpu_mla_check.sh
set -u
OUT=${OUT:-/tmp/ksb-out}
R=$OUT/mla; mkdir -p "$R"
export KSB_TEST_DEVICE=cuda PYTHONUNBUFFERED=1
log() { echo "[gpu_mla_check $(date +%T)] $*"; }
step() {  # step NAME SECONDS cmd...: run with a time limit (SIGINT first: pytest prints its summary), log to $R/NAME.txt
  local name=$1 limit=$2; shift 2
  log "$name"
  timeout -s INT -k 10 "$limit" "$@" > "$R/$name.txt" 2>&1
  echo "  exit $? :: $(grep -E '(passed|failed|error)' "$R/$name.txt" | tail -1)"
}
bash tools/gpu_check.sh install > "$R/install.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
step tests 120 python3 -m pytest -q -m gpu --no-header -rA -p no:cacheprovider \
  packages/backend-triton/tests/test_attention_gpu.py -k "mla and not 2cta and not pairs"
# the pair schedule's tests on their own (never run before): a hang or failure there costs only this step, and the
# probes then leave the pair kernel out
step tests-pairs 80 python3 -m pytest -q -m gpu --no-header -rA -p no:cacheprovider \
  packages/backend-triton/tests/test_attention_gpu.py -k "mla and pairs"
PAIRS=""; grep -qE "^[0-9]+ passed" "$R/tests-pairs.txt" && ! grep -qE "failed|error" "$R/tests-pairs.txt" || PAIRS=--no-pairs
log "pair schedule in the probes: ${PAIRS:-yes}"
step probe-h128 110 python3 tools/mla_probe.py $PAIRS  # FlashInfer's MLA module JIT-compiles here (~20 s) the first time
tail -6 "$R/probe-h128.txt"
step probe-h16 45 python3 tools/mla_probe.py --heads 16 --rounds 1 $PAIRS
tail -6 "$R/probe-h16.txt"
step bench 100 switchboard bench --preset deepseek-v3-mla
step bench-mtp 55 switchboard bench --op attention.mla_decode --param batch=128 --param kv_len=8192 \
  --param num_heads=128 --param page_size=64 --param q_len=2
grep -hE "mla|MLA" "$R"/bench*.txt | grep -v "^bench \[" | cut -c1-200
tar czf "$OUT/mla.tgz" -C "$OUT" mla
step tests-plan 45 python3 -m pytest -q -m gpu --no-header -rA -p no:cacheprovider tests/test_attention_plan.py -k mla
step first-call 30 python3 tools/first_call.py "$R/first_call.jsonl" triton:mla  # compile seconds by stage
tar czf "$OUT/mla.tgz" -C "$OUT" mla
log done
