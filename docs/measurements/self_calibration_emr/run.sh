#!/bin/bash
# Issue 47: the step-time self-calibration on a CPU kind no shipped preset covers, natively (an Intel
# Xeon family 6 model 207, Emerald Rapids: AVX-512 with AVX512-BF16 and AMX; the presets hold the
# Zen 5 only), with the bytes term's padding chosen by leave-one-out (committed before anything here
# was measured), judged on the held-out points the Zen 5 record was judged on, measured here: the
# full-resolution width sweep (4-24 filters, fp32 and bf16; its 4 and 8 filters are also quick-sweep
# points and are left out of the full-resolution judgment), the 10-filter check points (half and full,
# with and without recomputation) and 288x336x240 at 8 filters. One process at a time on an otherwise
# idle machine; each sweep resumes where it stopped (its .jsonl).
#   bash docs/measurements/self_calibration_emr/run.sh
# then, offline, the same quick points fitted with the bytes as stored (the form before):
#   python docs/measurements/self_calibration_emr/refit.py docs/measurements/self_calibration_emr/calibration.json bytes_block=1
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/self_calibration_emr
for sweep in width step_time_check beyond_full; do
  $PY scripts/benchmark.py benchmark.sweep=$sweep benchmark.out=$REC/$sweep.jsonl > $REC/$sweep.log 2>&1
done
# a cache folder of its own: the quick sweep measured again and fitted alone, its time taken
rm -rf /tmp/calib_emr
BRATS_SEG_CACHE_DIR=/tmp/calib_emr $PY scripts/calibrate_step_time.py quick=true \
  "held_out=[$REC/width.jsonl,$REC/step_time_check.jsonl,$REC/beyond_full.jsonl]" \
  out=$REC/calibration.json figure=$REC/step_time.png 2>&1 | tee $REC/calibrate.txt
