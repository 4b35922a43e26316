"""A run resolved once: the user's config and the machine turned into every decision the run depends on.

:func:`resolve_run` is called once per start, by the entry points (``train.py``,
``scripts/plan_memory.py``, ``scripts/benchmark.py``, ``scripts/profile_step.py``) and by
:func:`brats_seg.training.loop.train` when code hands it a plain config;
:func:`resolve_inference` is its twin for the commands that infer (evaluate, predict, export,
the studies). Each returns a frozen decision, taken before TensorFlow is imported, that the
rest of the process reads and nothing re-derives:

- ``config``: a copy of the user's config with its derived values filled in -- the model's
  outputs and region parents (:func:`brats_seg.data.labels.resolve_model_outputs`) and absolute
  data, cache and run paths -- every value checked once (:func:`brats_seg.checks.check_train_config`);
- ``backend``: the backend, device, precision policy and XLA, and why
  (:func:`brats_seg.backend.decide_backend`, the one place they are decided; applied by
  :func:`brats_seg.backend.configure`);
- ``replicas`` (and whether this process is the chief): from ``distribute`` and the GPUs visible
  (:func:`brats_seg.distribute.resolve.planned_replicas`); training checks that TensorFlow's
  strategy agrees;
- for training, the LMS strategy (:func:`brats_seg.lms.planner.preflight.lms_strategy`, the one
  rule) and its memory plan for one replica's share of the batch, or the plan a resumed run
  started with (its ``plan.json``, :func:`stored_plan`); on a GPU that ``backend=auto`` chose, a
  run whose plan without LMS does not fit becomes ``gpu_lms`` with ``lms=auto`` (and without XLA).

The user's config object is never written into. Pure Python: nothing here imports TensorFlow,
so a start resolves (and a bad value fails) in about a second.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from brats_seg.backend import ResolvedBackend, decide_backend
from brats_seg.checks import check_train_config
from brats_seg.config import BackendConfig, TrainConfig, flatten_config
from brats_seg.data.labels import resolve_model_outputs
from brats_seg.distribute.resolve import planned_replicas
from brats_seg.lms.planner.preflight import lms_strategy
from brats_seg.patch_schedule import GROW, Stage, parse_schedule, stage_epochs
from brats_seg.run_dir import RunFolder, has_progress

if TYPE_CHECKING:
    from brats_seg.lms.planner.plan import Plan

__all__ = [
    "PlannedStage",
    "ResolvedRun",
    "per_replica",
    "planned_for",
    "resolve_inference",
    "resolve_paths",
    "resolve_run",
    "stage_config",
    "stored_plan",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedStage:
    """A stage of ``trainer.patch_schedule`` (:class:`~brats_seg.patch_schedule.Stage`) and the
    memory plan it trains under; ``first_epoch`` (0-based) where the run has no time budget, the
    epoch it starts at (None with a budget: the clock decides)."""

    stage: Stage
    plan: Plan
    first_epoch: int | None = None

    def to_dict(self) -> dict:
        return {**self.stage.to_dict(), "first_epoch": self.first_epoch, "plan": self.plan.to_dict()}

    @classmethod
    def from_dict(cls, data) -> PlannedStage:
        from brats_seg.lms.planner.plan import Plan

        return cls(Stage.from_dict(data), Plan.from_dict(data["plan"]), data.get("first_epoch"))


@dataclass(frozen=True)
class ResolvedRun:
    """Every decision a run depends on, taken once (:func:`resolve_run`).

    Attributes:
        config: the run's config with its derived values (model outputs, region parents,
            absolute paths); what training writes to ``config.json``. Read it, do not edit it.
        backend: backend, device, precision, Keras policy and XLA, with ``reason`` when ``auto`` chose.
        replicas: how many replicas share the global batch (each device's memory holds one share).
        chief: this process writes the run folder (False for the other workers of ``multi_worker``).
        lms: the LMS strategy (``off``/``recompute``/``offload``/``auto``).
        plan: the memory plan the run trains under; None when not resolved for training. With a
            patch schedule, the plan of its stage with the highest predicted peak.
        reason: why this backend and LMS strategy, in words (logged, and kept in the MLflow tags).
        stages: with ``trainer.patch_schedule``, each stage and its own plan (:class:`PlannedStage`);
            empty without one.
    """

    config: TrainConfig
    backend: ResolvedBackend
    replicas: int = 1
    chief: bool = True
    lms: str = ""
    plan: Plan | None = None
    reason: str = ""
    stages: tuple[PlannedStage, ...] = ()

    @property
    def device(self) -> str:
        """``CPU`` or ``GPU``: where the run computes and what its memory must fit."""
        return self.backend.device


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """A copy of ``cfg`` with absolute data, cache and run paths (so the run folder's config works
    from any cwd); an unset ``run_dir`` stays unset."""
    data = dataclasses.replace(
        cfg.data,
        root=str(Path(cfg.data.root).expanduser().resolve()),
        cache_dir=str(Path(cfg.data.cache_dir).expanduser().resolve()),
    )
    run_dir = str(Path(cfg.run_dir).expanduser().resolve()) if cfg.run_dir else ""
    return dataclasses.replace(cfg, data=data, run_dir=run_dir)


def resolve_run(
    cfg: TrainConfig | ResolvedRun, *, training: bool = True, gpus: int | None = None, cpuinfo: str | None = None
) -> ResolvedRun:
    """The run ``cfg`` describes on this machine, every value checked: the one place its derived
    values, its backend, its replicas and (training) its LMS strategy and plan are decided. A
    :class:`ResolvedRun` is returned as it is.

    Args:
        cfg: the user's config (not written into).
        training: the run trains here, into ``run_dir`` (checked; a GPU backend needs a visible GPU;
            the memory plan is made, or read back on resume); False for the planner's entry points,
            which plan for a device without needing it.
        gpus: the GPUs visible; None counts them (:func:`brats_seg.backend.visible_gpus`,
            TensorFlow's count if it is imported, else ``nvidia-smi``'s).
        cpuinfo: ``/proc/cpuinfo`` text to judge bf16 support by (tests); None reads the host's.

    Raises:
        ValueError: a bad config value, named as the user types it; a run predicted not to fit,
            with the numbers and the fix; ``lms=offload`` on a CPU-only run.
        BackendError: a backend or precision this machine cannot run.
    """
    if isinstance(cfg, ResolvedRun):
        return cfg
    config = resolve_model_outputs(cfg)
    check_train_config(config, training=training)  # on the paths as given: an unset data.root is named
    config = resolve_paths(config)
    backend = decide_backend(config.backend, gpus, cpuinfo, require_gpu=training)
    strategy, reason = lms_strategy(config.lms.name, backend.name, backend.device)
    replicas, chief = planned_replicas(config.distribute, backend.device, backend.n_gpus) if training else (1, True)
    run = ResolvedRun(config, backend, replicas, chief, strategy, reason=reason)
    if training:
        stored = _stored_plans(config.run_dir, run) if chief and has_progress(Path(config.run_dir)) else None
        run = _planned(run, stored)
    log.info(
        "run resolved: backend %s on %s (%s), precision %s (policy %s)%s, %d output(s)%s%s",
        run.backend.name,
        run.device,
        run.backend.reason or "as configured",
        run.backend.precision,
        run.backend.policy,
        ", XLA" if run.backend.xla else "",
        config.model.out_channels,
        f", region parents {config.model.region_parents}" if any(p >= 0 for p in config.model.region_parents) else "",
        f", {replicas} replicas" if replicas > 1 else "",
    )
    return run


def resolve_inference(
    run_config: TrainConfig,
    backend: BackendConfig,
    precision_given: bool = False,
    *,
    gpus: int | None = None,
    cpuinfo: str | None = None,
) -> ResolvedBackend:
    """The backend a command that infers with a trained run's model uses (evaluate, predict,
    export, the studies): the twin of :func:`resolve_run`, decided once before TensorFlow is
    imported and applied by :func:`brats_seg.backend.configure`.

    The precision is ``backend.precision`` when the command line gives it (``precision_given``),
    else the run's own, so a bf16 run is evaluated in bf16 (half the memory) -- except on a CPU
    without native bf16, where oneDNN cannot run it: fp32, said once. A run trained in fp16
    (a GPU's) infers in fp32 unless told otherwise.

    Args:
        run_config: the trained run's config (its ``config.json``).
        backend: the inferring command's ``backend`` group (its device decides).
        precision_given: ``backend.precision=`` was given on the command line.

    Raises:
        BackendError: a backend or a given precision this machine cannot run.
    """
    from brats_seg.backend import concrete_backend, visible_gpus
    from brats_seg.checks import check_backend_config
    from brats_seg.cpu import cpu_model_name, has_native_bf16

    check_backend_config(backend)
    gpus = visible_gpus() if gpus is None else gpus
    precision = str(backend.precision) if precision_given else str(run_config.backend.precision)
    if not precision_given:
        if (
            precision == "bf16"
            and concrete_backend(backend.name, gpus)[0] == "cpu_onednn"
            and not has_native_bf16(cpuinfo)
        ):
            log.warning(
                "the run trained in bf16; this CPU (%s) has no native bf16, so its model infers in fp32 "
                "(about twice the memory of bf16)",
                cpu_model_name(cpuinfo),
            )
            precision = "fp32"
        precision = precision if precision in ("fp32", "bf16") else "fp32"
    return decide_backend(dataclasses.replace(backend, precision=precision), gpus, cpuinfo)


def per_replica(cfg: TrainConfig, replicas: int) -> TrainConfig:
    """``cfg`` with one replica's share of the global batch (what one device's memory must hold).

    Raises:
        ValueError: ``trainer.batch_size`` does not divide among the replicas.
    """
    t = cfg.trainer
    if t.batch_size % replicas:
        raise ValueError(
            f"trainer.batch_size={t.batch_size} is the global batch and must divide among the "
            f"{replicas} replicas of distribute={cfg.distribute.name}: use a multiple of {replicas}."
        )
    return dataclasses.replace(cfg, trainer=dataclasses.replace(t, batch_size=t.batch_size // replicas))


def stage_config(cfg: TrainConfig, stage: Stage) -> TrainConfig:
    """``cfg`` as one stage of its patch schedule trains it: the stage's patch (None: the whole
    volume) and global batch, and no schedule (what the planner, the data and the model read)."""
    t = dataclasses.replace(
        cfg.trainer,
        patch_size=None if stage.patch is None else list(stage.patch),
        batch_size=stage.batch_size,
        patch_schedule=None,
    )
    return dataclasses.replace(cfg, trainer=t)


def _schedule(cfg: TrainConfig) -> tuple[Stage, ...] | None:
    t = cfg.trainer
    return parse_schedule(t.patch_schedule, cfg.resolution.shape, cfg.model.depth, t.batch_size)


def _plans(run: ResolvedRun, configs: list[tuple[str, TrainConfig]]):
    """Plan each config (one replica's share of its batch) under the run's strategy: ``(backend,
    strategy, reason, plans)``. On a GPU ``backend=auto`` chose, a config whose plan without LMS
    does not fit moves the whole run to ``gpu_lms`` with ``lms=auto``, and every config is planned so.

    Raises:
        ValueError: a config predicted not to fit, named (``where``) with the numbers and the fix.
    """
    from brats_seg.lms.planner.plan import PlanDoesNotFitError
    from brats_seg.lms.planner.preflight import plan_run

    backend, strategy, reason = run.backend, run.lms, run.reason

    def plan_all():
        plans = []
        for where, cfg in configs:
            try:
                plans.append(plan_run(per_replica(cfg, run.replicas), backend.device, strategy))
            except PlanDoesNotFitError as e:
                e.where = where
                raise
        return plans

    try:
        try:
            plans = plan_all()
        except PlanDoesNotFitError as e:
            if not (backend.reason and backend.device == "GPU" and strategy == "off"):
                raise
            # backend=auto chose this GPU: add LMS (and drop XLA, which would undo its host placements) rather than fail
            strategy, reason = (
                "auto",
                (
                    f"backend=auto ({backend.reason}): the plan{e.where} without LMS does not fit "
                    f"({e.smallest_peak_bytes / 1e9:.2f} GB predicted); using gpu_lms with lms=auto"
                ),
            )
            backend = dataclasses.replace(backend, name="gpu_lms", reason=reason, xla=False)
            plans = plan_all()
    except PlanDoesNotFitError as e:
        raise ValueError(f"{e.where.strip(' ()') + ': ' if e.where else ''}{e}") from e
    return backend, strategy, reason, plans


def planned(run: ResolvedRun) -> ResolvedRun:
    """``run`` with its plan and, with ``trainer.patch_schedule``, each stage's, as training plans
    them (for a command that states a run's costs without training it: ``plan_memory.py``)."""
    return _planned(run, None)


def _stage_starts(cfg: TrainConfig, stages: tuple[Stage, ...], plans) -> list[int | None]:
    """Each stage's first epoch without a time budget (None with one: the clock decides). For
    ``grow`` the time shares become epoch shares by each stage's predicted epoch time (its steps
    per case's voxels times the predicted step), where the step-time model has one (a CPU)."""
    t = cfg.trainer
    if t.time_budget_s:
        return [None] * len(stages)
    shares = [s.share for s in stages]
    times = [p.predicted_step_s for p in plans]
    if str(t.patch_schedule).strip().lower() == GROW and all(x is not None for x in times):
        from brats_seg.data.patches import crops_per_case

        epoch_s = [crops_per_case(cfg.resolution.shape, s.patch) / s.batch_size * x for s, x in zip(stages, times)]
        weights = [share / e for share, e in zip(shares, epoch_s)]
        shares = [w / sum(weights) for w in weights]
    return list(stage_epochs([dataclasses.replace(s, share=x) for s, x in zip(stages, shares)], t.epochs))


def _planned(run: ResolvedRun, stored: tuple[Plan, tuple[PlannedStage, ...]] | None) -> ResolvedRun:
    """``run`` with its memory plan against ``lms.limit`` for one replica's share of the batch
    (with a patch schedule, each stage's plan: a stage that does not fit is refused now, named),
    or the plans a resumed run started with (``stored``: its plan.json's, :func:`_stored_plans`),
    logged once with the reason.

    Raises:
        ValueError: the run (or a stage) is predicted not to fit, with the numbers and the fix.
    """
    cfg, backend, strategy, reason = run.config, run.backend, run.lms, run.reason
    schedule = _schedule(cfg)
    if stored is not None and len(stored[1]) == len(schedule or ()):
        plan, stages = stored
        if plan.strategy == "auto" and backend.name == "gpu" and backend.reason:
            backend = dataclasses.replace(backend, name="gpu_lms", xla=False)
        log.info(
            "backend %s, lms=%s: resuming under the run's plan.json (predicted peak %.2f GB within %.2f GB%s)",
            backend.name,
            plan.strategy,
            plan.predicted_peak_bytes / 1e9,
            plan.budget_bytes / 1e9,
            f"; {len(stages)} stages" if stages else "",
        )
        return dataclasses.replace(
            run,
            backend=backend,
            lms=plan.strategy,
            plan=plan,
            reason=f"{reason}; the plan the run started with (plan.json)",
            stages=stages,
        )
    if schedule is None:
        configs = [("", cfg)]
    else:
        for i, stage in enumerate(schedule):
            if stage.batch_size % run.replicas:
                raise ValueError(
                    f"trainer.patch_schedule[{i}].batch_size={stage.batch_size} is a global batch and must divide "
                    f"among the {run.replicas} replicas of distribute={cfg.distribute.name}: use a multiple of "
                    f"{run.replicas}."
                )
        configs = [
            (
                f" (trainer.patch_schedule stage {i + 1} of {len(schedule)}, {s.name}, batch {s.batch_size})",
                stage_config(cfg, s),
            )
            for i, s in enumerate(schedule)
        ]
    backend, strategy, reason, plans = _plans(run, configs)
    plan = max(plans, key=lambda p: p.predicted_peak_bytes)
    stages = ()
    if schedule is not None:
        starts = _stage_starts(cfg, schedule, plans)
        stages = tuple(PlannedStage(s, p, first) for s, p, first in zip(schedule, plans, starts))
    if backend.xla and strategy != "off" and any(p != "keep" for pl in plans for p in pl.policies.values()):
        backend = dataclasses.replace(backend, xla=False)  # XLA would drop the plan's host placements
        reason += "; backend.xla off: XLA would drop the plan's recompute/offload placements"
    if backend.reason and backend.reason not in reason:
        reason = f"backend=auto chose {backend.name} ({backend.reason}); {reason}"
    log.info(
        "backend %s, lms=%s (%s). Memory plan: predicted peak %.2f GB within %.2f GB (lms.limit %.2f GB "
        "less %.1f%% for the planner's error)",
        backend.name,
        strategy,
        reason,
        plan.predicted_peak_bytes / 1e9,
        plan.budget_bytes / 1e9,
        plan.limit_bytes / 1e9,
        100 * plan.margin,
    )
    for i, st in enumerate(stages):
        log.info(
            "stage %d/%d %s, batch %d, share %.3g%s: predicted peak %.2f GB%s%s",
            i + 1,
            len(stages),
            st.stage.name,
            st.stage.batch_size,
            st.stage.share,
            "" if st.first_epoch is None else f" (from epoch {st.first_epoch + 1})",
            st.plan.predicted_peak_bytes / 1e9,
            "" if st.plan.predicted_step_s is None else f", step {st.plan.predicted_step_s:.2f} s",
            "".join(f", {b}={p}" for b, p in st.plan.policies.items() if p != "keep"),
        )
    return dataclasses.replace(run, backend=backend, lms=strategy, plan=plan, reason=reason, stages=stages)


def planned_for(run: ResolvedRun, replicas: int | None = None) -> dict:
    """The settings a run's memory plan depends on beyond its model and input (which a resumed run
    cannot change): ``lms.*``, the backend and precision, the batch one replica holds, a GPU cap."""
    cfg, replicas = run.config, run.replicas if replicas is None else replicas
    return {
        "lms": {k: str(v) if k in ("name", "limit") else v for k, v in dataclasses.asdict(cfg.lms).items()},
        "backend": str(cfg.backend.name),
        "device": run.backend.device,
        "precision": str(cfg.backend.precision),
        "replica_batch": cfg.trainer.batch_size // max(replicas, 1),
        "gpu_memory_limit_mb": cfg.backend.gpu_memory_limit_mb,
    }


def stored_plan(run_dir: str | Path, run: ResolvedRun, replicas: int | None = None) -> Plan | None:
    """The :class:`~brats_seg.lms.planner.plan.Plan` a run with progress was trained under, if it
    was made for this run's memory settings; None (planning again, and saying why) if they
    changed since (``lms.limit=`` on the resuming command, another precision or replica count),
    or the folder has no readable plan of this version."""
    stored = _stored_plans(run_dir, run, replicas)
    return None if stored is None else stored[0]


def _stored_plans(run_dir, run: ResolvedRun, replicas: int | None = None):
    """:func:`stored_plan` and the stages' plans of a patch schedule (``()`` without one)."""
    from brats_seg.lms.planner.plan import Plan

    folder = RunFolder(Path(run_dir))
    record = folder.read_plan()
    if record is None:
        log.warning("%s has progress but no readable plan.json: planning again", run_dir)
        return None
    before, now = record.get("planned_for"), planned_for(run, replicas)
    if before is None:
        log.info("%s: plan.json of an earlier version (no planned_for): planning again", run_dir)
        return None
    flat_before, flat_now = flatten_config(before), flatten_config(now)
    changed = {
        k: (flat_before.get(k), flat_now.get(k))
        for k in sorted(set(flat_before) | set(flat_now))
        if flat_before.get(k) != flat_now.get(k)
    }
    if changed:
        log.warning(
            "re-planning on purpose: %s changed since the run's plan.json was made; the new plan replaces it",
            ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()),
        )
        return None
    try:
        return Plan.from_dict(record), tuple(PlannedStage.from_dict(d) for d in record.get("stages", ()))
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s: %s; planning again", folder.plan_paths[1], e)
        return None
