#!/bin/bash
# Issue 46 at half resolution with 9 validation cases: experiment=patches_vs_whole_30, one job at a
# time on an otherwise idle machine, each run evaluated (with TEST=1 also on the test split, 6 cases) on
# data=mni_gliomas_heldout2 (30 cases no earlier recipe was scored on) as soon as it finishes, without
# test-time mirroring (evaluate.mirror=false, every arm alike: it halves the evaluation, which at this
# CPU's speed decides whether the study fits in one session; the runs' folders do not outlive it).
#   bash docs/measurements/patch_schedule_emr/run_30.sh budget        # whole volume, 15 epochs, no budget: the time
#   ARMS="grow patch48 whole" [TEST=1] bash docs/measurements/patch_schedule_emr/run_30.sh arms
# A run already finished is passed over; an interrupted one resumes (the same command again).
# Then: python scripts/study.py dir=outputs/patches_vs_whole_30 'sets=[test,heldout2]'
set -u
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OUT=outputs/patches_vs_whole_30
mkdir -p $OUT
log() { echo "$(date -u +%FT%TZ) $*" | tee -a $OUT/run_30.log; }
evaluate() {  # run name; the test split too with TEST=1
  local run=$OUT/$1
  if [ -n "${TEST:-}" ] && [ ! -f $run/eval/test/summary.json ]; then
    $PY scripts/evaluate.py run_dir=$run evaluate.overlays=false evaluate.mirror=false > $OUT/$1.eval_test.log 2>&1
  fi
  [ -f "$run/eval/all@mni_gliomas_heldout2/summary.json" ] || $PY scripts/evaluate.py run_dir=$run split=all \
    on=mni_gliomas_heldout2 evaluate.overlays=false evaluate.mirror=false > $OUT/$1.eval_heldout2.log 2>&1
  log "evaluated $1 rc=$?"
}
case ${1:?budget or arms} in
  budget)
    name=budget_whole_seed-0
    log "train $name (15 epochs, no budget)"
    $PY train.py experiment=patches_vs_whole_30 +arm=whole trainer.seed=0 trainer.time_budget_s=0 trainer.epochs=15 \
      run_dir=$OUT/$name >> $OUT/$name.train.log 2>&1
    log "train $name rc=$?"
    $PY - $OUT/$name/history.csv <<'PYEOF' | tee -a $OUT/run_30.log
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"whole volume, {len(rows)} epochs, {sum(int(float(r['steps'])) for r in rows)} steps: "
      f"{float(rows[-1]['train_time_s']):.1f} s of training (validation excluded)")
PYEOF
    ;;
  arms)
    for arm in ${ARMS:-grow patch48 whole}; do
      for seed in ${SEEDS:-0 1 2}; do
        name=arm-${arm}_seed-$seed
        log "train $name"
        $PY train.py experiment=patches_vs_whole_30 +arm=$arm trainer.seed=$seed run_dir=$OUT/$name >> $OUT/$name.train.log 2>&1
        log "train $name rc=$?"
        evaluate $name
      done
    done
    ;;
esac
