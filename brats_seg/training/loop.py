"""Training: data ready -> run folder -> strategy -> model -> the step loop, with resume and tracking.

:func:`train` is what ``train.py`` calls (and tests call directly): the conductor. Building
the models is :mod:`brats_seg.training.build`'s, the run folder's start and resume
:mod:`brats_seg.training.checkpoint`'s. Order matters:

1. the run is resolved once (:func:`brats_seg.resolve.resolve_run`: every config value
   checked, the model's outputs and the paths derived, the backend, the replicas and the LMS
   strategy decided and planned for the per-replica batch, logged with the reason and tagged
   -- or, on resume, the run's ``plan.json`` read back and kept unless the memory settings
   changed; ``train.py`` resolves before TensorFlow is imported and passes the result), the
   backend applied (:func:`brats_seg.backend.configure`) and the ``distribute=`` strategy made
   (:mod:`brats_seg.distribute.strategy`), which must agree with the run's replicas: a bad
   value or a run that would not fit fails before anything is prepared or written;
2. the data layer prepares and validates every case, so corrupt or inconsistent data
   fails with its message before the run folder is written;
3. the run folder gets ``config.json`` and ``split.json`` (evaluation reads these); a
   folder with progress and a different config is refused rather than mixed, one without
   a completed step takes the new config; the model is built under the seed in the
   strategy's scope, compiled, and, if ``checkpoints/last.keras`` and ``state.json``
   exist, restored with its optimizer state and continued from the last completed epoch,
   or from the saved step of a run stopped by a signal (data order and augmentation are
   stateless functions of ``(seed, epoch, position)``, the LR schedule a function of the
   optimizer's step); other workers take the chief's weights;
4. the step loop (:mod:`brats_seg.training.epochs`, one ``strategy.run`` step for every
   strategy) with checkpoint/early-stopping and tracking callbacks, and the run's end
   (``_Session``). Only the chief writes the run folder and tracks; SIGTERM/SIGINT end the
   run resumably (:mod:`brats_seg.training.preemption`); running out of memory ends in the
   plan's numbers and the settings that fit, and a run the kernel killed is diagnosed from its
   lock record when the next start takes the lock over (:mod:`brats_seg.training.oom`).

This module imports TensorFlow: entry points import it after :func:`brats_seg.backend.configure`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from brats_seg.backend import configure
from brats_seg.config import TrainConfig, network_input_shape
from brats_seg.data.dataset import prepare_dataset
from brats_seg.data.labels import output_regions
from brats_seg.data.pipeline import TrainInput, make_eval_dataset, make_train_dataset
from brats_seg.data.splits import validation_subset
from brats_seg.distribute.strategy import make_strategy
from brats_seg.lms.runtime.stats import MemoryStatsCallback, current_file_rss_bytes, current_rss_bytes
from brats_seg.locks import hold_lock, remove_stale_temporaries
from brats_seg.oom import MemoryWatch, out_of_memory_guard
from brats_seg.resolve import ResolvedRun, resolve_run
from brats_seg.run_dir import RunFolder
from brats_seg.signals import Preempted
from brats_seg.tracking import NullTracker, make_run_name
from brats_seg.training.budget import TrainingClock
from brats_seg.training.build import compile_models, training_metrics
from brats_seg.training.callbacks import DeadRegionWarning, RunCheckpoint, TrackingCallback, TrainingCurves, load_state
from brats_seg.training.checkpoint import ResumePosition, load_resume, prepare_run_dir, save_plan
from brats_seg.training.cluster_sync import COLLECTIVE_ERRORS, cluster_error, sync_with_chief
from brats_seg.training.epochs import LoopOutcome, LoopShape, evaluate, run_epochs
from brats_seg.training.oom import MemoryRecordCallback, warn_about_dead_run
from brats_seg.training.preemption import PreemptionFlag
from brats_seg.training.stages import StageModels, stage_of_epoch, stage_runs, total_steps
from brats_seg.training.steps import chief_value, make_eval_step, make_sliding_eval_step, make_train_step
from brats_seg.training.tracked import end_tracking, start_tracking

__all__ = ["TrainResult", "train"]

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run produced."""

    run_dir: Path
    best_val_dice: float
    best_epoch: int
    epochs_done: int
    run_id: str | None


