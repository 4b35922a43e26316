"""Raw NIfTI in, BraTS labels out: the served model's raw-case path
(brats_seg.evaluation.serving.nifti_request, behind brats_seg/tracking/pyfunc_model.py), predict.py's
label conventions and a challenge's /input, and the whole chain end to end (slow): evaluate.py's
predictions, predict.py's masks and the served model's label maps are the same arrays.

The run is a folder as train.py writes it over two synthetic brats2021 cases at 2 mm, whose best.keras
is a tiny U-Net with a random head (tests/unit/test_export.py): its regions vary over the brain, so
the masks hold every label of the layout and a wrong grid, orientation or label shows in them.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import nibabel as nib
import numpy as np
import pytest

from brats_seg.config import EvaluateConfig
from brats_seg.data.layouts import discover_cases
from tests.integration.scripts import post_json, serve_model, stop_server
from tests.unit.test_evaluate import CLI_BACKEND, make_run_dir, run_script
from tests.unit.test_export import random_head_unet
from tests.unit.test_resume_eval_predict import write_small_dataset

CONTRASTS = ("flair", "t1", "t1ce", "t2")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A run over two cases (both in its test split), its export and the export's raw-case server."""
    from brats_seg.data.phantoms.synthetic import write_synthetic_dataset
    from brats_seg.evaluation.serving.export import export_run
    from brats_seg.evaluation.serving.nifti_request import NiftiServer

    base = tmp_path_factory.mktemp("serving")
    write_synthetic_dataset(base / "source", "brats2021", n_cases=2, seed=0)
    root = base / "data"
    ids = write_small_dataset(base / "source", root, 2)
    run_dir = base / "run"
    config = make_run_dir(
        run_dir, root, "brats2021", base, {"train": [], "val": [], "test": ids}, model=random_head_unet()
    )
    folder = export_run(run_dir, base / "export")
    cases = discover_cases(root, "brats2021")[0]
    return SimpleNamespace(
        base=base,
        root=root,
        run_dir=run_dir,
        config=config,
        folder=folder,
        cases=cases,
        server=NiftiServer.load(folder),
    )


def _nifti(data: bytes) -> nib.Nifti1Image:
    """A gzipped NIfTI's bytes as an image (in memory)."""
    return nib.Nifti1Image.from_bytes(gzip.decompress(data))


def _request(cases, as_bytes=()) -> list[dict]:
    """One record per case: each contrast its path, or its bytes for the case ids in ``as_bytes``."""
    return [
        {
            "case_id": c.case_id,
            **{k: p.read_bytes() if c.case_id in as_bytes else str(p) for k, p in zip(CONTRASTS, c.images)},
        }
        for c in cases
    ]


def test_a_case_sent_as_paths_or_bytes_is_segmented_as_predict_writes_it(served, tmp_path):
    """The answer's label maps (one case by paths, one by bytes) are predict.py's masks for the same
    export, with the cases' affines; the probabilities come on request, on the native grid."""
    import pandas as pd

    from brats_seg.evaluation.inference.predict import predict_new_cases

    first, second = served.cases
    answer = served.server.segment(pd.DataFrame(_request(served.cases, as_bytes={second.case_id})), probabilities=True)
    assert list(answer.columns) == ["case_id", "labels", "probabilities"]
    assert list(answer.case_id) == [first.case_id, second.case_id]
    written = predict_new_cases(
        served.server.model, served.cases, served.config, tmp_path, EvaluateConfig(overlays=False), progress=False
    )
    for row, path in zip(answer.itertuples(), written):
        mask, labels = nib.load(path), _nifti(row.labels)
        expected = np.asarray(mask.dataobj)
        assert set(np.unique(expected)) == {0, 1, 2, 4}  # every label: a comparison worth making
        np.testing.assert_array_equal(np.asarray(labels.dataobj), expected)
        np.testing.assert_array_equal(labels.affine, mask.affine)
        probabilities = np.asarray(_nifti(row.probabilities).dataobj)
        assert probabilities.shape == (*expected.shape, 3) and probabilities.dtype == np.float32
        # no post-processing chosen: the label map is the thresholded probabilities, painted ET > TC > WT
        np.testing.assert_array_equal(expected == 4, probabilities[..., 2] > 0.5)
        np.testing.assert_array_equal(expected > 0, probabilities[..., 0] > 0.5)


def test_a_dict_of_base64_text_is_one_case_and_labels_choose_the_convention(served):
    """MLflow's ``inputs`` over HTTP: base64 text per contrast, BraTS 2023's names accepted; with
    ``labels=brats2023`` ET is written as 3, the other labels as they were."""
    case = served.cases[0]
    names = dict(zip(CONTRASTS, ("t2f", "t1n", "t1c", "t2w")))
    request = {names[k]: base64.b64encode(p.read_bytes()).decode() for k, p in zip(CONTRASTS, case.images)}
    (as_2023,) = served.server.segment(request, labels="brats2023").labels
    (as_2021,) = served.server.segment(_request([case])).labels
    new, old = np.asarray(_nifti(as_2023).dataobj), np.asarray(_nifti(as_2021).dataobj)
    assert set(np.unique(new)) == {0, 1, 2, 3}
    np.testing.assert_array_equal(new, np.where(old == 4, 3, old))


