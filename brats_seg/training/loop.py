"""Training: data ready -> run folder -> strategy -> model -> the step loop, with resume and tracking.

:func:`train` is what ``train.py`` calls (and tests call directly). Order matters:

1. the data layer prepares and validates every case first, so corrupt or inconsistent
   data fails with its message before any model is built;
2. the run folder gets ``config.json`` and ``split.json`` (evaluation reads these);
   an existing run folder with a different config is refused rather than mixed;
3. the ``distribute=`` strategy is made (:mod:`brats_seg.distribute.strategy`), the memory
   plan is made for the per-replica batch, and the model is built under the seed in the
   strategy's scope, compiled, and, if ``checkpoints/last.keras`` and ``state.json``
   exist, restored with its optimizer state and continued from the last completed epoch,
   or from the saved step of a run stopped by a signal (data order and augmentation are
   stateless functions of ``(seed, epoch, position)``, the LR schedule a function of the
   optimizer's step); other workers take the chief's weights;
4. the step loop (:mod:`brats_seg.training.epochs`, one ``strategy.run`` step for every
   strategy) with checkpoint/early-stopping and tracking callbacks. Only the chief writes
   the run folder and tracks; SIGTERM/SIGINT end the run resumably
   (:mod:`brats_seg.training.preemption`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from brats_seg.backend import ResolvedBackend
from brats_seg.config import TrainConfig, flatten_config
from brats_seg.data.labels import resolve_model_outputs
from brats_seg.data.dataset import prepare_dataset
from brats_seg.run_dir import RunFolder

__all__ = ["TrainResult", "train", "resolve_paths", "make_optimizer", "compile_models", "training_metrics", "check_resumable",
           "resume_position"]

log = logging.getLogger(__name__)

# Keys that may change between a run and its resumption (length, patience, logging).
_RESUME_MUTABLE = {"trainer.epochs", "trainer.early_stopping_patience", "trainer.val_every", "run_name",
                   "run_dir", "data.num_workers", "data.on_error", "tracking.", "backend.", "plan.", "benchmark.",
                   "lms.", "distribute."}


@dataclass
class TrainResult:
    """What a training run produced."""

    run_dir: Path
    best_val_dice: float
    best_epoch: int
    epochs_done: int
    run_id: str | None


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """Make data paths absolute (so the run folder's config works from any cwd)."""
    cfg.data.root = str(Path(cfg.data.root).expanduser().resolve())
    cfg.data.cache_dir = str(Path(cfg.data.cache_dir).expanduser().resolve())
    cfg.run_dir = str(Path(cfg.run_dir).expanduser().resolve())
    return cfg


def _mutable(key: str) -> bool:
    return any(key == m or (m.endswith(".") and key.startswith(m)) for m in _RESUME_MUTABLE)


def check_resumable(run_dir: Path, cfg: TrainConfig) -> None:
    """Refuse to continue a run folder written with a different (non-length) config.

    The stored config is read as evaluation reads it (:meth:`RunFolder.read_config`: an older
    run's config upgraded to this version's keys), so a run from an earlier version resumes.
    """
    folder = RunFolder(run_dir)
    if not folder.has_config():
        return
    old = flatten_config(folder.read_config())
    new = flatten_config(cfg)
    diff = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if not _mutable(k) and old.get(k) != new.get(k)}
    if diff:
        lines = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(diff.items())[:6])
        raise ValueError(
            f"run_dir {run_dir} holds a run with a different config ({lines}). Re-running the same "
            "command resumes it; for a new experiment pass a new run_dir=."
        )


