#!/usr/bin/env python
"""Check score.py against the official BraTS evaluation code, on designed multi-lesion cases.

    python scripts/check_official_metrics.py [work=/tmp/brats_official_check] [n_cases=10]
        [official=<folder holding brats_evaluation/>] [metrics_2023=<clone of BraTS-2023-Metrics>]
        [download=true]
    python scripts/check_official_metrics.py expected=tests/data/official_metrics/anisotropic.json

The official code is run here, never imported by brats-seg: ``brats-evaluation`` 0.0.10 (the
official BraTS 2025+ evaluation, built on panoptica; AGPL) and rachitsaluja/BraTS-2023-Metrics
(the BraTS 2023/2024 lesion-wise code). Nothing is fetched unless ``download=true``: the
official package is taken from ``official=`` (an unpacked wheel or a site-packages folder),
else from this interpreter if it is installed, else from ``<work>/be/unpacked`` (an earlier download);
the 2023 code from ``metrics_2023=``, else ``<work>/ref2023``, else its comparison is skipped.
``download=true`` gets whichever is missing (``pip download --no-deps``, ``git clone``).

For each of the brats2024, brats2023, brats2021 and msd label conventions it writes
``n_cases`` cases (several lesions per region, missed lesions, false-positive blobs, merged
lesions, lesions under the volume threshold, empty masks, a resection cavity; voxels of
1 mm and of five anisotropic sizes, most with a different size on each axis; files stored
RAS, LPS and ASL, an axis-permuted storage), scores them with ``scripts/score.py``, runs
both official codes on the same files in subprocesses, and prints the largest difference
per column; it fails (exit 1) above 1e-6 (1e-4 mm for distances). The brats2023 cases are
the brats2024 files with the resection cavity (4) folded into necrosis (1). It also
compares our panoptica evaluator with the official GLI configuration field by field, and
reports how far the official lesion-wise HD95/NSD are from panoptica given each array
axis's own voxel size (README "Metrics": SimpleITK's ``(k, j, i)`` array with the
``(i, j, k)`` spacing).

``expected=<json>`` instead writes the official values of a few small anisotropic cases
(:func:`brats_seg.evaluation.scoring.official_cases.small_case`) to ``<json>``, the test data of
tests/unit/test_official_metrics.py. The cases are :mod:`brats_seg.evaluation.scoring.official_cases`'s.

The 2023 code predates numpy 2 and pandas 2; three shims make it run unchanged
(``np.Inf``, ``DataFrame.append``, ``DataFrame.replace`` on a frame with a column of arrays).
Labels are mapped to its 1 NCR / 2 ED / 3 ET convention first; RC is scored as the ET of
a file holding only RC.

The official codes run in child processes of this script (``--child official|2023 <json>``,
:func:`brats_seg.cli.child_command`), not as Hydra commands: each child must import the official
code from the folder its parent found (first on its ``PYTHONPATH``: the unpacked package, the
clone with its own vendored ``surface_distance``) rather than from anything installed, and the
brats-seg package never imports that code.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np

from brats_seg.cli import child_args, child_command, hydra_entry, to_config, user_errors
from brats_seg.data.labels import region_label_values
from brats_seg.evaluation.scoring.official_cases import SMALL_CASES, write_designed_cases, write_small_cases
from brats_seg.files import atomic_dir, atomic_path, write_text_atomic
from brats_seg.script_configs import register_configs

register_configs()
REPO = Path(__file__).resolve().parents[1]  # score.py is run here

LAYOUTS = ("brats2024", "brats2023", "brats2021", "msd")
BRATS_EVALUATION = "brats-evaluation==0.0.10"
METRICS_2023 = "https://github.com/rachitsaluja/BraTS-2023-Metrics"
OFFICIAL_CONFIG = Path("brats_evaluation") / "configs" / "config_gli.yaml"

# Tolerances of the comparison: values and distances (mm).
TOL, TOL_MM = 1e-6, 1e-4


# --- the official codes: where they are --------------------------------------------------


def find_official(work: Path, official: str, download: bool) -> Path:
    """The folder holding the ``brats_evaluation`` package (first on the child's ``PYTHONPATH``)."""
    if official:
        folder = Path(official).expanduser().resolve()
        if not (folder / "brats_evaluation").is_dir():
            raise FileNotFoundError(
                f"official={folder} holds no brats_evaluation/ folder: pass an unpacked "
                f"{BRATS_EVALUATION} wheel or the site-packages it is installed in."
            )
        return folder
    installed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import brats_evaluation, os; print(os.path.dirname(os.path.dirname(brats_evaluation.__file__)))",
        ],
        capture_output=True,
        text=True,
    )
    if installed.returncode == 0:
        return Path(installed.stdout.strip())
    be = work / "be"
    unpacked = be / "unpacked"  # whole or absent: an interrupted unpacking is never taken for the package
    if not (unpacked / "brats_evaluation").is_dir():
        if not download:
            raise FileNotFoundError(
                f"brats-evaluation is not installed here, and not in {unpacked}: pass official="
                f"<folder holding brats_evaluation/>, or download=true to fetch {BRATS_EVALUATION} "
                "with pip."
            )
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(be), BRATS_EVALUATION], check=True
        )
        with atomic_dir(unpacked) as tmp:
            zipfile.ZipFile(next(be.glob("brats_evaluation-*.whl"))).extractall(tmp)
    return unpacked


