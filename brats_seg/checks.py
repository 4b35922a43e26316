"""Every value of a run's config checked before anything is prepared or written.

:func:`check_train_config` runs once per start, where the run is resolved
(:func:`brats_seg.resolve.resolve_run`), in a fraction of a second: a typo (``trainer.lr_schedule=cosin``), a bad size
(``trainer.batch_size=-1``), a shape the U-Net cannot take (``resolution.shape=[50,50,50]``)
or an unreadable ``lms.limit=16gigs`` fails here, naming the key and what to use, before data
preparation and before the run folder gets its ``config.json``, so the corrected command
runs in the same ``run_dir``. The memory plan is the next check
(made by :func:`brats_seg.resolve.resolve_run` after these checks), also before anything is written.

Pure Python (no TensorFlow or MLflow import): ``train.py`` runs it before the backend is
configured, so a bad value fails in about a second. The closed sets are the config's own
(:data:`brats_seg.config.CHOICES`), which Hydra also enforces at composition; this check
catches the same values in a ``TrainConfig`` built in code.
"""

from __future__ import annotations

from brats_seg.choices import check_choice
from brats_seg.config import (
    BackendConfig,
    BackendName,
    LMSStrategy,
    LRSchedule,
    OnError,
    Precision,
    TrackerName,
    TrainConfig,
    check_distribute_config,
)
from brats_seg.model.checks import check_input_shape, check_model_config
from brats_seg.run_dir import RunFolder

__all__ = ["check_patch_config", "check_train_config"]


def _positive_int(value, key: str, minimum: int = 1, what: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key}={value!r}: use an integer >= {minimum}{f' ({what})' if what else ''}.")


