#!/usr/bin/env python
"""The TensorFlow allocator's peak of a sliding-window validation's scoring: the blended prediction
made a tensor (``tf.constant``) and scored by the run's loss and metrics over the whole volume
(``brats_seg.training.steps.make_sliding_eval_step``'s ``score``), in float32 arrays of the
volume's (x, y, z, R): what ``SLIDING_SCORE_REGION_ARRAYS`` counts. Eight calls in one process
(the executor's order varies between calls), at the run's grid.

    python docs/measurements/stage_memory_zen5/score_arrays.py /tmp/w/stage_memory/patch32      # full resolution
    python docs/measurements/stage_memory_zen5/score_arrays.py outputs/patch_schedule_half/arm-patch48_seed-0
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def main(run: str) -> None:
    sys.path.insert(0, str(REPO))
    from brats_seg.backend import configure, decide_backend
    from brats_seg.config import BackendConfig

    configure(decide_backend(BackendConfig(name="cpu_onednn")))
    import numpy as np
    import tensorflow as tf

    from brats_seg.run_dir import RunFolder
    from brats_seg.training.build import training_metrics
    from brats_seg.training.losses import SoftDiceBCELoss
    from brats_seg.training.steps import COUNT, _metric_sums

    cfg = RunFolder(Path(run)).read_config()
    shape, regions = tuple(cfg.resolution.shape), cfg.model.out_channels
    metrics = training_metrics(cfg)
    loss = SoftDiceBCELoss(bce_weight=cfg.trainer.bce_weight, batch_dice=cfg.trainer.batch_dice)

    @tf.function
    def score(y, pred):  # as make_sliding_eval_step's
        out = {COUNT: tf.cast(tf.shape(pred)[0], tf.float32)}
        out["loss"] = tf.reduce_sum(loss.call(y, pred))
        out.update(_metric_sums(metrics, y, pred))
        return out

    rng = np.random.default_rng(0)
    y = tf.constant((rng.random((1, *shape, regions)) > 0.9).astype(np.uint8))
    pred = rng.random((*shape, regions), dtype=np.float32)
    array = int(np.prod(shape)) * regions * 4
    for call in range(1, 9):
        tf.config.experimental.reset_memory_stats("CPU:0")
        current = tf.config.experimental.get_memory_info("CPU:0")["current"]
        {k: float(v) for k, v in score(y, tf.constant([pred])).items()}
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - current
        print(
            json.dumps(
                {
                    "grid": list(shape),
                    "call": call,
                    "allocator_peak_gb": round(peak / 1e9, 3),
                    "region_arrays": round(peak / array, 2),
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1])
