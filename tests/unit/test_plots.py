"""The benchmark sweep's and the resolution study's figures (brats_seg.plots), and the sweep files."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest

from brats_seg.plots import plot_benchmark_sweep, plot_resolution_study


def _record(shape, precision, strategy, voxels_per_s, measured, predicted, flops, sgemm):
    return {
        "shape": list(shape),
        "batch_size": 1,
        "precision": precision,
        "strategy": strategy,
        "voxels_per_s": voxels_per_s,
        "measured_bytes": measured,
        "predicted_peak_bytes": predicted,
        "flops_per_s": flops,
        "sgemm_flops_per_s": sgemm,
        "cpu": "test CPU",
        "cpu_kind": "avx2",
    }


def test_sweep_figures_are_written_and_differ_by_what_they_show(tmp_path):
    records = [
        _record(s, p, "off", v, m, m * 1.05, f, 3e11)
        for s, p, v, m, f in [
            ((32, 32, 32), "fp32", 1e5, 2e8, 1e11),
            ((64, 64, 48), "fp32", 1.2e5, 6e8, 1.5e11),
            ((32, 32, 32), "bf16", 2e5, 1.2e8, 2e11),
            ((64, 64, 48), "bf16", 2.4e5, 3.5e8, 2.8e11),
        ]
    ]
    paths = plot_benchmark_sweep(records, tmp_path)
    assert [p.name for p in paths] == ["throughput.png", "memory.png", "flops.png"]
    images = [mpimg.imread(p) for p in paths]
    assert all(img.ndim == 3 and img.shape[0] > 200 for img in images)
    assert not np.array_equal(images[0], images[1])  # three different figures
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flops.png", "memory.png", "throughput.png"]  # no temps


def test_sweep_without_results_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no benchmark results"):
        plot_benchmark_sweep([], tmp_path)


def test_resolution_chart_has_a_group_per_resolution(tmp_path):
    rows = [
        {
            "label": r,
            "spacing_mm": s,
            "epochs": 5,
            "n_cases": 4,
            **{f"dice_{x}": {"mean": 0.5 + s / 10, "std": 0.1} for x in ("wt", "tc", "et")},
        }
        for r, s in (("tiny", 4.0), ("full", 1.0), ("half", 2.0))
    ]
    path = plot_resolution_study(rows, tmp_path / "study.png")
    assert path.exists() and mpimg.imread(path).shape[1] > 300


def test_sweep_files_name_their_axes(tmp_path):
    from brats_seg.benchmark.sweep import load_sweep_spec as _sweep_spec

    path, spec = _sweep_spec("readme")
    assert path.name == "readme.yaml" and set(spec["axes"]) == {"resolution.shape", "backend.precision", "lms"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: [backend=cpu_onednn]\n")
    with pytest.raises(ValueError, match="axes"):
        _sweep_spec(str(bad))
    with pytest.raises(ValueError, match="use one of .*readme"):
        _sweep_spec("no_such_sweep")


def _history(epochs: int, val_every: int = 1) -> list[dict]:
    rows = []
    for e in range(1, epochs + 1):
        row = {"epoch": e, "loss": 1 / e, "dice_mean": 0.5}
        row.update({f"dice_{r}": 1 - k / (e + 2) for k, r in enumerate(("wt", "tc", "et"), 1)})
        if e % val_every == 0:
            row.update(
                {
                    "val_loss": 1.2 / e,
                    **{f"val_dice_{r}": 0.9 - k / (e + 1) for k, r in enumerate(("wt", "tc", "et"), 1)},
                }
            )
            row["val_dice_mean"] = float(np.mean([row[f"val_dice_{r}"] for r in ("wt", "tc", "et")]))
        rows.append(row)
    return rows


def test_training_curves_show_what_the_history_holds(tmp_path):
    from brats_seg.plots import plot_training_curves

    full = plot_training_curves(_history(12), ("wt", "tc", "et"), tmp_path / "full.png", title="run")
    sparse = plot_training_curves(_history(12, val_every=3), ("wt", "tc", "et"), tmp_path / "sparse.png")
    no_val = plot_training_curves(
        [{k: v for k, v in row.items() if not k.startswith("val_")} for row in _history(12)],
        ("wt", "tc", "et"),
        tmp_path / "no_val.png",
    )
    images = [mpimg.imread(p) for p in (full, sparse, no_val)]
    assert all(img.ndim == 3 and img.shape[1] > 800 for img in images)
    assert not np.array_equal(images[0], images[1]) and not np.array_equal(images[1], images[2])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.png", "no_val.png", "sparse.png"]  # no temporaries
    with pytest.raises(ValueError, match="train at least one epoch"):
        plot_training_curves([], ("wt",), tmp_path / "none.png")


def test_case_scores_figure_takes_penalties_and_undefined_regions(tmp_path):
    from brats_seg.plots import plot_case_scores

    ids = [f"case{i}" for i in range(6)]
    dice = {
        "wt": np.linspace(0.5, 0.95, 6),
        "tc": np.array([0.8, 0.0, 0.7, 0.9, 0.6, 0.75]),
        "et": np.full(6, np.nan),
    }  # a WT-only model's ET column is undefined
    hd95 = {
        "wt": np.array([0.0, 2.0, 3.5, 8.0, 12.0, 4.0]),
        "tc": np.array([3.0, np.inf, 5.0, 2.0, 9.0, 373.0]),
        "et": np.full(6, np.nan),
    }
    path = plot_case_scores(ids, dice, hd95, tmp_path / "eval" / "per_case.png", title="run, test split")
    assert mpimg.imread(path).shape[1] > 800
    with pytest.raises(ValueError, match="one value per case"):
        plot_case_scores(ids, {"wt": np.ones(5)}, {"wt": np.ones(6)}, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="no case"):
        plot_case_scores([], {"wt": np.ones(0)}, {"wt": np.ones(0)}, tmp_path / "empty.png")
