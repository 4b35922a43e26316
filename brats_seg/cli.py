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
def user_errors():
    """Report bad data, config and environment as messages, not tracebacks; exit status 2.

    Messages of this package's ValueErrors are written for users (what, which value, what
    to do), so they are shown as they are.
    """
    from brats_seg.backend import BackendError
    from brats_seg.lms.plan import PlanDoesNotFitError

    try:
        yield
    except (ValueError, FileNotFoundError, BackendError, PlanDoesNotFitError) as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
