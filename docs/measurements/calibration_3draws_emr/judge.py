"""Judge the quick calibration (run.sh's calibration.json, as the planner reads it from a user's cache)
on the held-out points, each the median of its draws (run.sh's held/): the planner's step time for
each, against the measured. Nothing is measured here.

    python docs/measurements/calibration_3draws_emr/judge.py > docs/measurements/calibration_3draws_emr/judge.txt
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))


def main() -> None:
    here = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else HERE  # another record of the same layout
    entry = json.loads((here / "calibration.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BRATS_SEG_CACHE_DIR"] = tmp  # the calibration where a user's cache keeps it
        from brats_seg.benchmark import step_time_fit as stf
        from brats_seg.lms.planner.step_time import cpu_time_model, user_calibration_path

        target = user_calibration_path(entry["cpu_id"])
        target.parent.mkdir(parents=True)
        shutil.copy(here / "calibration.json", target)
        model = cpu_time_model(entry["cpu_id"])
        assert model.source.startswith("calibrated here"), model.source
        points = defaultdict(list)
        for path in sorted((here / "held").glob("*_rep*.json")):
            points[path.stem.rsplit("_rep", 1)[0]].append(json.loads(path.read_text()))
    print(
        f"CPU {entry['cpu_id']} ({entry['cpu_name']}); calibration: {len(entry['points'])} points x "
        f"{entry['draws']} draw(s) in {entry['seconds']:.0f} s"
        + (f", a point's draws up to {entry['draws_apart']:.0%} apart" if entry.get("draws_apart") else "")
    )
    print(f"  leave one out: {entry['summary']['leave_one_out']}")
    for dtype, c in entry["fit"].items():
        print(f"  {dtype}: conv padded to {c['block']}, bytes to {c.get('bytes_block', 1)}, off-block rate from {c.get('align', 0)}")
    print(f"\nheld out (each the median of its draws; {model.source.split(' (')[0]}):")
    rows = []
    for name, records in points.items():
        steps = sorted(r["step_s"] for r in records)
        median = {**records[0], "step_s": statistics.median(steps), "_file": "held"}
        row = stf._row(median, stf._predict(median, model))
        rows.append(row)
        flag = "  MISS" if abs(row["error"]) > 0.25 else ""
        print(
            f"  {row['error']:+7.1%}  measured {row['measured_s']:6.2f} s (draws {', '.join(f'{s:.2f}' for s in steps)})"
            f"  predicted {row['predicted_s']:6.2f} s  {name}{flag}"
        )
    misses = sum(abs(r["error"]) > 0.25 for r in rows)
    print(f"\n{stf.summary_line(rows)}; outside ±25%: {misses} of {len(rows)}")


if __name__ == "__main__":
    main()
