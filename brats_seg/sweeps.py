"""A sweep job's run folder name (the ``sweep_dirname`` resolver of ``hydra.sweep.subdir``).

Pure Python, importing nothing of brats_seg: :func:`brats_seg.script_configs.register_configs`
registers it before any config is composed.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["MAX_DIRNAME", "sweep_dirname"]

MAX_DIRNAME = (
    120  # characters: a longer name keeps its first part and ends in 8 hex of the whole (file systems allow 255)
)


def sweep_dirname(overrides, exclude=()) -> str:
    """A sweep job's folder name from its overrides (``hydra.sweep.subdir``, resolver ``sweep_dirname``).

    ``["trainer.patch_size=[48,48,48]", "trainer.seed=0", "experiment=x"]`` with ``exclude=["experiment"]``
    -> ``patch_size-48x48x48_seed-0``: each key by its last part (the whole key where two share it),
    sorted, a list's items joined by ``x``, no ``=``, ``,`` or brackets, so that the folder is stable
    (the same command names the same folders: a finished job is resumed, not redone) and can be
    passed as ``run_dir=`` unquoted. Hydra's own ``override_dirname`` keeps ``=`` and a list's
    brackets and commas, which an override such as ``run_dir=`` cannot take unquoted. A name
    longer than :data:`MAX_DIRNAME` (many fixed keys, long paths) keeps its first part and ends in
    8 hex of the whole name, still the same for the same overrides.
    """
    items = []
    for line in overrides:
        key, sep, value = str(line).partition("=")
        key = key.strip().lstrip("+~")
        if sep and key not in set(exclude) and not key.startswith("hydra."):
            items.append((key, value.strip()))
    short = [k.rsplit(".", 1)[-1] for k, _ in items]
    parts = []
    for (key, value), name in zip(items, short):
        value = "x".join(v.strip(" '\"") for v in value.strip("[]").split(",")) if value.startswith("[") else value
        value = re.sub(r"[^A-Za-z0-9.+-]+", "-", value.strip("'\"")).strip("-") or "empty"
        parts.append(f"{name if short.count(name) == 1 else key}-{value}")
    name = "_".join(sorted(parts)) or "defaults"
    if len(name) > MAX_DIRNAME:
        name = f"{name[: MAX_DIRNAME - 9]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return name
