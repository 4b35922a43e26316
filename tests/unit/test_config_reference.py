"""docs/configuration.md is what the generator makes from brats_seg/config.py and
brats_seg/script_configs.py now, names every field of every schema, and a config key without a
comment is reported and fails."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from brats_seg import config, script_configs
from brats_seg.config_reference import NO_COMMENT, build_config_reference, read_field_comments

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def reference():
    return build_config_reference(configs_dir=REPO / "configs")


def test_the_page_is_what_the_generator_writes_now(reference):
    page = PAGE.read_text() if PAGE.exists() else ""
    if page != reference.markdown:
        diff = "".join(
            list(
                difflib.unified_diff(
                    page.splitlines(True), reference.markdown.splitlines(True), "docs/configuration.md", "generated now"
                )
            )[:60]
        )
        pytest.fail(
            "docs/configuration.md differs from the config schemas: run `python scripts/config_reference.py` "
            f"and commit the page.\n{diff}"
        )


def _nested(cls: type) -> dict[str, type]:
    """The fields of ``cls`` that hold another schema (a group), with its class."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out[f.name] = type(default)
    return out


def _keys(cls: type, prefix: str, reached: set) -> list[str]:
    """Every key of a schema, nested groups' keys by the path of fields that reaches them."""
    reached.add(cls)
    keys = [prefix + f.name for f in dataclasses.fields(cls)]
    for name, sub in _nested(cls).items():
        keys += _keys(sub, prefix + name + ".", reached)
    return keys


def test_every_field_of_every_schema_appears(reference):
    schemas = [
        c
        for module in (config, script_configs)
        for c in vars(module).values()
        if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == module.__name__
    ]
    held = {sub for c in schemas for sub in _nested(c).values()}
    entry_points = [c for c in schemas if c not in held]
    assert config.TrainConfig in entry_points and script_configs.EvaluateScriptConfig in entry_points, entry_points
    reached: set = set()
    missing = [
        f"{c.__name__}: `{key}`"
        for c in entry_points
        for key in _keys(c, "", reached)
        if f"| `{key}` |" not in reference.markdown
    ]
    assert reached == set(schemas)
    missing += [
        c.__name__
        for c in schemas
        if f"`{c.__name__}`" not in reference.markdown and f"### {c.__name__}" not in reference.markdown
    ]
    assert not missing, "keys missing from the configuration reference: " + ", ".join(missing)
    for key in config.CHOICES:  # each closed set is listed with its values
        assert f"| `{key}` | " + " \\| ".join(f"`{m.value}`" for m in config.CHOICES[key]) in reference.markdown


def test_every_config_key_has_a_comment(reference):
    assert not reference.undocumented, (
        "config keys without a comment in brats_seg/config.py or script_configs.py: "
        + ", ".join(sorted(reference.undocumented))
        + ". Give each a trailing `# what it is, and why the default is what it is`, then run "
        "`python scripts/config_reference.py`."
    )


def test_a_field_without_a_comment_is_reported(tmp_path, monkeypatch):
    source = textwrap.dedent('''
        from __future__ import annotations
        import enum
        from dataclasses import dataclass, field
        from typing import List

        Mode = enum.Enum("Mode", {"fast": "fast", "slow": "slow"})
        CHOICES = {"inner.mode": Mode}

        @dataclass
        class InnerConfig:
            """An inner group."""

            mode: Mode = Mode.fast  # fast | slow
            # above the field, then
            size: int = 3  # on its line
            bare: float = 0.5
            shape: List[int] = field(default_factory=lambda: [  # a default over
                1, 2])  # two lines

        @dataclass
        class ToolConfig:
            """Config of a tool."""

            inner: InnerConfig = field(default_factory=InnerConfig)
            out: str = ""

        def register(cs):  # read, never run
            cs.store(name="tool_schema", node=ToolConfig)
    ''')
    path = tmp_path / "toy_config.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("toy_config", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "toy_config", module)
    spec.loader.exec_module(module)

    comments = read_field_comments(source)
    assert comments[("InnerConfig", "size")] == "above the field, then on its line"
    assert comments[("InnerConfig", "shape")] == "a default over two lines"
    assert ("InnerConfig", "bare") not in comments

    ref = build_config_reference(module)
    assert ref.undocumented == ("InnerConfig.bare", "ToolConfig.out")  # the group field `inner` is its section
    assert f"| `inner.bare` | `float` | `0.5` | {NO_COMMENT} |" in ref.markdown
    assert "| `inner.mode` | `Mode`: `fast` \\| `slow` | `fast` | fast \\| slow |" in ref.markdown
    assert "| `inner.shape` | `List[int]` | `[1,2]` |" in ref.markdown
    assert "### `inner`" in ref.markdown and "### ToolConfig" in ref.markdown
    assert [s.key for s in ref.schemas] == ["inner", ""]

    configs = tmp_path / "configs"
    (configs / "inner").mkdir(parents=True)
    for option in ("a", "b"):
        (configs / "inner" / f"{option}.yaml").write_text("mode: fast\n")
    (configs / "base.yaml").write_text("defaults:\n  - inner: a\n")
    (configs / "tool.yaml").write_text(
        "defaults:\n  - tool_schema\n  - base\n  - override inner: b\n  - override hydra/job_logging: stdout\n"
    )
    page = build_config_reference(module, configs_dir=configs).markdown
    assert "Options (`inner=<option>`, `configs/inner/<option>.yaml`): `a`, `b`." in page
    assert "| `configs/tool.yaml` | [ToolConfig](#toolconfig) | `inner=b` |" in page
    assert "| `configs/base.yaml` | a defaults list, included by `tool.yaml` | `inner=a` |" in page
