"""A recorded quick calibration refitted offline with the step-time model of this checkout (nothing
measured), and judged on the held-out points its record was judged on: how a change of the model's
form would have done on a CPU that is no longer here. The benchmark's records name their CPU, which
the fit checks; this script stands in that CPU's id, the only thing it changes.

    python docs/measurements/self_calibration_emr/refit.py docs/measurements/self_calibration_zen5/calibration.json
    python docs/measurements/self_calibration_emr/refit.py docs/measurements/self_calibration_zen5/calibration.json bytes_block=1

``bytes_block=1`` keeps the form before the bytes term's padding was chosen (the record's own).
Output: refit_zen5.txt.
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import brats_seg.cpu
from brats_seg.benchmark import step_time_fit as stf


def main(path: str, plain: bool) -> None:
    record = json.loads(Path(path).read_text())
    cpu = record["cpu_id"]
    brats_seg.cpu.cpu_id = lambda: cpu  # the recorded CPU's id (the fit refuses records of another)
    if plain:
        stf.BYTES_BLOCKS = (1,)
    with tempfile.TemporaryDirectory() as tmp:
        quick = Path(tmp) / "quick.jsonl"
        lines = []
        for row in record["fitted_points"]:
            overrides = ["backend=cpu_onednn", *row["point"].split()]
            precision = next(o.split("=")[1] for o in overrides if o.startswith("backend.precision="))
            lines.append(
                {"overrides": overrides, "step_s": row["measured_s"], "strategy": "off", "precision": precision, "cpu_id": cpu}
            )
        quick.write_text("".join(json.dumps(r) + "\n" for r in lines))
        out = stf.calibrate([quick], record["held_out_files"])
    print(f"{path} refitted ({'bytes as stored' if plain else 'bytes padding chosen by leave-one-out'}), CPU {cpu}")
    for dtype, c in out["fit"].items():
        print(f"  {dtype}: block {c['block']}, bytes block {c['bytes_block']}")
    for key, line in out["summary"].items():
        print(f"  {key}: {line}")
    fitted = {frozenset(r["point"].split()) for r in record["fitted_points"]}
    full = [
        r for r in out["held_out"] if "resolution=half" not in r["point"] and frozenset(r["point"].split()) not in fitted
    ]
    print(f"  held out at full resolution and above, not fitted: {stf.summary_line(full)}")
    for r in full:
        flag = "  MISS" if abs(r["error"]) > 0.25 else ""
        print(f"    {r['error']:+7.1%}  {r['measured_s']:7.2f} s  {r['point']}{flag}")


if __name__ == "__main__":
    main(sys.argv[1], "bytes_block=1" in sys.argv[2:])
