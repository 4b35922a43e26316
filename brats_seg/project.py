"""The project beside the package: the folder holding ``configs/``, ``scripts/`` and ``train.py``
(:func:`project_dir`), and a config composed from its ``configs/`` (:func:`compose_config`).

Library code that runs the project's commands (a study's evaluations, a benchmark sweep, the memory
calibration's points) or derives a config from recorded overrides needs these two and nothing
else of the entry-point glue, so they live here, below everything that uses them, and
:mod:`brats_seg.cli` (which no library module imports) stays the scripts' alone. Hydra is imported
inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["compose_config", "project_dir"]

#: The repository beside the package (an editable install): where :func:`project_dir` looks
#: outside an entry point.
_REPOSITORY = Path(__file__).resolve().parents[1]


def project_dir() -> Path:
    """The folder holding ``configs/``, ``scripts/`` and ``train.py``: the running entry point's
    (its config folder's parent, e.g. the image's WORKDIR, where the package is installed
    elsewhere), else the repository beside the package (an editable install; the tests)."""
    with contextlib.suppress(ValueError, AttributeError):  # not inside an entry point
        from hydra.core.hydra_config import HydraConfig

        for source in HydraConfig.get().runtime.config_sources:
            if source.provider == "main" and source.schema == "file":
                return Path(source.path).parent
    return _REPOSITORY


def compose_config(config_name: str, overrides=(), config_dir: str | Path | None = None):
    """The dataclass config ``<config_dir>/<config_name>.yaml`` composes with ``overrides``
    (``config_dir``: default ``configs/`` of :func:`project_dir`).

    For code that derives a config from overrides it recorded or was given (a calibration
    point, the step a profile measures), not for a user's command (that is
    :func:`brats_seg.cli.hydra_entry` and :func:`brats_seg.cli.to_config`, which also refuse a
    ``+key`` the schema lacks): these overrides were written here or checked by the command that
    passed them, so the composed config is converted as it is (``OmegaConf.to_object``; a
    schema's own check of a value raises its ValueError). Works outside a Hydra app and inside one
    (which composes from its own config folder).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from brats_seg.script_configs import register_configs

    register_configs()
    if GlobalHydra.instance().is_initialized():  # inside an entry point: its config folder is ours
        return OmegaConf.to_object(compose(config_name=config_name, overrides=list(overrides)))
    with initialize_config_dir(config_dir=str(config_dir or project_dir() / "configs"), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name=config_name, overrides=list(overrides)))