def _shifted_copy(path: Path, folder: Path) -> Path:
    """``path`` on another grid (one slice fewer)."""
    image = nib.load(path)
    out = folder / "other_grid.nii.gz"
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj)[..., :-1], image.affine), out)
    return out


@pytest.mark.parametrize(
    ("fault", "names"),
    [
        ("missing", ["case BraTS2021_00000", "missing t1ce"]),
        ("not nifti", ["case BraTS2021_00000", "t2 (sent as bytes)"]),
        ("not nifti, as base64 text", ["case BraTS2021_00000", "t2 (sent as bytes)"]),
        ("other grid", ["case BraTS2021_00000", "t1 ("]),
        ("neither file nor base64", ["case BraTS2021_00000", "flair", "neither a file the server can read nor base64"]),
        ("unknown key", ["case BraTS2021_00000", "unknown key 'seg'"]),
        ("bad case id", ["case_id '../x'"]),
    ],
)
def test_a_bad_request_gets_one_line_naming_the_case_and_the_contrast(served, tmp_path, fault, names):
    from brats_seg.evaluation.serving.nifti_request import RequestError

    (record,) = _request(served.cases[:1])
    if fault == "missing":
        del record["t1ce"]
    elif fault == "not nifti":
        record["t2"] = b"this is a PNG, not a NIfTI file" * 20
    elif fault == "not nifti, as base64 text":  # longer than a file name may be
        record["t2"] = base64.b64encode(b"this is a PNG, not a NIfTI file" * 20).decode()
    elif fault == "other grid":
        record["t1"] = str(_shifted_copy(Path(record["t1"]), tmp_path))
    elif fault == "neither file nor base64":
        record["flair"] = "/no/such/file.nii.gz"
    elif fault == "unknown key":
        record["seg"] = record["flair"]
    else:
        record["case_id"] = "../x"
    with pytest.raises(RequestError) as raised:
        served.server.segment([record])
    message = str(raised.value)
    assert "\n" not in message and all(n in message for n in names), message
    assert "brats-seg-request-" not in message  # the request's temporary files are not named


def test_a_challenge_input_folder_holds_cases_in_either_naming(served, tmp_path):
    """``/input`` with one case named as BraTS 2021 names it and one as 2023 does, for a brats2021 run."""
    from brats_seg.data.predict_inputs import find_input_cases

    old, new = served.cases
    shutil.copytree(old.images[0].parent, tmp_path / old.case_id)
    folder = tmp_path / "BraTS-GLI-00001-000"
    folder.mkdir()
    for suffix, path in zip(("t2f", "t1n", "t1c", "t2w"), new.images):
        shutil.copy(path, folder / f"{folder.name}-{suffix}.nii.gz")
    found = find_input_cases(tmp_path, "brats2021")
    assert [c.case_id for c in found] == sorted([old.case_id, folder.name])  # in name order
    (new_case,) = [c for c in found if c.case_id == folder.name]
    assert [p.name for p in new_case.images] == [f"{folder.name}-{s}.nii.gz" for s in ("t2f", "t1n", "t1c", "t2w")]


def test_relabel_keeps_the_regions_in_another_conventions_values():
    from brats_seg.data.labels import labels_to_regions
    from brats_seg.evaluation.inference.predict import relabel

    labels = np.array([[[0, 1, 2, 4]]], np.uint8)
    names = ("wt", "tc", "et")
    for layout, expected in (("brats2023", [0, 1, 2, 3]), ("brats2024", [0, 1, 2, 3]), ("brats2021", [0, 1, 2, 4])):
        out = relabel(labels, "brats2021", layout, names)
        assert out.ravel().tolist() == expected
        np.testing.assert_array_equal(
            labels_to_regions(out, layout, names), labels_to_regions(labels, "brats2021", names)
        )


# ---------------------------------------------------------------------------------------
# End to end: the entry points, the logged model in another process, and over HTTP
# ---------------------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, sys
    import pandas as pd
    import tensorflow as tf

    uri, store, request = sys.argv[1:4]
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import mlflow

    mlflow.set_tracking_uri(store)
    model = mlflow.pyfunc.load_model(uri)
    loaded = set(sys.modules)  # mlflow, tensorflow, pandas and theirs: the volume path's
    answer = model.predict(pd.DataFrame(json.loads(open(request).read())))
    import importlib.metadata
    import brats_seg
    owners = importlib.metadata.packages_distributions()
    new = {m.split(".")[0] for m in set(sys.modules) - loaded} - set(sys.stdlib_module_names)
    imported = sorted({d for m in new for d in owners.get(m, ())})
    print(json.dumps({"brats_seg": brats_seg.__file__, "cases": list(answer.case_id),
                      "labels": [v.hex() for v in answer.labels], "distributions": imported}))