def find_2023(work: Path, metrics_2023: str, download: bool) -> Path | None:
    """A clone of BraTS-2023-Metrics, or None (its comparison is then skipped)."""
    if metrics_2023 and (Path(metrics_2023) / "metrics.py").is_file():
        return Path(metrics_2023).resolve()
    clone = work / "ref2023"
    if (clone / "metrics.py").is_file():
        return clone
    if not download:
        return None
    source = metrics_2023 or METRICS_2023
    with atomic_dir(clone) as tmp:  # an interrupted clone is never taken for a whole one
        if subprocess.run(["git", "clone", "-q", source, str(tmp)]).returncode != 0:
            raise ValueError(
                f"could not clone {source}; pass metrics_2023=<a local clone of rachitsaluja/BraTS-2023-Metrics>."
            )
    return clone


def official_config(official: Path, work: Path, layout: str) -> Path:
    """The official GLI config; for other label conventions, with this layout's values."""
    path = official / OFFICIAL_CONFIG
    if layout in ("brats2023", "brats2024"):  # the GLI labels: the file as it is
        return path
    head, _, _ = path.read_text().partition("segmentation_class_groups:")
    groups = "segmentation_class_groups: !SegmentationClassGroups\n  groups:\n"
    for r, vals in region_label_values(layout).items():
        kind = "LabelGroup" if len(vals) == 1 else "LabelMergeGroup"
        groups += f"    {r}: !{kind}\n      single_instance: false\n      value_labels: {list(vals)}\n"
    out = work / layout / "config.yaml"
    write_text_atomic(out, head + groups + "verbose: false\n")
    return out


# --- the official runners (run in subprocesses: each has its own imports) ----------------

PANOPTICA = {
    "nsd": "global_bin_nsd",
    "lesion_dice": "sq_dsc",
    "lesion_nsd": "sq_nsd",
    "lesion_hd95": "sq_hd95",
    "lesions_ref": "n_ref_instances",
    "lesions_pred": "n_pred_instances",
    "lesions_tp": "tp",
    "rq": "rq",
    "pq": "pq_dsc",
}
LESION23 = {"lesion23_dice": "LesionWise_Score_Dice", "lesion23_hd95": "LesionWise_Score_HD95"}


def _versions(official: Path) -> dict:
    from importlib import metadata

    import SimpleITK as sitk

    version = None
    for meta in official.glob("brats_evaluation-*.dist-info/METADATA"):
        version = next(
            line.split(":", 1)[1].strip() for line in meta.read_text().splitlines() if line.startswith("Version:")
        )
    if version is None:
        version = metadata.version("brats-evaluation")
    return {
        "brats_evaluation": version,
        "panoptica": metadata.version("panoptica"),
        "SimpleITK": sitk.Version_VersionString(),
        "nibabel": nib.__version__,
        "numpy": np.__version__,
    }


