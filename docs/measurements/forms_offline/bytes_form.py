"""Offline, nothing measured, not shipped: the form ``onednn_kernels_emr`` suggests, judged on every
recorded session's held-out ``lms=off`` points at full resolution and above (the recompute points
need the planner's pricing and are left out): an extra rate on the bytes of activations whose
channels are off the block (8 in fp32, 16 in bf16) instead of on the FLOPs of such convolutions.
Each fitted to its session's quick sweep plus full-resolution 12 and 16 filters (as shipped).

    seconds = a * padded FLOPs + b * bytes + b' * off-block bytes + c    (non-negative least squares,
                                                                          relative errors; paddings
                                                                          chosen by leave-one-out)

    python docs/measurements/forms_offline/bytes_form.py > docs/measurements/forms_offline/bytes_form.txt
"""

import itertools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "calibration_3draws_emr"))
from draws import _held  # noqa: E402
from forms import _label, _quick, sessions  # noqa: E402

from brats_seg.benchmark import step_time_fit as stf  # noqa: E402
from brats_seg.lms.planner.step_time import step_features  # noqa: E402

ALIGN = {"fp32": 8, "bf16": 16}


def features(r: dict, block: int, bytes_block: int, form: str) -> list[float]:
    net, _ = stf._network(tuple(r["overrides"]))
    align = ALIGN[r["precision"]]
    f = step_features(net, block, bytes_block, align)
    off_bytes = 0.0
    for blk in net.blocks:
        for layer in blk.layers:
            for t in (*layer.inputs, layer.output):
                c = blk.tensor_channels.get(t, 0)
                if c and c % align:
                    off_bytes += 3.0 * blk.tensor_bytes.get(t, 0)
    extra = {"one rate": 0.0, "off-block FLOPs (shipped)": f["unaligned_flops"], "off-block bytes": off_bytes}[form]
    return [f["padded_flops"], f["bytes"], 1.0, extra]


def fit(rows):
    a = np.array([x for x, _ in rows], dtype=float)
    y = np.array([t for _, t in rows], dtype=float)
    scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
    x, _ = nnls(a / scale / y[:, None], np.ones_like(y))
    return x / scale


def judge(quick, held, form):
    by = defaultdict(list)
    for r in quick:
        by[r["precision"]].append(r)
    errors = []
    for precision, recs in by.items():
        best = None
        for block, bytes_block in itertools.product(stf.BLOCKS, stf.BYTES_BLOCKS):
            rows = [(features(r, block, bytes_block, form), r["step_s"]) for r in recs]
            loo = []
            for k in range(len(rows)):
                coef = fit(rows[:k] + rows[k + 1 :])
                loo.append(abs(float(np.dot(coef, rows[k][0])) / rows[k][1] - 1))
            if best is None or max(loo) < best[0]:
                best = (max(loo), block, bytes_block, fit(rows))
        _, block, bytes_block, coef = best
        for r in held:
            if r["precision"] == precision:
                errors.append((float(np.dot(coef, features(r, block, bytes_block, form))) / r["step_s"] - 1, _label(r)))
    return errors


def main() -> None:
    alls = dict(sessions())
    new = json.loads((HERE.parent / "sweep_align_emr" / "calibration.json").read_text())
    held_new = {_label(r): r for r in _held(HERE.parent / "sweep_align_emr" / "held").values()}
    totals = defaultdict(lambda: [0, 0])
    for name, (quick, held) in list(alls.items()) + [("EMR session 4 (sweep_align_emr)", (_quick(new), held_new))]:
        wide = [
            r for k, r in held.items() if k.startswith("full ") and k.endswith(" off") and int(k.split()[1]) in (12, 16)
        ]
        fitq = quick + wide if "session 4" not in name else quick
        judged = [r for k, r in held.items() if k.endswith(" off") and not k.startswith("96x112x80") and r not in wide]
        print(f"\n== {name}: fitted on {len(fitq)}, judged on {len(judged)}")
        for form in ("one rate", "off-block FLOPs (shipped)", "off-block bytes"):
            errs = judge(fitq, judged, form)
            miss = [(e, k) for e, k in errs if abs(e) > 0.25]
            totals[form][0] += len(miss)
            totals[form][1] += len(errs)
            med = statistics.median(abs(e) for e, _ in errs)
            print(
                f"  {form:26s} {min(e for e, _ in errs):+.1%}..{max(e for e, _ in errs):+.1%}, median {med:.1%}; "
                f"outside ±25%: {len(miss)}  " + ", ".join(f"{k} {e:+.0%}" for e, k in miss)
            )
    print("\n== total outside ±25%")
    for form, (m, n) in totals.items():
        print(f"  {form:26s} {m} of {n}")


if __name__ == "__main__":
    main()
