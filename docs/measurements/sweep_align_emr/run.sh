#!/bin/bash
# Issue 47: the step-time self-calibration as shipped in 20189d3 (quick sweep with full-resolution 12
# and 16 filters; convolutions off the channel block at a rate of their own), judged on held-out points
# measured around it, this script committed before any of them: full resolution 6, 10, 20 and 24
# filters (lms=off; 20 in no earlier record), 160x192x128 at 12 (lms=off), 288x336x240 at 8
# (lms=recompute), fp32 and bf16 (where native). Draw 1 of the held-out points before the
# calibration, draw 2 after it; one process at a time; resumes (a finished file is kept).
#   bash docs/measurements/sweep_align_emr/run.sh && python docs/measurements/calibration_3draws_emr/judge.py docs/measurements/sweep_align_emr
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/sweep_align_emr
BASE="backend=cpu_onednn model.depth=4 trainer.batch_size=1 tracking=none"
PRECISIONS=$($PY -c "from brats_seg.cpu import has_native_bf16; print('fp32 bf16' if has_native_bf16() else 'fp32')")
mkdir -p $REC/held
measure() {  # out-file, overrides...
  local out=$1; shift
  [ -s "$out" ] && return 0
  echo "$(date +%T) $out"
  # shellcheck disable=SC2086
  $PY scripts/benchmark.py $BASE "$@" 2>>$REC/run.log | tail -1 > "$out.tmp"
  mv "$out.tmp" "$out"
}
held() {  # draw
  for p in $PRECISIONS; do
    for f in 6 10 20 24; do
      measure $REC/held/full_${f}_${p}_rep$1.json resolution=full model.base_filters=$f backend.precision=$p lms=off benchmark.steps=3
    done
    measure $REC/held/shape160_12_${p}_rep$1.json "resolution.shape=[160,192,128]" model.base_filters=12 backend.precision=$p lms=off benchmark.steps=3
    measure $REC/held/shape288_8_${p}_rep$1.json "resolution.shape=[288,336,240]" model.base_filters=8 backend.precision=$p lms=recompute benchmark.steps=2
  done
}
held 1
if [ ! -s $REC/calibration.json ]; then
  echo "$(date +%T) quick calibration, as shipped"
  rm -rf /tmp/calib_align
  BRATS_SEG_CACHE_DIR=/tmp/calib_align $PY scripts/calibrate_step_time.py quick=true out=$REC/calibration.json > $REC/calibrate.txt 2>&1
fi
held 2
echo "$(date +%T) done"
