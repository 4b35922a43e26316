#!/bin/bash
# Issue 47, option (b) tested offline: does a quick calibration fitted on each point's median over
# three processes hold ±25% at full resolution where one draw (today's quick calibration) does not?
# Measured (one process at a time, round robin so drift reaches every point alike):
#   quick/   the quick calibration's 12 points (QUICK_POINTS x fp32, bf16; its exact overrides),
#            three processes each;
#   held/    full-resolution 6, 12, 16 and 24 filters x fp32, bf16 (the held-out widths of
#            the earlier records), two processes each.
# Then fit.py fits each draw alone and the medians, all judged on the held-out medians.
#   bash docs/measurements/calibration_draws_emr/run.sh && python docs/measurements/calibration_draws_emr/fit.py
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/calibration_draws_emr
BASE="backend=cpu_onednn model.depth=4 trainer.batch_size=1 lms=off benchmark.steps=3 tracking=none"
mkdir -p $REC/quick $REC/held
measure() {  # out-file, overrides...
  local out=$1; shift
  [ -s "$out" ] && return 0  # resumes: a measurement done is kept
  echo "$(date +%T) $out"
  # shellcheck disable=SC2086
  $PY scripts/benchmark.py $BASE "$@" 2>>$REC/run.log | tail -1 > "$out.tmp"
  mv "$out.tmp" "$out"
}
for rep in 1 2 3; do
  for p in fp32 bf16; do
    for point in half:4 half:8 half:16 half:32 full:4 full:8; do
      measure $REC/quick/${point/:/_}_${p}_rep$rep.json resolution=${point%:*} model.base_filters=${point#*:} backend.precision=$p
    done
  done
  if [ $rep -le 2 ]; then
    for f in 6 12 16 24; do
      for p in fp32 bf16; do
        measure $REC/held/full_${f}_${p}_rep$rep.json resolution=full model.base_filters=$f backend.precision=$p
      done
    done
  fi
done
