"""Each quick-calibration point's measured step in every recorded session on the Emerald Rapids (one
draw each; a session's own processes), and how far apart they lie: the noise a quick calibration
is fitted through on this shared 2-vCPU machine. Nothing is measured here.

    python docs/measurements/bytes_shipped_emr/quick_across_sessions.py > docs/measurements/bytes_shipped_emr/quick_across_sessions.txt
"""

import json
from pathlib import Path

M = Path(__file__).resolve().parent.parent
SESSIONS = {
    "s1": "self_calibration_emr",
    "s2": "calibration_3draws_emr",
    "s3": "sweep12_emr",
    "s4": "sweep_align_emr",
    "s5": "bytes_shipped_emr",
}


def main() -> None:
    table: dict[tuple, dict[str, float]] = {}
    for key, folder in SESSIONS.items():
        entry = json.loads((M / folder / "calibration.json").read_text())
        for row in entry["fitted_points"]:
            o = dict(x.split("=", 1) for x in row["point"].split())
            point = (o["resolution"], int(o["model.base_filters"]), o["backend.precision"])
            table.setdefault(point, {})[key] = row["measured_s"]
    print("sessions: " + ", ".join(f"{k} {v}" for k, v in SESSIONS.items()))
    print("point                  " + "".join(f"{k:>8}" for k in SESSIONS) + "   max/min")
    for point in sorted(table):
        steps = table[point]
        cells = "".join(f"{steps[k]:8.2f}" if k in steps else f"{'':8}" for k in SESSIONS)
        spread = max(steps.values()) / min(steps.values()) - 1 if len(steps) > 1 else 0.0
        print(f"{' '.join(map(str, point)):22s} {cells}   {spread:+.0%}")


if __name__ == "__main__":
    main()
