#!/usr/bin/env python
"""The analysis of a study: the finished run folders of a sweep, grouped into arms, compared.

    python train.py -m experiment=patches_vs_whole                          # the study's runs (a sweep)
    python scripts/study.py dir=outputs/patches_vs_whole                    # test split
    python scripts/study.py dir=outputs/recipe_study 'sets=[test,shifted,heldout,heldout_shifted]'
    python scripts/study.py dir=outputs/resolution_study evaluate=false     # report what lacks an evaluation

Finds every run folder under ``dir`` (a training run's config and state), groups the runs into
arms: runs whose configs agree on every key but the seed (and the keys of ``ignore``) are one arm,
named by the keys that differ (``whole``, ``patch 48x48x48``, ``resolution=full``). A finished run
that lacks the evaluation of a requested set is evaluated first (``scripts/evaluate.py``, one after
another, each logged to ``<dir>/logs/``; ``evaluate=false`` lists them instead). Sets:
``test`` (alias ``matched``), ``val``, ``shifted`` (the test cases as ``data=mni_gliomas_shifted``
holds them), ``heldout`` and ``heldout_shifted`` (``split=all on=mni_gliomas_heldout[_shifted]``),
or any ``<split>@<data config>``.

Writes ``<dir>/study.json`` (per run and per arm, mean and std over seeds: Dice, HD95 and BraTS
2023 lesion-wise Dice per region on each set, training time and throughput, best validation Dice
and the training time to reach each of ``thresholds``), the charts of
:mod:`brats_seg.plots.study` beside it (``val_dice_vs_time.png``, ``throughput.png``,
``<set>_metrics.png``; ``resolution_study.png`` when the arms differ in resolution), prints the
Markdown tables, and logs the charts and study.json into each run's MLflow run (artifacts
``study/``; a store that fails is reported once and skipped). Re-running it is cheap: what is
evaluated is read back. Exit status 1 if an evaluation failed (everything else is still
written). The work is :func:`brats_seg.evaluation.studies.study_run.run_study`'s; this prints its report.
"""

from __future__ import annotations

import sys

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "study")
def main(cfg) -> None:
    from brats_seg.evaluation.studies.study_run import format_report, run_study

    conf = to_config(cfg)
    with user_errors("the study"):
        outcome = run_study(conf)
    print(format_report(outcome))
    if outcome.failed:
        print(outcome.failure(), file=sys.stderr)
        raise SystemExit(outcome.status)


if __name__ == "__main__":
    main()
