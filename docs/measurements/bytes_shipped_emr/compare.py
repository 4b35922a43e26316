"""The forms before, refitted offline on this record's quick calibration and judged on its held-out
``lms=off`` points (each the median of its draws), beside the shipped form (off-block bytes) as the
same script refits it: one rate, and the off-block rate on convolution FLOPs (``20189d3``). The
recompute points need the planner's pricing and are judged by ``judge.py`` alone. Nothing is
measured here.

    python docs/measurements/bytes_shipped_emr/compare.py > docs/measurements/bytes_shipped_emr/compare.txt
"""

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent / "forms_offline"))
sys.path.insert(0, str(HERE.parent / "calibration_3draws_emr"))
from bytes_form import judge  # noqa: E402
from draws import _held  # noqa: E402
from forms import _quick  # noqa: E402


def main() -> None:
    quick = _quick(json.loads((HERE / "calibration.json").read_text()))
    held = [r for r in _held(HERE / "held").values() if r["strategy"] == "off"]
    for form in ("one rate", "off-block FLOPs (shipped)", "off-block bytes"):
        errs = judge(quick, held, form)
        miss = [(e, k) for e, k in errs if abs(e) > 0.25]
        name = form.replace("(shipped)", "(20189d3)") + (" (shipped, 92d8635)" if form == "off-block bytes" else "")
        print(
            f"\n{name}: {min(e for e, _ in errs):+.1%}..{max(e for e, _ in errs):+.1%}, "
            f"median |error| {statistics.median(abs(e) for e, _ in errs):.1%}; outside ±25%: {len(miss)} of {len(errs)}"
        )
        for e, k in sorted(errs, key=lambda x: x[1]):
            print(f"   {e:+7.1%}  {k}{'  MISS' if abs(e) > 0.25 else ''}")


if __name__ == "__main__":
    main()
