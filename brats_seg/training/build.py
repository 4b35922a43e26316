"""Building a run's model: the optimizer, the memory plan it trains under, the models and their compilation.

:func:`preflight_plan` decides the run's LMS strategy (and, on a GPU ``backend=auto`` chose,
whether it needs ``gpu_lms``) and plans it against ``lms.limit`` before anything is built, or
takes the plan a resumed run was trained under; :func:`build_models`
makes the training model (blocks run through the plan's wrapper) and the plain export model
on the same layers; :func:`compile_models` does it under the distribution strategy with the
optimizer and loss. TensorFlow and Keras are imported inside the functions, after
:func:`brats_seg.backend.configure`.
"""

from __future__ import annotations

import dataclasses
import logging

from brats_seg.backend import ResolvedBackend
from brats_seg.choices import check_choice
from brats_seg.config import LRScaling, LRSchedule, TrainConfig, network_input_shape
from brats_seg.resolve import ResolvedRun

__all__ = ["build_models", "choose_lms", "compile_models", "make_optimizer", "per_replica", "preflight_plan",
           "training_metrics"]

log = logging.getLogger(__name__)

def make_optimizer(cfg: TrainConfig, steps_per_epoch: int, replicas: int = 1):
    """Adam with a per-step LR schedule (cosine with linear warm-up, or constant; with
    ``trainer.time_budget_s`` the cosine runs over the budget's time, not the epochs).

    ``trainer.learning_rate`` is the rate for the global batch ``trainer.batch_size``
    (whatever the number of replicas sharing it); ``distribute.lr_scaling=linear``
    multiplies it by ``replicas`` instead (a recipe tuned on one device at
    ``batch_size / replicas``).
    """
    import keras

    t = cfg.trainer
    scaling = check_choice(getattr(cfg.distribute, "lr_scaling", "none"), LRScaling, "distribute.lr_scaling")
    base_lr = t.learning_rate * (replicas if scaling == "linear" else 1)
    if check_choice(t.lr_schedule, LRSchedule, "trainer.lr_schedule") == "constant":
        lr = base_lr
    elif t.time_budget_s:  # the cosine over the budget's time (brats_seg.training.budget)
        from brats_seg.training.budget import BudgetCosineDecay

        lr = BudgetCosineDecay(base_lr, min(t.warmup_epochs, max(t.epochs - 1, 0)) * steps_per_epoch)
    else:
        warmup = min(t.warmup_epochs, max(t.epochs - 1, 0)) * steps_per_epoch
        total = max(t.epochs * steps_per_epoch - warmup, 1)
        lr = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=base_lr if warmup == 0 else 0.0,
            decay_steps=total,
            alpha=0.01,
            warmup_target=base_lr if warmup else None,
            warmup_steps=warmup,
        )
    return keras.optimizers.Adam(learning_rate=lr)


def choose_lms(cfg: TrainConfig, backend: ResolvedBackend) -> tuple[str, str]:
    """``(strategy, reason)`` from the config alone: ``lms=`` as given, except that
    ``backend=gpu_lms`` with ``lms=off`` plans (``auto``).

    Raises:
        ValueError: ``lms=offload`` on a CPU-only run.
    """
    if backend.device == "CPU" and cfg.lms.name == "offload":
        raise ValueError(
            "lms=offload needs a GPU: a CPU-only run has no separate device memory to offload from. "
            "Use lms=recompute (or lms=auto) to fit a RAM budget on CPU."
        )
    if backend.name == "gpu_lms" and cfg.lms.name == "off":
        return "auto", "backend=gpu_lms with lms=off: planning with lms=auto"
    return cfg.lms.name, f"lms={cfg.lms.name} as configured"


def per_replica(cfg: TrainConfig, replicas: int) -> TrainConfig:
    """``cfg`` with one replica's share of the global batch (what one device's memory must hold).

    Raises:
        ValueError: ``trainer.batch_size`` does not divide among the replicas.
    """
    t = cfg.trainer
    if t.batch_size % replicas:
        raise ValueError(f"trainer.batch_size={t.batch_size} is the global batch and must divide among the "
                         f"{replicas} replicas of distribute={cfg.distribute.name}: use a multiple of {replicas}.")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, batch_size=t.batch_size // replicas))


