"""Offline, nothing measured: would one draw a point have done better or worse than the median of
three (today's quick calibration, calibration.json's draws_s), and does a median fit carry between
sessions? Each fit (this checkout's calibrate) judged on the held-out medians of both sessions:
this record's held/ (14 points, measured here around the calibration) and the earlier session's
../calibration_draws_emr/held/ (8 points, 2026-11-29 07:57-08:42).

    python docs/measurements/calibration_3draws_emr/draws.py > docs/measurements/calibration_3draws_emr/draws.txt
"""

import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from brats_seg.benchmark import step_time_fit as stf  # noqa: E402
from brats_seg.benchmark.self_calibration import _BASE  # noqa: E402

EARLIER = HERE.parent / "calibration_draws_emr"


def _held(folder: Path) -> dict[str, dict]:
    """point name -> its record with the median step over its draws (``<name>_rep<r>.json``)."""
    points = defaultdict(list)
    for path in sorted(folder.glob("*_rep*.json")):
        points[path.stem.rsplit("_rep", 1)[0]].append(json.loads(path.read_text()))
    return {k: {**v[0], "step_s": statistics.median(r["step_s"] for r in v)} for k, v in points.items()}


def _quick_today(draw: int | None) -> list[dict]:
    """Today's quick points as records: draw ``draw`` (0-based) of each, or (None) its median."""
    entry = json.loads((HERE / "calibration.json").read_text())
    records = []
    for name, steps in entry["draws_s"].items():
        res, width, _, precision = name.split()
        overrides = [*_BASE, "tracking=none", f"resolution={res}", f"model.base_filters={width}"]
        step = statistics.median(steps) if draw is None else steps[draw]
        records.append(
            {
                "overrides": [*overrides, f"backend.precision={precision}"],
                "strategy": "off",
                "precision": precision,
                "cpu_id": entry["cpu_id"],
                "step_s": step,
            }
        )
    return records


def _quick_earlier() -> list[dict]:
    points = defaultdict(list)
    for path in sorted((EARLIER / "quick").glob("*_rep*.json")):
        points[path.stem.rsplit("_rep", 1)[0]].append(json.loads(path.read_text()))
    return [{**v[0], "step_s": statistics.median(r["step_s"] for r in v)} for v in points.values()]


def _write(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def main() -> None:
    fits = {f"today, draw {k + 1} alone": _quick_today(k) for k in range(3)}
    fits["today, median of 3 (shipped)"] = _quick_today(None)
    fits["earlier session, median of 3"] = _quick_earlier()
    with tempfile.TemporaryDirectory() as tmp:
        held = {
            "held out today (14)": _write(Path(tmp) / "today.jsonl", list(_held(HERE / "held").values())),
            "held out in the earlier session (8)": _write(
                Path(tmp) / "earlier.jsonl", list(_held(EARLIER / "held").values())
            ),
        }
        for label, records in fits.items():
            print(f"\n{label}:")
            for judge, path in held.items():
                entry = stf.calibrate([_write(Path(tmp) / "quick.jsonl", records)], [path])
                misses = sum(abs(r["error"]) > 0.25 for r in entry["held_out"])
                print(f"  {judge}: {entry['summary']['held_out']}; outside ±25%: {misses}")


if __name__ == "__main__":
    main()
