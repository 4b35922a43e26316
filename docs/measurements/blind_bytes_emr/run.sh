#!/bin/bash
# Issue 47: a blind judge of two step-time forms, committed before anything here is measured: the
# shipped one (off-block rate on convolution FLOPs, 20189d3) and the offline candidate
# (../forms_offline/bytes_form.py: off-block rate on activation bytes), both fitted to the quick
# calibration of ../sweep_align_emr/ (measured 13:30 UTC the same day, copied here as a user's cache
# would keep it), judged on widths and a shape in no earlier record: full resolution 14 and 18 filters
# (fp32, bf16), 32 filters (bf16), 160x192x128 at 20 (fp32, bf16); lms=off; two draws, one process at
# a time; resumes.
#   bash docs/measurements/blind_bytes_emr/run.sh
#   python docs/measurements/calibration_3draws_emr/judge.py docs/measurements/blind_bytes_emr > docs/measurements/blind_bytes_emr/judge.txt
#   python docs/measurements/blind_bytes_emr/judge_bytes.py > docs/measurements/blind_bytes_emr/judge_bytes.txt
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/blind_bytes_emr
BASE="backend=cpu_onednn model.depth=4 trainer.batch_size=1 tracking=none lms=off benchmark.steps=3"
mkdir -p $REC/held
measure() {  # out-file, overrides...
  local out=$1; shift
  [ -s "$out" ] && return 0
  echo "$(date +%T) $out"
  # shellcheck disable=SC2086
  $PY scripts/benchmark.py $BASE "$@" 2>>$REC/run.log | tail -1 > "$out.tmp"
  mv "$out.tmp" "$out"
}
for rep in 1 2; do
  for p in fp32 bf16; do
    for f in 14 18; do
      measure $REC/held/full_${f}_${p}_rep$rep.json resolution=full model.base_filters=$f backend.precision=$p
    done
    measure $REC/held/shape160_20_${p}_rep$rep.json "resolution.shape=[160,192,128]" model.base_filters=20 backend.precision=$p
  done
  measure $REC/held/full_32_bf16_rep$rep.json resolution=full model.base_filters=32 backend.precision=bf16
done
echo "$(date +%T) done"
