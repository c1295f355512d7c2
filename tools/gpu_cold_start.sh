#!/usr/bin/env bash
# Cold start on an H100 / H200 in one command: the first result of every op family in a fresh process with cold,
# warm and `switchboard build` caches, FlashInfer's first calls beside them, and the import time of
# kernel_switchboard. Usage, from the project root, in an environment that already has torch, Triton, FlashInfer
# and the vendor libraries to time:
#   bash tools/gpu_cold_start.sh
# Each step has its own time budget; the whole stays under ~9 minutes. Results under $OUT: first-call-*/first-call.json
# and the tables (*.txt), importtime.txt, summary.txt; packed into $OUT/results.tgz at the end.
set -u
OUT=${OUT:-/tmp/ksb-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "[gpu_cold_start $(date +%T)] $*"; }
start=$(date +%s)
left() { echo $(( ${KSB_COLD_BUDGET_S:-520} - ($(date +%s) - start) )); }

log "install"
python3 -m pip install -q --no-index --no-deps --no-build-isolation \
  -e packages/core -e packages/backend-triton -e packages/backend-cudnn -e packages/backend-fa \
  -e packages/backend-cutlass -e packages/backend-trtllm > "$OUT/install.log" 2>&1 || tail -20 "$OUT/install.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
for pkg in flashinfer-python nvidia-cudnn-frontend flash-attn-4 nvidia-cutlass-dsl nvidia-cutlass; do
  python3 -c "from importlib.metadata import version as v; print('$pkg', v('$pkg'))" 2>/dev/null | tee -a "$OUT/gpu.txt"
done
timeout 120 switchboard doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"  # kernel ids and availability
python3 -c "import flash_attn.cute.cache_utils" 2>/dev/null && echo "flash-attn-4 has its persistent CuTe DSL cache" \
  | tee -a "$OUT/gpu.txt"

log "import time (three fresh processes)"
for i in 1 2 3; do
  python3 -X importtime -c "import kernel_switchboard" 2> "$OUT/importtime-$i.raw"
  python3 - "$OUT/importtime-$i.raw" <<'EOF' | tee -a "$OUT/importtime.txt"
import re, sys
cum = {}
for line in open(sys.argv[1]):
    m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
    if m:
        cum[m.group(3)] = int(m.group(1)) / 1e6
total, torch = cum.get("kernel_switchboard", 0), cum.get("torch", 0)
print(f"import kernel_switchboard: {total:.3f} s, of which torch {torch:.3f} s, the switchboard's own {total - torch:.3f} s")
EOF
done

log "first call: cold and warm caches, every op family (automatic dispatch)"
timeout -k 10 $(( $(left) < 260 ? $(left) : 260 )) switchboard bench --preset first-call --cache cold,warm \
  --timeout-s 120 --budget-s 230 --out "$OUT/first-call" > "$OUT/first-call.txt" 2> "$OUT/first-call.err"
cat "$OUT/first-call.txt"

log "first call after switchboard build (fresh caches filled by the build): decode, RMSNorm, ragged prefill"
if [ "$(left)" -gt 150 ]; then
  timeout -k 10 90 switchboard bench --preset first-call --cache built --op attention.decode --op norm.rms_norm \
    --op attention.prefill_ragged --timeout-s 60 --budget-s 70 --out "$OUT/first-call-built" \
    > "$OUT/first-call-built.txt" 2> "$OUT/first-call-built.err"
  cat "$OUT/first-call-built.txt"
fi

log "FlashInfer's first calls on the same shapes (empty FlashInfer cache; decode, RMSNorm, ragged prefill)"
if [ "$(left)" -gt 60 ]; then
  timeout -k 10 $(( $(left) - 30 < 250 ? $(left) - 30 : 250 )) switchboard bench --preset first-call --cache none \
    --op attention.decode --op norm.rms_norm --op attention.prefill_ragged --flashinfer \
    --flashinfer-op attention.decode --flashinfer-op norm.rms_norm --flashinfer-op attention.prefill_ragged \
    --timeout-s 130 --budget-s $(( $(left) - 40 )) --out "$OUT/first-call-flashinfer" \
    > "$OUT/first-call-flashinfer.txt" 2> "$OUT/first-call-flashinfer.err"
  cat "$OUT/first-call-flashinfer.txt"
fi

log "summary"
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("first-call", "first-call-flashinfer", "first-call-built"):
    f = out / name / "first-call.json"
    if not f.exists():
        print(f"{name}: no result")
        continue
    for r in json.loads(f.read_text()):
        if r.get("error"):
            print(f"{r['op']:<30} {r['mode']:<16} ERROR {r['error'][:150]}")
            continue
        extra = [f"vendors {','.join(r.get('vendors_after_call') or []) or '-'}",
                 f"dynamo {'yes' if r.get('torch_dynamo_loaded') else 'no'}",
                 f"imports {r.get('vendor_imports')}", f"correct {r.get('correct')}"]
        print(f"{r['op']:<30} {r['mode']:<16} {str(r.get('chosen'))[:40]:<40} first result {r.get('first_result_s')} s "
              f"(import {r.get('import_s')}, select {r.get('select_s')}, call {r.get('first_call_s')}, "
              f"compile {r.get('compile_s')}, gc {r.get('gc_s')}); new cache files {r.get('cache_files_added')}; " + "; ".join(extra))
EOF
tar czf /tmp/results.tgz -C "$OUT" . 2>/dev/null && find "$OUT" -mindepth 1 -delete && mv /tmp/results.tgz "$OUT/results.tgz"
log "done in $(( $(date +%s) - start )) s"
