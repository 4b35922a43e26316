"""A study's numbers: the runs of a sweep grouped into arms, each arm's mean and standard
deviation over seeds, the time each run takes to given validation Dice.

``scripts/study.py`` reads the run folders and builds one plain record per run
(:func:`compute_run_record`); :func:`compute_study` groups the records into arms (the runs whose
configs agree on every key but the seed and the keys of ``ignore``) and pools their seeds. The
result is the study (``study.json``), which :func:`brats_seg.plots.study.plot_study` draws and
:func:`format_study_markdown` prints.

Every function here takes plain values (flattened configs, history rows, ``summary.json``
contents), never a config object; nothing is read from or written to a run folder, and nothing
imports TensorFlow.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping, Sequence

from brats_seg.evaluation.studies.arms import compute_arm_keys, compute_arm_label, compute_arms, is_ignored

__all__ = [
    "FALLBACK_TIME",
    "METRICS",
    "compute_arm_label",
    "compute_arms",
    "compute_finished",
    "compute_mean_std",
    "compute_run_record",
    "compute_study",
    "compute_time_to_reach",
    "compute_timeline",
    "curve_keys",
    "format_study_markdown",
    "shared_curve",
]

log = logging.getLogger(__name__)

#: The per-region metrics the study compares (summary.json columns ``<metric>_<region>``).
METRICS = {"dice": "Dice", "hd95": "HD95 (mm)", "lesion23_dice": "lesion-wise Dice (BraTS 2023)"}
#: Where history rows hold no ``train_time_s`` (runs older than the column): what is used instead.
FALLBACK_TIME = "sum of (seconds - val_s) per epoch: runs without train_time_s (includes checkpoint writes)"


# -- numbers ------------------------------------------------------------------------------------


def compute_mean_std(values: Sequence[float | None]) -> dict:
    """``{"mean", "std", "n", "values"}`` of the finite ``values`` (std: sample standard deviation
    over seeds, None with fewer than two; mean None with none)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return {
        "mean": statistics.mean(finite) if finite else None,
        "std": statistics.stdev(finite) if len(finite) > 1 else None,
        "n": len(finite),
        "values": [None if v is None else float(v) for v in values],
    }


