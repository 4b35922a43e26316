"""Malformed configs, as a user types them: each ends in ONE line on stderr, ``error: ...``,
naming the key (or the file) and what to use, with exit status 2 -- no traceback, no Hydra
report of several lines -- and nothing is written: no run folder, no stray
``outputs/<date>/<time>/``, no generated data, no cache.

The table covers unknown keys (typed with and without ``+``), wrong types, values outside a
closed set (typed as Enum fields, so Hydra refuses them at composition), config options that
do not exist, overrides that do not parse, sizes that are not positive, shapes the U-Net
cannot take, and a ``run_dir`` that holds another project's files. Each row runs the real
entry point in a subprocess from an empty working folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _foreign_files(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("my thesis notes")
    (run_dir / "subjects.csv").write_text("id,age\n1,40\n")


def _foreign_config(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"lr": 0.1, "arch": "resnet"}))


def _broken_config(run_dir: Path) -> None:
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"data": {"root": ')


def _a_file(run_dir: Path) -> None:
    run_dir.write_text("not a folder")


# (script, overrides, the error line's pattern, what to set up in run_dir first)
ROWS = [
    # unknown keys
    (
        "train.py",
        ["trainer.epoch=3"],
        r"trainer\.epoch: no such key \(trainer has epochs, .*Did you mean trainer\.epochs\?",
        None,
    ),
    ("train.py", ["+trainer.foo=1"], r"trainer\.foo: no such key \(trainer has epochs", None),
    ("train.py", ["+lerning_rate=1"], r"lerning_rate: no such key \(the config has data, resolution, model", None),
    ("train.py", ["model.dept=4"], r"model\.dept: no such key .*Did you mean model\.depth\?", None),
    (
        "scripts/evaluate.py",
        ["splt=val", "run_dir=x"],
        r"splt: no such key \(the config has run_dir, split.*Did you mean split\?",
        None,
    ),
    # wrong types
    (
        "train.py",
        ["trainer.epochs=abc"],
        r"trainer\.epochs=abc: Value 'abc' of type 'str' could not be converted to Integer",
        None,
    ),
    ("train.py", ["trainer.seed=1.5"], r"trainer\.seed=1\.5: .*could not be converted to Integer", None),
    (
        "train.py",
        ["resolution.shape=[a,b,c]"],
        r"resolution\.shape.*Value 'a' of type 'str' could not be converted to Integer",
        None,
    ),
    ("train.py", ["model.depth=null"], r"model\.depth=null: field 'model\.depth' is not Optional", None),
    ("train.py", ["run_dir=[1,2]"], r"run_dir=\[1,2\]: Cannot convert 'list' to string", None),
    (
        "train.py",
        ["trainer.augment=maybe"],
        r"trainer\.augment='maybe': use one of none, light, nnunet\. true and false "
        r"mean light and none\.$",
        None,
    ),
    (
        "train.py",
        ["trainer.augmentation.p_gamma=2"],
        r"trainer\.augmentation\.p_gamma=2\.0: a probability, in \[0, 1\]\.$",
        None,
    ),
    # closed sets (Enum fields: refused at composition)
    ("train.py", ["model.norm=layer"], r"model\.norm='layer': use one of instance, group, batch\.$", None),
    ("train.py", ["backend.precision=fp8"], r"backend\.precision='fp8': use one of fp32, bf16, fp16\.$", None),
    (
        "train.py",
        ["trainer.lr_schedule=cosin"],
        r"trainer\.lr_schedule='cosin': use cosine or constant\. Did you mean 'cosine'\?",
        None,
    ),
    ("train.py", ["data.on_error=ignore"], r"data\.on_error='ignore': use raise or skip\.$", None),
    ("train.py", ["distribute.collective=mpi"], r"distribute\.collective='mpi': use one of auto, ring, nccl\.$", None),
    (
        "scripts/evaluate.py",
        ["split=vall", "run_dir=x"],
        r"split='vall': use one of val, test, all\. Did you mean 'val'\?",
        None,
    ),
    (
        "scripts/evaluate.py",
        ["evaluate.mode=slide", "run_dir=x"],
        r"evaluate\.mode='slide': use whole or sliding\. Did you mean 'sliding'\?",
        None,
    ),
    # config options that do not exist
    (
        "train.py",
        ["resolution=huge"],
        r"resolution=huge: no such resolution config; use one of 2x, full, half, tiny\.",
        None,
    ),
    ("train.py", ["lms=swap"], r"lms=swap: no such lms config; use one of auto, off, offload, recompute\.", None),
    ("train.py", ["data=brats2022"], r"data=brats2022: no such data config; .*Did you mean data=brats202[134]\?", None),
    # overrides that do not parse
    ("train.py", ["trainer.batch_size=[1"], r"trainer\.batch_size=\[1: cannot parse it", None),
    ("train.py", ["data.root"], r"data\.root: an override needs a value: write data\.root=<value>\.", None),
    # sizes, shapes, budgets (checked right after composition, before the backend is configured)
    (
        "train.py",
        ["trainer.batch_size=-1"],
        r"trainer\.batch_size=-1: use an integer >= 1 \(the global batch\)\.$",
        None,
    ),
    ("train.py", ["trainer.epochs=0"], r"trainer\.epochs=0: use an integer >= 1\.$", None),
    ("train.py", ["data.num_workers=-2"], r"data\.num_workers=-2: use an integer >= 1 \(or auto: .*\)\.$", None),
    ("train.py", ["model.base_filters=0"], r"model\.base_filters must be an integer >= 1, got 0", None),
    ("train.py", ["resolution.shape=[50,50,50]"], r"\(50, 50, 50\).*model\.depth=3.*\(48, 48, 48\)", None),
    ("train.py", ["lms.limit=16gigs"], r"lms\.limit '16gigs'", None),
    ("train.py", ["data.val_fraction=0.6", "data.test_fraction=0.5"], r"leaves no training cases", None),
    ("train.py", ["data=brats2021"], r"data\.root is not set: pass data\.root=", None),
    # a run_dir that is not ours to write into
    (
        "train.py",
        [],
        r"run_dir .*run already holds files that are not a brats-seg run \(notes\.txt, subjects\.csv\)",
        _foreign_files,
    ),
    (
        "train.py",
        [],
        r"run/config\.json is not a brats-seg run's config\.json \(another program's file\?\)",
        _foreign_config,
    ),
    ("train.py", [], r"run/config\.json is not readable JSON", _broken_config),
    ("train.py", [], r"run_dir .*run is a file, not a folder", _a_file),
    ("scripts/evaluate.py", [], r"run/config\.json is not a brats-seg run's config\.json", _foreign_config),
]


def _id(row) -> str:
    script, overrides, _, setup = row
    return f"{Path(script).stem}:{' '.join(overrides) or setup.__name__.lstrip('_')}"


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.parametrize("row", ROWS, ids=[_id(r) for r in ROWS])
def test_a_malformed_config_ends_in_one_line_naming_the_key_and_writes_nothing(tmp_path, row):
    script, overrides, pattern, setup = row
    work = tmp_path / "work"
    work.mkdir()
    run_dir = work / "run"
    if setup is not None:
        setup(run_dir)
    defaults = {
        "run_dir": f"run_dir={run_dir}",
        "tracking": "tracking=none",
        "data.cache_dir": f"data.cache_dir={work / 'cache'}",
    }
    if script == "train.py":
        given = {o.split("=", 1)[0].lstrip("+") for o in overrides}
        overrides = overrides + [v for k, v in defaults.items() if k not in given]
    elif not any(o.startswith("run_dir=") for o in overrides):
        overrides = overrides + [defaults["run_dir"]]
    before = _listing(work)

    proc = subprocess.run(
        [sys.executable, str(REPO / script), *overrides], cwd=work, capture_output=True, text=True, timeout=120
    )

    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert __import__("re").search(pattern, lines[0]), lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert _listing(work) == before, "the failed command wrote files"  # no run folder, outputs/, cache, data
