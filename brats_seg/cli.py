"""Entry-point glue: the only package module that knows Hydra/OmegaConf.

Scripts call :func:`to_config` once to turn the composed config into the plain
dataclasses of :mod:`brats_seg.config`, and wrap their body in :func:`user_errors` so
bad input ends in a one-paragraph message and a non-zero exit, not a stack trace.
"""

from __future__ import annotations

import contextlib
import logging
import sys

__all__ = ["to_config", "user_errors"]

log = logging.getLogger(__name__)

#: Exit status of a ``multi_worker`` run whose cluster lost (or never got) a worker.
EXIT_CLUSTER_FAILURE = 3


def to_config(cfg):
    """Convert a composed structured config to its dataclass (``OmegaConf.to_object``)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        sys.stderr.write(f"error: {e.full_key} is required: pass {e.full_key}=...\n")
        raise SystemExit(2) from None


@contextlib.contextmanager
def user_errors(stage: str = "the command"):
    """Report bad data, config and environment as messages, not tracebacks; exit status 2.

    Messages of this package's ValueErrors are written for users (what, which value, what
    to do), so they are shown as they are. SIGTERM/SIGINT inside the block stop ``stage``
    (:func:`brats_seg.signals.stop_on_signals`; training saves its step first) with exit
    status 75: the same command continues.
    """
    from brats_seg.signals import Interrupted, stop_on_signals

    from brats_seg.backend import BackendError
    from brats_seg.distribute.cluster import ClusterError
    from brats_seg.files import DiskFullError, LockedError
    from brats_seg.lms.planner.plan import PlanDoesNotFitError

    try:
        with stop_on_signals(stage):
            yield
    except (ValueError, FileNotFoundError, BackendError, PlanDoesNotFitError, ClusterError, LockedError,
            DiskFullError) as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
    except Interrupted as e:  # what was finished is kept; the same command continues
        from brats_seg.training.preemption import EXIT_PREEMPTED

        sys.stderr.write(f"{e}\n")
        raise SystemExit(EXIT_PREEMPTED) from None
    except Exception as e:  # the two training outcomes that are not bugs (no TensorFlow import here)
        from brats_seg.distribute.cluster import ClusterFailure
        from brats_seg.training.preemption import EXIT_PREEMPTED, Preempted

        if isinstance(e, Preempted):  # saved; the same command resumes
            sys.stderr.write(f"{e}\n")
            raise SystemExit(EXIT_PREEMPTED) from None
        if isinstance(e, ClusterFailure):  # a worker lost or never came
            sys.stderr.write(f"error: {e}\n")
            raise SystemExit(EXIT_CLUSTER_FAILURE) from None
        raise