def _prepared_data(cfg: TrainConfig):
    """The run's dataset, prepared and split.

    Raises:
        ValueError: a split without training or validation cases.
    """
    ds = prepare_dataset(cfg.data, cfg.resolution)
    if not ds.split["train"] or not ds.split["val"]:
        raise ValueError(
            f"{len(ds.entries)} prepared cases give train={len(ds.split['train'])}, val={len(ds.split['val'])}: "
            "training needs at least one of each (add cases or change data.val_fraction/test_fraction)."
        )
    return ds


def _train_dataset_fn(cfg: TrainConfig, train_dirs, start: ResumePosition):
    """The ``dataset_fn`` of ``strategy.distribute_datasets_from_function``: each input pipeline
    its shard, from the resumed position on."""
    spec = TrainInput.from_config(cfg)

    def dataset_fn(ctx):
        return make_train_dataset(
            train_dirs,
            spec,
            initial_epoch=start.epoch,
            initial_step=start.step,
            shard=(ctx.input_pipeline_id, ctx.num_input_pipelines),
            replica_batch=ctx.get_per_replica_batch_size(spec.batch_size),
        )

    return dataset_fn


def _model_desc(cfg: TrainConfig) -> str:
    m = cfg.model
    return f"unet3d_d{m.depth}f{m.base_filters}{'' if m.in_channels == 4 else '_flair'}"


def train(
    run: TrainConfig | ResolvedRun, extra_callbacks=(), tags: dict[str, str] | None = None, name_suffix: str = ""
) -> TrainResult:
    """Train (or resume) the run described by ``run``.

    Args:
        run: the run as :func:`~brats_seg.resolve.resolve_run` resolved it (``train.py``, which
            configured its backend before importing TensorFlow), or a plain config (code, tests),
            resolved and its backend applied here; ``run_dir`` must be set.
        extra_callbacks: more Keras callbacks (tests use one to interrupt a run).
        tags: more MLflow tags (a sweep's job number and overrides).
        name_suffix: appended to the generated run name (a sweep job's overrides), so that
            the jobs of a sweep have distinct names.

    Returns:
        :class:`TrainResult` with the best validation mean Dice.

    Raises:
        ValueError: a bad config value or a run predicted not to fit, before anything is written;
            a strategy whose replicas differ from those the run was planned for.
        LockedError: another process trains in ``run_dir`` (its PID, host and command named).
        Preempted: SIGTERM/SIGINT stopped the run after saving; the same command resumes.
        ClusterFailure: a worker of a ``multi_worker`` cluster was lost, naming it.
        OutOfMemoryError: memory ran out (``ResourceExhaustedError``, ``MemoryError``), with the
            plan's and the measured peak and the settings predicted to fit; the run folder keeps
            its last completed epoch. A run killed by the kernel is diagnosed on the next start
            (:mod:`brats_seg.training.oom`) and resumed.
    """
    # every value checked, outputs and paths derived, the plan made, in a second: nothing is prepared or written before
    run = resolve_run(run)
    cfg, device = run.config, run.device
    configure(run.backend)  # the decision applied (already, when train.py passed the run)
    strategy, cluster = make_strategy(cfg.distribute, device)  # before any TensorFlow op runs
    if strategy.num_replicas_in_sync != run.replicas:
        raise ValueError(
            f"distribute={cfg.distribute.name} made {strategy.num_replicas_in_sync} replica(s) but the run was planned "
            f"for {run.replicas} (its devices as seen before TensorFlow started): name them, "
            "distribute.devices=[/GPU:0,/GPU:1], so both agree."
        )
    watch = MemoryWatch(cfg, device)  # its record in the lock tells the next start why this one died
    lock = (
        hold_lock(
            cfg.run_dir,
            "run folder",
            record=watch.lock_record(),  # one training per folder
            on_takeover=warn_about_dead_run(cfg, device, cfg.run_dir, run.replicas),
        )
        if run.chief
        else contextlib.nullcontext()
    )
    with lock as watch.lock, out_of_memory_guard(watch), contextlib.ExitStack() as logs:
        if run.chief:  # what writers killed by SIGKILL left (never read: final names are whole files)
            removed = remove_stale_temporaries(cfg.run_dir)
            if removed:
                log.info("removed %d temporary file(s) a killed run left in %s", len(removed), cfg.run_dir)
        return _train_in_folder(run, strategy, cluster, extra_callbacks, tags, name_suffix, watch, logs)


