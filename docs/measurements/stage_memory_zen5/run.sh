#!/usr/bin/env bash
# Where a patch run's epoch peaks: the training steps' peak and the validation pass's own, each above
# the runtime (history.csv's train_measured_bytes, val_measured_bytes; file_bytes), against the plan.
# experiment=patches_vs_whole_full's recipe (full resolution, bf16, batch 2, data=mni_gliomas) at a
# constant patch, 250 steps an epoch, 3 epochs, one fresh run each on an otherwise idle machine:
#   bash docs/measurements/stage_memory_zen5/run.sh /tmp/w/stage_memory
# then: python docs/measurements/stage_memory_zen5/table.py /tmp/w/stage_memory/*
set -u
WORK=${1:?work folder}
PY=${PY:-.venv/bin/python}
PATCHES=${PATCHES:-32 64 96}
mkdir -p "$WORK"
for p in $PATCHES; do
  run="$WORK/patch$p"
  rm -rf "$run"
  $PY train.py experiment=patches_vs_whole_full +arm=patch96 "trainer.patch_size=[$p,$p,$p]" \
    trainer.time_budget_s=0 trainer.epochs=3 trainer.steps_per_epoch=250 tracking.name=none \
    run_dir="$run" > "$WORK/patch$p.log" 2>&1
  echo "patch$p rc=$?"
done