def make_optimizer(cfg: TrainConfig, steps_per_epoch: int, replicas: int = 1):
    """Adam with a per-step LR schedule (cosine with linear warm-up, or constant).

    ``trainer.learning_rate`` is the rate for the global batch ``trainer.batch_size``
    (whatever the number of replicas sharing it); ``distribute.lr_scaling=linear``
    multiplies it by ``replicas`` instead (a recipe tuned on one device at
    ``batch_size / replicas``).
    """
    import keras

    t = cfg.trainer
    scaling = getattr(cfg.distribute, "lr_scaling", "none")
    if scaling not in ("none", "linear"):
        raise ValueError(f"distribute.lr_scaling={scaling!r}: use none or linear.")
    base_lr = t.learning_rate * (replicas if scaling == "linear" else 1)
    if t.lr_schedule == "constant":
        lr = base_lr
    elif t.lr_schedule == "cosine":
        warmup = min(t.warmup_epochs, max(t.epochs - 1, 0)) * steps_per_epoch
        total = max(t.epochs * steps_per_epoch - warmup, 1)
        lr = keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=base_lr if warmup == 0 else 0.0,
            decay_steps=total,
            alpha=0.01,
            warmup_target=base_lr if warmup else None,
            warmup_steps=warmup,
        )
    else:
        raise ValueError(f"trainer.lr_schedule={t.lr_schedule!r}: use cosine or constant.")
    return keras.optimizers.Adam(learning_rate=lr)


def _prepare_run_dir(cfg: TrainConfig, split: dict, split_path: Path) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    check_resumable(run_dir, cfg)
    folder = RunFolder(run_dir)
    folder.write_config(cfg)
    if folder.has_split():
        if folder.read_split().get("test") != split["test"]:
            raise ValueError(
                f"{folder.split_path}: the dataset's test split changed since this run started "
                f"({split_path}). Resuming would train on former test cases; start a new run_dir=."
            )
    else:  # the dataset's split file as it is (its seed and fractions with the ids)
        folder.write_split(json.loads(Path(split_path).read_text()))
    return run_dir


def _model_desc(cfg: TrainConfig) -> str:
    m = cfg.model
    return f"unet3d_d{m.depth}f{m.base_filters}{'' if m.in_channels == 4 else '_flair'}"


def effective_lms(cfg: TrainConfig, backend: ResolvedBackend) -> str:
    """The LMS strategy a run uses: ``backend=gpu_lms`` with ``lms=off`` plans (``auto``)."""
    if backend.name == "gpu_lms" and cfg.lms.name == "off":
        log.info("backend=gpu_lms with lms=off: planning with lms=auto")
        return "auto"
    return cfg.lms.name


def preflight_plan(cfg: TrainConfig, backend: ResolvedBackend):
    """Plan the run against ``lms.limit`` before building anything.

    Raises:
        PlanDoesNotFitError: the run is predicted not to fit, with the numbers and the fix.
        ValueError: ``lms=offload`` on a CPU-only run.
    """
    from brats_seg.lms.planner.plan import PlanDoesNotFitError
    from brats_seg.lms.planner.preflight import plan_run

    strategy = effective_lms(cfg, backend)
    if backend.device == "CPU" and strategy == "offload":
        raise ValueError(
            "lms=offload needs a GPU: a CPU-only run has no separate device memory to offload from. "
            "Use lms=recompute (or lms=auto) to fit a RAM budget on CPU."
        )
    try:
        plan = plan_run(cfg, backend.device, strategy)
    except PlanDoesNotFitError as e:
        if backend.reason and backend.device == "GPU" and strategy == "off":  # backend=auto: add LMS if needed
            log.info("backend=auto: the plan without LMS does not fit the GPU; using gpu_lms with lms=auto")
            return plan_run(cfg, backend.device, "auto")
        raise ValueError(str(e)) from e
    log.info("memory plan (lms=%s): predicted peak %.2f GB within %.2f GB (lms.limit %.2f GB less %.1f%% for "
             "the planner's error)", plan.strategy, plan.predicted_peak_bytes / 1e9, plan.budget_bytes / 1e9,
             plan.limit_bytes / 1e9, 100 * plan.margin)
    return plan


def _save_plan(plan, run_dir: Path) -> list[Path]:
    return RunFolder(run_dir).write_plan(plan.format_table(), plan.to_json())


def build_models(cfg: TrainConfig, plan, backend: ResolvedBackend):
    """``(train_model, export_model, offload_stats)`` sharing one set of layers and weights.

    Without LMS both are the plain U-Net. With LMS the training model runs blocks through
    the plan's keep/recompute/offload wrapper, and the export model (plain, saveable as
    ``.keras``, what evaluation loads) is built on the same blocks.
    """
    from brats_seg.lms.runtime.offload import BlockWrapper
    from brats_seg.lms.runtime.stats import OffloadStats
    from brats_seg.model.unet3d import build_unet3d, make_unet_blocks

    shape = tuple(cfg.resolution.shape)
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
        loss = SoftDiceBCELoss(bce_weight=cfg.trainer.bce_weight)
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


