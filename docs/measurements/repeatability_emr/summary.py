"""The spread of repeated step measurements (run.sh's records): per point, each process's median
step and its timed steps, and how far the processes' medians lie apart (max / min - 1).

    python docs/measurements/repeatability_emr/summary.py > docs/measurements/repeatability_emr/summary.txt
"""

import json
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    points = defaultdict(list)
    for path in sorted((HERE / "records").glob("point*_rep*.json")):
        r = json.loads(path.read_text())
        label = f"{r['base_filters']:>2} filters {r['precision']}"
        points[label].append((path.stem.split("_")[1], r["step_s"], r["step_times_s"], r["first_step_s"]))
    cpu = json.loads(next((HERE / "records").glob("*.json")).read_text())["cpu_id"]
    print(f"CPU {cpu}; full resolution 192x224x160, depth 4, batch 1, lms=off; 3 timed steps a process")
    spreads = []
    for label, reps in points.items():
        medians = [m for _, m, _, _ in reps]
        spread = max(medians) / min(medians) - 1
        spreads.append(spread)
        within = max(max(t) / min(t) - 1 for _, _, t, _ in reps)
        print(
            f"\n{label}: processes' medians {min(medians):.2f}-{max(medians):.2f} s, apart by {spread:.1%}; "
            f"steps within one process apart by up to {within:.1%}"
        )
        for rep, m, times, first in reps:
            print(f"  {rep}: median {m:6.2f} s  steps {', '.join(f'{t:.2f}' for t in times)}  (first {first:.1f} s)")
    print(
        f"\nlargest spread between processes: {max(spreads):.1%}; median over points {sorted(spreads)[len(spreads) // 2]:.1%}"
    )


if __name__ == "__main__":
    main()
