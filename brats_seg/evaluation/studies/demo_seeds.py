"""``make demo``'s recipe over seeds: is the first result a user sees luck, or the recipe?

For each seed (an arm, its own run folder ``<out>/seed<seed>``): ``train.py experiment=demo
trainer.seed=<seed>`` (with the train.py overrides given), then ``scripts/evaluate.py`` on the
held-out test split (post-processing chosen on the val split, as ``make demo`` does) and on
``heldout`` (default ``data=synthetic_heldout``: 40 phantoms of another generator seed, under the
run's case ids), which no choice of the recipe ever looked at. An arm
trained to the end and evaluated is not run again; an interrupted one resumes from its run
folder. :func:`run_demo_seeds` returns per seed and as mean ± std over seeds: legacy Dice and
BraTS 2023 lesion-wise Dice per region (and before post-processing), the test cases whose ET is
wrong on either side (reference without ET and ET predicted, or the reverse), and the training
time, and writes them to ``<out>/demo_seeds.json``; :func:`format_demo_seeds` is the table.
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from brats_seg.evaluation.studies.study_run import run_logged
from brats_seg.project import project_dir

__all__ = ["METRICS", "REGIONS", "format_demo_seeds", "run_arm", "run_demo_seeds", "train_overrides"]

log = logging.getLogger(__name__)

REGIONS = ("wt", "tc", "et")
METRICS = {"dice": "Dice", "lesion23_dice": "lesion-wise Dice (2023)"}
OWN_KEYS = ("seeds", "out", "heldout")  # the driver's own keys; every other override is train.py's
SET_PER_ARM = ("run_dir", "trainer.seed")  # what each arm sets itself


def train_overrides(overrides: list[str]) -> list[str]:
    """The command line's overrides that go to every train.py (all but ``seeds``/``out``).

    Raises:
        ValueError: ``run_dir=`` or ``trainer.seed=``, which each arm sets itself.
    """
    passed = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in SET_PER_ARM:
            raise ValueError(
                f"{o}: each arm sets {key} itself (<out>/seed<seed>, the seed); "
                "choose the arms with seeds=[...] and their folder with out=."
            )
        if key not in OWN_KEYS:
            passed.append(o)
    return passed


def _scores(folder, split: str) -> dict:
    """Means per region of ``eval/<split>`` (and before post-processing), and the cases whose ET
    is wrong on either side."""
    summary = json.loads(folder.summary_json(split).read_text())
    before = (summary.get("postprocess") or {}).get("unprocessed_mean") or {}
    out = {"n_cases": summary["n_cases"], "postprocess": (summary.get("postprocess") or {}).get("described", "none")}
    for m in METRICS:
        for r in REGIONS:
            out[f"{m}_{r}"] = summary[f"{m}_{r}"]["mean"]
            out[f"{m}_{r}_unprocessed"] = before.get(f"{m}_{r}", out[f"{m}_{r}"])
    with open(folder.metrics_csv(split), newline="") as f:
        rows = list(csv.DictReader(f))
    out["et_false"] = [
        r["case_id"] for r in rows if float(r["lesions_ref_et"] or 0) == 0 and float(r["lesions_pred_et"] or 0) > 0
    ]
    out["et_missed"] = [
        r["case_id"] for r in rows if float(r["lesions_ref_et"] or 0) > 0 and float(r["lesions_pred_et"] or 0) == 0
    ]
    out["without_et"] = sum(float(r["lesions_ref_et"] or 0) == 0 for r in rows)
    return out


def run_arm(run_dir: Path, seed: int, passed: list[str], heldout: str = "") -> dict:
    """Train and evaluate one seed (what is done is kept); its time, means and ET errors, and
    under ``"heldout"`` the same on ``split=all on=<heldout>`` when ``heldout`` names a data set."""
    from brats_seg.files import write_text_atomic
    from brats_seg.run_dir import RunFolder

    folder, logfile = RunFolder(run_dir), run_dir.parent / f"{run_dir.name}.log"
    timing_path = run_dir.parent / f"{run_dir.name}.time.json"
    timing = json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    log.info("seed %d:", seed)
    state = folder.read_state() if folder.has_config() else None
    if state is None or int(state.get("epoch", 0)) < folder.read_config().trainer.epochs:
        experiment = [] if any(o.startswith("experiment=") for o in passed) else ["experiment=demo"]
        t0 = time.time()
        run_logged(
            [
                sys.executable,
                str(project_dir() / "train.py"),
                *experiment,
                f"trainer.seed={seed}",
                "tracking=none",
                f"run_dir={run_dir}",
                *passed,
            ],
            logfile,
        )
        timing["train_s"] = timing.get("train_s", 0.0) + time.time() - t0  # summed over resumed starts
        write_text_atomic(timing_path, json.dumps(timing) + "\n")
    if not folder.summary_json("test").is_file():
        t0 = time.time()
        run_logged(
            [sys.executable, str(project_dir() / "scripts" / "evaluate.py"), f"run_dir={run_dir}", "split=test"],
            logfile,
        )
        timing["evaluate_s"] = time.time() - t0
        write_text_atomic(timing_path, json.dumps(timing) + "\n")
    out = {
        "seed": seed,
        "train_s": round(timing.get("train_s", float("nan")), 1),
        "evaluate_s": round(timing.get("evaluate_s", float("nan")), 1),
        **_scores(folder, "test"),
    }
    if heldout:
        split = f"all@{heldout}"
        if not folder.summary_json(split).is_file():
            run_logged(
                [
                    sys.executable,
                    str(project_dir() / "scripts" / "evaluate.py"),
                    f"run_dir={run_dir}",
                    "split=all",
                    f"on={heldout}",
                ],
                logfile,
            )
        out["heldout"] = {"set": heldout, **_scores(folder, split)}
    return out


def _seeds(value) -> list[int]:
    """``seeds=`` as a list: a list, one seed, or ``'0,1,2'`` (quoted)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        seeds = [int(s) for s in items if str(s).strip() != ""]
    except ValueError:
        raise ValueError(
            f"seeds={value!r}: give whole numbers, a list (seeds=[0,1,2]) or one seed (seeds=3)."
        ) from None
    if not seeds:
        raise ValueError("seeds is empty: give at least one, e.g. seeds=[0,1,2].")
    return seeds


