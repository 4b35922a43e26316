"""Offline, nothing measured: this session's quick points refitted with the form and sweep shipped
before ``20189d3`` (one rate for all convolutions; without full-resolution 12 and 16 filters, which
are then judged too), with one rate on the new sweep, and as shipped, each judged on this record's
held-out medians. What the change did on points measured after it.

    python docs/measurements/sweep_align_emr/compare.py > docs/measurements/sweep_align_emr/compare.txt
"""

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE.parent / "forms_offline"))
sys.path.insert(0, str(HERE.parent / "calibration_3draws_emr"))
from draws import _held  # noqa: E402
from forms import _quick, _write  # noqa: E402

import brats_seg.cpu  # noqa: E402
from brats_seg.benchmark import step_time_fit as stf  # noqa: E402


def main() -> None:
    entry = json.loads((HERE / "calibration.json").read_text())
    brats_seg.cpu.cpu_id = lambda: entry["cpu_id"]
    quick = _quick(entry)
    held = list(_held(HERE / "held").values())
    wide = [r for r in quick if r["resolution"] == "full" and r["base_filters"] in (12, 16)]
    narrow = [r for r in quick if r not in wide]
    variants = {
        "before (one rate, 6-configuration sweep; full 12 and 16 judged)": ((0,), narrow, held + wide),
        "one rate, 8-configuration sweep": ((0,), quick, held),
        "shipped (off-block rate, 8-configuration sweep)": (None, quick, held),
    }
    shipped = dict(stf.ALIGNS)
    for label, (aligns, fit, judged) in variants.items():
        stf.ALIGNS = shipped if aligns is None else dict.fromkeys(shipped, aligns)
        with tempfile.TemporaryDirectory() as tmp:
            out = stf.calibrate([_write(Path(tmp) / "q.jsonl", fit)], [_write(Path(tmp) / "h.jsonl", judged)])
        rows = out["held_out"]
        misses = [r for r in rows if abs(r["error"]) > 0.25]
        print(f"\n{label}: {stf.summary_line(rows)}; outside ±25%: {len(misses)} of {len(rows)}")
        for r in rows:
            flag = "  MISS" if abs(r["error"]) > 0.25 else ""
            print(f"   {r['error']:+7.1%}  {r['measured_s']:6.2f} s  {r['point']}{flag}")


if __name__ == "__main__":
    main()
