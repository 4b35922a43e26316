"""Offline, nothing measured: the three step-time forms of ``../forms_offline/bytes_form.py`` (one rate;
an off-block rate on convolution FLOPs, ``20189d3``; on activation bytes, ``92d8635``), each fitted
to a session's quick calibration (with full-resolution 12 and 16 filters, as shipped since
``20189d3``: taken from the session's held-out points where its sweep lacked them) and judged on its
held-out ``lms=off`` points at full resolution and above: the four sessions of ``forms.py``,
``../sweep_align_emr/``, ``../blind_bytes_emr/`` (fitted to sweep_align_emr's calibration) and this
record.

    python docs/measurements/bytes_shipped_emr/all_sessions.py > docs/measurements/bytes_shipped_emr/all_sessions.txt
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
M = HERE.parent
sys.path.insert(0, str(M.parents[1]))
sys.path.insert(0, str(M / "forms_offline"))
sys.path.insert(0, str(M / "calibration_3draws_emr"))
from bytes_form import judge  # noqa: E402
from draws import _held  # noqa: E402
from forms import _label, _quick, sessions  # noqa: E402

FORMS = ("one rate", "off-block FLOPs (shipped)", "off-block bytes")


def recorded_sets() -> dict[str, tuple[list[dict], dict[str, dict]]]:
    """name -> (quick records, held-out medians by label) of every recorded held-out set."""
    sets = dict(sessions())
    for name, calibration in (
        ("sweep_align_emr", "sweep_align_emr"),
        ("blind_bytes_emr", "sweep_align_emr"),
        ("bytes_shipped_emr", "bytes_shipped_emr"),
    ):
        quick = _quick(json.loads((M / calibration / "calibration.json").read_text()))
        sets[name] = (quick, {_label(r): r for r in _held(M / name / "held").values()})
    return sets


def fit_and_judged(quick: list[dict], held: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """The points a set's form is fitted to (its quick sweep, with full-resolution 12 and 16 filters
    from its held-out points where the sweep lacked them) and those it is judged on (the rest of its
    ``lms=off`` points at full resolution and above)."""
    wide = [
        r for k, r in held.items() if k.startswith("full ") and k.endswith(" off") and int(k.split()[1]) in (12, 16)
    ]
    has12 = any(r["resolution"] == "full" and r["base_filters"] == 12 for r in quick)
    judged = [r for k, r in held.items() if k.endswith(" off") and not k.startswith("96x112x80") and r not in wide]
    return (quick if has12 else quick + wide), judged


def main() -> None:
    totals = defaultdict(lambda: [0, 0])
    for name, (quick, held) in recorded_sets().items():
        fitq, judged = fit_and_judged(quick, held)
        print(f"\n== {name}: fitted on {len(fitq)}, judged on {len(judged)}")
        for form in FORMS:
            errs = judge(fitq, judged, form)
            miss = [f"{k} {e:+.0%}" for e, k in errs if abs(e) > 0.25]
            totals[form][0] += len(miss)
            totals[form][1] += len(errs)
            print(f"  {form.replace(' (shipped)', ''):16s} outside ±25%: {len(miss)} of {len(errs)}  {', '.join(miss)}")
    print("\n== total outside ±25%")
    for form, (m, n) in totals.items():
        print(f"  {form.replace(' (shipped)', ''):16s} {m} of {n}")


if __name__ == "__main__":
    main()
