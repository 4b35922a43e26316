#!/bin/bash
# Issue 47: the step-time self-calibration as shipped in 92d8635 (off-block rate on activation bytes),
# judged on held-out widths and shapes in no earlier record, this script committed before any of them
# was measured: full resolution 22 filters (fp32, bf16) and 28 (bf16), 176x208x144 at 10 (fp32, bf16)
# and 24 (bf16), lms=off; 256x304x208 at 6 recomputing (fp32, bf16). bf16 only where native. Draw 1 of
# the held-out points before a fresh quick calibration, draw 2 after it; one process at a time;
# resumes (a finished file is kept).
#   bash docs/measurements/bytes_shipped_emr/run.sh
#   python docs/measurements/calibration_3draws_emr/judge.py docs/measurements/bytes_shipped_emr > docs/measurements/bytes_shipped_emr/judge.txt
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/bytes_shipped_emr
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
    measure $REC/held/full_22_${p}_rep$1.json resolution=full model.base_filters=22 backend.precision=$p lms=off benchmark.steps=3
    measure $REC/held/shape176_10_${p}_rep$1.json "resolution.shape=[176,208,144]" model.base_filters=10 backend.precision=$p lms=off benchmark.steps=3
    measure $REC/held/shape256_6_${p}_rep$1.json "resolution.shape=[256,304,208]" model.base_filters=6 backend.precision=$p lms=recompute benchmark.steps=2
    if [ "$p" = bf16 ]; then
      measure $REC/held/full_28_bf16_rep$1.json resolution=full model.base_filters=28 backend.precision=bf16 lms=off benchmark.steps=3
      measure $REC/held/shape176_24_bf16_rep$1.json "resolution.shape=[176,208,144]" model.base_filters=24 backend.precision=bf16 lms=off benchmark.steps=3
    fi
  done
}
held 1
if [ ! -s $REC/calibration.json ]; then
  echo "$(date +%T) quick calibration, as shipped"
  rm -rf /tmp/calib_bytes
  BRATS_SEG_CACHE_DIR=/tmp/calib_bytes $PY scripts/calibrate_step_time.py quick=true out=$REC/calibration.json > $REC/calibrate.txt 2>&1
fi
held 2
echo "$(date +%T) done"
