"""Would the step-time model fit this CPU's bf16 if the bytes term counted tensors padded to a channel
block, as oneDNN's blocked layouts store them? Offline, on a calibration's own points (nothing measured):
every pair of (padding of the convolutions' channels in the FLOPs term, padding of every tensor's
channels in the bytes term), fitted as brats_seg.benchmark.step_time_fit fits (non-negative least
squares of the relative error), judged by leave-one-out.

    python docs/measurements/self_calibration_emr/bytes_padding.py docs/measurements/self_calibration_emr/auto_calibration.json
    python docs/measurements/self_calibration_emr/bytes_padding.py docs/measurements/self_calibration_zen5/calibration.json

The shipped form is "bytes block 1". Output: bytes_padding_emr.txt, bytes_padding_zen5.txt.
"""

import itertools
import json
import sys

import numpy as np

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from brats_seg.lms.planner import layer_cost

CH = {}
_orig = layer_cost._BlockCosting.add_tensor


def add_tensor(self, t):
    CH[t.name] = (t.channels, self.batch * self.voxels(t), layer_cost.DTYPE_BYTES[t.dtype])
    return _orig(self, t)


layer_cost._BlockCosting.add_tensor = add_tensor
from brats_seg.benchmark import step_time_fit as stf
from brats_seg.lms.planner.step_time import _conv_padded


def records_from(path, key="fitted_points"):
    d = json.load(open(path))
    out = []
    for r in d[key]:
        ov = ["backend=cpu_onednn"] + r["point"].split()
        prec = [o.split("=")[1] for o in ov if o.startswith("backend.precision=")][0]
        out.append(
            {"overrides": ov, "step_s": r["measured_s"], "strategy": "off", "precision": prec, "label": r["point"]}
        )
    return out


def pad(c, b):
    return -(-c // b) * b


def feats(rec, fb, bb):
    CH.clear()
    stf._network.cache_clear()
    net, _ = stf._network(tuple(rec["overrides"]))
    # channels of block-level tensors (image, block outputs) are not in CH; fall back to bytes
    flops = moved = 0.0
    first = True
    for blk in net.blocks:
        for layer in blk.layers:
            if layer.kind in ("conv", "up_transpose"):
                flops += _conv_padded(layer, fb) * (2.0 if first else 3.0)
                first = False
            for t in (*layer.inputs, layer.output):
                nb = blk.tensor_bytes.get(t, 0)
                if t in CH and CH[t][0]:
                    nb = nb * pad(CH[t][0], bb) / CH[t][0]
                moved += 3.0 * nb
    return flops, moved


def fit(points):
    A = np.array([[f, m, 1.0] for f, m, _ in points])
    y = np.array([s for *_, s in points])
    from scipy.optimize import nnls

    w = 1 / y
    x, _ = nnls(A * w[:, None], y * w)
    return x


def evaluate(recs, fb, bb):
    pts = [(*feats(r, fb, bb), r["step_s"]) for r in recs]
    loo = []
    for k in range(len(pts)):
        x = fit(pts[:k] + pts[k + 1 :])
        f, m, s = pts[k]
        loo.append((x[0] * f + x[1] * m + x[2]) / s - 1)
    return loo, fit(pts)


if __name__ == "__main__":
    path = sys.argv[1]
    recs = records_from(path)
    for dtype in ("fp32", "bf16"):
        rs = [r for r in recs if r["precision"] == dtype]
        print(dtype)
        for fb, bb in itertools.product((1, 4, 8, 16, 32), (1, 8, 16, 32)):
            loo, x = evaluate(rs, fb, bb)
            print(
                f"  flops block {fb:2d} bytes block {bb:2d}: LOO {min(loo):+.0%}..{max(loo):+.0%} worst {max(map(abs, loo)):.0%}  coef {x[0]:.2e} {x[1]:.2e} {x[2]:.2f}"
            )
