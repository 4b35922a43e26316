#!/usr/bin/env python
"""`make demo`'s recipe over seeds: is the first result a user sees luck, or the recipe?

    python scripts/demo_seeds.py                                      # seeds 0,1,2 into outputs/demo_seeds
    python scripts/demo_seeds.py 'seeds=[3]' out=outputs/demo_seeds   # one more arm (arms resume)
    python scripts/demo_seeds.py trainer.epochs=120 out=outputs/demo_e120   # a variant: train.py's keys go to train.py

For each seed (an arm, its own run folder ``<out>/seed<seed>``): ``train.py experiment=demo
trainer.seed=<seed>`` (with the train.py overrides given), then ``scripts/evaluate.py`` on the
held-out test split (post-processing chosen on the val split, as ``make demo`` does). An arm
trained to the end and evaluated is not run again; an interrupted one resumes from its run
folder. Prints per seed and as mean ± std over seeds: legacy Dice and BraTS 2023 lesion-wise
Dice per region (and before post-processing), the test cases whose ET is wrong on either side
(reference without ET and ET predicted, or the reverse), and the training time; writes
``<out>/demo_seeds.json``. Its own keys are ``seeds`` (a list, or one seed) and ``out``; every
other key is train.py's, checked here against train.py's config before the first arm starts.
The work is :mod:`brats_seg.evaluation.studies.demo_seeds`'s.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "demo_seeds")
def main(cfg) -> None:
    from brats_seg.evaluation.studies.demo_seeds import format_demo_seeds, run_demo_seeds

    conf = to_config(cfg)
    with user_errors("the seeds"):
        result = run_demo_seeds(conf, list(HydraConfig.get().overrides.task))
    print("\n" + format_demo_seeds(result))
    print(f"wrote {Path(conf.out).expanduser() / 'demo_seeds.json'}")


if __name__ == "__main__":
    main()
