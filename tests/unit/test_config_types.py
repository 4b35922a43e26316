"""Closed sets of config values are typed (``choice_type`` Enums in brats_seg/config.py): every
config file composes with them, a table keyed by one (a precision's Keras policy) covers exactly
the set the schema allows, and a typed value still behaves as the plain string everywhere it goes
(comparisons, dict keys, f-strings, config.json, MLflow params, pickling to workers)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from brats_seg.config import CHOICES, Precision, TrainConfig, config_from_dict, config_to_dict, flatten_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


def _tables() -> dict[str, tuple[str, dict]]:
    """The tables keyed by a closed set, which map each value to what it means and so cannot be the
    Enum itself: by table, its config key and the table. (The modules that only check a value take
    the Enum of brats_seg/config.py, so there is no copy of a set left to compare.)"""
    from brats_seg.model.checks import PRECISION_POLICIES

    return {"model.checks.PRECISION_POLICIES": ("backend.precision", PRECISION_POLICIES)}


@pytest.mark.parametrize("table", sorted(_tables()))
def test_a_table_keyed_by_a_closed_set_covers_exactly_what_the_schema_allows(table):
    key, values = _tables()[table]
    assert {str(v) for v in values} == {m.value for m in CHOICES[key]}


def test_a_typed_value_behaves_as_its_string():
    p = Precision.bf16
    assert p == "bf16" and hash(p) == hash("bf16") and {"bf16": 1}[p] == 1 and "bf16" in (p,)
    assert f"{p}" == "bf16" and str(p) == "bf16" and f"{p:>6}" == "  bf16" and json.dumps(p) == '"bf16"'
    assert pickle.loads(pickle.dumps(p)) is p  # to spawned preparation workers


def test_a_composed_config_round_trips_through_config_json_and_mlflow_params(tmp_path):
    from hydra import compose, initialize_config_dir

    from brats_seg.cli import to_config
    from brats_seg.data.labels import resolve_model_outputs
    from brats_seg.run_dir import RunFolder
    from brats_seg.script_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_config(
            compose(
                "train",
                overrides=[
                    "backend=cpu_onednn",
                    "backend.precision=bf16",
                    "lms=recompute",
                    "data.on_error=skip",
                    "model.norm=group",
                ],
            )
        )
    assert isinstance(cfg.backend.precision, Precision) and cfg.backend.precision == "bf16"
    cfg.run_dir = str(tmp_path / "run")
    folder = RunFolder.of(cfg.run_dir)
    cfg = resolve_model_outputs(cfg)  # a copy with the outputs resolved, as training writes it
    folder.write_config(cfg)
    stored = json.loads(folder.config_path.read_text())
    assert stored["backend"]["precision"] == "bf16" and stored["data"]["on_error"] == "skip"
    assert stored["lms"]["name"] == "recompute" and stored["model"]["norm"] == "group"
    back = folder.read_config()  # plain strings from JSON compare equal to the typed values
    assert flatten_config(back) == flatten_config(cfg)
    params = {k: str(v) for k, v in flatten_config(cfg).items()}  # what MLflow logs
    assert params["backend.precision"] == "bf16" and params["lms.name"] == "recompute"
    assert config_to_dict(config_from_dict(TrainConfig, stored)) == stored


def _group_options() -> list[tuple[str, str]]:
    out = []
    for group in ("data", "resolution", "model", "trainer", "backend", "lms", "tracking", "distribute", "experiment"):
        out += [(group, p.stem) for p in sorted((CONFIGS / group).glob("*.yaml"))]
    return out


@pytest.mark.parametrize("group,option", _group_options(), ids=[f"{g}={o}" for g, o in _group_options()])
def test_every_config_option_composes_and_passes_the_checks(tmp_path, synthetic_root, group, option):
    """Each option of each train.py group (the others at their defaults) composes against the
    typed schema and passes the semantic checks: a YAML value outside a closed set (an unquoted
    ``off`` read as false, a misspelt choice) fails here, not on a user's machine. A dataset that
    is not generated gets a folder of its layout's cases as data.root (the checks look for them)."""
    from hydra import compose, initialize_config_dir

    from brats_seg.checks import check_train_config
    from brats_seg.cli import to_config
    from brats_seg.data.dataset import GENERATED
    from brats_seg.data.labels import resolve_model_outputs
    from brats_seg.script_configs import register_configs

    register_configs()
    overrides = [f"{group}={option}", f"run_dir={tmp_path / 'run'}"]
    if group == "distribute" and option == "multi_worker":
        overrides.append("distribute.workers=[localhost:12345]")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_config(compose("train", overrides=overrides))
    assert dataclasses.is_dataclass(cfg)
    if cfg.data.name not in GENERATED:
        cfg.data.root = str(synthetic_root[str(cfg.data.layout)])
    check_train_config(resolve_model_outputs(cfg))


@pytest.mark.parametrize(
    "given,preset", [("true", "light"), ("false", "none"), ("light", "light"), ("nnunet", "nnunet"), ("none", "none")]
)
def test_trainer_augment_is_a_preset_and_the_old_switch_still_means_light_or_none(given, preset, tmp_path):
    from hydra import compose, initialize_config_dir

    from brats_seg.cli import to_config
    from brats_seg.script_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_config(
            compose(
                "train",
                overrides=[
                    f"trainer.augment={given}",
                    "trainer.augmentation.p_gamma=0.5",
                    "trainer.augmentation.gamma_range=[0.8,1.2]",
                ],
            )
        )
    assert cfg.trainer.augment == preset and cfg.trainer.augmentation.p_gamma == 0.5
    stored = config_to_dict(cfg)
    assert config_to_dict(config_from_dict(TrainConfig, json.loads(json.dumps(stored)))) == stored
    old = json.loads(json.dumps(stored))
    old["trainer"]["augment"] = given == "true" or (given != "false" and given != "none")  # a run from before presets
    if given in ("true", "false"):
        assert config_from_dict(TrainConfig, old).trainer.augment == preset  # resumes as the same recipe


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.augment=heavy", "trainer.augment='heavy': use one of none, light, nnunet"),
        ("trainer.augmentation.p_noise=1.5", "trainer.augmentation.p_noise=1.5: a probability, in [0, 1]"),
        ("trainer.augmentation.scale_range=[1.4,0.7]", "trainer.augmentation.scale_range=[1.4, 0.7]: use [low, high]"),
        ("trainer.augmentation.mirror_axes=[3]", "trainer.augmentation.mirror_axes=[3]: spatial axes 0 (x)"),
    ],
)
def test_a_bad_augmentation_value_is_one_line_naming_it(override, message, capsys):
    from hydra import compose, initialize_config_dir

    from brats_seg.cli import to_config
    from brats_seg.script_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        with pytest.raises(SystemExit) as exit_:
            to_config(compose("train", overrides=[override]))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1
