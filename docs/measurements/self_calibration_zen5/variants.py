"""Could another form of the step-time model, or another quick sweep, hold issue 47's +-25% on the
full-resolution widths? Tried offline on points already recorded on this Zen 5 (nothing measured):
each variant is fitted on a quick-sweep-like subset of the width sweeps and judged on the
full-resolution widths it did not see.

    python docs/measurements/self_calibration_zen5/variants.py > docs/measurements/self_calibration_zen5/variants.txt

Forms: ``padded`` is the shipped model (seconds = a * FLOPs with channels padded to the block +
b * bytes + c); ``split`` prices the FLOPs of convolutions whose channels are a multiple of the block
and of the others ("ragged": oneDNN's slower paths) at two rates, unpadded. Blocks: chosen per dtype
by the fit's leave-one-out error (as calibrate() does), by its own residual, or fixed.
Sets: the shipped quick points; + full 12 and 16 filters; + half 12 and 24 as well.
"""

import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from brats_seg.benchmark import step_time_fit as stf  # noqa: E402
from brats_seg.lms.planner.step_time import step_features  # noqa: E402

FILES = ["width_zen5/after/results.jsonl", "width_zen5/half/results.jsonl"]
records = []
for f in FILES:
    for line in (REPO / "docs/measurements" / f).read_text().splitlines():
        r = json.loads(line)
        if r["strategy"] == "off":
            o = dict(x.split("=", 1) for x in r["overrides"] if "=" in x)
            r["key"] = (o["resolution"], int(o["model.base_filters"]))
            records.append(r)


def features(r, block):
    net, _ = stf._network(tuple(r["overrides"]))
    padded = step_features(net, block)
    out = {"padded": padded["padded_flops"], "bytes": padded["bytes"], "blocked": 0.0, "ragged": 0.0}
    first = True
    for b in net.blocks:
        for layer in b.layers:
            if layer.kind in ("conv", "up_transpose"):
                cin, cout = layer.channels
                weight = 2.0 if first else 3.0
                first = False
                ragged = bool(cin and cout and (cin % block or cout % block))
                out["ragged" if ragged else "blocked"] += layer.forward_flops * weight
    return out


FORMS = {"padded": ["padded", "bytes"], "split": ["blocked", "ragged", "bytes"]}


def fit(rows, cols):
    a = np.array([[x[c] for c in cols] + [1.0] for x in rows])
    y = np.array([x["t"] for x in rows])
    s = a.max(0)
    s[s == 0] = 1
    w, _ = nnls(a / s / y[:, None], np.ones_like(y))
    return w / s


def predict(x, w, cols):
    return float(np.dot([x[c] for c in cols] + [1.0], w))


def judge(quick, form, select):
    cols = FORMS[form]
    held = []
    for prec in ("fp32", "bf16"):
        best = None
        for block in (select,) if isinstance(select, int) else (1, 4, 8, 16):
            rows = [
                {**features(r, block), "t": r["step_s"]}
                for r in records
                if r["precision"] == prec and r["key"] in quick
            ]
            if select == "loo":
                errs = [predict(x, fit(rows[:k] + rows[k + 1 :], cols), cols) / x["t"] - 1 for k, x in enumerate(rows)]
            else:
                errs = [predict(x, fit(rows, cols), cols) / x["t"] - 1 for x in rows]
            worst = max(abs(e) for e in errs)
            if best is None or worst < best[0]:
                best = (worst, block, fit(rows, cols))
        _, block, w = best
        for r in records:
            if r["precision"] == prec and r["key"] not in quick and r["key"][0] == "full":
                e = predict(features(r, block), w, cols) / r["step_s"] - 1
                held.append((f"full {r['key'][1]}f {prec} (block {block})", e))
    errs = [e for _, e in held]
    verdict = "holds" if max(abs(e) for e in errs) <= 0.25 else "misses"
    print(
        f"{form:6s} block by {select!s:4s} | {min(errs):+.1%} .. {max(errs):+.1%}, median |error| "
        f"{statistics.median(abs(e) for e in errs):.1%}: {verdict} +-25% | "
        + ", ".join(f"{n} {e:+.0%}" for n, e in held)
    )


QUICK = {("half", 4), ("half", 8), ("half", 16), ("half", 32), ("full", 4), ("full", 8)}
SETS = {
    "shipped quick points": QUICK,
    "+ full 12, 16": QUICK | {("full", 12), ("full", 16)},
    "+ full 12, 16, half 12, 24": QUICK | {("full", 12), ("full", 16), ("half", 12), ("half", 24)},
}
for name, quick in SETS.items():
    print(f"## fitted on {name}; judged on the full-resolution widths not in it")
    for form in FORMS:
        for select in ("loo", "fit", 8, 16):
            judge(quick, form, select)
