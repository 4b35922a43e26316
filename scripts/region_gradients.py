#!/usr/bin/env python
"""Which way the loss pushes each region's output: a per-region look at the head's logits.

    python scripts/region_gradients.py run_dir=outputs/<run> split=train checkpoint=init
    python scripts/region_gradients.py run_dir=outputs/<run> split=train checkpoint=last

For the run's model (``checkpoint=init``: freshly initialised with the run's seed, as training
starts; ``best``/``last``: a checkpoint) and the cached cases of a split (``train``, ``val``,
``test``), prints per region: its share of the voxels, the mean predicted probability inside
and outside the reference, and the gradient of each loss term (soft Dice, BCE) with respect to
the region's logits, summed over the reference voxels and over the rest (``-dL/dz``: positive
raises the region's probability there). A region whose outside push outweighs its inside pull
is driven to "empty" by the bulk of the volume before it can learn what it looks like.
"""

from __future__ import annotations

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.run_dir import RunFolder
from brats_seg.script_configs import register_configs

register_configs()


def region_gradients(run_dir: str, split: str, checkpoint: str) -> list[dict]:
    import keras
    import numpy as np
    import tensorflow as tf

    from brats_seg.data.dataset import prepare_dataset
    from brats_seg.data.pipeline import make_eval_dataset
    from brats_seg.evaluation.inference.run import load_run_config, load_run_model, run_regions
    from brats_seg.model.unet3d import build_unet3d
    from brats_seg.training.losses import compute_bce, compute_soft_dice

    cfg = load_run_config(run_dir)
    if checkpoint == "init":
        keras.utils.set_random_seed(cfg.trainer.seed)
        model = build_unet3d(cfg.model, tuple(cfg.resolution.shape))
    else:
        model = load_run_model(run_dir, checkpoint, cfg)
    folder = RunFolder.of(run_dir)
    names = folder.read_split().get(split)
    if not names:
        raise ValueError(f"{folder.split_path} has no cases in split={split!r}: use train, val or test.")
    entries = {e.case_id: e.path for e in prepare_dataset(cfg.data, cfg.resolution).entries}
    dirs = [entries[n] for n in names if n in entries]
    features = keras.Model(model.input, model.get_layer("head_conv").output)  # logits (B, x, y, z, R)
    head = model.get_layer("head_sigmoid")
    regions = run_regions(cfg)
    sums = {
        k: np.zeros(len(regions))
        for k in ("voxels", "ref", "p_in", "p_out", "dice_in", "dice_out", "bce_in", "bce_out")
    }
    for image, ref in make_eval_dataset(dirs, 1, cfg.model.in_channels, cfg.model.out_channels):
        z = features(image, training=False)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(z)
            p = head(z)
            dice_term = 1.0 - tf.reduce_mean(compute_soft_dice(ref, p))
            bce_term = cfg.trainer.bce_weight * tf.reduce_mean(compute_bce(ref, p))
        g_dice, g_bce = (-tape.gradient(t, z).numpy()[0] for t in (dice_term, bce_term))
        r, p = ref.numpy()[0] > 0.5, p.numpy()[0]
        for c in range(len(regions)):
            inside = r[..., c]
            sums["voxels"][c] += inside.size
            sums["ref"][c] += inside.sum()
            sums["p_in"][c] += p[..., c][inside].sum()
            sums["p_out"][c] += p[..., c][~inside].sum()
            for name, g in (("dice", g_dice), ("bce", g_bce)):
                sums[f"{name}_in"][c] += g[..., c][inside].sum()
                sums[f"{name}_out"][c] += g[..., c][~inside].sum()
    n = len(dirs)
    return [
        {
            "region": name,
            "cases": n,
            "share": sums["ref"][c] / sums["voxels"][c],
            "p_inside": sums["p_in"][c] / max(sums["ref"][c], 1),
            "p_outside": sums["p_out"][c] / (sums["voxels"][c] - sums["ref"][c]),
            **{k: sums[k][c] / n for k in ("dice_in", "dice_out", "bce_in", "bce_out")},
        }
        for c, name in enumerate(regions)
    ]


@hydra_entry("../configs", "region_gradients")
def main(cfg) -> None:
    conf = to_config(cfg)
    from brats_seg.backend import configure, decide_backend
    from brats_seg.checks import check_backend_config

    with user_errors():
        if not conf.run_dir.strip():
            raise ValueError("run_dir is not set: pass run_dir=<the training run's folder> (e.g. outputs/<run>).")
        check_backend_config(conf.backend)
        configure(decide_backend(conf.backend))  # the command's backend and precision (a measurement's)
        rows = region_gradients(conf.run_dir, conf.split, conf.checkpoint)
    print(
        f"\n{conf.run_dir}, checkpoint {conf.checkpoint}, {rows[0]['cases']} {conf.split} case(s); "
        "-dL/dlogit summed per case (positive: raises the region's probability)\n"
    )
    print(
        f"{'region':<7}{'share':>8}{'p inside':>10}{'p outside':>11}{'Dice in':>11}{'Dice out':>11}"
        f"{'BCE in':>11}{'BCE out':>11}"
    )
    for r in rows:
        print(
            f"{r['region'].upper():<7}{r['share']:>8.2%}{r['p_inside']:>10.4f}{r['p_outside']:>11.5f}"
            f"{r['dice_in']:>+11.2e}{r['dice_out']:>+11.2e}{r['bce_in']:>+11.2e}{r['bce_out']:>+11.2e}"
        )


if __name__ == "__main__":
    main()
