#!/usr/bin/env python
"""Check score.py against the official BraTS evaluation code, on designed multi-lesion cases.

    python scripts/check_official_metrics.py [work=/tmp/brats_official_check] [n_cases=10] [metrics_2023=URL or clone]

Needs the network once: it downloads ``brats-evaluation`` 0.0.10 (the official BraTS
2025+ evaluation, built on panoptica; AGPL, so it is run here, never imported by
brats-seg) with ``pip download --no-deps`` and clones rachitsaluja/BraTS-2023-Metrics (the
BraTS 2023/2024 lesion-wise code) into ``work``. For each of the brats2024, brats2021 and
msd label conventions it writes ``n_cases`` cases (several lesions, missed lesions,
false-positive blobs, merged lesions, lesions under the volume threshold, empty masks,
a resection cavity, LPS/RAS storage, anisotropic voxels), scores them with
``scripts/score.py``, runs both official codes on the same files in subprocesses, and
prints the largest difference per column. The official panoptica runs twice: on the file
paths, as the package does, and on the arrays with the spacing in the arrays' axis order
(see README "Metrics" for why the two differ on anisotropic files).

The 2023 code predates numpy 2 and pandas 2; three shims make it run unchanged
(``np.Inf``, ``DataFrame.append``, ``DataFrame.replace`` on a frame with a column of arrays).
Labels are mapped to its 1 NCR / 2 ED / 3 ET convention first; RC is scored as the ET of
a file holding only RC.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np
import scipy.ndimage as ndi

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from brats_seg.data.labels import LABELS, region_label_values  # noqa: E402
from brats_seg.data.synthetic import case_files, write_synthetic_dataset  # noqa: E402

LAYOUTS = ("brats2024", "brats2021", "msd")
BRATS_EVALUATION = "brats-evaluation==0.0.10"
METRICS_2023 = "https://github.com/rachitsaluja/BraTS-2023-Metrics"

SHAPE = (72, 80, 56)  # voxels: small enough to score quickly, large enough for several lesions


def ball(shape, c, r, spacing):
    zz = np.indices(shape).astype(float)
    d = sum(((zz[i] - c[i]) * spacing[i] / r[i]) ** 2 for i in range(3))
    return d <= 1.0


def lesion(shape, c, r_mm, spacing, lab):
    """WT ellipsoid: edema shell, core with ET rim and necrotic centre."""
    out = np.zeros(shape, np.uint8)
    out[ball(shape, c, r_mm, spacing)] = lab["edema"]
    core = ball(shape, c, [x * 0.6 for x in r_mm], spacing)
    out[core] = lab["et"]
    out[ball(shape, c, [x * 0.35 for x in r_mm], spacing)] = lab["core"]
    return out


def paint(dst, src):
    dst[src > 0] = src[src > 0]


def perturb(label, rng):
    """A plausible prediction of ``label``: per-label dilate/erode, a shift."""
    out = np.zeros_like(label)
    for v in sorted(np.unique(label))[1:]:
        m = label == v
        op = rng.integers(0, 3)
        if op == 1:
            m = ndi.binary_dilation(m)
        elif op == 2:
            m = ndi.binary_erosion(m)
        out[m] = v
    return np.roll(out, tuple(rng.integers(-1, 2, 3)), axis=(0, 1, 2))


def design(i, layout, rng):
    t = LABELS[layout]
    lab = {"edema": t.edema, "core": t.core, "et": t.enhancing}
    sp = [(1.0, 1.0, 1.0)] * 5 + [(1.0, 1.0, 3.0), (0.9375, 0.9375, 2.5), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0), (1.2, 1.0, 1.0)]
    spacing = sp[i % len(sp)]
    ref = np.zeros(SHAPE, np.uint8)
    pred = np.zeros(SHAPE, np.uint8)
    s = i % 10
    if s in (0, 1, 2, 5, 6, 9):
        centres = [(20, 22, 18), (50, 55, 36), (52, 20, 20)][: 2 + (s % 2)]
        for c in centres:
            r = rng.uniform(6, 11, 3)
            paint(ref, lesion(SHAPE, c, r, spacing, lab))
        pred = perturb(ref, rng)
        if s in (1, 6):  # a missed lesion
            pred[40:, 40:, :] = 0
        if s in (2, 6, 9):  # false positives: one large, one small blob
            paint(pred, lesion(SHAPE, (60, 60, 10), (5, 5, 5), spacing, lab))
            pred[5:7, 70:72, 45:47] = lab["et"]
        if s in (5, 9):  # reference lesions under the 50 mm3 threshold, one found, one missed
            ref[64:66, 8:10, 48:50] = lab["edema"]
            pred[64:66, 8:10, 48:50] = lab["edema"]
            ref[10:12, 66:68, 4:6] = lab["et"]
    elif s == 3:  # lesions 2-3 voxels apart: merged by the 2023 dilation
        paint(ref, lesion(SHAPE, (25, 40, 28), (7, 7, 7), spacing, lab))
        paint(ref, lesion(SHAPE, (42, 40, 28), (7, 7, 7), spacing, lab))
        pred = perturb(ref, rng)
        pred[33:35, 37:43, 25:31] = lab["edema"]  # predicted as one lesion
    elif s == 4:  # empty prediction
        paint(ref, lesion(SHAPE, (30, 30, 25), (9, 8, 7), spacing, lab))
    elif s == 7:  # empty reference, false positives
        paint(pred, lesion(SHAPE, (30, 30, 25), (6, 6, 6), spacing, lab))
    # s == 8: both empty
    if t.cavity is not None:
        if s in (0, 2, 3, 5):
            ref[5:15, 60:70, 5:12] = t.cavity
            pred[6:15, 60:71, 5:12] = t.cavity
        if s in (1, 6):
            ref[5:15, 60:70, 5:12] = t.cavity  # missed cavity
        if s in (7, 9):
            pred[60:66, 5:12, 40:50] = t.cavity  # false-positive cavity
    return ref, pred, spacing


def affine_for(spacing, lps):
    a = np.diag([*spacing, 1.0])
    if lps:
        a[0, 0] *= -1
        a[1, 1] *= -1
        a[:3, 3] = [SHAPE[0] * spacing[0], SHAPE[1] * spacing[1], 0]
    return a


def save(path, data, affine):
    path.parent.mkdir(parents=True, exist_ok=True)
    img = nib.Nifti1Image(data.astype(np.uint8), affine)
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    nib.save(img, str(path))


def build(work: Path, layout: str, n: int) -> tuple[Path, Path, list[dict]]:
    root, preds = work / layout / "ref", work / layout / "pred"
    ids = write_synthetic_dataset(root, layout, n_cases=n, seed=1)  # images; the labels are replaced
    rng = np.random.default_rng(7)
    cases = []
    for i, cid in enumerate(ids):
        ref, pred, spacing = design(i, layout, rng)
        aff = affine_for(spacing, lps=(i % 3 == 1))
        seg = case_files(root, layout, i)["seg"]
        save(seg, ref, aff)
        save(preds / f"{cid}.nii.gz", pred, aff)
        cases.append({"case_id": cid, "ref": str(seg), "pred": str(preds / f"{cid}.nii.gz")})
    return root, preds, cases


def official_config(work: Path, layout: str) -> Path:
    """The official GLI config with this layout's label values."""
    text = (work / "be" / "brats_evaluation" / "configs" / "config_gli.yaml").read_text()
    head, _, _ = text.partition("segmentation_class_groups:")
    groups = "segmentation_class_groups: !SegmentationClassGroups\n  groups:\n"
    for r, vals in region_label_values(layout).items():
        kind = "LabelGroup" if len(vals) == 1 else "LabelMergeGroup"
        groups += f"    {r}: !{kind}\n      single_instance: false\n      value_labels: {list(vals)}\n"
    out = work / layout / "config.yaml"
    out.write_text(head + groups + "verbose: false\n")
    return out