""")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _with_dependencies(names) -> set[str]:
    """The distributions ``names`` and everything they require (installed here), canonical names."""
    from importlib import metadata

    seen, todo = set(), [*names]
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    return seen


@pytest.mark.slow  # export.py, evaluate.py and predict.py twice; the logged model loaded and served
def test_evaluate_predict_and_the_served_model_write_the_same_label_maps(served, tmp_path):
    """evaluate.py's predictions of the test cases, predict.py's masks for the raw case folders (by
    the run and by its export, in the BraTS 2023 labels too) and the logged model's label maps (in
    another process that takes brats_seg from the model's own code/, and over HTTP with the cases'
    bytes) are the same arrays; a bad case over HTTP gets a 400 with one line naming it."""
    from brats_seg.config import TrackingConfig
    from brats_seg.evaluation.serving.export import is_export_dir
    from brats_seg.evaluation.serving.mlflow_model import SERVING_REQUIREMENTS, log_export_to_run
    from brats_seg.tracking import Tracker

    export = tmp_path / "export"
    done = run_script("export.py", f"run_dir={served.run_dir}", f"output={export}", *CLI_BACKEND)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"exported {served.run_dir} (checkpoint best, fp32) to {export}" in done.stdout
    assert is_export_dir(export) and not list(tmp_path.glob(".tmp-*"))  # in place whole, nothing left over
    done = run_script("evaluate.py", f"run_dir={served.run_dir}", "evaluate.overlays=false", *CLI_BACKEND)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {
        c.case_id: np.asarray(
            nib.load(served.run_dir / "eval" / "test" / "predictions" / f"{c.case_id}.nii.gz").dataobj
        )
        for c in served.cases
    }
    assert all(set(np.unique(m)) == {0, 1, 2, 4} for m in expected.values())
    for source, labels in ((f"run_dir={served.run_dir}", ""), (f"export={export}", "brats2023")):
        out = tmp_path / f"out_{labels or 'run'}"
        args = [source, f"input={served.root}", f"output={out}", "evaluate.overlays=false", *CLI_BACKEND]
        done = run_script("predict.py", *args, *([f"labels={labels}"] if labels else []))
        assert done.returncode == 0, done.stderr[-3000:]
        for case_id, mask in expected.items():
            written = np.asarray(nib.load(out / f"{case_id}.nii.gz").dataobj)
            np.testing.assert_array_equal(written, np.where(mask == 4, 3, mask) if labels else mask)

    store = f"sqlite:///{tmp_path}/mlruns.db"
    with Tracker.start(
        TrackingConfig(uri=store, experiment="serving", system_metrics=False), served.run_dir, "s", {}, {}
    ):
        pass  # the run's MLflow run (mlflow.json), as training makes it
    tracking = TrackingConfig(uri=store, experiment="serving", system_metrics=False)
    logged = log_export_to_run(served.run_dir, export, "best", dataclasses.replace(served.config, tracking=tracking))
    assert logged is not None
    request = tmp_path / "request.json"
    request.write_text(json.dumps(_request(served.cases)))
    (tmp_path / "child.py").write_text(_CHILD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    child = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), logged.run_uri, store, str(request)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert "/code/brats_seg/" in report["brats_seg"]  # the model's own copy, not this checkout
    # every distribution the raw-case path imported is a requirement of the model or one of theirs
    needed = _with_dependencies(SERVING_REQUIREMENTS)
    assert not [d for d in report["distributions"] if _canonical(d) not in needed and d != "brats-seg"], report
    assert report["cases"] == list(expected)
    for case_id, hex_bytes in zip(report["cases"], report["labels"]):
        np.testing.assert_array_equal(np.asarray(_nifti(bytes.fromhex(hex_bytes)).dataobj), expected[case_id])

    server, port = serve_model(logged.run_uri, store, tmp_path, threads=(1, 1))
    try:
        records = [
            {
                "case_id": c.case_id,
                **{k: base64.b64encode(p.read_bytes()).decode() for k, p in zip(CONTRASTS, c.images)},
            }
            for c in served.cases
        ]
        status, answer = post_json(port, {"dataframe_records": records})
        assert status == 200, answer
        for row in answer["predictions"]:
            labels = _nifti(base64.b64decode(row["labels"]))
            np.testing.assert_array_equal(np.asarray(labels.dataobj), expected[row["case_id"]])
        bad = dict(records[0], t2=base64.b64encode(b"not a NIfTI file" * 40).decode())
        for record, names in (
            (bad, ["t2 (sent as bytes)"]),
            ({k: v for k, v in records[0].items() if k != "t1"}, ["missing t1"]),
        ):
            status, answer = post_json(port, {"dataframe_records": [record]})
            assert status == 400, answer
            assert answer["message"].startswith(f"case {served.cases[0].case_id}")
            assert all(n in answer["message"] for n in names) and "\n" not in answer["message"], answer
            assert "Traceback" not in json.dumps(answer)
    finally:
        stop_server(server)