def _restore(model, export_model, last: Path) -> None:
    """Weights and optimizer state of ``last.keras`` into the (shared) models.

    Optimizer variables are matched by path without the optimizer's own name, which
    depends on how many optimizers the process has made (``adam_3/enc0_conv1_kernel_momentum``).
    """
    import keras

    def key(v) -> str:
        return v.path.split("/", 1)[-1]

    restored = keras.models.load_model(last, compile=True)
    export_model.set_weights(restored.get_weights())
    model.optimizer.build(model.trainable_variables)
    theirs = {key(v): v for v in restored.optimizer.variables}
    missing = [v.path for v in model.optimizer.variables if key(v) not in theirs]
    if missing:
        raise ValueError(f"{last}: its optimizer state lacks {missing[:3]}: the checkpoint is from another model. "
                         "Resume with the config it was trained with, or start a new run_dir=.")
    for v in model.optimizer.variables:
        v.assign(theirs[key(v)])


def resume_position(state, iterations: int | None, steps: int) -> tuple[int, int, dict | None]:
    """``(epoch, step, partial sums)`` to resume at: ``state.json``'s, checked against the
    optimizer step restored from ``last.keras``.

    ``last.keras`` is written before ``state.json``, which records the optimizer step it was
    written with (``iterations``). A run killed between the two writes leaves weights newer
    than the state: then the restored optimizer step says where the weights are (one per
    training step; under fp16 loss scaling, skipped steps make this approximate) and
    training resumes there, without the partial sums.
    """
    epoch, step = int(state["epoch"]), int(state.get("step", 0))
    partial = state.get("partial") if state.get("partial_epoch") == epoch + 1 and step else None
    recorded = state.get("iterations")
    if iterations is not None and recorded is not None and int(iterations) != int(recorded):
        new_epoch, new_step = divmod(int(iterations), steps)
        log.warning("last.keras holds optimizer step %d but state.json was written at step %d (epoch %d step %d): "
                    "stopped between the two writes; resuming at epoch %d step %d from the weights", iterations,
                    recorded, epoch, step, new_epoch + 1, new_step)
        return new_epoch, new_step, None
    return epoch, step, partial


