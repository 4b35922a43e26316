#!/usr/bin/env bash
# The 2x headline run, stage by stage, on this machine: prepare -> train (a few steps and
# validation) -> evaluate (test split) -> predict (one case), each under /usr/bin/time -v
# (wall time, peak RSS), with the plan's predictions beside the measurements.
#
#   scripts/measure_2x.sh [out_dir] [extra overrides for train.py, e.g. model.base_filters=8]
#
# Defaults: data=mni_gliomas (real MNI152 anatomy, 1 mm scans) at resolution=2x (0.5 mm,
# 384x448x320), depth 4, lms=auto under lms.limit=22GB, bf16 where the CPU has it, and the
# width the planner chooses (plan_memory.py plan.find=max_width: the widest that fits) unless
# model.base_filters=... is given.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/2x}; shift || true
PY=${PYTHON:-.venv/bin/python}
PREC=$($PY -c "from brats_seg.cpu import has_native_bf16; print('bf16' if has_native_bf16() else 'fp32')")
COMMON=(data=mni_gliomas resolution=2x model.depth=4 trainer.batch_size=1 backend=cpu_onednn
        backend.precision=$PREC lms=auto lms.limit=22GB "$@")
mkdir -p "$OUT"
LOG="$OUT/measure_2x.log"
if [[ " $* " != *" model.base_filters="* ]]; then  # the planner's choice of width
  $PY scripts/plan_memory.py "${COMMON[@]}" plan.find=max_width | tee -a "$LOG"
  WIDTH=$($PY scripts/plan_memory.py "${COMMON[@]}" plan.find=max_width plan.format=json |
          $PY -c "import json, sys; print(json.load(sys.stdin)['chosen_base_filters'] or '')")
  [[ -n "$WIDTH" ]] || { echo "no width fits lms.limit at 2x: see the table above" | tee -a "$LOG"; exit 1; }
  COMMON+=("model.base_filters=$WIDTH")
fi
stage() {  # stage <name> <command...>: its output to the log, then its time and peak RSS
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$LOG"
  /usr/bin/time -v "$@" >> "$LOG" 2> "$OUT/$name.time" || { tail -30 "$OUT/$name.time" | tee -a "$LOG"; exit 1; }
  grep -E "Elapsed \(wall clock\)|Maximum resident set size" "$OUT/$name.time" | sed "s/^\s*/  $name: /" | tee -a "$LOG"
}
echo "$(date -Is) $($PY -c 'from brats_seg.cpu import cpu_model_name, cpu_kind; print(cpu_model_name(), cpu_kind())'), precision $PREC" | tee -a "$LOG"
stage plan $PY scripts/plan_memory.py "${COMMON[@]}"
stage prepare $PY scripts/prepare_data.py data=mni_gliomas resolution=2x
# the cache folder is named by the dataset and its preprocessing (data/cache/mni_gliomas_<hash>/2x)
CACHE=$(grep -oE "  cache  \S+" "$LOG" | tail -1 | awk '{print $2}')
du -sb "$CACHE" | awk '{printf "  cache: %.2f GB for 20 cases\n", $1 / 1e9}' | tee -a "$LOG"
stage train $PY train.py "${COMMON[@]}" trainer.epochs=1 trainer.steps_per_epoch=4 tracking=none run_dir="$OUT/run"
$PY - "$OUT/run" <<'PY' | tee -a "$LOG"
import json, sys
run = sys.argv[1]
plan = json.load(open(f"{run}/plan.json"))
h = json.load(open(f"{run}/state.json"))["history"][-1]
print(f"  plan: {plan['strategy']} {[(b['block'], b['policy']) for b in plan['plan'] if b['policy'] != 'keep']}, "
      f"predicted {plan['predicted_peak_bytes'] / 1e9:.2f} GB at {plan['peak_at']}, limit {plan['limit_bytes'] / 1e9:.2f} GB")
print(f"  train+validation: measured {h['measured_bytes'] / 1e9:.2f} GB above the runtime (peak RSS {h['peak_bytes'] / 1e9:.2f} GB), "
      f"{h['measured_bytes'] / plan['predicted_peak_bytes'] - 1:+.1%} against the plan; "
      f"{h['step_s']:.1f} s per step (median of 4; planned {plan.get('predicted_step_s') or float('nan'):.1f} s), "
      f"validation {h['val_s']:.0f} s for its cases")
PY
stage evaluate $PY scripts/evaluate.py run_dir="$OUT/run" split=test backend=cpu_onednn
grep -E "inference of a case|evaluation peak" "$LOG" | tail -2 | sed 's/^/  /'
CASE=$($PY -c "import json; print(json.load(open('$OUT/run/split.json'))['test'][0])")
stage predict $PY scripts/predict.py run_dir="$OUT/run" input=data/mni_gliomas/$CASE output="$OUT/predicted" backend=cpu_onednn
echo "done $(date -Is)" | tee -a "$LOG"
