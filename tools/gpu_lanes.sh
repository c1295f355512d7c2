#!/usr/bin/env bash
# GPU work that outlasts one 600 s device call: two detached lanes on the GPU machine, collected by later calls while
# the machine stays warm (it is given back 30 s after a call ends, so issue the next call at once).
#   bash tools/gpu_lanes.sh start             # after `source .gpu/core/setup.sh` and `bash tools/gpu_check.sh install`
#   bash tools/gpu_lanes.sh collect SECONDS   # wait up to SECONDS for both lanes; pack what they wrote into $OUT
# Run it from a copy of the checkout in /tmp (`cp -a . /tmp/gpu-stash/repo && cd /tmp/gpu-stash/repo`): a later call
# replaces the checkout, and the lanes keep reading theirs.
# The tests lane runs GPU test folders one at a time (an 80 GB card holds one folder's tests, not two):
#   KSB_LANE_TESTS   "seconds:path[:workers] ..." (default below: the core, FlashInfer comparison, engine and adapters
#                    first); "|" splits it into lanes that run side by side; ":workers" runs that folder's tests in
#                    that many pytest-xdist processes on the one GPU (compile-bound folders: Triton compiles on the
#                    CPU cores) where xdist is installed (`pip download -d .whl/xdist pytest-xdist execnet` here,
#                    carried with `.whl`; `gpu_check.sh install` installs it), else in one process
# Compiles dominate the tests' time on a fresh machine: `bash tools/gpu_cache.sh pack` after a run and `restore` at
# the start of the next session's run carries the compiled kernels over.
# The bench lane runs beside it (its timings share the GPU with the tests lane: compare ratios within a row only):
#   KSB_LANE_DEMOS   model families for `switchboard demo --model F --check` (default: every family)
#   KSB_LANE_BENCH   "seconds:preset ..." for `switchboard bench --preset` (default below)
#   KSB_LANE_WARM    seconds for `tools/flashinfer_warm.py` over those presets first (FlashInfer's JIT modules built
#                    side by side instead of one after another inside the timed runs); "" skips it (default 900)
set -u
S=${KSB_LANES_DIR:-/tmp/gpu-stash}
OUT=${OUT:-/tmp/ksb-out}
# per-folder limits from the H100 and H200 runs with empty caches (first compiles included): the Triton backend's
# folder ran 40% of its tests in 480 s beside two other lanes in one process, all of them in 823 s in 8 xdist
# processes (H200; the lanes beside it then starved for CPU: keep them short); FlashInfer's first JIT builds take
# 100-300 s each in the comparison folder, which in 4 xdist processes (the builds side by side) ran whole in 287 s on
# an H100; CUTLASS's first library build alone takes over 150 s; with three lanes side by side the other folders took
# 80-230 s; the core's folder, with the GPU reference sampling checks (54 s alone) and its Triton compiles, ran 87% of
# its tests in 200 s beside the comparison folder (H200)
tests_default="420:packages/core/tests 600:packages/core/tests/flashinfer:4 90:tests 180:packages/engine/tests
150:packages/integration-transformers/tests 150:packages/backend-cudnn/tests 1500:packages/backend-triton/tests:8
300:packages/backend-trtllm/tests 300:packages/backend-fa/tests 360:packages/backend-cutlass/tests"
bench_default="300:flashinfer-compat 240:flashinfer-ops 300:beyond 300:variants"