def train(cfg: TrainConfig, backend: ResolvedBackend, extra_callbacks=(), tags: dict[str, str] | None = None,
          name_suffix: str = "") -> TrainResult:
    """Train (or resume) the run described by ``cfg``.

    Args:
        cfg: the full config; ``cfg.run_dir`` must be set.
        backend: what :func:`brats_seg.backend.configure` resolved (TF already configured).
        extra_callbacks: more Keras callbacks (tests use one to interrupt a run).
        tags: more MLflow tags (a sweep's job number and overrides).
        name_suffix: appended to the generated run name (a sweep job's overrides), so that
            the jobs of a sweep have distinct names.

    Returns:
        :class:`TrainResult` with the best validation mean Dice.

    Raises:
        Preempted: SIGTERM/SIGINT stopped the run after saving; the same command resumes.
        ClusterFailure: a worker of a ``multi_worker`` cluster was lost, naming it.
    """
    if not cfg.run_dir:
        raise ValueError("run_dir is not set: pass run_dir=outputs/<name>.")
    resolve_paths(cfg)
    resolve_model_outputs(cfg)  # one sigmoid output per region of the layout (or WT only)
    ds = prepare_dataset(cfg.data, cfg.resolution)  # fails here, with the data layer's message
    if not ds.split["train"] or not ds.split["val"]:
        raise ValueError(
            f"{len(ds.entries)} prepared cases give train={len(ds.split['train'])}, val={len(ds.split['val'])}: "
            "training needs at least one of each (add cases or change data.val_fraction/test_fraction)."
        )

    from brats_seg.distribute.strategy import make_strategy

    strategy, cluster = make_strategy(cfg.distribute, backend.device)  # before any TensorFlow op runs
    is_chief = cluster is None or cluster.is_chief
    replicas = strategy.num_replicas_in_sync
    t = cfg.trainer
    if t.batch_size % replicas:
        raise ValueError(f"trainer.batch_size={t.batch_size} is the global batch and must divide among the "
                         f"{replicas} replicas of distribute={cfg.distribute.name}: use a multiple of {replicas}.")
    run_dir = _prepare_run_dir(cfg, ds.split, ds.split_path) if is_chief else Path(cfg.run_dir)
    replica_cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(t, batch_size=t.batch_size // replicas))
    plan = preflight_plan(replica_cfg, backend)  # LMS plans one replica's memory
    plan_files = _save_plan(plan, run_dir) if is_chief else []

    import keras
    import tensorflow as tf

    from brats_seg.data.labels import output_regions
    from brats_seg.data.pipeline import make_eval_dataset, make_train_dataset, steps_per_epoch
    from brats_seg.lms.runtime.stats import MemoryStatsCallback, current_rss_bytes
    from brats_seg.tracking import NullTracker, Tracker, git_commit, make_run_name
    from brats_seg.training.callbacks import DeadRegionWarning, RunCheckpoint, TrackingCallback, load_state
    from brats_seg.training.epochs import LoopOutcome, run_epochs
    from brats_seg.training.preemption import Preempted, PreemptionFlag
    from brats_seg.training.cluster_sync import COLLECTIVE_ERRORS, cluster_error, sync_with_chief
    from brats_seg.training.steps import EpochSums, chief_value, make_eval_step, make_train_step

    state = load_state(run_dir) if is_chief else None  # the others take the chief's (no shared storage needed)
    train_dirs = [e.path for e in ds.entries_of("train")]
    val_dirs = [e.path for e in ds.entries_of("val")]
    steps = steps_per_epoch(len(train_dirs), t.batch_size, t.steps_per_epoch)

    keras.utils.set_random_seed(t.seed)
    if t.deterministic:
        tf.config.experimental.enable_op_determinism()
    baseline = current_rss_bytes() if backend.device == "CPU" else None  # the runtime, before the model
    model, export_model, offload_stats, loss = compile_models(cfg, plan, backend, strategy, steps)
    regions = output_regions(cfg.data.layout, cfg.model.out_channels)
    metrics = training_metrics(cfg)
    initial_epoch, initial_step, partial = 0, 0, None
    if state:
        last = RunFolder(run_dir).checkpoint_file("last")
        if not last.is_file():
            raise FileNotFoundError(f"{run_dir}/state.json says {state['epoch']} epochs are done but {last} is missing.")
        _restore(model, export_model, last)
        initial_epoch, initial_step, partial = resume_position(state, int(model.optimizer.iterations.numpy()), steps)
    if cluster is not None and cluster.num_workers > 1:  # workers without the chief's files follow it
        initial_epoch, initial_step = sync_with_chief(strategy, cluster, model, steps, t, len(train_dirs),
                                                       (initial_epoch, initial_step))
    if state or initial_epoch:
        log.info("resuming %s from epoch %d step %d (optimizer step %d)", run_dir, initial_epoch + 1, initial_step,
                 int(model.optimizer.iterations.numpy()))

    run_name = cfg.run_name or make_run_name(cfg.data.name, cfg.resolution.name, _model_desc(cfg),
                                             backend.name, cfg.lms.name) + name_suffix
    if is_chief:
        tracker = Tracker.start(
            cfg.tracking, run_dir, run_name, params=flatten_config(cfg),
            tags={"backend": backend.name, "device": backend.device, "precision": backend.precision,
                  "resolution": cfg.resolution.name, "data": cfg.data.name, "git_commit": git_commit(),
                  "run_dir": str(run_dir), "distribute": cfg.distribute.name, "replicas": str(replicas),
                  **(tags or {})},
        )
        tracker.log_artifact(RunFolder(run_dir).split_path)
        for path in plan_files:
            tracker.log_artifact(path, "plan")
    else:
        tracker = NullTracker()

    def dataset_fn(ctx: tf.distribute.InputContext):
        return make_train_dataset(
            train_dirs, t.batch_size, t.seed, t.augment, cfg.model.in_channels, cfg.model.out_channels,
            initial_epoch=initial_epoch, max_steps_per_epoch=t.steps_per_epoch, initial_step=initial_step,
            shard=(ctx.input_pipeline_id, ctx.num_input_pipelines),
            replica_batch=ctx.get_per_replica_batch_size(t.batch_size), prefetch_batches=cfg.data.prefetch_batches)

    val_ds = make_eval_dataset(val_dirs, 1, cfg.model.in_channels, cfg.model.out_channels)
    checkpoint = RunCheckpoint(run_dir, "val_dice_mean", t.early_stopping_patience, state, export_model,
                               write=is_chief)
    callbacks = [MemoryStatsCallback(backend.device, offload_stats, baseline), checkpoint, TrackingCallback(tracker),
                 *extra_callbacks]
    if is_chief:
        callbacks.insert(1, DeadRegionWarning(regions, t.dead_region_epochs, (state or {}).get("history", ())))
    log.info("training %s: %d train / %d val cases, %d steps/epoch of %d over %d replica(s), epochs %d..%d, run %s",
             run_name, len(train_dirs), len(val_dirs), steps, t.batch_size, replicas, initial_epoch + 1, t.epochs,
             run_dir)
    closed = []

    def close(status: str) -> None:
        """Log the final artifacts and end the tracked run, once."""
        if closed:
            return
        closed.append(status)
        st = checkpoint.state
        folder = RunFolder(run_dir)
        if is_chief and folder.checkpoint_file("best").is_file():
            tracker.log_artifact(folder.checkpoint_file("best"), "checkpoints")
        if is_chief and folder.history_path.is_file():
            tracker.log_artifact(folder.history_path)
        tracker.log_metrics({"best_val_dice_mean": st["best_value"] or 0.0}, step=st["epoch"])
        tracker.end(status)

    multi = cluster is not None and cluster.num_workers > 1
    status = "FAILED"
    flag = PreemptionFlag()
    try:
        outcome = LoopOutcome("finished")
        with flag:  # through the save: a second SIGTERM does not cut it short
            if initial_epoch < t.epochs:
                iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
                outcome = run_epochs(
                    strategy=strategy, model=model, iterator=iterator, val_dataset=val_ds,
                    train_step=make_train_step(strategy, model, loss, metrics, t.batch_size),
                    eval_step=make_eval_step(model, metrics, loss), epochs=t.epochs, initial_epoch=initial_epoch,
                    initial_step=initial_step, steps=steps, val_every=t.val_every,
                    callbacks=keras.callbacks.CallbackList(callbacks, model=model), preemption=flag,
                    partial=EpochSums.from_dict(partial) if partial else None, is_chief=is_chief,
                    single_worker=not multi)
            else:
                log.info("run %s already has %d/%d epochs: nothing to train", run_dir, initial_epoch, t.epochs)
            if outcome.status == "preempted":
                status = "KILLED"
                if outcome.step:
                    checkpoint.save_partial(outcome.epoch, outcome.step, outcome.sums.to_dict())
                    where = f"step {outcome.step} of epoch {outcome.epoch + 1}"
                else:
                    where = f"epoch {outcome.epoch}"
                close(status)
            if multi:  # nobody leaves before the chief has saved (srun --kill-on-bad-exit would cut it)
                chief_value(strategy, tf.constant(0.0))
        if outcome.status == "preempted":
            flag.pass_on()  # a launcher's requeue (SIGUSR2 under submitit) may end the process here
            raise Preempted(flag.signal_name or "signal", where, str(run_dir))
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except tuple(getattr(tf.errors, n) for n in COLLECTIVE_ERRORS) as e:
        failure = cluster_error(e, cluster) if multi else None
        if failure is None:
            raise
        raise failure from e
    finally:
        close(status)
    st = checkpoint.state
    return TrainResult(run_dir, float(st["best_value"] or 0.0), int(st["best_epoch"] or 0), int(st["epoch"]),
                       tracker.run_id)
