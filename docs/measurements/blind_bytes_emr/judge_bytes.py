"""The offline candidate form (../forms_offline/bytes_form.py: an off-block rate on activation bytes),
and the shipped form as that script refits it, fitted to ../sweep_align_emr/'s quick calibration and
judged on this record's held-out points (each the median of its draws). Nothing is measured here.

    python docs/measurements/blind_bytes_emr/judge_bytes.py > docs/measurements/blind_bytes_emr/judge_bytes.txt
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


def main(folder: Path = HERE, names: dict[str, str] | None = None) -> None:
    """Judge the three forms fitted to ``folder``'s calibration on its held-out ``lms=off`` points
    (``names``: how to print a form's name, default as ``bytes_form.py`` calls it)."""
    quick = _quick(json.loads((folder / "calibration.json").read_text()))
    held = [r for r in _held(folder / "held").values() if r["strategy"] == "off"]
    for form in ("one rate", "off-block FLOPs (shipped)", "off-block bytes"):
        errs = judge(quick, held, form)
        miss = [(e, k) for e, k in errs if abs(e) > 0.25]
        print(
            f"\n{(names or {}).get(form, form)}: {min(e for e, _ in errs):+.1%}..{max(e for e, _ in errs):+.1%}, "
            f"median |error| {statistics.median(abs(e) for e, _ in errs):.1%}; outside ±25%: {len(miss)} of {len(errs)}"
        )
        for e, k in sorted(errs, key=lambda x: x[1]):
            print(f"   {e:+7.1%}  {k}{'  MISS' if abs(e) > 0.25 else ''}")


if __name__ == "__main__":
    main()