def fetch(work: Path, metrics_2023: str) -> None:
    be = work / "be"
    if not (be / "brats_evaluation").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(be), BRATS_EVALUATION],
                       check=True)
        zipfile.ZipFile(next(be.glob("brats_evaluation-*.whl"))).extractall(be)
    if not (work / "ref2023" / "metrics.py").is_file():
        done = subprocess.run(["git", "clone", "-q", metrics_2023, str(work / "ref2023")])
        if done.returncode != 0:
            raise SystemExit(f"error: could not clone {metrics_2023}; pass metrics_2023=<a local clone of "
                             "rachitsaluja/BraTS-2023-Metrics>.")


# --- the official runners (run in subprocesses: each has its own imports) ----------------

def run_official(work: Path, cfg: str, cases: str, out: str) -> None:
    import warnings

    sys.path.insert(0, str(work / "be"))
    warnings.filterwarnings("ignore")
    from brats_evaluation.evaluation import evaluate_single_exam
    from panoptica import Panoptica_Evaluator

    ev = Panoptica_Evaluator.load_from_config(cfg)

    def flat(r):
        return {k: {kk: (None if vv != vv else vv) for kk, vv in v.items() if not isinstance(vv, list)}
                for k, v in r.items() if isinstance(v, dict)}

    res = {"files": {}, "arrays": {}}
    for c in json.loads(Path(cases).read_text()):
        r = evaluate_single_exam(c["pred"], c["ref"], c["case_id"], ev)
        assert "error" not in r, r
        res["files"][c["case_id"]] = flat(r)
        p, g = nib.load(c["pred"]), nib.load(c["ref"])
        spacing = tuple(float(z) for z in g.header.get_zooms())
        r = ev.evaluate(np.asarray(p.dataobj), np.asarray(g.dataobj), voxelspacing=spacing)
        res["arrays"][c["case_id"]] = flat({k: v.to_dict(True) for k, v in r.items()})
    Path(out).write_text(json.dumps(res, default=float))


