"""Offline, nothing measured: would a quick sweep that also measured an unaligned width at full
resolution (12 filters; its levels 12, 24, 48, 96, 192 channels) predict the other held-out points
better? In each Emerald Rapids session with three-draw quick points, that session's own held-out
medians of full 12 filters (fp32, bf16) are moved into the fit and the rest judged; the shipped
sweep judged on the same rest beside it. Next step's evidence, not a judgment: the points moved
in were measured as held-out points, and a sweep chosen here must be judged on points measured
after it is committed.

    python docs/measurements/calibration_3draws_emr/sweep_variants.py > docs/measurements/calibration_3draws_emr/sweep_variants.txt
"""

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from brats_seg.benchmark import step_time_fit as stf  # noqa: E402

sys.path.insert(0, str(HERE))
from draws import EARLIER, _held, _quick_earlier, _quick_today  # noqa: E402


def _write(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def main() -> None:
    sessions = {
        "earlier session (calibration_draws_emr)": (_quick_earlier(), _held(EARLIER / "held")),
        "this session (calibration_3draws_emr)": (_quick_today(None), _held(HERE / "held")),
    }
    moved_sets = {"shipped sweep": [], "+ full 12 filters": ["full_12_fp32", "full_12_bf16"]}
    with tempfile.TemporaryDirectory() as tmp:
        for session, (quick, held) in sessions.items():
            rest = {k: v for k, v in held.items() if not k.startswith("full_12_")}
            judged = _write(Path(tmp) / "held.jsonl", list(rest.values()))
            print(f"\n{session}: judged on {len(rest)} held-out points ({', '.join(sorted(rest))})")
            for label, moved in moved_sets.items():
                fit = _write(Path(tmp) / "fit.jsonl", quick + [held[k] for k in moved])
                entry = stf.calibrate([fit], [judged])
                misses = [r for r in entry["held_out"] if abs(r["error"]) > 0.25]
                form = "; ".join(f"{d}: conv {c['block']}, bytes {c['bytes_block']}" for d, c in entry["fit"].items())
                print(f"  {label} ({form}): {entry['summary']['held_out']}; outside ±25%: {len(misses)}")
                for r in misses:
                    print(f"      {r['error']:+.1%}  {r['point']}")


if __name__ == "__main__":
    main()
