"""Entry-point glue: the only package module that knows Hydra/OmegaConf.

Scripts declare their main function with :func:`hydra_entry` (``hydra.main`` whose
composition errors -- an unknown key, a value of the wrong type, a choice outside its set,
a config group option that does not exist, an override that does not parse -- end in one
line naming the key, and exit status 2), call :func:`to_config` once to turn the composed
config into the plain dataclasses of :mod:`brats_seg.config`, and wrap their body in
:func:`user_errors` so bad input ends in a one-paragraph message and a non-zero exit, not a
stack trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import logging
import os
import sys

__all__ = ["config_error_line", "hydra_entry", "to_config", "user_errors"]

log = logging.getLogger(__name__)

#: Exit status of a ``multi_worker`` run whose cluster lost (or never got) a worker.
EXIT_CLUSTER_FAILURE = 3


def hydra_entry(config_path: str, config_name: str):
    """``hydra.main(config_path, config_name, version_base="1.3")`` with one-line composition errors.

    Hydra reports a bad override in several lines of its own plus OmegaConf's (``full_key:``,
    ``object_type=``) and exits 1; here it is one line, ``error: <key>=<value>: <what to use>``,
    and exit status 2, as for every other bad value. Errors inside the task are left to it
    (:func:`user_errors`), and a bug still shows its traceback.
    """
    import hydra

    def decorate(task):
        hydra_task = hydra.main(config_path=config_path, config_name=config_name, version_base="1.3")(task)

        @functools.wraps(task)
        def main():
            from hydra.errors import HydraException
            from omegaconf.errors import OmegaConfBaseException

            previous = os.environ.get("HYDRA_FULL_ERROR")
            os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its report
            try:
                return hydra_task()
            except (HydraException, OmegaConfBaseException) as e:
                sys.stderr.write(f"error: {config_error_line(e)}\n")
                raise SystemExit(2) from None
            finally:
                if previous is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = previous

        return main

    return decorate


def _schema_fields(full_key: str):
    """The dataclass fields of the node that holds ``full_key`` in the train schema (or None)."""
    from brats_seg.config import EvaluateScriptConfig, PredictScriptConfig, ScoreScriptConfig, TrainConfig

    parts = full_key.split(".")[:-1]
    for root in (TrainConfig, EvaluateScriptConfig, PredictScriptConfig, ScoreScriptConfig):
        node = root
        for part in parts:
            field = {f.name: f for f in dataclasses.fields(node)}.get(part)
            if field is None or not dataclasses.is_dataclass(field.default_factory()
                                                             if callable(field.default_factory) else None):
                node = None
                break
            node = type(field.default_factory())
        if node is not None:
            return [f.name for f in dataclasses.fields(node)]
    return None


def _first_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).strip().splitlines()[:1])


def config_error_line(exc: BaseException) -> str:
    """One line for a Hydra/OmegaConf composition error: the key (or override), what was wrong,
    what to use, and for a near miss the key or option probably meant."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigKeyError, ValidationError

    cause = exc.__cause__ if exc.__cause__ is not None else exc
    text = str(exc)
    override = None
    for marker in ("Error merging override ", "Could not override '", "Could not append to config. An item is already at '",
                   "Could not delete from config. ", "Error parsing override '"):
        if marker in text:
            override = text.split(marker, 1)[1].splitlines()[0].rstrip("'.").strip()
            break
    if isinstance(exc, MissingConfigException):
        group = (exc.missing_cfg_file or "").rsplit("/", 1)
        options = ", ".join(exc.options or [])
        if len(group) == 2 and exc.options:
            near = difflib.get_close_matches(group[1], exc.options, n=1, cutoff=0.6)
            hint = f" Did you mean {group[0]}={near[0]}?" if near else ""
            return f"{group[0]}={group[1]}: no such {group[0]} config; use one of {options}.{hint}"
        return _first_line(text)
    if isinstance(exc, OverrideParseException):
        given = getattr(exc, "override", None) or override or "an override"
        detail = " ".join(line.strip() for line in str(getattr(exc, "message", text)).splitlines()
                          if line.strip() and not line.startswith("See "))
        if "missing EQUAL" in detail:
            return f"{given}: an override needs a value: write {given}=<value>."
        return (f"{given}: cannot parse it ({detail}); write key=value, a list as key=[a,b] "
                "(https://hydra.cc/docs/advanced/override_grammar/basic/).")
    full_key = getattr(cause, "full_key", None) or (override.split("=", 1)[0].lstrip("+~") if override else None)
    if isinstance(cause, ConfigKeyError) or "not in '" in str(cause) or "Key '" in str(cause):
        if full_key:
            fields = _schema_fields(full_key) or []
            name = full_key.rsplit(".", 1)[-1]
            parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
            near = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
            hint = f" Did you mean {(parent + '.') if parent else ''}{near[0]}?" if near else ""
            where = f"{parent} has" if parent else "the config has"
            shown = ", ".join(fields[:12]) + (", ..." if len(fields) > 12 else "")
            return f"{full_key}: no such key ({where} {shown}).{hint}" if fields else f"{full_key}: no such key.{hint}"
    if isinstance(cause, ValidationError) and full_key:
        msg = getattr(cause, "msg", None) or _first_line(str(cause))
        value = override.split("=", 1)[1] if override and "=" in override else None
        if "expected one of [" in msg:  # a closed set (Enum field)
            allowed = [a.strip() for a in msg.split("expected one of [", 1)[1].rstrip("]").split(",")]
            from brats_seg.choices import check_choice

            try:
                check_choice(value if value is not None else msg, allowed, full_key)
            except ValueError as e:
                return str(e)
        return f"{full_key}={value}: {_first_line(msg)}." if value is not None else f"{full_key}: {_first_line(msg)}."
    line = _first_line(getattr(cause, "msg", None) or str(cause))
    return f"{override}: {line}" if override else line


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
