#!/usr/bin/env bash
# GPU check in one command on an H100 or H200 (sm_90): install the project offline, run every GPU test (one folder
# at a time), run the benchmarks, write logs and tables under $OUT. Usage, from the project root, in an environment
# that already has torch, Triton and the vendor libraries to test:
#   bash tools/gpu_check.sh [stage ...]
# Stages, run in this order whatever the order given (default: install smoke tests backend-bench bench pack;
# also moe-build, tune, trt-decode, trt-moe; pack makes one archive of $OUT). Each stage has its own time limit so one
# hang cannot eat the whole check. KSB_TUNE_CACHE may point outside $OUT (e.g. /tmp/gpu-stash/tune.json) so
# that a later check on the same machine benches with the winners an earlier check's tune stage stored.
# Work longer than one device call (the whole GPU suite, FlashInfer's first compiles, the benchmarks) runs detached:
# tools/gpu_lanes.sh.
set -u
OUT=${OUT:-/tmp/ksb-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KSB_TUNE_CACHE=${KSB_TUNE_CACHE:-$OUT/tune.json}
stages=${*:-install smoke tests backend-bench bench pack}
log() { echo "[gpu_check $(date +%T)] $*"; }

if [[ " $stages " == *" install "* ]]; then
  log "install"
  # transformers (the engine and its adapter test against it) travels as wheels in .whl/tf when carried
  if ls .whl/tf/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site .whl/tf/*.whl > "$OUT/install-tf.log" 2>&1 \
      || tail -5 "$OUT/install-tf.log"
  fi
  # pytest-xdist (tools/gpu_lanes.sh runs compile-bound folders in several processes) travels in .whl/xdist
  if ls .whl/xdist/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site .whl/xdist/*.whl \
      > "$OUT/install-xdist.log" 2>&1 || tail -5 "$OUT/install-xdist.log"
  fi
  # every package of the repository, editable (the engine adapters for vLLM / SGLang only import without their engine)
  python3 -m pip install -q --no-index --no-deps --no-build-isolation \
    $(for p in packages/*/pyproject.toml; do printf -- "-e %s " "${p%/pyproject.toml}"; done) > "$OUT/install.log" 2>&1 \
    || { tail -20 "$OUT/install.log"; }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
  timeout 120 switchboard doctor > "$OUT/doctor.txt" 2>&1; cat "$OUT/doctor.txt" | head -60
fi

if [[ " $stages " == *" moe-build "* ]]; then
  # flashinfer's sm_90 CUTLASS fused-MoE module takes longer to build than one check runs: build it detached
  # (a later check on the same machine uses it) with FAST_BUILD on host and device code (one tile, 128x128x128,
  # instead of every tactic), then copy it to the AOT path, where flashinfer loads it without a build.
  # Log: /tmp/gpu-stash/moe-build.log.
  mkdir -p /tmp/gpu-stash
  if pgrep -f gen_cutlass_fused_moe_sm90 > /dev/null; then log "moe-build already running"; else
    log "moe-build: started in the background"
    FLASHINFER_EXTRA_CUDAFLAGS="-DFAST_BUILD" MAX_JOBS=${KSB_MOE_BUILD_JOBS:-10} setsid nohup python3 -c "
import shutil, time
from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module
t0 = time.time()
spec = gen_cutlass_fused_moe_sm90_module(use_fast_build=True)
spec.build()
spec.aot_path.parent.mkdir(parents=True, exist_ok=True)
shutil.copy(spec.jit_library_path, spec.aot_path)
print('BUILT', round(time.time() - t0), 's ->', spec.aot_path)" > /tmp/gpu-stash/moe-build.log 2>&1 < /dev/null &
    disown
  fi
fi

if [[ " $stages " == *" smoke "* ]]; then
  log "smoke"
  timeout -s INT -k 10 ${KSB_SMOKE_TIMEOUT:-150} python3 tools/gpu_smoke.py 2>&1 | tee "$OUT/smoke.txt"
fi

