"""Building a run's model: the optimizer, the models under the run's memory plan and their compilation.

The plan is the resolved run's (:func:`brats_seg.resolve.resolve_run` decided the LMS strategy
and planned it, or read back the plan a resumed run started with); :func:`build_models`
makes the training model (blocks run through the plan's wrapper) and the plain export model
on the same layers; :func:`compile_models` does it under the distribution strategy with the
optimizer and loss. TensorFlow and Keras are imported inside the functions, after
:func:`brats_seg.backend.configure`.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from brats_seg.backend import ResolvedBackend
from brats_seg.choices import check_choice
from brats_seg.config import LRScaling, LRSchedule, TrainConfig, network_input_shape

__all__ = [
    "CompiledModels",
    "build_models",
    "build_train_model",
    "compile_models",
    "make_optimizer",
    "training_metrics",
]

log = logging.getLogger(__name__)


def make_optimizer(cfg: TrainConfig, steps_per_epoch: int, replicas: int = 1, total_steps: int | None = None):
    """Adam with a per-step LR schedule (cosine with linear warm-up, or constant; with
    ``trainer.time_budget_s`` the cosine runs over the budget's time, not the epochs).

    ``trainer.learning_rate`` is the rate for the global batch ``trainer.batch_size``
    (whatever the number of replicas sharing it); ``distribute.lr_scaling=linear``
    multiplies it by ``replicas`` instead (a recipe tuned on one device at
    ``batch_size / replicas``). ``total_steps``: the run's steps when its epochs differ in
    length (a patch schedule's stages); None = ``trainer.epochs * steps_per_epoch``. The warm-up
    is ``trainer.warmup_epochs`` epochs of ``steps_per_epoch`` (the first stage's) steps.
    """
    import keras

    t = cfg.trainer
    scaling = check_choice(getattr(cfg.distribute, "lr_scaling", "none"), LRScaling, "distribute.lr_scaling")
    base_lr = t.learning_rate * (replicas if scaling == "linear" else 1)
    warmup = min(t.warmup_epochs, max(t.epochs - 1, 0)) * steps_per_epoch
    if check_choice(t.lr_schedule, LRSchedule, "trainer.lr_schedule") == "constant":
        lr = base_lr
    elif t.time_budget_s:  # the cosine over the budget's time (brats_seg.training.budget)
        from brats_seg.training.budget import BudgetCosineDecay

        lr = BudgetCosineDecay(base_lr, warmup)
    else:
        total = max((total_steps or t.epochs * steps_per_epoch) - warmup, 1)
        lr = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=base_lr if warmup == 0 else 0.0,
            decay_steps=total,
            alpha=0.01,
            warmup_target=base_lr if warmup else None,
            warmup_steps=warmup,
        )
    return keras.optimizers.Adam(learning_rate=lr)


def build_train_model(cfg: TrainConfig, plan, backend: ResolvedBackend, blocks):
    """The training model at ``cfg``'s network input (the patch in patch mode) on the layers
    ``blocks`` (:func:`~brats_seg.model.unet3d.make_unet_blocks`), its blocks run through the
    plan's keep/recompute/offload wrapper: ``(model, offload_stats)``, the plain U-Net (stats
    None) where the plan keeps every block."""
    from brats_seg.lms.runtime.offload import BlockWrapper
    from brats_seg.lms.runtime.stats import OffloadStats
    from brats_seg.model.unet3d import build_unet3d

    shape, policies = network_input_shape(cfg), plan.policies
    if all(p == "keep" for p in policies.values()):
        return build_unet3d(cfg.model, shape, blocks=blocks), None
    batch = max(cfg.trainer.batch_size, 1)
    stats = OffloadStats({row.block: row.recomputed_flops / batch for row in plan.blocks})
    wrapper = BlockWrapper(
        policies,
        host_device="/CPU:0",
        prefetch=cfg.lms.prefetch,
        offload_skips=plan.offload_skips,
        stats=stats,
        keep_tails=plan.keep_tails,
        compute_device="/GPU:0" if backend.device == "GPU" else "/CPU:0",
    )
    model = build_unet3d(cfg.model, shape, block_wrapper=wrapper, blocks=blocks)
    log.info(
        "LMS: %s (input %s)",
        ", ".join(
            f"{b}={p}" + (" (last conv unit kept)" if b in plan.keep_tails else "")
            for b, p in policies.items()
            if p != "keep"
        ),
        "x".join(str(s) for s in shape),
    )
    return model, stats


def build_models(cfg: TrainConfig, plan, backend: ResolvedBackend, blocks=None, export_shape=None):
    """``(train_model, export_model, offload_stats)`` sharing one set of layers and weights.

    Without LMS both are the plain U-Net (one model, unless ``export_shape`` differs from the
    network input). With LMS the training model runs blocks through the plan's keep/recompute/
    offload wrapper, and the export model (plain, saveable as ``.keras``, what evaluation loads)
    is built on the same blocks, at ``export_shape`` (None: the network input; a patch
    schedule's runs export at their last stage's).
    """
    from brats_seg.model.unet3d import build_unet3d, make_unet_blocks

    shape = network_input_shape(cfg)  # the patch in patch mode
    export_shape = tuple(int(s) for s in export_shape) if export_shape else shape
    blocks = make_unet_blocks(cfg.model) if blocks is None else blocks
    export_model = build_unet3d(cfg.model, export_shape, blocks=blocks)
    if all(p == "keep" for p in plan.policies.values()) and export_shape == shape:
        return export_model, export_model, None
    model, stats = build_train_model(cfg, plan, backend, blocks)
    return model, export_model, stats


class CompiledModels(NamedTuple):
    """What a training step needs: the models on one set of layers, their loss, and the layers
    (``blocks``) further models are built on (a patch schedule's later stages)."""

    model: object
    export_model: object
    offload_stats: object
    loss: object
    blocks: object


def compile_models(
    cfg: TrainConfig,
    plan,
    backend: ResolvedBackend,
    strategy,
    steps_per_epoch: int,
    *,
    export_shape=None,
    total_steps: int | None = None,
) -> CompiledModels:
    """:func:`build_models` under ``strategy``, compiled with the run's loss and optimizer
    (:func:`make_optimizer` with ``total_steps``) and the optimizer built."""
    from brats_seg.model.unet3d import make_unet_blocks
    from brats_seg.training.losses import SoftDiceBCELoss

    with strategy.scope():
        blocks = make_unet_blocks(cfg.model)
        model, export_model, offload_stats = build_models(cfg, plan, backend, blocks, export_shape)
        loss = SoftDiceBCELoss(bce_weight=cfg.trainer.bce_weight, batch_dice=cfg.trainer.batch_dice)
        optimizer = make_optimizer(cfg, steps_per_epoch, strategy.num_replicas_in_sync, total_steps)
        model.compile(optimizer=optimizer, loss=loss, jit_compile=False)  # XLA would drop the LMS host placements
        if export_model is not model:  # the plain twin saves the shared weights and optimizer as .keras
            export_model.compile(optimizer=model.optimizer, loss=loss, jit_compile=False)
        model.optimizer.build(model.trainable_variables)
    return CompiledModels(model, export_model, offload_stats, loss, blocks)


def training_metrics(cfg: TrainConfig) -> list:
    """The per-sample metrics a training step sums: Dice and monitors of the output regions."""
    from brats_seg.data.labels import output_regions
    from brats_seg.training.metrics import make_dice_metrics, make_region_monitors

    regions = output_regions(cfg.data.layout, cfg.model.out_channels)
    return [*make_dice_metrics(regions), *make_region_monitors(regions, cfg.resolution.spacing_mm**3 / 1000.0)]