def preflight_plan(run: ResolvedRun, replicas: int = 1, stored=None) -> ResolvedRun:
    """``run`` with its LMS strategy and memory plan against ``lms.limit``, decided before anything
    is built and logged once with the reason.

    :func:`choose_lms` applies the config; then, on a GPU that ``backend=auto`` chose, a run
    whose plan without LMS does not fit becomes ``gpu_lms`` with ``lms=auto``.

    Args:
        run: the resolved run (its config holds the global batch).
        replicas: how many replicas share the batch; each device's memory holds one share.
        stored: the :class:`~brats_seg.lms.planner.plan.Plan` a resumed run was trained under
            (its ``plan.json``): kept when it was made for this run's memory settings
            (:func:`brats_seg.training.checkpoint.stored_plan` compares them), so a resumed run
            trains under the plan it started with.

    Raises:
        ValueError: the run is predicted not to fit, with the numbers and the fix; or
            ``lms=offload`` on a CPU-only run.
    """
    from brats_seg.lms.planner.plan import PlanDoesNotFitError
    from brats_seg.lms.planner.preflight import plan_run

    cfg, backend = per_replica(run.config, replicas), run.backend
    strategy, reason = choose_lms(cfg, backend)
    if stored is not None:
        if stored.strategy == "auto" and backend.name == "gpu" and backend.reason:
            backend = dataclasses.replace(backend, name="gpu_lms")
        log.info("backend %s, lms=%s: resuming under the run's plan.json (predicted peak %.2f GB within %.2f GB)",
                 backend.name, stored.strategy, stored.predicted_peak_bytes / 1e9, stored.budget_bytes / 1e9)
        return run.with_plan(backend, stored.strategy, stored, f"{reason}; the plan the run started with (plan.json)")
    try:
        try:
            plan = plan_run(cfg, backend.device, strategy)
        except PlanDoesNotFitError as e:
            if not (backend.reason and backend.device == "GPU" and strategy == "off"):
                raise
            # backend=auto chose this GPU: add LMS rather than fail
            strategy, reason = "auto", (f"backend=auto ({backend.reason}): the plan without LMS does not fit "
                                        f"({e.smallest_peak_bytes / 1e9:.2f} GB predicted); using gpu_lms with lms=auto")
            backend = dataclasses.replace(backend, name="gpu_lms", reason=reason)
            plan = plan_run(cfg, backend.device, strategy)
    except PlanDoesNotFitError as e:
        raise ValueError(str(e)) from e
    if backend.reason and backend.reason not in reason:
        reason = f"backend=auto chose {backend.name} ({backend.reason}); {reason}"
    log.info("backend %s, lms=%s (%s). Memory plan: predicted peak %.2f GB within %.2f GB (lms.limit %.2f GB "
             "less %.1f%% for the planner's error)", backend.name, strategy, reason, plan.predicted_peak_bytes / 1e9,
             plan.budget_bytes / 1e9, plan.limit_bytes / 1e9, 100 * plan.margin)
    return run.with_plan(backend, strategy, plan, reason)


def build_models(cfg: TrainConfig, plan, backend: ResolvedBackend):
    """``(train_model, export_model, offload_stats)`` sharing one set of layers and weights.

    Without LMS both are the plain U-Net. With LMS the training model runs blocks through
    the plan's keep/recompute/offload wrapper, and the export model (plain, saveable as
    ``.keras``, what evaluation loads) is built on the same blocks.
    """
    from brats_seg.lms.runtime.offload import BlockWrapper
    from brats_seg.lms.runtime.stats import OffloadStats
    from brats_seg.model.unet3d import build_unet3d, make_unet_blocks

    shape = network_input_shape(cfg)  # the patch in patch mode
    blocks = make_unet_blocks(cfg.model)
    export_model = build_unet3d(cfg.model, shape, blocks=blocks)
    policies = plan.policies
    if all(p == "keep" for p in policies.values()):
        return export_model, export_model, None
    batch = max(cfg.trainer.batch_size, 1)
    stats = OffloadStats({row.block: row.recomputed_flops / batch for row in plan.blocks})
    wrapper = BlockWrapper(policies, host_device="/CPU:0", prefetch=cfg.lms.prefetch,
                                 offload_skips=plan.offload_skips, stats=stats, keep_tails=plan.keep_tails,
                                 compute_device="/GPU:0" if backend.device == "GPU" else "/CPU:0")
    model = build_unet3d(cfg.model, shape, block_wrapper=wrapper, blocks=blocks)
    log.info("LMS: %s", ", ".join(f"{b}={p}" + (" (last conv unit kept)" if b in plan.keep_tails else "")
                                  for b, p in policies.items() if p != "keep"))
    return model, export_model, stats


def compile_models(cfg: TrainConfig, plan, backend: ResolvedBackend, strategy, steps_per_epoch: int):
    """:func:`build_models` under ``strategy``, compiled with the run's loss and optimizer and
    the optimizer built: what a training step needs (``training.steps.make_train_step``).

    Returns:
        ``(train_model, export_model, offload_stats, loss)``.
    """
    from brats_seg.training.losses import SoftDiceBCELoss

    with strategy.scope():
        model, export_model, offload_stats = build_models(cfg, plan, backend)
        loss = SoftDiceBCELoss(bce_weight=cfg.trainer.bce_weight, batch_dice=cfg.trainer.batch_dice)
        model.compile(optimizer=make_optimizer(cfg, steps_per_epoch, strategy.num_replicas_in_sync), loss=loss,
                      jit_compile=False)  # XLA would drop the LMS host placements
        if export_model is not model:  # the plain twin saves the shared weights and optimizer as .keras
            export_model.compile(optimizer=model.optimizer, loss=loss, jit_compile=False)
        model.optimizer.build(model.trainable_variables)
    return model, export_model, offload_stats, loss


def training_metrics(cfg: TrainConfig) -> list:
    """The per-sample metrics a training step sums: Dice and monitors of the output regions."""
    from brats_seg.data.labels import output_regions
    from brats_seg.training.metrics import make_dice_metrics, make_region_monitors

    regions = output_regions(cfg.data.layout, cfg.model.out_channels)
    return [*make_dice_metrics(regions), *make_region_monitors(regions, cfg.resolution.spacing_mm**3 / 1000.0)]
