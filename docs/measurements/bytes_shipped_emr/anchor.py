"""Offline, nothing measured, not shipped: would a bfloat16 anchor past 16 filters at full resolution
in the quick sweep hold the wide bf16 points every session over-predicts? In each recorded held-out
set that measured full resolution at 24 filters in bf16, that point moves into the quick fit (bf16
only) and the shipped form (off-block bytes) is judged on the set's other ``lms=off`` points, against
the same form without it. Sets without the point are left out (listed as such). A candidate for the next session, to
be judged on points measured after its commit.

    python docs/measurements/bytes_shipped_emr/anchor.py > docs/measurements/bytes_shipped_emr/anchor.txt
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "forms_offline"))
from all_sessions import fit_and_judged, recorded_sets  # noqa: E402
from bytes_form import judge  # noqa: E402

ANCHOR = "full 24 bf16 off"


def main() -> None:
    sets = recorded_sets()
    # blind_bytes_emr was fitted to sweep_align_emr's calibration: its anchor is that set's
    sets["blind_bytes_emr"][1][ANCHOR] = sets["sweep_align_emr"][1][ANCHOR]
    totals = {"without": [0, 0], "with": [0, 0]}
    for name, (quick, held) in sets.items():
        if ANCHOR not in held:
            print(f"\n== {name}: no {ANCHOR} measured; left out")
            continue
        fitq, judged = fit_and_judged(quick, held)
        judged = [r for r in judged if r is not held[ANCHOR]]
        print(f"\n== {name}: judged on {len(judged)}")
        for label, fit in (("without", fitq), ("with", fitq + [held[ANCHOR]])):
            errs = judge(fit, judged, "off-block bytes")
            miss = [f"{k} {e:+.0%}" for e, k in errs if abs(e) > 0.25]
            bf16 = ", ".join(
                f"{k.split()[0]} {k.split()[1]} {e:+.0%}" for e, k in sorted(errs, key=lambda x: x[1]) if "bf16" in k
            )
            totals[label][0] += len(miss)
            totals[label][1] += len(errs)
            print(f"  {label:7s} the anchor: outside ±25% {len(miss)} of {len(errs)} {miss}; bf16: {bf16}")
    print("\n== total outside ±25%")
    for label, (m, n) in totals.items():
        print(f"  {label:7s} the anchor: {m} of {n}")


if __name__ == "__main__":
    main()