def _config_differences(official_ev, layout: str) -> list[str]:
    """Fields of our evaluator that differ from the official config's (groups: ours only)."""
    from panoptica import Panoptica_Evaluator
    from panoptica.utils.config import _register_helper_classes
    from ruamel.yaml import YAML

    from brats_seg.evaluation.scoring.panoptica_metrics import make_panoptica_evaluator

    def dump(value) -> str:
        yaml = YAML(typ="safe")
        yaml.default_flow_style = None
        yaml.representer.ignore_aliases = lambda *a: True
        _register_helper_classes(yaml)
        yaml.register_class(Panoptica_Evaluator)
        out = io.StringIO()
        yaml.dump(value, out)
        return out.getvalue()

    theirs = Panoptica_Evaluator._yaml_repr(official_ev)
    ours = Panoptica_Evaluator._yaml_repr(make_panoptica_evaluator(region_label_values(layout)))
    differ = [k for k in theirs if k != "segmentation_class_groups" and dump(theirs[k]) != dump(ours[k])]
    their_groups = theirs["segmentation_class_groups"]._yaml_repr(theirs["segmentation_class_groups"])["groups"]
    our_groups = ours["segmentation_class_groups"]._yaml_repr(ours["segmentation_class_groups"])["groups"]
    differ += [
        f"group {r}" for r in our_groups if r not in their_groups or dump(our_groups[r]) != dump(their_groups[r])
    ]
    return differ


def run_official(official: Path, cfg: str, cases: str, out: str, layout: str) -> None:
    """In the child (``official`` first on its ``PYTHONPATH``): brats-evaluation on the file paths
    (what it does), and, for comparison, panoptica on nibabel's (x, y, z) arrays with each axis's
    own voxel size."""
    import contextlib
    import warnings

    warnings.filterwarnings("ignore")
    from brats_evaluation.evaluation import evaluate_single_exam
    from panoptica import Panoptica_Evaluator

    with contextlib.redirect_stdout(io.StringIO()):
        ev = Panoptica_Evaluator.load_from_config(cfg)

    def flat(r):
        return {
            k: {kk: (None if vv != vv else vv) for kk, vv in v.items() if not isinstance(vv, list)}
            for k, v in r.items()
            if isinstance(v, dict)
        }

    res = {
        "versions": _versions(official),
        "config_differences": _config_differences(ev, layout),
        "files": {},
        "physical": {},
    }
    for c in json.loads(Path(cases).read_text()):
        with contextlib.redirect_stdout(io.StringIO()):
            r = evaluate_single_exam(c["pred"], c["ref"], c["case_id"], ev)
        assert "error" not in r, r
        res["files"][c["case_id"]] = flat(r)
        p, g = nib.load(c["pred"]), nib.load(c["ref"])
        spacing = tuple(float(z) for z in g.header.get_zooms())
        r = ev.evaluate(np.asarray(p.dataobj), np.asarray(g.dataobj), voxelspacing=spacing)
        res["physical"][c["case_id"]] = flat({k: v.to_dict(True) for k, v in r.items()})
    write_text_atomic(out, json.dumps(res, default=float))


def run_2023(cases: str, out: str, layout: str) -> None:
    """In the child (the clone first on its ``PYTHONPATH``: its own ``metrics`` and vendored
    ``surface_distance``): the BraTS 2023 lesion-wise code on the files, labels mapped to its
    convention."""
    import tempfile
    import warnings

    import pandas as pd

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

    mapping = {
        "brats2024": {1: 1, 2: 2, 3: 3},
        "brats2023": {1: 1, 2: 2, 3: 3},
        "brats2021": {1: 1, 2: 2, 4: 3},
        "msd": {1: 2, 2: 1, 3: 3},
    }[layout]
    tmp = tempfile.mkdtemp()

    def remap(path, table, name):
        img = nib.load(path)
        a = np.asarray(img.dataobj)
        o = np.zeros_like(a)
        for k, v in table.items():
            o[a == k] = v
        p = Path(tmp) / name
        with atomic_path(p) as part:
            nib.save(nib.Nifti1Image(o, img.affine, img.header), str(part))
        return str(p)

    keys = ("LesionWise_Score_Dice", "LesionWise_Score_HD95")
    res = {}
    for c in json.loads(Path(cases).read_text()):
        cid = c["case_id"]
        challenge = "-".join(cid.split("-")[:2]) if cid.startswith("BraTS-") else "BraTS-GLI"
        df = eval2023.get_LesionWiseResults(
            remap(c["pred"], mapping, "p.nii.gz"), remap(c["ref"], mapping, "r.nii.gz"), challenge
        )
        res[cid] = {r["Labels"].lower(): {k: float(r[k]) for k in keys} for _, r in df.iterrows()}
        if layout == "brats2024":
            df = eval2023.get_LesionWiseResults(
                remap(c["pred"], {4: 3}, "p.nii.gz"), remap(c["ref"], {4: 3}, "r.nii.gz"), challenge
            )
            row = df[df["Labels"] == "ET"].iloc[0]
            res[cid]["rc"] = {k: float(row[k]) for k in keys}
    write_text_atomic(out, json.dumps(res))