case "${1:-}" in
start)
  mkdir -p "$S/tests" "$S/bench"
  export KSB_TEST_DEVICE=cuda PYTHONUNBUFFERED=1
  # "|" splits the list into lanes that run side by side (a 141 GB H200 holds two folders' tests at once)
  IFS='|' read -ra test_lanes <<< "${KSB_LANE_TESTS-$tests_default}"
  echo "${#test_lanes[@]}" > "$S/tests/lanes"
  for i in "${!test_lanes[@]}"; do
    LANE_ITEMS=${test_lanes[$i]} LANE=$i setsid nohup bash -c '
    for item in $LANE_ITEMS; do
      IFS=: read -r limit path workers <<< "$item"; name=${path//\//_}
      ignore=$([ "$path" = packages/core/tests ] && echo --ignore=packages/core/tests/flashinfer)
      parallel=$([ -n "$workers" ] && python3 -c "import xdist" 2> /dev/null && echo "-n $workers")
      timeout -s INT -k 20 "$limit" python3 -m pytest -q -m gpu --no-header -rfEP -p no:cacheprovider --durations=10 \
        $parallel "$path" $ignore > "'"$S"'/tests/$name.log" 2>&1
      echo "$path (exit $?): $(grep -E " in [0-9.]+s" "'"$S"'/tests/$name.log" | tail -1)" \
        >> "'"$S"'/tests/summary.txt"
      # where xdist processes ran the card out of memory (an 80 GB card holds the folder, not 8 copies of its largest
      # tests), the failed tests run again in one process and report on a line of their own
      oom=$(grep -q OutOfMemoryError "'"$S"'/tests/$name.log" \
            && grep -E "^(FAILED|ERROR) " "'"$S"'/tests/$name.log" | sed "s/^[A-Z]* //; s/ - .*//")
      if [ -n "$parallel" ] && [ -n "$oom" ]; then
        timeout -s INT -k 20 "$limit" python3 -m pytest -q -m gpu --no-header -rfE -p no:cacheprovider $oom \
          > "'"$S"'/tests/$name.oom-rerun.log" 2>&1
        rc=$?
        echo "$path, the $(echo "$oom" | wc -l) failed where $workers processes ran out of memory, alone (exit $rc):" \
          "$(grep -E " in [0-9.]+s" "'"$S"'/tests/$name.oom-rerun.log" | tail -1)" >> "'"$S"'/tests/summary.txt"
      fi
    done
    touch "'"$S"'/tests/done-$LANE"' < /dev/null > /dev/null 2>&1 &
  done
  KSB_LANE_WARM=${KSB_LANE_WARM-900} \
  KSB_LANE_DEMOS=${KSB_LANE_DEMOS-llama qwen2 qwen3 mistral mixtral gemma2 gemma3 deepseek} \
  KSB_LANE_BENCH=${KSB_LANE_BENCH-$bench_default} setsid nohup bash -c '
    for family in $KSB_LANE_DEMOS; do
      timeout 120 switchboard demo --model "$family" --check > "'"$S"'/bench/demo-$family.txt" 2>&1
      echo "exit $?" >> "'"$S"'/bench/demo-$family.txt"
    done
    presets=$(for item in $KSB_LANE_BENCH; do printf "%s " "${item#*:}"; done)
    if [ -n "$KSB_LANE_WARM" ] && [ -n "$presets" ] && [ "${KSB_BENCH_FLASHINFER:-1}" != 0 ]; then
      timeout "$KSB_LANE_WARM" python3 tools/flashinfer_warm.py $presets > "'"$S"'/bench/warm.txt" 2>&1
    fi
    for item in $KSB_LANE_BENCH; do
      limit=${item%%:*}; preset=${item#*:}
      timeout "$limit" switchboard bench --preset "$preset" --out "'"$S"'/bench/$preset" --reps-ms 50 \
        > "'"$S"'/bench/bench-$preset.txt" 2>&1
      echo "exit $?" >> "'"$S"'/bench/bench-$preset.txt"
    done
    touch "'"$S"'/bench/done"' < /dev/null > /dev/null 2>&1 &
  echo "gpu_lanes: started; logs under $S/tests and $S/bench" ;;
collect)
  end=$(( $(date +%s) + ${2:-500} ))
  tests_done() { [ "$(ls "$S"/tests/done-* 2>/dev/null | wc -l)" -ge "$(cat "$S/tests/lanes" 2>/dev/null || echo 1)" ]; }
  while [ "$(date +%s)" -lt "$end" ] && ! { tests_done && [ -f "$S/bench/done" ]; }; do sleep 5; done
  mkdir -p "$OUT" && tar czf "$OUT/results.tgz" -C "$S" tests bench 2>/dev/null
  cat "$S/tests/summary.txt" 2>/dev/null
  grep -h "^check\|positions past" "$S"/bench/demo-*.txt 2>/dev/null
  tests_done || echo "gpu_lanes: $S/tests still running"
  [ -f "$S/bench/done" ] || echo "gpu_lanes: $S/bench still running" ;;
*)
  echo "usage: bash tools/gpu_lanes.sh start | collect SECONDS" >&2; exit 2 ;;
esac
