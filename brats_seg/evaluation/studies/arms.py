"""A study's arms: which keys tell its runs apart, each arm's name, and the runs pooled per arm
(their seeds). Plain values only (flattened configs), like :mod:`brats_seg.evaluation.studies.study`,
which groups its runs with :func:`compute_arms`."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence

__all__ = ["compute_arm_keys", "compute_arm_label", "compute_arms", "is_ignored"]


def is_ignored(key: str, ignore: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in ignore)


def _hashable(value):
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def compute_arm_keys(configs: Mapping[str, Mapping[str, object]], ignore: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(label keys, differing keys)`` of flattened configs (run name -> config).

    The differing keys are those whose value is not the same in every run (``ignore`` excluded).
    The label keys are the fewest of them that tell the arms apart: keys are taken by how many
    values they have (a group's ``.name`` first among equals), and a key whose value follows from
    those taken already is left out of the label (``resolution.shape`` once ``resolution.name``
    varies; the 2x arm's ``lms.name`` and epochs).
    """
    keys = sorted({k for c in configs.values() for k in c})
    differing = [
        k for k in keys if not is_ignored(k, ignore) and len({_hashable(c.get(k)) for c in configs.values()}) > 1
    ]
    distinct = {k: len({_hashable(c.get(k)) for c in configs.values()}) for k in differing}
    label: list[str] = []
    for key in sorted(differing, key=lambda k: (-distinct[k], not k.endswith(".name"), k)):
        seen: dict = {}
        determined = True
        for c in configs.values():
            past = tuple(_hashable(c.get(k)) for k in label)
            if seen.setdefault(past, _hashable(c.get(key))) != _hashable(c.get(key)):
                determined = False
                break
        if not determined or not label:
            label.append(key)
    return label, differing


def _value_text(value) -> str:
    return "x".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)


def compute_arm_label(values: Mapping[str, object]) -> str:
    """An arm's name from its label keys' values: ``whole``, ``patch 48x48x48``, ``grow`` (a
    patch schedule), ``resolution=full``, ``precision=bf16``, ``augment=nnunet`` (the whole key if two end alike)."""
    if not values:
        return "all runs"
    short = [k.rsplit(".", 1)[-1] for k in values]
    parts = []
    schedule = values.get("trainer.patch_schedule")
    for (key, value), name in zip(values.items(), short):
        if key == "trainer.patch_schedule":
            if not value and "trainer.patch_size" not in values:  # the same patch_size everywhere: a grow run's, none
                parts.append("whole")
            elif value:  # grow, or a schedule's stages
                parts.append(
                    str(value)
                    if isinstance(value, str)
                    else "schedule " + " > ".join(_value_text(s.get("patch")) for s in value if isinstance(s, Mapping))
                )
        elif key == "trainer.patch_size":
            if not schedule:
                parts.append("whole" if not value else f"patch {_value_text(value)}")
        elif key.endswith(".name"):
            parts.append(f"{key[:-5]}={_value_text(value)}")
        else:
            parts.append(f"{name if short.count(name) == 1 else key}={_value_text(value)}")
    return ", ".join(parts)


def _order(value):
    """Sort key of a config value: None first, then numbers, then text and lists."""
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, float(value), "")
    if isinstance(value, (list, tuple)):
        return (2, float(math.prod(value)) if all(isinstance(v, (int, float)) for v in value) else 0.0, str(value))
    return (3, 0.0, str(value))


def compute_arms(configs: Mapping[str, Mapping[str, object]], ignore: Sequence[str]) -> list[dict]:
    """The arms of a study: ``[{"label", "values", "runs"}]``, runs whose configs agree on every
    key but ``ignore`` pooled (their seeds). Ordered coarse to fine when the resolution varies,
    else by the label keys' values (whole volume first)."""
    label_keys, differing = compute_arm_keys(configs, ignore)
    groups: dict[tuple, list[str]] = {}
    for name in sorted(configs):
        groups.setdefault(tuple(_hashable(configs[name].get(k)) for k in differing), []).append(name)
    arms = []
    for members in groups.values():
        first = configs[members[0]]
        values = {k: first.get(k) for k in label_keys}
        arms.append({"label": compute_arm_label(values), "values": values, "runs": members})
    # label keys may not tell two arms apart if a determined key differs within a label: name both fully
    labels = [a["label"] for a in arms]
    for arm, members in zip(arms, groups.values()):
        if labels.count(arm["label"]) > 1:
            arm["values"] = {k: configs[members[0]].get(k) for k in differing}
            arm["label"] = compute_arm_label(arm["values"])
    if "resolution.name" in label_keys:
        return sorted(arms, key=lambda a: -float(configs[a["runs"][0]].get("resolution.spacing_mm") or 0.0))
    return sorted(arms, key=lambda a: [_order(a["values"][k]) for k in a["values"]])
