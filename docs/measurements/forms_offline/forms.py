"""Offline, nothing measured: which form of the step-time model, fitted to which quick sweep, predicts
the held-out full-resolution points of every recorded session (three on the Emerald Rapids, one on
the Zen 5), before the form is shipped and judged on points measured after it (issue 47).

A sweep with full-resolution 12 or 16 filters added takes that point from the session's own held-out
measurements (the median of its draws) into the fit, and it is no longer judged. Forms:

- ``one rate``: one rate for all convolutions, paddings chosen by leave-one-out, a tie kept plain
  (the form shipped before this study);
- ``ties-large``: paddings tried largest first, so a tie is settled for the larger block;
- ``align chosen``: a rate of its own for convolutions whose channels are not multiples of 8 or 16
  (``bf60176``), chosen among (0, 8, 16) by leave-one-out with a one-point handicap;
- ``align 8/16 fixed``: that rate always, off multiples of 8 in float32 and of 16 in bfloat16
  (non-negative: it fits to 0 where nothing differs); ``or none``: that or no such rate, chosen.

The study chose ``+full 12, 16`` with ``align 8/16 fixed`` (1 miss of 48), shipped in
``brats_seg.benchmark.step_time_fit.ALIGNS`` and ``self_calibration.QUICK_POINTS``; chosen on these
records, it is judged on points measured after it (``../sweep_align_emr/``).

    python docs/measurements/forms_offline/forms.py > docs/measurements/forms_offline/forms.txt
"""

import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
import brats_seg.cpu  # noqa: E402
from brats_seg.benchmark import step_time_fit as stf  # noqa: E402

M = ROOT / "docs" / "measurements"


def _label(r: dict) -> str:
    size = "x".join(map(str, r["shape"])) if r.get("resolution") != "full" else "full"
    return f"{size} {r['base_filters']} {r['precision']} {r['strategy']}"


def _medians(records: list[dict]) -> dict[str, dict]:
    groups = defaultdict(list)
    for r in records:
        groups[_label(r)].append(r)
    return {k: {**v[0], "step_s": statistics.median(x["step_s"] for x in v)} for k, v in groups.items()}


def _jsonl(paths) -> list[dict]:
    out = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def _quick(entry: dict) -> list[dict]:
    records = []
    for row in entry["fitted_points"]:
        overrides = ["backend=cpu_onednn", "tracking=none", *row["point"].split()]
        o = dict(x.split("=", 1) for x in overrides)
        records.append(
            {
                "overrides": overrides,
                "step_s": row["measured_s"],
                "strategy": "off",
                "precision": o["backend.precision"],
                "cpu_id": entry["cpu_id"],
                "resolution": o["resolution"],
                "shape": [],
                "base_filters": int(o["model.base_filters"]),
            }
        )
    return records


def sessions() -> dict[str, tuple[list[dict], dict[str, dict]]]:
    """name -> (quick records, held-out medians by label) of each recorded session."""
    out = {}
    a = json.loads((M / "self_calibration_emr" / "calibration.json").read_text())
    out["EMR session 1 (self_calibration_emr)"] = (_quick(a), _medians(_jsonl(a["held_out_files"])))
    b = json.loads((M / "calibration_3draws_emr" / "calibration.json").read_text())
    held_b = [json.loads(p.read_text()) for p in sorted((M / "calibration_3draws_emr" / "held").glob("*.json"))]
    out["EMR session 2 (calibration_3draws_emr)"] = (_quick(b), _medians(held_b))
    c = json.loads((M / "sweep12_emr" / "calibration.json").read_text())
    held_c = [json.loads(p.read_text()) for p in sorted((M / "sweep12_emr" / "held").glob("*.json"))]
    quick_c = [r for r in _quick(c) if not (r["resolution"] == "full" and r["base_filters"] == 12)]
    full12 = [r for r in _quick(c) if r["resolution"] == "full" and r["base_filters"] == 12]
    held_c = _medians(held_c)
    held_c.update({_label(r): r for r in full12})  # its full 12 becomes a held-out point like the others'
    out["EMR session 3 (sweep12_emr)"] = (quick_c, held_c)
    z = json.loads((M / "self_calibration_zen5" / "calibration.json").read_text())
    out["Zen 5 (self_calibration_zen5)"] = (_quick(z), _medians(_jsonl(z["held_out_files"])))
    return out