# --- comparison ------------------------------------------------------------------------


def num(x) -> float:
    if x is None or x == "":
        return math.nan
    x = float(x)
    return 373.0 if math.isinf(x) else x  # as our CSV writes it


def difference(a: float, b: float) -> float:
    if math.isnan(a) and math.isnan(b):
        return 0.0
    return math.inf if math.isnan(a) or math.isnan(b) else abs(a - b)


def compare(layout: str, csv_path: Path, wd: Path, mode: str, with_2023: bool) -> tuple[dict, list]:
    """Largest difference per column between our CSV and the official ``mode`` values, and
    the cells over tolerance ``(case, column, ours, official)``."""
    ours = {r["case_id"]: r for r in csv.DictReader(open(csv_path))}
    official = json.loads((wd / "official.json").read_text())[mode]
    ref23 = json.loads((wd / "ref2023.json").read_text()) if with_2023 else {}
    worst, over = {}, []
    for cid, row in ours.items():
        for region in region_label_values(layout):
            pairs = [(c, num(row[f"{c}_{region}"]), num(official[cid][region].get(k))) for c, k in PANOPTICA.items()]
            if with_2023:
                pairs += [(c, num(row[f"{c}_{region}"]), float(ref23[cid][region][k])) for c, k in LESION23.items()]
            for col, a, b in pairs:
                d = difference(a, b)
                worst[col] = max(worst.get(col, 0.0), d)
                if d > (TOL_MM if "hd95" in col else TOL):
                    over.append((cid, f"{col}_{region}", a, b))
    return worst, over


def score(preds: Path, root: Path, layout: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "score.py"), f"pred_dir={preds}", f"ref_dir={root}", f"data={layout}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ValueError(f"score.py failed on {preds}:\n{done.stdout}{done.stderr}")


def _child(role: str, first_on_path: Path, **args) -> None:
    """This script as a child running ``role`` with ``first_on_path`` ahead of site-packages."""
    path = os.pathsep.join(p for p in (str(first_on_path), os.environ.get("PYTHONPATH", "")) if p)
    subprocess.run(
        child_command(Path(__file__).resolve(), role, **args),
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": path},
    )


def run_official_subprocess(official: Path, cfg: Path, cases_json: Path, out: Path, layout: str) -> dict:
    _child(
        "official", official, official=str(official), cfg=str(cfg), cases=str(cases_json), out=str(out), layout=layout
    )
    return json.loads(out.read_text())


def write_expected(path: Path, work: Path, official: Path, argv: list[str]) -> int:
    """The official values of the small cases, for tests/unit/test_official_metrics.py."""
    doc = {
        "about": "Official BraTS evaluation values of the small anisotropic cases of "
        "scripts/check_official_metrics.py (small_case): brats-evaluation's evaluate_single_exam on "
        "the NIfTI files with its GLI config. Numbers only; an infinite distance is written 373, an "
        "undefined value null. Compared with score.py's columns by tests/unit/test_official_metrics.py.",
        "command": "python scripts/check_official_metrics.py " + " ".join(shlex.quote(a) for a in argv),
        "config": str(OFFICIAL_CONFIG),
        "versions": {},
        "cases": [{"voxel_mm": list(spacing), "storage": storage} for spacing, storage in SMALL_CASES],
    }
    failed = False
    for layout in ("brats2024", "brats2023"):
        wd = work / "small" / layout
        cases = write_small_cases(wd / "ref", wd / "pred", layout)
        write_text_atomic(wd / "cases.json", json.dumps(cases))
        official_values = run_official_subprocess(
            official, official_config(official, work, layout), wd / "cases.json", wd / "official.json", layout
        )
        doc["versions"] = official_values["versions"]
        if official_values["config_differences"]:
            print(f"our evaluator differs from the official config in: {official_values['config_differences']}")
            failed = True
        score(wd / "pred", wd / "ref", layout)
        worst, over = compare(layout, wd / "pred" / "metrics.csv", wd, "files", with_2023=False)
        print(
            f"{layout:10s} {len(cases)} small cases, score.py vs brats-evaluation: largest difference "
            + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items()))
        )
        failed |= bool(over)
        for entry, c in zip(doc["cases"], cases):
            values = official_values["files"][c["case_id"]]
            entry[layout] = {
                "case_id": c["case_id"],
                **{
                    region: {
                        col: (None if math.isnan(v := num(values[region].get(k))) else v)
                        for col, k in PANOPTICA.items()
                    }
                    for region in region_label_values(layout)
                },
            }
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    print(
        f"wrote {path} (brats-evaluation {doc['versions']['brats_evaluation']}, "
        f"panoptica {doc['versions']['panoptica']})"
    )
    return 1 if failed else 0