if [[ " $stages " == *" tests "* ]]; then
  log "gpu tests (one folder at a time)"
  export KSB_TEST_DEVICE=cuda
  # one pytest per folder (the packages' test files share basenames: test_norm.py ...), run one after another so
  # that no two processes hold GPU memory at once. SIGINT at the time limit makes pytest print its summary
  # (failures so far) instead of dying silently. Per folder: exit status and the passed/failed/skipped/error counts.
  : > "$OUT/pytest-gpu.log"
  printf "%-40s %5s %7s %7s %7s %7s\n" folder exit passed failed skipped errors | tee -a "$OUT/pytest-gpu.log"
  count() { grep -oE "[0-9]+ $1" <<< "$2" | tail -1 | grep -oE "^[0-9]+" || echo 0; }
  for d in ${KSB_TEST_DIRS:-tests packages/*/tests}; do
    [ -e "${d%%::*}" ] || continue  # a folder, a file or a test node id
    flog="$OUT/pytest-gpu-${d//[\/:]/_}.log"
    timeout -s INT -k 20 ${KSB_TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu --maxfail=30 --no-header -rA \
      -p no:cacheprovider --durations=8 "$d" ${KSB_PYTEST_ARGS:-} > "$flog" 2>&1
    rc=$?
    summary=$(grep -E "^(=+ )?(no tests ran|[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)).* in [0-9.]+s" \
      "$flog" | tail -1)
    printf "%-40s %5s %7s %7s %7s %7s\n" "$d" "$rc" "$(count passed "$summary")" "$(count failed "$summary")" \
      "$(count skipped "$summary")" "$(count 'errors?' "$summary")" | tee -a "$OUT/pytest-gpu.log"
  done
  grep -hE "^(FAILED|ERROR)" "$OUT"/pytest-gpu-*.log | head -40
fi

if [[ " $stages " == *" backend-bench "* ]]; then
  log "backend benchmarks"
  timeout ${KSB_BACKEND_BENCH_TIMEOUT:-300} python3 tools/gpu_bench.py "$OUT/backend-bench.json" ${KSB_BACKEND_BENCH_FILTER:-} \
    > "$OUT/backend-bench.txt" 2>&1
  log "backend bench exit $?"; tail -80 "$OUT/backend-bench.txt"
fi

if [[ " $stages " == *" tune "* ]]; then
  log "tune (winners into $KSB_TUNE_CACHE)"
  timeout ${KSB_TUNE_TIMEOUT:-300} switchboard tune --preset ${KSB_BENCH_PRESETS:-attention} \
    --reps-ms ${KSB_TUNE_REPS_MS:-40} > "$OUT/tune.txt" 2>&1
  log "tune exit $?"; tail -50 "$OUT/tune.txt"
fi

if [[ " $stages " == *" bench "* ]]; then
  log "bench"
  timeout ${KSB_BENCH_TIMEOUT:-300} switchboard bench --preset ${KSB_BENCH_PRESETS:-llama3-8b} --out "$OUT/bench" \
    --reps-ms ${KSB_BENCH_REPS_MS:-100} > "$OUT/bench.txt" 2>&1
  log "bench exit $?"; tail -60 "$OUT/bench.txt"
fi

if [[ " $stages " == *" trt-decode "* ]]; then
  log "trtllm decode points (XQA eager and CUDA-graph rows; not its MoE compile)"
  (cd packages/backend-trtllm/benchmarks && timeout ${KSB_TRT_TIMEOUT:-200} python3 -c "import torch, decode as d
for b, l, p in d.FULL['decode']: d._bench_decode_point(b, l, p, d.HEADS, torch.device('cuda'))") > "$OUT/trt-decode.txt" 2>&1
  log "trt-decode exit $?"; tail -30 "$OUT/trt-decode.txt"
fi

if [[ " $stages " == *" trt-moe "* ]]; then
  log "trtllm fused MoE, Mixtral shape; moe-build log: $(tail -c 300 /tmp/gpu-stash/moe-build.log 2>/dev/null)"
  if grep -q BUILT /tmp/gpu-stash/moe-build.log 2>/dev/null; then
    (cd packages/backend-trtllm/benchmarks && timeout ${KSB_TRT_TIMEOUT:-200} python3 -c "import torch, decode as d
d._bench_moe(*d.FULL['moe'], torch.device('cuda'))") > "$OUT/trt-moe.txt" 2>&1
    log "trt-moe exit $?"; tail -10 "$OUT/trt-moe.txt"
  else
    log "trt-moe skipped: the module is not built yet (a JIT build here would outlast the stage's time limit)"
  fi
fi

if [[ " $stages " == *" pack "* ]]; then
  # one archive of everything under $OUT, to copy back from the GPU machine in one file
  [ -f "$KSB_TUNE_CACHE" ] && cp "$KSB_TUNE_CACHE" "$OUT/tune-cache.json" 2>/dev/null
  tar czf /tmp/results.tgz -C "$OUT" . 2>/dev/null && find "$OUT" -mindepth 1 -delete && mv /tmp/results.tgz "$OUT/results.tgz"
  log "done: $OUT/results.tgz"
fi
