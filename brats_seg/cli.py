"""Entry-point glue: what train.py and the scripts need of Hydra/OmegaConf.

Scripts declare their main function with :func:`hydra_entry` (``hydra.main`` whose
composition errors -- an unknown key, a value of the wrong type, a choice outside its set,
a config group option that does not exist, an override that does not parse -- end in one
line naming the key, and exit status 2), call :func:`to_config` once to turn the composed
config into the plain dataclasses of :mod:`brats_seg.config` (the run's) and
:mod:`brats_seg.script_configs` (the scripts'), and wrap their body in
:func:`user_errors` so bad input ends in a one-paragraph message and a non-zero exit, not a
stack trace.

One more piece of glue for code that is not a user's command: :func:`child_command`/:func:`child_args`
are the one protocol by which a script starts itself as a child process (values its parent already
checked, passed as JSON, no Hydra in the child). Where the project's folder is and a config composed
from recorded overrides are :mod:`brats_seg.project`'s, for library code: no module of the package
imports this one (tests/unit/test_layout.py); train.py, the scripts and the tests do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import json
import logging
import os
import sys

__all__ = [
    "child_args",
    "child_command",
    "config_error_line",
    "given_override",
    "hydra_entry",
    "to_config",
    "user_errors",
]

log = logging.getLogger(__name__)

#: Exit status of a ``multi_worker`` run whose cluster lost (or never got) a worker.
EXIT_CLUSTER_FAILURE = 3

#: Each entry point's config file -> its schema in :mod:`brats_seg.script_configs` (``TrainConfig``:
#: :mod:`brats_seg.config`), for the near-miss hints of a bad key; a file not named here composes
#: ``TrainConfig``.
_ENTRY_SCHEMAS = {
    "train": "TrainConfig",
    "plan_memory": "PlanMemoryConfig",
    "benchmark": "BenchmarkScriptConfig",
    "evaluate": "EvaluateScriptConfig",
    "predict": "PredictScriptConfig",
    "score": "ScoreScriptConfig",
    "export": "ExportScriptConfig",
    "prepare": "PrepareConfig",
    "study": "StudyScriptConfig",
    "calibrate_step_time": "StepTimeCalibrationConfig",
    "calibrate_memory": "MemoryCalibrationConfig",
    "scaling": "ScalingScriptConfig",
    "measure_inference_peak": "InferencePeakConfig",
    "make_mni_gliomas": "MniGliomasScriptConfig",
    "check_official_metrics": "OfficialMetricsCheckConfig",
    "demo_seeds": "DemoSeedsScriptConfig",
    "profile_augment": "AugmentProfileConfig",
    "region_gradients": "RegionGradientsConfig",
}


def hydra_entry(config_path: str, config_name: str):
    """``hydra.main(config_path, config_name, version_base="1.3")`` with one-line composition errors.

    Hydra reports a bad override in several lines of its own plus OmegaConf's (``full_key:``,
    ``object_type=``) and exits 1; here it is one line, ``error: <key>=<value>: <what to use>``,
    and exit status 2, as for every other bad value. Errors inside the task are left to it
    (:func:`user_errors`), and a bug still shows its traceback.
    """
    import hydra

    from brats_seg import config, script_configs

    name = _ENTRY_SCHEMAS.get(config_name, "TrainConfig")
    _schema_root[:] = [getattr(script_configs, name) if name in script_configs.__all__ else getattr(config, name)]

    def decorate(task):
        hydra_task = hydra.main(config_path=config_path, config_name=config_name, version_base="1.3")(task)

        @functools.wraps(task)
        def main():
            from hydra.errors import HydraException
            from omegaconf.errors import OmegaConfBaseException

            previous = os.environ.get("HYDRA_FULL_ERROR")
            os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its report
            given = _given_run_dir()
            existed = given is not None and given.exists()
            if existed and not given.is_dir():  # Hydra would fail making it, with a traceback
                sys.stderr.write(
                    f"error: run_dir {given} is a file, not a folder: pass run_dir= a new or empty folder.\n"
                )
                raise SystemExit(2)
            try:
                return hydra_task()
            except (HydraException, OmegaConfBaseException) as e:
                sys.stderr.write(f"error: {config_error_line(e)}\n")
                raise SystemExit(2) from None
            except SystemExit as e:
                if e.code not in (0, None):
                    _remove_empty_output_dir(given, existed)
                raise
            finally:
                if previous is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = previous

        return main

    return decorate


def _given_run_dir():
    """The folder of the last ``run_dir=`` on the command line (absolute), or None."""
    from pathlib import Path

    given = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("run_dir=")]
    return Path(given[-1]).expanduser().resolve() if given and given[-1].strip() else None


def _remove_empty_output_dir(given, existed: bool) -> None:
    """After a failed single run: Hydra made its output folder (``run_dir``, or the dated
    ``outputs/<date>/<time>``) before the task's checks refused the config; if it is still
    empty and this command made it, remove it (and the empty dated parents), so a refused
    command leaves nothing behind."""
    from pathlib import Path

    if not _job_output_dir:  # a multirun job, or the task never started
        return
    out = Path(_job_output_dir.pop()).resolve()
    cwd = Path.cwd().resolve()
    if out == cwd or (given is not None and (out != given or existed)):
        return
    with contextlib.suppress(OSError):
        out.rmdir()  # only if empty
        if given is None:  # outputs/<date>/<time>: the dated parents too, while empty
            for parent in out.parents:
                if parent == cwd or cwd not in parent.parents:
                    break
                parent.rmdir()


_job_output_dir: list = []  # a single run's Hydra output folder, recorded by to_config for _remove_empty_output_dir
_schema_root: list = []  # the dataclass of the entry point's config (set by hydra_entry), for messages


def _schema_fields(full_key: str, root=None) -> list[str] | None:
    """The field names of the schema node that holds ``full_key`` (``trainer.epoch`` -> the
    TrainerConfig fields), from ``root`` or the entry point's schema; None if not a known node."""
    from brats_seg.config import TrainConfig

    node = root or (_schema_root[0] if _schema_root else TrainConfig)
    for part in full_key.split(".")[:-1]:
        field = {f.name: f for f in dataclasses.fields(node)}.get(part)
        default = field.default_factory() if field is not None and callable(field.default_factory) else None
        if not dataclasses.is_dataclass(default):
            return None
        node = type(default)
    return [f.name for f in dataclasses.fields(node)]


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
    for marker in (
        "Error merging override ",
        "Could not override '",
        "Could not append to config. An item is already at '",
        "Could not delete from config. ",
        "Error parsing override '",
    ):
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
        detail = " ".join(
            line.strip()
            for line in str(getattr(exc, "message", text)).splitlines()
            if line.strip() and not line.startswith("See ")
        )
        if "missing EQUAL" in detail:
            return f"{given}: an override needs a value: write {given}=<value>."
        return (
            f"{given}: cannot parse it ({detail}); write key=value, a list as key=[a,b] "
            "(https://hydra.cc/docs/advanced/override_grammar/basic/)."
        )
    typed_key = override.split("=", 1)[0].lstrip("+~") if override else None
    full_key = typed_key or getattr(cause, "full_key", None)
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
        msg = _first_line(getattr(cause, "msg", None) or str(cause))
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


