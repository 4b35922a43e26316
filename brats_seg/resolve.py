"""A run resolved once: the user's config and the machine turned into every decision the run depends on.

:func:`resolve_run` is called once per start, by the entry points (``train.py``,
``scripts/plan_memory.py``, ``scripts/benchmark.py``, ``scripts/profile_step.py``) and by
:func:`brats_seg.training.loop.train` when code hands it a plain config. It returns a frozen
:class:`ResolvedRun` holding

- ``config``: a copy of the user's config with its derived values filled in -- the model's
  outputs and region parents (:func:`brats_seg.data.labels.resolve_model_outputs`) and absolute
  data, cache and run paths -- every value checked once (:func:`brats_seg.checks.check_train_config`);
- ``backend``: the backend, device and precision policy, and why
  (:func:`brats_seg.backend.decide_backend`, the one place they are decided);

and, once training knows how many replicas share the batch, the LMS strategy and its memory
plan (:meth:`ResolvedRun.with_plan`: planned by :func:`brats_seg.training.build.preflight_plan`,
or read back from the run folder's ``plan.json`` on resume). The user's config object is never
written into. Pure Python: nothing here imports TensorFlow, so a start resolves (and a bad
value fails) in about a second.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from brats_seg.backend import ResolvedBackend, decide_backend, visible_gpus
from brats_seg.checks import check_train_config
from brats_seg.config import TrainConfig
from brats_seg.data.labels import resolve_model_outputs

if TYPE_CHECKING:
    from brats_seg.lms.planner.plan import Plan

__all__ = ["ResolvedRun", "resolve_paths", "resolve_run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedRun:
    """Every decision a run depends on, taken once (:func:`resolve_run`).

    Attributes:
        config: the run's config with its derived values (model outputs, region parents,
            absolute paths); what training writes to ``config.json``. Read it, do not edit it.
        backend: backend, device, precision and Keras policy, with ``reason`` when ``auto`` chose.
        lms: the LMS strategy planned (``off``/``recompute``/``offload``/``auto``); empty until planned.
        plan: the memory plan the run trains under; None until planned.
        reason: why this backend and LMS strategy, in words (logged, and kept in the MLflow tags).
    """

    config: TrainConfig
    backend: ResolvedBackend
    lms: str = ""
    plan: Plan | None = None
    reason: str = ""

    @property
    def device(self) -> str:
        """``CPU`` or ``GPU``: where the run computes and what its memory must fit."""
        return self.backend.device

    def with_backend(self, backend: ResolvedBackend) -> ResolvedRun:
        """The run under the backend :func:`brats_seg.backend.configure` set up (TensorFlow's view of
        the GPUs, which may differ from ``nvidia-smi``'s).

        Raises:
            ValueError: the configured device is not the one the run was resolved for.
        """
        if backend.device != self.backend.device:
            raise ValueError(f"the run was resolved for {self.backend.device} ({self.backend.reason or self.backend.name}) "
                             f"but TensorFlow set up {backend.device} ({backend.reason or backend.name}): "
                             "name the backend (backend=cpu_onednn or backend=gpu) to decide it.")
        return dataclasses.replace(self, backend=backend)

    def with_plan(self, backend: ResolvedBackend, lms: str, plan: Plan, reason: str) -> ResolvedRun:
        """The run with its LMS strategy and memory plan decided."""
        return dataclasses.replace(self, backend=backend, lms=lms, plan=plan, reason=reason)


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """A copy of ``cfg`` with absolute data, cache and run paths (so the run folder's config works
    from any cwd); an unset ``run_dir`` stays unset."""
    data = dataclasses.replace(cfg.data, root=str(Path(cfg.data.root).expanduser().resolve()),
                               cache_dir=str(Path(cfg.data.cache_dir).expanduser().resolve()))
    run_dir = str(Path(cfg.run_dir).expanduser().resolve()) if cfg.run_dir else ""
    return dataclasses.replace(cfg, data=data, run_dir=run_dir)


def resolve_run(cfg: TrainConfig | ResolvedRun, *, training: bool = True, gpus: int | None = None,
                cpuinfo: str | None = None) -> ResolvedRun:
    """The run ``cfg`` describes on this machine, every value checked: the one place its derived
    values and its backend are decided. A :class:`ResolvedRun` is returned as it is.

    Args:
        cfg: the user's config (not written into).
        training: the run trains here, into ``run_dir`` (checked; a GPU backend needs a visible GPU);
            False for the planner's entry points, which plan for a device without needing it.
        gpus: the GPUs visible; None counts them (:func:`brats_seg.backend.visible_gpus`,
            TensorFlow's count if it is imported, else ``nvidia-smi``'s).
        cpuinfo: ``/proc/cpuinfo`` text to judge bf16 support by (tests); None reads the host's.

    Raises:
        ValueError: a bad config value, named as the user types it.
        BackendError: a backend or precision this machine cannot run.
    """
    if isinstance(cfg, ResolvedRun):
        return cfg
    config = resolve_model_outputs(cfg)
    check_train_config(config, training=training)  # on the paths as given: an unset data.root is named
    config = resolve_paths(config)
    backend = decide_backend(config.backend, visible_gpus() if gpus is None else gpus, cpuinfo, require_gpu=training)
    log.info("run resolved: backend %s on %s (%s), precision %s (policy %s), %d output(s)%s",
             backend.name, backend.device, backend.reason or "as configured", backend.precision, backend.policy,
             config.model.out_channels,
             f", region parents {config.model.region_parents}" if any(p >= 0 for p in config.model.region_parents)
             else "")
    return ResolvedRun(config, backend)