def run_2023(work: Path, cases: str, out: str, layout: str) -> None:
    import tempfile
    import warnings

    import pandas as pd

    sys.path.insert(0, str(work / "ref2023"))  # its own vendored surface_distance first
    warnings.filterwarnings("ignore")
    np.Inf = np.inf
    pd.DataFrame.append = lambda self, other: pd.concat([self, other])
    replace = pd.DataFrame.replace

    def replace_numeric(self, to_replace=None, value=None, **kw):
        try:
            return replace(self, to_replace, value, **kw)
        except ValueError:  # pandas 2 cannot compare a column of arrays with inf
            out = self.copy()
            num = out.select_dtypes("number").columns
            out[num] = replace(out[num], to_replace, value, **kw)
            return out

    pd.DataFrame.replace = replace_numeric
    import metrics as eval2023

    mapping = {"brats2024": {1: 1, 2: 2, 3: 3}, "brats2021": {1: 1, 2: 2, 4: 3}, "msd": {1: 2, 2: 1, 3: 3}}[layout]
    tmp = tempfile.mkdtemp()

    def remap(path, table, name):
        img = nib.load(path)
        a = np.asarray(img.dataobj)
        o = np.zeros_like(a)
        for k, v in table.items():
            o[a == k] = v
        p = str(Path(tmp) / name)
        nib.save(nib.Nifti1Image(o, img.affine, img.header), p)
        return p

    keys = ("LesionWise_Score_Dice", "LesionWise_Score_HD95")
    res = {}
    for c in json.loads(Path(cases).read_text()):
        cid = c["case_id"]
        challenge = "-".join(cid.split("-")[:2]) if cid.startswith("BraTS-") else "BraTS-GLI"
        df = eval2023.get_LesionWiseResults(remap(c["pred"], mapping, "p.nii.gz"), remap(c["ref"], mapping, "r.nii.gz"),
                                            challenge)
        res[cid] = {r["Labels"].lower(): {k: float(r[k]) for k in keys} for _, r in df.iterrows()}
        if layout == "brats2024":
            df = eval2023.get_LesionWiseResults(remap(c["pred"], {4: 3}, "p.nii.gz"), remap(c["ref"], {4: 3}, "r.nii.gz"),
                                                challenge)
            row = df[df["Labels"] == "ET"].iloc[0]
            res[cid]["rc"] = {k: float(row[k]) for k in keys}
    Path(out).write_text(json.dumps(res))