FORMS = {
    "one rate": dict(aligns=(0,), blocks=(1, 4, 8, 16)),
    "ties-large": dict(aligns=(0,), blocks=(16, 8, 4, 1)),
    "align chosen": dict(aligns=(0, 8, 16), blocks=(1, 4, 8, 16)),
    "align chosen, ties-large": dict(aligns=(0, 8, 16), blocks=(16, 8, 4, 1)),
    "align 8/16 fixed": dict(aligns={"float32": (8,), "bfloat16": (16,)}, blocks=(1, 4, 8, 16)),
    "align 8/16 or none": dict(aligns={"float32": (0, 8), "bfloat16": (0, 16)}, blocks=(1, 4, 8, 16)),
    "align 8/16 fixed, ties-large": dict(aligns={"float32": (8,), "bfloat16": (16,)}, blocks=(16, 8, 4, 1)),
}
SWEEPS = {"sweep before": (), "+full 12": (12,), "+full 16": (16,), "+full 12, 16": (12, 16)}


def _write(path: Path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def main() -> None:
    table = defaultdict(dict)
    recorded = sessions()
    for name, (quick, held) in recorded.items():
        cpu = quick[0]["cpu_id"]
        brats_seg.cpu.cpu_id = lambda cpu=cpu: cpu
        print(f"\n== {name}")
        for sweep, widths in SWEEPS.items():
            added = [
                r
                for k, r in held.items()
                if k.split()[0] == "full" and k.endswith(" off") and int(k.split()[1]) in widths
            ]
            if len(added) < 2 * len(widths):
                print(f"  {sweep}: not every added point was measured in this session; skipped")
                continue
            judged = {
                k: r
                for k, r in held.items()
                if k.split()[0] != "96x112x80"
                and not (k.split()[0] == "full" and k.endswith(" off") and int(k.split()[1]) in widths)
            }
            for form, f in FORMS.items():
                aligns = (
                    f["aligns"]
                    if isinstance(f["aligns"], dict)
                    else dict.fromkeys(("float32", "bfloat16"), f["aligns"])
                )
                stf.ALIGNS, stf.BLOCKS = aligns, f["blocks"]
                with tempfile.TemporaryDirectory() as tmp:
                    q = _write(Path(tmp) / "q.jsonl", quick + added)
                    h = _write(Path(tmp) / "h.jsonl", list(judged.values()))
                    entry = stf.calibrate([q], [h])
                rows = entry["held_out"]
                misses = [r for r in rows if abs(r["error"]) > 0.25]
                table[(sweep, form)][name] = (len(misses), len(rows))
                forms = ", ".join(
                    f"{d[:4]} block {c['block']} bytes {c['bytes_block']} align {c.get('align', 0)}"
                    for d, c in entry["fit"].items()
                )
                print(f"  {sweep:14s} {form:28s} {stf.summary_line(rows)}; misses {len(misses)}  [{forms}]")
                for r in misses:
                    print(f"      {r['error']:+7.1%}  {r['measured_s']:6.2f} s  {r['point']}")
    print("\n== misses of ±25% (held-out points at full resolution and above), per session")
    names = list(recorded)
    print(f"{'':44s}" + "".join(f"{n.split(' (')[0]:>16s}" for n in names) + "   total")
    for (sweep, form), cells in table.items():
        total = sum(m for m, _ in cells.values()), sum(n for _, n in cells.values())
        line = "".join(f"{f'{cells[n][0]} of {cells[n][1]}' if n in cells else '-':>16s}" for n in names)
        print(f"{sweep + ', ' + form:44s}{line}   {total[0]} of {total[1]}")


if __name__ == "__main__":
    main()