class _RunLogHandler(logging.FileHandler):
    """``train.log``'s handler: a line that cannot be written (a full disk) detaches it, with one
    warning, instead of logging's traceback for every line after."""

    def handleError(self, record) -> None:  # noqa: N802 - logging's name
        import sys

        logging.getLogger().removeHandler(self)
        log.warning(
            "cannot append to %s (%s): the rest of the log goes to the console only",
            self.baseFilename,
            sys.exc_info()[1],
        )


@contextlib.contextmanager
def run_log(run_dir: Path):
    """Everything logged while the run trains is appended to ``<run_dir>/train.log`` too (the
    console gets it as before), each start with a line saying who started it: the record of a
    run that outlives the terminal or the SLURM output file."""
    import os
    import socket
    import sys

    handler = _RunLogHandler(RunFolder(run_dir).log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)  # what reaches it is what the console shows (Hydra's job logging: INFO)
    log.info("started by PID %d on %s: %s", os.getpid(), socket.gethostname(), " ".join(sys.argv))
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def _train_in_folder(
    run: ResolvedRun,
    strategy,
    cluster,
    extra_callbacks,
    tags: dict[str, str] | None,
    name_suffix: str,
    watch: MemoryWatch,
    logs: contextlib.ExitStack,
) -> TrainResult:
    """:func:`train` from the plan on, with the run folder locked: plan -> data -> run folder ->
    model -> resume -> tracking -> epochs."""
    is_chief, cfg, replicas = run.chief, run.config, run.replicas
    backend, plan = run.backend, run.plan
    watch.planned(plan, run.lms, replicas)
    ds = _prepared_data(cfg)  # fails here, with the data layer's message, before the run folder is written
    run_dir = prepare_run_dir(cfg, ds.split, ds.split_path) if is_chief else Path(cfg.run_dir)
    if is_chief:  # training can start: the run folder is written from here on
        logs.enter_context(run_log(run_dir))
    plan_files = save_plan(run, run_dir) if is_chief else []

    t = cfg.trainer
    state = load_state(run_dir) if is_chief else None  # the others take the chief's (no shared storage needed)
    validated = set(validation_subset(ds.split["val"], t.val_cases, cfg.data.split_seed))  # trainer.val_cases
    train_dirs = [e.path for e in ds.entries_of("train")]
    val_dirs = [e.path for e in ds.entries_of("val") if e.case_id in validated]
    if len(val_dirs) < len(ds.split["val"]):
        log.info(
            "validating during training on %d of the %d val cases (trainer.val_cases; a fixed seeded subset)",
            len(val_dirs),
            len(ds.split["val"]),
        )
    stages = stage_runs(run, len(train_dirs))  # one, the run itself, without a patch schedule
    steps = stages[0].steps
    keras.utils.set_random_seed(t.seed)
    if t.deterministic:
        tf.config.experimental.enable_op_determinism()
    if backend.device == "CPU":  # what earlier work left to free is freed now, not mid-epoch below the baseline
        import gc

        gc.collect()
    baseline = current_rss_bytes() if backend.device == "CPU" else None  # the runtime, before the model
    baseline_files = current_file_rss_bytes() if backend.device == "CPU" else None  # its mapped files' pages
    watch.started(baseline, state)
    compiled = compile_models(
        stages[0].config,
        stages[0].plan,
        backend,
        strategy,
        steps,
        export_shape=network_input_shape(stages[-1].config),  # a schedule's last stage: what evaluation infers
        total_steps=total_steps(stages, t.epochs),
    )
    model, export_model, offload_stats = compiled.model, compiled.export_model, compiled.offload_stats
    start = load_resume(run_dir, state, model, export_model, steps)
    if cluster is not None and cluster.num_workers > 1:  # workers without the chief's files follow it
        start = sync_with_chief(strategy, cluster, model, steps, t, len(train_dirs), start)
    if state or start.epoch:
        log.info(
            "resuming %s from epoch %d step %d (optimizer step %d)",
            run_dir,
            start.epoch + 1,
            start.step,
            int(model.optimizer.iterations.numpy()),
        )

    run_name = (
        cfg.run_name
        or make_run_name(cfg.data.name, cfg.resolution.name, _model_desc(cfg), backend.name, run.lms) + name_suffix
    )
    tracker = start_tracking(run, run_dir, run_name, replicas, plan_files, tags) if is_chief else NullTracker()
    checkpoint = RunCheckpoint(
        run_dir,
        "val_dice_mean",
        t.early_stopping_patience,
        state,
        export_model,
        write=is_chief,
        select_stage=len(stages) if len(stages) > 1 else None,
    )
    memory_stats = MemoryStatsCallback(backend.device, offload_stats, baseline, baseline_files)
    callbacks = [
        memory_stats,
        checkpoint,
        TrackingCallback(tracker),
        MemoryRecordCallback(watch),
        *extra_callbacks,
    ]  # the record after the stats and the checkpoint
    if is_chief:
        regions = output_regions(cfg.data.layout, cfg.model.out_channels)
        callbacks.insert(1, DeadRegionWarning(regions, t.dead_region_epochs, (state or {}).get("history", ())))
        callbacks.insert(callbacks.index(checkpoint) + 1, TrainingCurves(checkpoint, regions, tracker, run_name))
    log.info(
        "training %s: %d train / %d val cases, %s over %d replica(s), epochs %d..%d, run %s",
        run_name,
        len(train_dirs),
        len(val_dirs),
        "; ".join(
            f"{s.name + ': ' if s.name else ''}{s.steps} steps/epoch of {s.config.trainer.batch_size}" for s in stages
        ),
        strategy.num_replicas_in_sync,
        start.epoch + 1,
        t.epochs,
        run_dir,
    )
    if is_chief and start.epoch == 0:  # what the run will take, before its first step
        from brats_seg.run_time import predict_run_time

        estimate = predict_run_time(run, len(train_dirs), len(val_dirs))
        for line in estimate.lines() if estimate is not None else ():
            log.info("%s", line)
    models = StageModels(compiled, stages, backend, strategy)
    session = _Session(cfg, strategy, cluster, models, tracker, checkpoint, run_dir, is_chief, memory_stats)
    session.run(train_dirs, val_dirs, stages, start, callbacks)
    st = checkpoint.state
    return TrainResult(
        run_dir, float(st["best_value"] or 0.0), int(st["best_epoch"] or 0), int(st["epoch"]), tracker.run_id
    )


