#!/bin/bash
# Issue 47, next step (a candidate, not shipped): the quick sweep with one unaligned width at full
# resolution added, 12 filters (levels 12, 24, 48, 96, 192 channels), measured once a point as
# shipped, fitted as shipped, and judged on held-out points measured after this script was committed:
# full resolution 6, 10, 16 and 24 filters (lms=off), 160x192x128 at 12 (lms=off), 288x336x240 at 8
# (lms=recompute), fp32 and bf16 (where native). Draw 1 of the held-out points after the
# calibration, draw 2 (next session, resumes) after it; judge.py judges on the medians of what exists.
#   bash docs/measurements/sweep12_emr/run.sh && python docs/measurements/calibration_3draws_emr/judge.py docs/measurements/sweep12_emr
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/sweep12_emr
BASE="backend=cpu_onednn model.depth=4 trainer.batch_size=1 tracking=none"
PRECISIONS=$($PY -c "from brats_seg.cpu import has_native_bf16; print('fp32 bf16' if has_native_bf16() else 'fp32')")
mkdir -p $REC/held
if [ ! -s $REC/calibration.json ]; then
  echo "$(date +%T) quick calibration + full 12 filters"
  BRATS_SEG_CACHE_DIR=/tmp/calib_sweep12 $PY -c "
import logging; logging.basicConfig(level=logging.INFO)
from pathlib import Path
from brats_seg.benchmark.self_calibration import QUICK_POINTS, calibrate_here
calibrate_here(progress=False, points=QUICK_POINTS + (('full', 12),), out=Path('$REC/calibration.json.tmp'))
" > $REC/calibrate.txt 2>&1
  mv $REC/calibration.json.tmp $REC/calibration.json
fi
measure() {  # out-file, overrides...
  local out=$1; shift
  [ -s "$out" ] && return 0
  echo "$(date +%T) $out"
  # shellcheck disable=SC2086
  $PY scripts/benchmark.py $BASE "$@" 2>>$REC/run.log | tail -1 > "$out.tmp"
  mv "$out.tmp" "$out"
}
for rep in 1 2; do
  for p in $PRECISIONS; do
    for f in 6 10 16 24; do
      measure $REC/held/full_${f}_${p}_rep$rep.json resolution=full model.base_filters=$f backend.precision=$p lms=off benchmark.steps=3
    done
    measure $REC/held/shape160_12_${p}_rep$rep.json "resolution.shape=[160,192,128]" model.base_filters=12 backend.precision=$p lms=off benchmark.steps=3
    measure $REC/held/shape288_8_${p}_rep$rep.json "resolution.shape=[288,336,240]" model.base_filters=8 backend.precision=$p lms=recompute benchmark.steps=2
  done
done
echo "$(date +%T) done"