def _finite(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def compute_timeline(history: Sequence[Mapping], regions: Sequence[str]) -> dict:
    """Validation Dice against cumulative training seconds, one entry per epoch.

    ``train_time_s`` (cumulative training seconds, validation excluded, across resumes) where the
    rows have it; otherwise the running sum of each epoch's ``seconds - val_s``, and ``source``
    says so. Epochs without validation have None Dice.

    Returns:
        ``{"epoch": [...], "train_time_s": [...], "val_dice_mean": [...], "val_dice_<r>": [...], "source"}``.
    """
    rows = sorted((r for r in history if r.get("epoch") is not None), key=lambda r: int(r["epoch"]))
    measured = bool(rows) and all(_finite(r.get("train_time_s")) is not None for r in rows)
    out: dict = {"epoch": [], "train_time_s": [], "source": "train_time_s" if measured else FALLBACK_TIME}
    keys = ["val_dice_mean", *(f"val_dice_{r}" for r in regions)]
    out.update({k: [] for k in keys})
    total = 0.0
    for row in rows:
        if measured:
            total = float(row["train_time_s"])
        else:
            total += (_finite(row.get("seconds")) or 0.0) - (_finite(row.get("val_s")) or 0.0)
        out["epoch"].append(int(row["epoch"]))
        out["train_time_s"].append(round(total, 3))
        for k in keys:
            out[k].append(_finite(row.get(k)))
    return out


def compute_time_to_reach(timeline: Mapping, thresholds: Sequence[float]) -> dict[str, float | None]:
    """``{"0.8": seconds}``: the training seconds at the end of the first epoch whose validation
    mean Dice reached each threshold (None: never reached)."""
    out: dict[str, float | None] = {}
    for threshold in thresholds:
        out[f"{threshold:g}"] = next(
            (
                t
                for t, d in zip(timeline["train_time_s"], timeline["val_dice_mean"])
                if d is not None and d >= threshold
            ),
            None,
        )
    return out


def _train_time_s(state: Mapping, timeline: Mapping) -> float | None:
    """The run's training seconds: the state's own (a stop inside an epoch counts too), else the
    timeline's last."""
    if timeline["source"] == "train_time_s" and _finite(state.get("train_time_s")) is not None:
        return float(state["train_time_s"])
    return timeline["train_time_s"][-1] if timeline["train_time_s"] else None


def compute_finished(config: Mapping[str, object], state: Mapping | None) -> tuple[bool, str]:
    """Whether a run trained to its end, and why (or where it stands): its epochs done, its time
    budget spent, or stopped early (no validation gain for ``trainer.early_stopping_patience`` epochs)."""
    state = state or {}
    epochs, done = int(config.get("trainer.epochs") or 0), int(state.get("epoch") or 0)
    budget = _finite(config.get("trainer.time_budget_s")) or 0.0
    spent = _train_time_s(state, compute_timeline(state.get("history") or [], ()))
    patience, best_epoch = int(config.get("trainer.early_stopping_patience") or 0), int(state.get("best_epoch") or 0)
    if budget > 0 and spent is not None and spent >= budget:
        return True, f"time budget {budget:g} s spent at epoch {done}"
    if "step" in state:  # stopped inside an epoch (a signal): resumable
        return False, f"stopped in epoch {done + 1} of {epochs}"
    if done >= epochs > 0:
        return True, f"{done}/{epochs} epochs"
    if patience > 0 and done and done - best_epoch >= patience:
        return True, f"stopped early at epoch {done}/{epochs}"
    return False, f"epoch {done}/{epochs}"


def _set_record(summary: Mapping, regions: Sequence[str]) -> dict:
    """One evaluation's means (and case spread) per metric and region, from its summary.json."""
    record: dict = {"n_cases": summary.get("n_cases"), "metrics": {}, "case_std": {}, "median": {}}
    for metric in METRICS:
        for region in regions:
            stats = summary.get(f"{metric}_{region}")
            if isinstance(stats, Mapping):
                record["metrics"][f"{metric}_{region}"] = _finite(stats.get("mean"))
                record["case_std"][f"{metric}_{region}"] = _finite(stats.get("std"))
                record["median"][f"{metric}_{region}"] = _finite(stats.get("median"))
    before = (summary.get("postprocess") or {}).get("unprocessed_mean")
    if isinstance(before, Mapping):  # the means before post-processing (when it changed something)
        record["unprocessed"] = {k: _finite(before.get(k, record["metrics"][k])) for k in record["metrics"]}
    return record


def compute_run_record(
    name: str,
    config: Mapping[str, object],
    state: Mapping | None,
    summaries: Mapping[str, Mapping | None],
    regions: Sequence[str],
    thresholds: Sequence[float],
    voxels_per_step: int,
    volume_voxels: int,
    stage_voxels: Mapping[int, int] | None = None,
) -> dict:
    """One run of the study, from its folder's contents.

    Args:
        name: the run folder relative to the study's folder.
        config: the run's flattened config (``{"trainer.seed": 0, ...}``).
        state: ``state.json`` (``epoch``, ``history``, ``best_value``, ``iterations``), None if absent.
        summaries: set name -> its ``summary.json`` (None: not evaluated).
        regions: the layout's regions.
        thresholds: validation mean Dice levels for :func:`compute_time_to_reach`.
        voxels_per_step: ``trainer.batch_size`` times the network input's voxels (patch or grid).
        volume_voxels: the voxels of one whole volume (``resolution.shape``).
        stage_voxels: a patch schedule's voxels per step by stage (1-based: its batch times its
            patch's or the grid's voxels); None without one.

    Steps and memory are as the run recorded them: ``steps_taken`` sums the steps each epoch took
    (``history``'s ``steps``; the optimizer's ``iterations`` for runs before it), the throughput
    is the voxels those steps trained over the training seconds, ``peak_process_bytes`` the
    process's peak (runtime included) and ``peak_above_runtime_bytes`` the peak above the runtime,
    which the plan predicts; ``plan_error_by_stage`` is that peak against each stage's plan
    (``planned_bytes``): measured / planned - 1.
    """
    state = state or {}
    history = state.get("history") or []
    timeline = compute_timeline(history, regions)
    train_time_s = _train_time_s(state, timeline)
    iterations = state.get("iterations")
    step_s = [s for s in (_finite(r.get("step_s")) for r in history) if s]
    step_voxels_per_s = voxels_per_step / statistics.median(step_s) if step_s else None
    stepped = [r for r in history if _finite(r.get("steps")) is not None]
    steps_taken = sum(int(r["steps"]) for r in stepped) if stepped and len(stepped) == len(history) else iterations
    if stage_voxels and stepped and len(stepped) == len(history):  # a schedule: each epoch at its stage's step size
        voxels_trained = sum(int(r["steps"]) * stage_voxels[int(r.get("stage", 1))] for r in history)
    else:
        voxels_trained = int(steps_taken) * voxels_per_step if steps_taken else None
    # steps taken over training seconds (data waits and the first step's tracing included), else the median step
    voxels_per_s = voxels_trained / train_time_s if voxels_trained and train_time_s else step_voxels_per_s
    measured = [_finite(r.get("measured_bytes")) for r in history]
    plan_error: dict[int, float] = {}
    for r, m in zip(history, measured):
        planned = _finite(r.get("planned_bytes"))
        if m is not None and planned:
            k = int(r.get("stage", 1))
            plan_error[k] = max(plan_error.get(k, -1.0), m / planned - 1.0)
    finished, why = compute_finished(config, state)
    vals = [d for d in timeline["val_dice_mean"] if d is not None]
    best = _finite(state.get("best_value"))
    return {
        "name": name,
        "seed": config.get("trainer.seed"),
        "finished": finished,
        "finished_why": why,
        "epochs": int(config.get("trainer.epochs") or 0),
        "epochs_done": int(state.get("epoch") or 0),
        "time_source": timeline["source"],
        "train_time_s": train_time_s,
        "best_val_dice": best if best is not None else (max(vals) if vals else None),
        "best_epoch": state.get("best_epoch"),
        "time_to_val_dice": compute_time_to_reach(timeline, thresholds),
        "voxels_per_step": voxels_per_step,
        "steps_taken": steps_taken,
        "peak_process_bytes": max((x for x in (_finite(r.get("peak_bytes")) for r in history) if x), default=None),
        "peak_above_runtime_bytes": max((m for m in measured if m is not None), default=None),
        "plan_error_by_stage": plan_error,
        "voxels_per_s": voxels_per_s,
        "volumes_per_s": voxels_per_s / volume_voxels if voxels_per_s else None,
        "step_voxels_per_s": step_voxels_per_s,
        "throughput_source": "voxels of the steps taken / training seconds"
        if voxels_trained and train_time_s
        else "median step_s",
        "spacing_mm": config.get("resolution.spacing_mm"),
        "curve": timeline,
        "sets": {s: _set_record(summary, regions) for s, summary in summaries.items() if summary is not None},
        "missing": [s for s, summary in summaries.items() if summary is None],
    }


def shared_curve(curves: Sequence[Mapping], key: str) -> dict | None:
    """The mean over runs of ``key`` and of the training time at the epochs every run validated."""
    common = None
    for c in curves:
        epochs = {e for e, v in zip(c["epoch"], c[key]) if v is not None}
        common = epochs if common is None else common & epochs
    if not common or len(curves) < 2:
        return None
    out = {"epoch": sorted(common), "train_time_s": [], key: []}
    for epoch in out["epoch"]:
        at = [c["epoch"].index(epoch) for c in curves]
        out["train_time_s"].append(statistics.mean(c["train_time_s"][i] for c, i in zip(curves, at)))
        out[key].append(statistics.mean(c[key][i] for c, i in zip(curves, at)))
    return out


def _arm_numbers(arm: dict, runs: Mapping[str, dict], sets: Sequence[str], thresholds: Sequence[float]) -> dict:
    members = [runs[n] for n in arm["runs"]]
    out = dict(arm, seeds=[r["seed"] for r in members], n_runs=len(members))
    for key in ("train_time_s", "voxels_per_s", "volumes_per_s", "step_voxels_per_s", "best_val_dice", "epochs_done"):
        out[key] = compute_mean_std([r[key] for r in members])
    out["time_to_val_dice"] = {}
    for threshold in thresholds:
        t = f"{threshold:g}"
        reached = [r["time_to_val_dice"][t] for r in members if r["time_to_val_dice"].get(t) is not None]
        out["time_to_val_dice"][t] = dict(compute_mean_std(reached), runs=len(members))  # the seeds that reached it
    out["sets"] = {}
    for s in sets:
        evaluated = [r["sets"][s] for r in members if s in r["sets"]]
        if not evaluated:
            continue
        keys = list(evaluated[0]["metrics"])
        entry = {
            "n_runs": len(evaluated),
            "n_cases": evaluated[0]["n_cases"],
            "metrics": {k: compute_mean_std([e["metrics"].get(k) for e in evaluated]) for k in keys},
            "case_std": {k: compute_mean_std([e["case_std"].get(k) for e in evaluated])["mean"] for k in keys},
        }
        if any("unprocessed" in e for e in evaluated):  # a run whose post-processing changed nothing: as written
            entry["unprocessed"] = {
                k: compute_mean_std([e.get("unprocessed", e["metrics"]).get(k) for e in evaluated]) for k in keys
            }
        out["sets"][s] = entry
    out["spacing_mm"] = members[0]["spacing_mm"]
    return out


def compute_study(
    records: Sequence[dict],
    configs: Mapping[str, Mapping[str, object]],
    sets: Sequence[str],
    regions: Sequence[str],
    thresholds: Sequence[float],
    ignore: Sequence[str],
) -> dict:
    """The study: every run (:func:`compute_run_record`), its arm, and each arm's numbers.

    Args:
        records: one per run, ``name`` matching a key of ``configs``.
        configs: run name -> flattened config.
        sets: evaluated set names, in the order to report them.
        regions: the layout's regions.
        thresholds: validation mean Dice levels.
        ignore: config key patterns that do not make an arm (``trainer.seed`` among them).

    Returns:
        ``{"arm_keys", "differing_keys", "common", "regions", "sets", "thresholds", "metrics" (column ->
        name), "curve_keys" (the validation curves compared), "runs", "arms" (each with its
        ``mean_curves``), "notes"}``.

    Raises:
        ValueError: no runs.
    """
    if not records:
        raise ValueError(
            "no run folders to compare (a folder with a run's config and state); "
            "run the study's sweep first: python train.py -m experiment=<study>"
        )
    arms = compute_arms(configs, ignore)
    label_keys, differing = compute_arm_keys(configs, ignore)
    runs = {r["name"]: r for r in records}
    for arm in arms:
        for name in arm["runs"]:
            runs[name]["arm"] = arm["label"]
            runs[name]["config"] = {k: configs[name].get(k) for k in differing}
    first = configs[records[0]["name"]]
    common = {k: v for k, v in first.items() if k not in differing and not is_ignored(k, ignore)}
    notes = []
    if any(r["time_source"] != "train_time_s" for r in records):
        old = [r["name"] for r in records if r["time_source"] != "train_time_s"]
        notes.append(f"training time of {', '.join(old)}: {FALLBACK_TIME}")
    arm_records = [_arm_numbers(a, runs, sets, thresholds) for a in arms]
    for arm in arm_records:  # the mean validation curves over the arm's seeds, at the epochs they share
        curves = [runs[n]["curve"] for n in arm["runs"]]
        arm["mean_curves"] = {key: shared_curve(curves, key) for key in curve_keys(regions)}
    return {
        "arm_keys": label_keys,
        "differing_keys": differing,
        "common": common,
        "regions": list(regions),
        "sets": list(sets),
        "thresholds": list(thresholds),
        "metrics": dict(METRICS),
        "curve_keys": curve_keys(regions),
        "runs": [runs[r["name"]] for r in records],
        "arms": arm_records,
        "notes": notes,
    }


def curve_keys(regions: Sequence[str]) -> list[str]:
    """The validation curves a study compares: the mean Dice, then each region's."""
    return ["val_dice_mean", *(f"val_dice_{r}" for r in regions)]


# -- text ---------------------------------------------------------------------------------------


def _pm(stats: Mapping, digits: int = 3) -> str:
    if stats.get("mean") is None:
        return "-"
    return f"{stats['mean']:.{digits}f}" + (f" ± {stats['std']:.{digits}f}" if stats.get("std") is not None else "")


def format_study_markdown(study: Mapping) -> str:
    """Markdown tables: each arm's training (time, throughput, best validation Dice, time to each
    threshold), then per evaluated set its Dice, HD95 and lesion-wise Dice per region (mean ± std over seeds)."""
    regions, arms = study["regions"], study["arms"]
    ts = list(study["thresholds"])
    lines = [
        "| arm | seeds | epochs | training (min) | voxels/s (M) | volumes/s | best val Dice | "
        + " | ".join(f"min to val {t:g}" for t in ts)
        + " |",
        "|---" * (7 + len(ts)) + "|",
    ]
    for a in arms:
        minutes = {k: (v / 60 if v is not None else None) for k, v in a["train_time_s"].items() if k in ("mean", "std")}
        mvox = {k: (v / 1e6 if v is not None else None) for k, v in a["voxels_per_s"].items() if k in ("mean", "std")}
        reach = []
        for t in ts:
            stats = a["time_to_val_dice"][f"{t:g}"]
            in_min = {k: (stats[k] / 60 if stats[k] is not None else None) for k in ("mean", "std")}
            reach.append(f"{_pm(in_min, 1)} ({stats['n']}/{a['n_runs']})")
        lines.append(
            f"| {a['label']} | {a['n_runs']} | {_pm(a['epochs_done'], 0)} | {_pm(minutes, 1)} | "
            f"{_pm(mvox, 3)} | {_pm(a['volumes_per_s'], 3)} | {_pm(a['best_val_dice'])} | " + " | ".join(reach) + " |"
        )
    for s in study["sets"]:
        shown = [a for a in arms if s in a["sets"]]
        if not shown:
            continue
        cases = shown[0]["sets"][s]["n_cases"]
        lines += [
            "",
            f"{s} ({cases} cases), mean ± std over seeds:",
            "",
            "| arm | runs | "
            + " | ".join(f"{METRICS[m].split(' (')[0]} {r.upper()}" for m in METRICS for r in regions)
            + " |",
            "|---" * (2 + len(METRICS) * len(regions)) + "|",
        ]
        for a in shown:
            e = a["sets"][s]
            lines.append(
                f"| {a['label']} | {e['n_runs']} | "
                + " | ".join(_pm(e["metrics"][f"{m}_{r}"], 1 if m == "hd95" else 3) for m in METRICS for r in regions)
                + " |"
            )
    return "\n".join(lines)
