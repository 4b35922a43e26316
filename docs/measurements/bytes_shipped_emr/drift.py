"""How the held-out points' second draw compares with their first in the four records that measured
two (draw 1 and draw 2 in separate processes, the same session; in sweep_align_emr and this record a
calibration ran between them): drift within a session on this shared machine. Nothing is measured
here.

    python docs/measurements/bytes_shipped_emr/drift.py > docs/measurements/bytes_shipped_emr/drift.txt
"""

import json
import statistics
from collections import defaultdict
from pathlib import Path

M = Path(__file__).resolve().parent.parent
RECORDS = ("calibration_3draws_emr", "sweep_align_emr", "blind_bytes_emr", "bytes_shipped_emr")


def main() -> None:
    for record in RECORDS:
        draws: dict[str, dict[str, float]] = defaultdict(dict)
        for path in (M / record / "held").glob("*_rep*.json"):
            name, rep = path.stem.rsplit("_rep", 1)
            draws[name][rep] = json.loads(path.read_text())["step_s"]
        ratios = sorted(d["2"] / d["1"] for d in draws.values() if "1" in d and "2" in d)
        print(
            f"{record:24s} {len(ratios):2d} points: draw 2 / draw 1 {ratios[0]:.2f}..{ratios[-1]:.2f}, "
            f"median {statistics.median(ratios):.2f}; draw 1 slower for {sum(r < 1 for r in ratios)}"
        )


if __name__ == "__main__":
    main()