def check(conf, argv: list[str]) -> int:
    """The check (or, ``expected=``, the test data) of :class:`brats_seg.script_configs.OfficialMetricsCheckConfig`;
    exit status 1 if a value or the evaluator's configuration differs beyond the tolerances."""
    work = Path(conf.work).expanduser().resolve()
    official = find_official(work, conf.official, conf.download)
    if conf.expected:
        return write_expected(Path(conf.expected), work, official, argv)
    clone_2023 = find_2023(work, conf.metrics_2023, conf.download)
    failed = False
    if clone_2023 is None:
        print("no clone of BraTS-2023-Metrics (pass metrics_2023=<clone> or download=true): lesion23_* not checked")
    for layout in LAYOUTS:
        root, preds, cases = write_designed_cases(work, layout, conf.n_cases)
        wd = work / layout
        write_text_atomic(wd / "cases.json", json.dumps(cases))
        score(preds, root, layout)
        result = run_official_subprocess(
            official, official_config(official, work, layout), wd / "cases.json", wd / "official.json", layout
        )
        if clone_2023 is not None:
            _child("2023", clone_2023, cases=str(wd / "cases.json"), out=str(wd / "ref2023.json"), layout=layout)
        if layout == LAYOUTS[0]:
            print("versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()))
        sizes = sorted({tuple(c["voxel_mm"]) for c in cases})
        print(f"{layout:10s} {len(cases)} cases, voxels {sizes}, stored {sorted({c['storage'] for c in cases})}")
        if result["config_differences"]:
            print(f"           our evaluator differs from the official config in: {result['config_differences']}")
            failed = True
        else:
            print("           our panoptica evaluator: every field as in the official config")
        worst, over = compare(layout, preds / "metrics.csv", wd, "files", clone_2023 is not None)
        label = "brats-evaluation" + (" + 2023 code" if clone_2023 is not None else "")
        print(
            f"           vs {label}: largest difference " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(worst.items()))
        )
        if over:
            print(
                f"           over tolerance in {len({o[0] for o in over})} case(s): "
                + "; ".join(f"{c} {col} ours {a:.6g} official {b:.6g}" for c, col, a, b in over[:12])
            )
            failed = True
        else:
            print(f"           all within {TOL:g} ({TOL_MM:g} mm for distances)")
        worst, _ = compare(layout, preds / "metrics.csv", wd, "physical", False)
        print(
            "           (panoptica with each axis's own voxel size would differ by "
            + ", ".join(f"{k} {worst[k]:.2g}" for k in ("lesion_hd95", "lesion_nsd"))
            + ")"
        )
    return 1 if failed else 0


@hydra_entry("../configs", "check_official_metrics")
def main(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    conf = to_config(cfg)
    with user_errors("the check"):
        status = check(conf, list(HydraConfig.get().overrides.task))
    if status:
        raise SystemExit(status)


def child(role: str, args: dict) -> None:
    """A child process :func:`_child` started: one official code's values, written to ``args["out"]``."""
    if role == "official":
        run_official(Path(args["official"]), args["cfg"], args["cases"], args["out"], args["layout"])
    elif role == "2023":
        run_2023(args["cases"], args["out"], args["layout"])
    else:
        sys.exit(f"error: unknown child role {role!r}")


if __name__ == "__main__":
    if (request := child_args()) is not None:
        child(*request)
    else:
        main()
