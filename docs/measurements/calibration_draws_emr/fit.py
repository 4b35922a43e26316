"""Fit the step-time model (this checkout's, as the quick calibration does) to each draw of the quick
points alone and to their per-point medians over the draws; judge each on the held-out points'
medians (run.sh's records). Nothing is measured here.

    python docs/measurements/calibration_draws_emr/fit.py > docs/measurements/calibration_draws_emr/fit.txt
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


def _load(folder: str) -> dict[str, list[dict]]:
    """point name -> its records, one a draw (``..._rep<r>.json``)."""
    points = defaultdict(list)
    for path in sorted((HERE / folder).glob("*_rep*.json")):
        points[path.stem.rsplit("_rep", 1)[0]].append(json.loads(path.read_text()))
    return points


def _median(records: list[dict]) -> dict:
    return {**records[0], "step_s": statistics.median(r["step_s"] for r in records)}


def _write(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def main() -> None:
    quick, held = _load("quick"), _load("held")
    draws = min(len(v) for v in quick.values())
    print(
        f"CPU {next(iter(quick.values()))[0]['cpu_id']}: {len(quick)} quick points x {draws} draws; "
        f"{len(held)} held-out points x {min(len(v) for v in held.values())} draws (their medians judge)"
    )
    print("\nquick points, each draw's step (s):")
    for name, recs in quick.items():
        steps = [r["step_s"] for r in recs]
        print(f"  {name:<18} {', '.join(f'{s:6.2f}' for s in steps)}   apart {max(steps) / min(steps) - 1:5.1%}")
    print("held-out points, each draw's step (s):")
    for name, recs in held.items():
        steps = [r["step_s"] for r in recs]
        print(f"  {name:<18} {', '.join(f'{s:6.2f}' for s in steps)}   apart {max(steps) / min(steps) - 1:5.1%}")
    with tempfile.TemporaryDirectory() as tmp:
        held_path = _write(Path(tmp) / "held.jsonl", [_median(v) for v in held.values()])
        fits = {f"draw {k + 1}": [v[k] for v in quick.values()] for k in range(draws)}
        fits[f"median of {draws} draws"] = [_median(v) for v in quick.values()]
        for label, records in fits.items():
            entry = stf.calibrate([_write(Path(tmp) / "quick.jsonl", records)], [held_path])
            form = "; ".join(f"{d}: conv {c['block']}, bytes {c['bytes_block']}" for d, c in entry["fit"].items())
            print(f"\n{label} ({form})")
            print(f"  leave one out: {entry['summary']['leave_one_out']}")
            print(f"  held out (full resolution): {entry['summary']['held_out']}")
            for r in entry["held_out"]:
                flag = "  MISS" if abs(r["error"]) > 0.25 else ""
                print(
                    f"    {r['error']:+7.1%}  measured {r['measured_s']:6.2f} s  predicted {r['predicted_s']:6.2f} s  {r['point']}{flag}"
                )


if __name__ == "__main__":
    main()