@dataclass
class _Session:
    """The epoch loop of a built, resumed run, and its end whatever ends it: finished, early
    stopping, a signal (saved, tracked as KILLED, :class:`Preempted` raised), a lost worker
    (:class:`~brats_seg.distribute.cluster.ClusterFailure`) or any error (tracked as FAILED)."""

    cfg: TrainConfig
    strategy: object
    cluster: object
    models: StageModels  # each stage's model on the run's layers (one stage without a schedule)
    tracker: object
    checkpoint: RunCheckpoint
    run_dir: Path
    is_chief: bool  # the resolved run's (ResolvedRun.chief)
    memory_stats: MemoryStatsCallback
    closed: bool = False

    @property
    def multi(self) -> bool:
        return self.cluster is not None and self.cluster.num_workers > 1

    def run(self, train_dirs, val_dirs, stages, start: ResumePosition, callbacks) -> None:
        status = "FAILED"
        try:
            status = self._epochs(train_dirs, val_dirs, stages, start, callbacks)
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        except tuple(getattr(tf.errors, n) for n in COLLECTIVE_ERRORS) as e:
            failure = cluster_error(e, self.cluster) if self.multi else None
            if failure is None:
                raise
            raise failure from e
        finally:
            self.close(status)

    def _epochs(self, train_dirs, val_dirs, stages, start: ResumePosition, callbacks) -> str:
        """Run the remaining epochs, stage after stage; ``FINISHED``, or :class:`Preempted` once the
        position is saved."""
        t = self.cfg.trainer
        outcome = LoopOutcome("finished")
        flag = PreemptionFlag()
        with flag:  # through the save: a second SIGTERM does not cut it short
            if start.epoch < t.epochs:
                state = self.checkpoint.state or {}
                history = state.get("history") or []
                metrics = training_metrics(self.cfg)
                optimizer = self.models.compiled.model.optimizer
                clock = TrainingClock(
                    t.time_budget_s, state.get("train_time_s", 0.0), getattr(optimizer, "_learning_rate", None)
                )
                # the clock when the epoch to train began: the last finished epoch's end if it is under way
                began = float(history[-1].get("train_time_s", 0.0) if history else 0.0) if start.step else clock.spent_s
                index = stage_of_epoch(stages, start.epoch, began)  # the epoch's stage: when it began
                val_dataset = make_eval_dataset(val_dirs, 1, self.cfg.model.in_channels, self.cfg.model.out_channels)
                callback_list = keras.callbacks.CallbackList(callbacks, model=self.models.compiled.model)
                callback_list.on_train_begin()
                while True:
                    stage = stages[index]
                    model, stats = self.models.model(index)
                    self.memory_stats.offload_stats = stats
                    if stage.count > 1:
                        log.info(
                            "stage %d/%d: %s, batch %d, from epoch %d step %d",
                            index + 1,
                            stage.count,
                            stage.name,
                            stage.config.trainer.batch_size,
                            start.epoch + 1,
                            start.step + 1,
                        )
                    iterator = iter(
                        self.strategy.distribute_datasets_from_function(
                            _train_dataset_fn(stage.config, train_dirs, start)
                        )
                    )
                    outcome = run_epochs(
                        strategy=self.strategy,
                        model=model,
                        iterator=iterator,
                        train_step=make_train_step(
                            self.strategy, model, self.models.compiled.loss, metrics, stage.config.trainer.batch_size
                        ),
                        validate=functools.partial(
                            evaluate, self._eval_step(model, stage.config, metrics), val_dataset
                        ),
                        shape=LoopShape(t.epochs, stage.steps, t.val_every, stage),
                        start=start,
                        callbacks=callback_list,
                        preemption=flag,
                        is_chief=self.is_chief,
                        single_worker=not self.multi,
                        clock=clock,
                    )
                    if outcome.status != "stage_done":
                        break
                    index = max(index + 1, stage_of_epoch(stages, outcome.epoch, clock.spent_s))
                    start = ResumePosition(outcome.epoch, 0)
                if outcome.status == "finished":
                    callback_list.on_train_end()
            else:
                log.info("run %s already has %d/%d epochs: nothing to train", self.run_dir, start.epoch, t.epochs)
            if outcome.status == "preempted":
                where = self._save_preempted(outcome)
                self.close("KILLED")
            if self.multi:  # nobody leaves before the chief has saved (srun --kill-on-bad-exit would cut it)
                chief_value(self.strategy, tf.constant(0.0))
        if outcome.status == "preempted":
            flag.pass_on()  # a launcher's requeue (SIGUSR2 under submitit) may end the process here
            raise Preempted(flag.signal_name or "signal", where, str(self.run_dir))
        return "FINISHED"

    def _eval_step(self, model, cfg: TrainConfig, metrics):
        """Validation of whole volumes: in one pass, or (patch mode, or a schedule's patch stage)
        by windows of the patch size with Gaussian blending, as evaluation infers the run
        (``evaluate.window_overlap``'s default overlap)."""
        patch = cfg.trainer.patch_size
        if not patch:
            return make_eval_step(model, metrics, self.models.compiled.loss)
        from brats_seg.config import EvaluateConfig

        return make_sliding_eval_step(
            model, metrics, self.models.compiled.loss, patch, EvaluateConfig().window_overlap, cfg.model.depth
        )

    def _save_preempted(self, outcome: LoopOutcome) -> str:
        """Save a partial epoch's position and sums; where the run stopped, in words."""
        if not outcome.step:
            return f"epoch {outcome.epoch}"
        self.checkpoint.save_partial(outcome.epoch, outcome.step, outcome.sums.to_dict(), outcome.train_time_s)
        return f"step {outcome.step} of epoch {outcome.epoch + 1}"

    def close(self, status: str) -> None:
        """End the tracked run once (a preempted run closes before it raises)."""
        if not self.closed:
            self.closed = True
            end_tracking(self.tracker, self.checkpoint.state, self.run_dir, self.is_chief, status)
