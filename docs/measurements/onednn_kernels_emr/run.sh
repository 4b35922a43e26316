#!/bin/bash
# Issue 47, what the step-time model's misses are made of: which oneDNN kernels one training step runs
# for each convolution, and how long each takes, at widths on and off the channel block (half
# resolution, depth 4, batch 1, lms=off; one process at a time). ONEDNN_VERBOSE=1 prints every
# primitive's execution; summarize.py groups them.
#   bash docs/measurements/onednn_kernels_emr/run.sh && python docs/measurements/onednn_kernels_emr/summarize.py > docs/measurements/onednn_kernels_emr/summary.txt
set -eu
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
REC=docs/measurements/onednn_kernels_emr
mkdir -p $REC/logs
for p in bf16 fp32; do
  for f in 6 8 12 16 20 24; do
    out=$REC/logs/half_${f}_${p}.csv
    [ -s "$out.gz" ] && continue
    echo "$(date +%T) $out"
    ONEDNN_VERBOSE=1 $PY scripts/benchmark.py backend=cpu_onednn model.depth=4 trainer.batch_size=1 tracking=none \
      resolution=half model.base_filters=$f backend.precision=$p lms=off benchmark.steps=2 2>/dev/null \
      | grep -E "^onednn_verbose,.*exec" > "$out.tmp" || true
    gzip -c "$out.tmp" > "$out.gz.tmp" && mv "$out.gz.tmp" "$out.gz" && rm "$out.tmp"
  done
done
echo "$(date +%T) done"
