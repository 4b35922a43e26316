"""Offline, nothing measured, not shipped: would a bfloat16 anchor past 16 filters at full resolution
in the quick sweep hold the wide bf16 points every session over-predicts? In each recorded held-out
set that measured full resolution at 24 filters in bf16, that point moves into the quick fit (bf16
only) and the shipped form (off-block bytes) is judged on the set's other ``lms=off`` points, against
the same form without it. Sets without the point are left out. A candidate for the next session, to
be judged on points measured after its commit.

    python docs/measurements/bytes_shipped_emr/anchor.py > docs/measurements/bytes_shipped_emr/anchor.txt
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
M = HERE.parent
sys.path.insert(0, str(M.parents[1]))
sys.path.insert(0, str(M / "forms_offline"))
sys.path.insert(0, str(M / "calibration_3draws_emr"))
from bytes_form import judge  # noqa: E402
from draws import _held  # noqa: E402
from forms import _label, _quick, sessions  # noqa: E402

ANCHOR = "full 24 bf16 off"


def main() -> None:
    alls = dict(sessions())
    for name, calibration in (("sweep_align_emr", "sweep_align_emr"), ("blind_bytes_emr", "sweep_align_emr")):
        quick = _quick(json.loads((M / calibration / "calibration.json").read_text()))
        alls[name] = (quick, {_label(r): r for r in _held(M / name / "held").values()})
    # blind_bytes_emr was fitted to sweep_align_emr's calibration: its anchor is that set's
    alls["blind_bytes_emr"][1][ANCHOR] = alls["sweep_align_emr"][1][ANCHOR]
    totals = {"without": [0, 0], "with": [0, 0]}
    for name, (quick, held) in alls.items():
        if ANCHOR not in held:
            print(f"\n== {name}: no {ANCHOR} measured; left out")
            continue
        wide = [
            r for k, r in held.items() if k.startswith("full ") and k.endswith(" off") and int(k.split()[1]) in (12, 16)
        ]
        has12 = any(r["resolution"] == "full" and r["base_filters"] == 12 for r in quick)
        fitq = quick if has12 else quick + wide
        judged = [
            r
            for k, r in held.items()
            if k.endswith(" off") and not k.startswith("96x112x80") and r not in wide and k != ANCHOR
        ]
        print(f"\n== {name}: judged on {len(judged)}")
        for label, fit in (("without", fitq), ("with", fitq + [held[ANCHOR]])):
            errs = judge(fit, judged, "off-block bytes")
            miss = [f"{k} {e:+.0%}" for e, k in errs if abs(e) > 0.25]
            bf16 = ", ".join(f"{k.split()[0]} {k.split()[1]} {e:+.0%}" for e, k in sorted(errs, key=lambda x: x[1]) if "bf16" in k)
            totals[label][0] += len(miss)
            totals[label][1] += len(errs)
            print(f"  {label:7s} the anchor: outside ±25% {len(miss)} of {len(errs)} {miss}; bf16: {bf16}")
    print("\n== total outside ±25%")
    for label, (m, n) in totals.items():
        print(f"  {label:7s} the anchor: {m} of {n}")


if __name__ == "__main__":
    main()