# --- comparison ------------------------------------------------------------------------

PANOPTICA = {"nsd": "global_bin_nsd", "lesion_dice": "sq_dsc", "lesion_nsd": "sq_nsd", "lesion_hd95": "sq_hd95",
             "lesions_ref": "n_ref_instances", "lesions_pred": "n_pred_instances", "lesions_tp": "tp",
             "rq": "rq", "pq": "pq_dsc"}
LESION23 = {"lesion23_dice": "LesionWise_Score_Dice", "lesion23_hd95": "LesionWise_Score_HD95"}


def num(x) -> float:
    if x is None or x == "":
        return math.nan
    x = float(x)
    return 373.0 if math.isinf(x) else x  # as our CSV writes it


def compare(layout: str, csv_path: Path, wd: Path, mode: str) -> tuple[dict, list]:
    ours = {r["case_id"]: r for r in csv.DictReader(open(csv_path))}
    official = json.loads((wd / "official.json").read_text())[mode]
    ref23 = json.loads((wd / "ref2023.json").read_text())
    worst, over = {}, []
    for cid, row in ours.items():
        for region in region_label_values(layout):
            pairs = [(c, num(row[f"{c}_{region}"]), num(official[cid][region].get(k))) for c, k in PANOPTICA.items()]
            pairs += [(c, num(row[f"{c}_{region}"]), float(ref23[cid][region][k])) for c, k in LESION23.items()]
            for col, a, b in pairs:
                d = 0.0 if (math.isnan(a) and math.isnan(b)) else abs(a - b) if not (math.isnan(a) or math.isnan(b)) else math.inf
                worst[col] = max(worst.get(col, 0.0), d)
                if d > (0.05 if "hd95" in col else 1e-4):
                    over.append((cid, f"{col}_{region}", a, b))
    return worst, over


def main(argv: list[str]) -> int:
    args = dict(a.split("=", 1) for a in argv if "=" in a)
    if argv and argv[0] == "_official":
        run_official(Path(args["work"]), args["cfg"], args["cases"], args["out"])
        return 0
    if argv and argv[0] == "_2023":
        run_2023(Path(args["work"]), args["cases"], args["out"], args["layout"])
        return 0
    work = Path(args.get("work", "/tmp/brats_official_check")).resolve()
    n = int(args.get("n_cases", 10))
    fetch(work, args.get("metrics_2023", METRICS_2023))
    me = [sys.executable, str(Path(__file__).resolve())]
    failed = False
    for layout in LAYOUTS:
        root, preds, cases = build(work, layout, n)
        wd = work / layout
        (wd / "cases.json").write_text(json.dumps(cases))
        subprocess.run([sys.executable, str(REPO / "scripts" / "score.py"), f"pred_dir={preds}", f"ref_dir={root}",
                        f"data={layout}"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        subprocess.run([*me, "_official", f"work={work}", f"cfg={official_config(work, layout)}",
                        f"cases={wd / 'cases.json'}", f"out={wd / 'official.json'}"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([*me, "_2023", f"work={work}", f"cases={wd / 'cases.json'}", f"out={wd / 'ref2023.json'}",
                        f"layout={layout}"], check=True, stdout=subprocess.DEVNULL)
        for mode in ("arrays", "files"):
            worst, over = compare(layout, preds / "metrics.csv", wd, mode)
            label = "panoptica on arrays + 2023 code" if mode == "arrays" else "brats-evaluation on file paths"
            print(f"{layout:10s} {len(cases)} cases, vs {label}: largest difference "
                  + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items()))
                  + (f"\n           over tolerance in {len({o[0] for o in over})} case(s): "
                     f"{sorted({o[0] for o in over})}" if over else "\n           all within 1e-4 (Dice/NSD) / 0.05 mm"))
            failed |= bool(over) and mode == "arrays"
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