def _fraction(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{key}={value!r}: use a share of the cases in [0, 1).")


def check_train_config(cfg: TrainConfig, training: bool = True) -> None:
    """Check the values a training run uses; the first bad one raises, named as the user types it.

    Args:
        training: the run trains into ``run_dir`` (checked too); False for the planner's entry
            points, which plan a config without a run folder.

    Raises:
        ValueError: an unknown choice (with the allowed values), a size that is not positive,
            a shape not divisible by ``2**model.depth`` (with the nearest that are), an
            unreadable ``lms.limit``, ``data.root`` unset, missing or without the layout's cases
            for a dataset that is not generated (training only), a
            ``run_dir`` holding another program's files (:class:`~brats_seg.run_dir.RunError`).
    """
    from brats_seg.data.dataset import GENERATED
    from brats_seg.data.layouts import check_dataset_root
    from brats_seg.lms.planner.units import parse_limit

    if training and not cfg.run_dir:
        raise ValueError("run_dir is not set: pass run_dir=outputs/<name>.")
    if training:
        RunFolder.of(cfg.run_dir).check_can_hold_a_run()  # not a dataset, a home folder, another project's outputs
    d, t = cfg.data, cfg.trainer
    if not str(d.root).strip() and d.name not in GENERATED:
        raise ValueError(f"data.root is not set: pass data.root=/path/to/your/dataset (data={d.name}).")
    if training and d.name not in GENERATED:  # a second, not TensorFlow's start-up, before a missing folder is said
        check_dataset_root(d.root, d.layout)
    check_choice(d.on_error, OnError, "data.on_error")
    if str(d.num_workers).strip().lower() != "auto":
        workers = d.num_workers
        if isinstance(workers, str) and workers.strip().lstrip("-").isdigit():
            workers = int(workers)
        _positive_int(workers, "data.num_workers", what="or auto: the cores this process may use")
    _positive_int(d.prefetch_batches, "data.prefetch_batches", minimum=0)
    _fraction(d.val_fraction, "data.val_fraction")
    _fraction(d.test_fraction, "data.test_fraction")
    if d.val_fraction + d.test_fraction >= 1.0:
        raise ValueError(
            f"data.val_fraction={d.val_fraction} + data.test_fraction={d.test_fraction} leaves no "
            "training cases: keep their sum below 1."
        )

    _positive_int(t.epochs, "trainer.epochs")
    _positive_int(t.batch_size, "trainer.batch_size", what="the global batch")
    if t.steps_per_epoch is not None:
        _positive_int(t.steps_per_epoch, "trainer.steps_per_epoch", what="or null for one pass over the cases")
    _positive_int(t.val_every, "trainer.val_every")
    _positive_int(t.val_cases, "trainer.val_cases", minimum=0, what="0 validates on every val case")
    _positive_int(t.warmup_epochs, "trainer.warmup_epochs", minimum=0)
    _positive_int(t.early_stopping_patience, "trainer.early_stopping_patience", minimum=0, what="0 = off")
    _positive_int(t.dead_region_epochs, "trainer.dead_region_epochs", minimum=0, what="0 = off")
    if isinstance(t.learning_rate, bool) or not isinstance(t.learning_rate, (int, float)) or not t.learning_rate > 0:
        raise ValueError(f"trainer.learning_rate={t.learning_rate!r}: use a positive number (e.g. 3e-3).")
    if not t.bce_weight >= 0:
        raise ValueError(f"trainer.bce_weight={t.bce_weight!r}: use a number >= 0 (0 = soft Dice only).")
    check_choice(t.lr_schedule, LRSchedule, "trainer.lr_schedule")

    check_model_config(cfg.model)
    check_input_shape(cfg.resolution.shape, cfg.model.depth)
    check_patch_config(cfg)
    check_backend_config(cfg.backend)
    check_choice(cfg.lms.name, LMSStrategy, "lms")
    parse_limit(cfg.lms.limit, device_bytes=1 << 40)  # its form; a fraction's bytes are the device's (the plan)
    check_choice(cfg.tracking.name, TrackerName, "tracking")
    check_register_as(cfg.tracking.name, cfg.tracking.register_as)
    check_distribute_config(cfg.distribute)


def check_backend_config(cfg: BackendConfig) -> None:
    """The ``backend`` group's names (a run's, or an inferring command's), before its decision
    (:func:`brats_seg.backend.decide_backend`)."""
    check_choice(cfg.name, BackendName, "backend")
    check_choice(cfg.precision, Precision, "backend.precision")


def check_register_as(tracker: str, name: str) -> None:
    """``tracking.register_as``: refused before training, not at its end, where the model is
    registered: without MLflow tracking, or a name the Model Registry refuses (its own rules)."""
    if not name:
        return
    if str(tracker) != "mlflow":
        raise ValueError(
            f"tracking.register_as={name!r} registers the run's MLflow model, but tracking={tracker}: "
            "use tracking=mlflow, or drop tracking.register_as."
        )
    # the registry's rule (MLflow's _validate_model_name, not public API: the copy is
    # held to it by tests/unit/test_check_first.py): not blank, no '/' or ':', and a name that stays
    # itself as a path ('.' and names beginning with '..' do not)
    why = (
        "it is blank"
        if not name.strip()
        else "names cannot contain '/' or ':'"
        if "/" in name or ":" in name
        else "it would resolve to another name as a path"
        if name == "." or name.startswith("..")
        else None
    )
    if why:
        raise ValueError(
            f"tracking.register_as={name!r}: the Model Registry refuses this name ({why}); "
            "choose another, e.g. brats-demo."
        )


def check_patch_config(cfg: TrainConfig) -> None:
    """``trainer.patch_size``, ``trainer.patch_schedule``, ``trainer.foreground_fraction`` and
    ``trainer.time_budget_s``.

    A patch is 3 sides, each a multiple of ``2**model.depth`` (the U-Net halves it ``depth``
    times) and at most ``resolution.shape`` on its axis; the message lists the allowed sides.

    Raises:
        ValueError: naming the key and what to use.
    """
    t = cfg.trainer
    fraction = t.foreground_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise ValueError(
            f"trainer.foreground_fraction={fraction!r}: use a share of the crops in [0, 1] "
            "(nnU-Net's 0.33; 0 = crops anywhere, 1 = every crop holds tumour)."
        )
    budget = t.time_budget_s
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
        raise ValueError(f"trainer.time_budget_s={budget!r}: use seconds of training >= 0 (0 = no budget).")
    from brats_seg.patch_schedule import check_patch, parse_schedule

    if t.patch_schedule is not None and t.patch_schedule != []:
        if t.patch_size:
            raise ValueError(
                f"trainer.patch_size={list(t.patch_size)} and trainer.patch_schedule={t.patch_schedule!r} both "
                "given: the schedule names each stage's patch; give one of them (patch_size=null with a schedule)."
            )
        parse_schedule(t.patch_schedule, cfg.resolution.shape, cfg.model.depth, t.batch_size)
    check_patch(t.patch_size or None, "trainer.patch_size", cfg.resolution.shape, cfg.model.depth)