def compute_means(runs: list[dict]) -> dict:
    """``{"dice_wt": {"mean", "std"}, ...}`` over the seeds' rows (std 0 for one seed)."""
    means = {}
    for m in METRICS:
        for r in REGIONS:
            for key in (f"{m}_{r}", f"{m}_{r}_unprocessed"):
                values = [run[key] for run in runs]
                means[key] = {
                    "mean": statistics.mean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                }
    return means


def run_demo_seeds(conf, overrides: list[str]) -> dict:
    """Every arm of ``conf`` (:class:`brats_seg.script_configs.DemoSeedsScriptConfig`) trained and
    evaluated (what is done is kept), the means over seeds, written to ``<out>/demo_seeds.json``.

    Args:
        conf: the driver's config (``seeds``, ``out``; its train keys were checked when composed).
        overrides: the command line's overrides: all but the driver's own go to every train.py.

    Raises:
        ValueError: bad seeds, or an override each arm sets itself.
        brats_seg.evaluation.studies.study_run.StepFailed: a training or evaluation failed (its log named).
    """
    from brats_seg.cpu import cpu_kind, cpu_model_name
    from brats_seg.files import write_text_atomic

    seeds, passed = _seeds(conf.seeds), train_overrides(overrides)
    out = Path(conf.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    runs = [run_arm(out / f"seed{s}", s, passed, conf.heldout) for s in seeds]
    result = {
        "cpu": cpu_model_name(),
        "cpu_kind": cpu_kind(),
        "overrides": passed,
        "runs": runs,
        "means": compute_means(runs),
    }
    if conf.heldout:
        result["heldout_means"] = compute_means([run["heldout"] for run in runs])
    write_text_atomic(out / "demo_seeds.json", json.dumps(result, indent=1) + "\n")
    return result


def _table(title: str, runs: list[dict], means: dict, train_s: list[float] | None) -> list[str]:
    columns = [(m, r) for m in METRICS for r in REGIONS]
    lines = [
        title,
        "",
        "| seed | "
        + " | ".join(f"{METRICS[m]} {r.upper()}" for m, r in columns)
        + " | ET on a case without ET | ET missed |"
        + (" training |" if train_s else ""),
        "|---" * (len(columns) + 3 + bool(train_s)) + "|",
    ]
    for i, run in enumerate(runs):
        cells = [f"{run[f'{m}_{r}']:.3f} ({run[f'{m}_{r}_unprocessed']:.3f})" for m, r in columns]
        lines.append(
            f"| {run['seed']} | " + " | ".join(cells) + f" | {', '.join(run['et_false']) or '-'} | "
            f"{', '.join(run['et_missed']) or '-'} |" + (f" {train_s[i] / 60:.1f} min |" if train_s else "")
        )
    lines.append(
        "| mean ± std | "
        + " | ".join(f"{means[f'{m}_{r}']['mean']:.3f} ± {means[f'{m}_{r}']['std']:.3f}" for m, r in columns)
        + " | | |"
        + (" |" if train_s else "")
    )
    return lines


def format_demo_seeds(result: dict) -> str:
    """The Markdown tables of :func:`run_demo_seeds`'s result: a row per seed, then mean ± std; the
    test split's, then the held-out set's."""
    runs, passed = result["runs"], result["overrides"]
    recipe = f"make demo's recipe{' with ' + ' '.join(passed) if passed else ''}"
    lines = _table(
        f"{result['cpu']} ({result['cpu_kind']}); {recipe}; test split ({runs[0]['n_cases']} cases, "
        f"{runs[0].get('without_et', '?')} without ET), native 1 mm grid",
        runs,
        result["means"],
        [run["train_s"] for run in runs],
    )
    if result.get("heldout_means"):
        held = [{"seed": run["seed"], **run["heldout"]} for run in runs]
        lines += [""] + _table(
            f"{held[0]['set']}: {held[0]['n_cases']} cases ({held[0]['without_et']} without ET) "
            "that no choice of the recipe looked at",
            held,
            result["heldout_means"],
            None,
        )
    lines += ["", "(in brackets: before post-processing)"]
    return "\n".join(lines)
