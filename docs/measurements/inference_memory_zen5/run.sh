#!/usr/bin/env bash
# Evaluation and prediction peaks against the inference planner (brats_seg/lms/planner/inference.py),
# one fresh process per point on an otherwise idle machine. From the repository root:
#   bash docs/measurements/inference_memory_zen5/run.sh /tmp/w/inference_memory
# Needs the patch-schedule study's run folders (outputs/patch_schedule_{half,full}; docs/studies.md) and
# data/mni_gliomas{,_heldout}. Each point's log goes to <work>/<point>.log; table.py reads them.
set -u
WORK=${1:?work folder}
OUT=docs/measurements/inference_memory_zen5
PY=${PY:-.venv/bin/python}
mkdir -p "$WORK"

copy_run() {  # the files evaluate.py and predict.py read: no eval/, no MLflow link
  local src=$1 dst=$2
  rm -rf "$dst" && mkdir -p "$dst/checkpoints"
  for f in config.json split.json state.json postprocess.json plan.json; do
    [ -f "$src/$f" ] && cp "$src/$f" "$dst/$f"
  done
  cp "$src/checkpoints/best.keras" "$dst/checkpoints/best.keras"
}

HALF=outputs/patch_schedule_half
FULL=outputs/patch_schedule_full
copy_run $HALF/arm-whole_seed-2 "$WORK/half_whole"
copy_run $HALF/arm-patch48_seed-0 "$WORK/half_patch48"
copy_run $FULL/arm-whole_seed-0 "$WORK/full_whole"
copy_run $FULL/arm-grow_seed-0 "$WORK/full_grow"
copy_run $FULL/arm-patch96_seed-1 "$WORK/full_patch96"

# raw inputs: two held-out cases as they are (240x240x155 at 1 mm), and one resampled to 0.8 mm
rm -rf "$WORK/in_2" && mkdir -p "$WORK/in_2"
ln -s "$PWD/data/mni_gliomas_heldout/MNIG_00000" "$PWD/data/mni_gliomas_heldout/MNIG_00001" "$WORK/in_2/"
[ -d "$WORK/in_08/MNIG_00002r" ] || $PY $OUT/make_case.py data/mni_gliomas_heldout/MNIG_00002 0.8 "$WORK/in_08"

ev() {  # point run_dir [overrides]
  local point=$1 run=$2; shift 2
  $PY scripts/evaluate.py run_dir="$run" split=test evaluate.overlays=false "$@" > "$WORK/$point.log" 2>&1
  echo "$point rc=$?"
}
pr() {  # point run_dir input [overrides]
  local point=$1 run=$2 input=$3; shift 3
  rm -rf "$WORK/$point.out"
  $PY scripts/predict.py run_dir="$run" input="$input" output="$WORK/$point.out" evaluate.overlays=false "$@" > "$WORK/$point.log" 2>&1
  echo "$point rc=$?"
}

ev eval_half_whole "$WORK/half_whole"
ev eval_half_patch48 "$WORK/half_patch48"
ev eval_full_whole_bf16 "$WORK/full_whole"
ev eval_full_grow_bf16 "$WORK/full_grow"
ev eval_full_grow_fp32 "$WORK/full_grow" backend.precision=fp32
ev eval_full_patch96_bf16 "$WORK/full_patch96"
pr predict_full_fp32 "$WORK/full_grow" "$WORK/in_2" backend.precision=fp32
pr predict_full_bf16 "$WORK/full_grow" "$WORK/in_2"
pr predict_half "$WORK/half_whole" "$WORK/in_2"
pr predict_full_fp32_08mm "$WORK/full_grow" "$WORK/in_08" backend.precision=fp32
pr predict_half_08mm "$WORK/half_whole" "$WORK/in_08"
# the served model (mlflow models serve), one raw case: its own JSON line
rm -rf "$WORK/serve"
$PY docs/measurements/serving_zen5/serve_full.py $FULL/arm-grow_seed-0 data/mni_gliomas_heldout/MNIG_00000 "$WORK/serve" > "$WORK/serve_full.log" 2>&1
echo "serve_full rc=$?"