def _unknown_keys(node, prefix: str = "") -> list[str]:
    """Keys of a composed config that its dataclass schema does not have (``+trainer.foo=1``
    adds them: Hydra opens the struct for ``+``, and ``OmegaConf.to_object`` drops them silently)."""
    from omegaconf import DictConfig, OmegaConf

    schema = OmegaConf.get_type(node)
    fields = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    out = []
    for key in node.keys() if isinstance(node, DictConfig) else ():
        name = f"{prefix}{key}"
        if fields is not None and key not in fields:
            out.append(name)
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            out.extend(_unknown_keys(child, name + "."))
    return out


def to_config(cfg):
    """Convert a composed structured config to its dataclass (``OmegaConf.to_object``).

    A key the schema does not have (added with ``+key=value``) is refused in one line with the
    keys that exist, rather than dropped without a word; exit status 2."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    with contextlib.suppress(ValueError, AttributeError):  # not under hydra.main (tests compose directly)
        hc = HydraConfig.get()
        _job_output_dir[:] = [hc.runtime.output_dir] if hc.mode == RunMode.RUN else []
    unknown = [k for k in _unknown_keys(cfg) if k != "hydra" and not k.startswith("hydra.")]
    if unknown:
        key = unknown[0]
        fields = _schema_fields(key, OmegaConf.get_type(cfg)) or []
        name, parent = key.rsplit(".", 1)[-1], key.rsplit(".", 1)[0] if "." in key else ""
        near = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        hint = f" Did you mean {(parent + '.') if parent else ''}{near[0]}?" if near else ""
        shown = ", ".join(fields[:12]) + (", ..." if len(fields) > 12 else "")
        sys.stderr.write(f"error: {key}: no such key ({parent or 'the config'} has {shown}).{hint}\n")
        raise SystemExit(2)
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        sys.stderr.write(f"error: {e.full_key} is required: pass {e.full_key}=...\n")
        raise SystemExit(2) from None
    except ValueError as e:  # a schema's own check of a value (trainer.augment, trainer.augmentation.*)
        sys.stderr.write(f"error: {_first_line(str(e))}\n")
        raise SystemExit(2) from None


def given_override(key: str) -> str | None:
    """The value of ``key=`` if the command line gave it (the last one given), else None: for an
    entry point whose default depends on something else unless the user named it (evaluation's
    ``backend.precision``: the run's own, unless given)."""
    from hydra.core.hydra_config import HydraConfig

    given = [o.split("=", 1)[1] for o in HydraConfig.get().overrides.task if o.split("=", 1)[0].lstrip("+~") == key]
    return given[-1] if given else None


@contextlib.contextmanager
def user_errors(stage: str = "the command"):
    """Report bad data, config and environment as messages, not tracebacks; exit status 2.

    Messages of this package's ValueErrors are written for users (what, which value, what
    to do), so they are shown as they are; so are a full disk (the file and the free space)
    and running out of memory (the plan's peak, the measured one, settings that fit).
    SIGTERM/SIGINT inside the block stop ``stage`` (:func:`brats_seg.signals.stop_on_signals`;
    training saves its step first) with exit status 75: the same command continues.
    """
    from brats_seg.backend import BackendError
    from brats_seg.distribute.cluster import ClusterError
    from brats_seg.files import DiskFullError
    from brats_seg.lms.planner.advice import OutOfMemoryError
    from brats_seg.lms.planner.plan import PlanDoesNotFitError
    from brats_seg.locks import LockedError
    from brats_seg.signals import EXIT_PREEMPTED, Interrupted, Preempted, stop_on_signals

    try:
        with stop_on_signals(stage):
            yield
    except (
        ValueError,
        FileNotFoundError,
        BackendError,
        PlanDoesNotFitError,
        ClusterError,
        LockedError,
        DiskFullError,
        OutOfMemoryError,
    ) as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
    except Interrupted as e:  # what was finished is kept; the same command continues
        sys.stderr.write(f"{e}\n")
        raise SystemExit(EXIT_PREEMPTED) from None
    except Exception as e:  # the two training outcomes that are not bugs (no TensorFlow import here)
        from brats_seg.distribute.cluster import ClusterFailure

        if isinstance(e, Preempted):  # saved; the same command resumes
            sys.stderr.write(f"{e}\n")
            raise SystemExit(EXIT_PREEMPTED) from None
        if isinstance(e, ClusterFailure):  # a worker lost or never came
            sys.stderr.write(f"error: {e}\n")
            raise SystemExit(EXIT_CLUSTER_FAILURE) from None
        raise


CHILD_FLAG = "--child"  # argv[1] of a script's own child process (child_command)


def child_command(script, role: str, **args) -> list[str]:
    """``[python, script, --child, role, <args as JSON>]``: the command by which a script starts
    itself as a child process with one ``role`` (read back by :func:`child_args`).

    A child is not a user's command: its values were checked by its parent, and it must set up
    what it imports before anything else (the official BraTS code first on its path, TensorFlow's
    environment), so it takes them as JSON rather than composing a config with Hydra.
    """
    return [sys.executable, str(script), CHILD_FLAG, role, json.dumps(args)]


def child_args(argv=None) -> tuple[str, dict] | None:
    """``(role, args)`` if this process is a child a script started with :func:`child_command`,
    else None (a user's command, for Hydra)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) == 3 and argv[0] == CHILD_FLAG:
        return argv[1], json.loads(argv[2])
    return None
