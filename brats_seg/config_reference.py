"""The configuration reference: Markdown generated from the config schemas and their comments.

Every dataclass in :mod:`brats_seg.config` (the run's schemas) and :mod:`brats_seg.script_configs`
(the entry scripts') is read as it is written: field names, types and
defaults through :func:`dataclasses.fields`, and each field's words from the source (the
``# comment`` on the field's own lines, after the comment lines right above it), so the
reference is the schemas' own text and cannot drift from them
(``tests/unit/test_config_reference.py`` fails when ``docs/configuration.md`` is not what
:func:`build_config_reference` makes now; ``python scripts/config_reference.py`` rewrites it).

The schemas are sorted from the code, not from a list kept here: a *group* is a dataclass that
another one holds as a field (its key is the path of fields that reaches it: ``data``,
``trainer.augmentation``, ``evaluate``); an *entry point's schema* is one no other holds
(``TrainConfig``, ``EvaluateScriptConfig``, ...). A schema added to either module appears on the
page without touching this module. Closed sets of values (``config.CHOICES``, the Enum-typed
fields) are listed with their values. Given the ``configs/`` folder, the page also names each
group's options (``configs/<group>/*.yaml``) and which top-level config composes which schema.

A field without a comment is written ``—`` and named in :attr:`ConfigReference.undocumented`
(a field holding a group is documented by the group's section).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import io
import re
import tokenize
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = ["ConfigReference", "FieldDoc", "SchemaDoc", "build_config_reference", "read_field_comments"]

NO_COMMENT = "—"  # what the page says for a field its schema gives no comment


@dataclass(frozen=True)
class FieldDoc:
    """One config key as the page shows it."""

    key: str  # the full key an override names: trainer.augmentation.p_rotation
    name: str  # the dataclass field: p_rotation
    type: str  # as written in the schema
    default: str  # as an override would write it
    comment: str  # the field's comment in the schema; "" = none
    choices: tuple[str, ...]  # the closed set of values, if the type is one
    group: str  # the key of the group this field holds ("" = a plain value)


@dataclass(frozen=True)
class SchemaDoc:
    """One schema dataclass: a group (``key`` is its path) or an entry point's schema (``key`` "")."""

    name: str  # the class name
    key: str
    doc: str  # the class docstring, one paragraph
    fields: tuple[FieldDoc, ...]
    used_by: tuple[str, ...]  # entry points' schemas that hold this group


@dataclass(frozen=True)
class ConfigReference:
    """What :func:`build_config_reference` made."""

    markdown: str
    schemas: tuple[SchemaDoc, ...]
    undocumented: tuple[str, ...]  # "Class.field" of every field without a comment, in source order


def read_field_comments(source: str) -> dict[tuple[str, str], str]:
    """``{(class, field): comment}`` for every annotated field of every class in ``source``.

    A field's comment is the block of comment lines right above it (no blank line between),
    then the comments on the field's own lines (a default spread over several lines included),
    joined with spaces and without their ``#``. Fields with neither are left out.
    """
    comments: dict[int, str] = {}  # line -> the comment on it
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    found = {}
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above, line = [], stmt.lineno - 1
            while line >= 1 and line in comments and lines[line - 1].lstrip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            own = [comments[n] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in comments]
            text = " ".join(c for c in above + own if c)
            if text:
                found[(cls.name, stmt.target.id)] = text
    return found


def _schema_classes(modules: Sequence[ModuleType]) -> list[type]:
    """The dataclasses defined in ``modules``, module by module, each in source order."""
    out = []
    for module in modules:
        classes = [
            c
            for c in vars(module).values()
            if inspect.isclass(c) and dataclasses.is_dataclass(c) and c.__module__ == module.__name__
        ]
        out += sorted(classes, key=lambda c: inspect.getsourcelines(c)[1])
    return out


def _format_value(value) -> str:
    """A value as an override writes it (``null``, ``true``, ``[48,48,48]``, ``""``)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format_value(v) for v in value) + "]"
    return repr(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _format_value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _format_value(f.default_factory())
    return "(required)"


def _type_text(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))


def _docstring(cls: type) -> str:
    """The first paragraph of the class's own docstring ("" without one: not the signature
    :func:`dataclasses.dataclass` puts in ``__doc__`` then)."""
    node = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body[0]
    doc = ast.get_docstring(node) if isinstance(node, ast.ClassDef) else None
    return " ".join(doc.split("\n\n")[0].split()) if doc else ""


class _Walk:
    """Sorts the ``modules``' dataclasses into groups (with their keys) and entry points' schemas."""

    def __init__(self, modules: Sequence[ModuleType]) -> None:
        self.classes = _schema_classes(modules)
        self.hints = {c: typing.get_type_hints(c) for c in self.classes}
        held = {h for c in self.classes for h in self.hints[c].values() if h in self.classes}
        self.roots = [c for c in self.classes if c not in held]
        self.keys: dict[type, str] = {}  # group class -> its key (the first path that reaches it)
        self.used_by: dict[type, list[str]] = {}
        for root in self.roots:
            self._visit(root, "", root)

    def _visit(self, cls: type, prefix: str, root: type) -> None:
        for f in dataclasses.fields(cls):
            sub = self.hints[cls].get(f.name)
            if sub in self.classes:
                self.keys.setdefault(sub, prefix + f.name)
                users = self.used_by.setdefault(sub, [])
                if root.__name__ not in users:
                    users.append(root.__name__)
                self._visit(sub, prefix + f.name + ".", root)

    def groups(self) -> list[type]:
        """Groups in the order a depth-first walk of the entry points' schemas meets them."""
        return list(self.keys)

    def schema_doc(self, cls: type, comments: dict, choices: dict) -> SchemaDoc:
        key = self.keys.get(cls, "")
        prefix = key + "." if key else ""
        rows = []
        for f in dataclasses.fields(cls):
            hint = self.hints[cls].get(f.name)
            full = prefix + f.name
            closed = choices.get(full) or (hint if inspect.isclass(hint) and issubclass(hint, enum.Enum) else None)
            rows.append(
                FieldDoc(
                    key=full,
                    name=f.name,
                    type=_type_text(f),
                    default="" if hint in self.classes else _default(f),
                    comment=next(
                        (
                            comments[(c.__name__, f.name)]
                            for c in cls.__mro__  # an inherited field: its base's words
                            if (c.__name__, f.name) in comments
                        ),
                        "",
                    ),
                    choices=tuple(str(m.value) for m in closed) if closed else (),
                    group=self.keys.get(hint, "") if hint in self.classes else "",
                )
            )
        return SchemaDoc(
            name=cls.__name__,
            key=key,
            doc=_docstring(cls),
            fields=tuple(rows),
            used_by=tuple(self.used_by.get(cls, ())),
        )


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def _cell(text: str) -> str:
    """Text for a table cell: ``|`` escaped, on one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def _prose(text: str) -> str:
    """A comment or docstring as Markdown: outside code spans ``<split>`` would be read as an
    HTML tag and vanish, so its ``<`` is escaped."""
    parts = re.split(r"(`+[^`]*`+)", _cell(text))
    return "".join(p if i % 2 else p.replace("<", "\\<") for i, p in enumerate(parts))


def _code(text: str) -> str:
    return f"`{_cell(text)}`"


def _store_names(modules: Sequence[ModuleType]) -> dict[str, str]:
    """``{"train_schema": "TrainConfig", ...}``: the ConfigStore names ``cs.store(name=..., node=...)``
    gives the schemas in the ``modules``' source (read, not run: Hydra stays out of this module)."""
    names = {}
    for node in (n for module in modules for n in ast.walk(ast.parse(inspect.getsource(module)))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "store":
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(kw.get("name"), ast.Constant) and isinstance(kw.get("node"), ast.Name):
                names[kw["name"].value] = kw["node"].id
    return names


@dataclass(frozen=True)
class _EntryConfig:
    """A top-level file of ``configs/`` as its ``defaults`` list composes it."""

    name: str  # train.yaml
    schema: str  # the schema class it composes ("" = none of its own)
    options: tuple[str, ...]  # "group=option", after the files it includes and its overrides
    included_by: tuple[str, ...]  # the top-level files whose defaults include this one


def _read_defaults(configs_dir: Path, name: str, stores: dict[str, str]) -> tuple[str, dict, list[str]]:
    """``(schema, {group: option}, included files)`` of ``configs/<name>.yaml``: a default naming a
    stored schema chooses it, one naming another top-level file includes that file's choices in
    place, ``group: option`` chooses, ``override group: option`` replaces (Hydra's order)."""
    import yaml

    schema, chosen, included = "", {}, []
    for entry in (yaml.safe_load((configs_dir / f"{name}.yaml").read_text()) or {}).get("defaults") or []:
        if isinstance(entry, str):
            if entry in stores:
                schema = stores[entry]
            elif (configs_dir / f"{entry}.yaml").is_file():
                inner_schema, inner, _ = _read_defaults(configs_dir, entry, stores)
                schema, chosen = schema or inner_schema, {**chosen, **inner}
                included.append(entry)
            continue
        for key, value in entry.items():
            group = key.removeprefix("override ").strip()
            if not group.startswith("hydra/"):
                chosen[group] = _format_value(value)
    return schema, chosen, included


def _entry_configs(configs_dir: Path, modules: Sequence[ModuleType]) -> list[_EntryConfig]:
    """Every top-level ``configs/*.yaml``: the schema it composes and the group options it starts from."""
    stores = _store_names(modules)
    read = {p.stem: _read_defaults(configs_dir, p.stem, stores) for p in sorted(configs_dir.glob("*.yaml"))}
    return [
        _EntryConfig(
            name=f"{stem}.yaml",
            schema=schema,
            options=tuple(f"{g}={o}" for g, o in chosen.items()),
            included_by=tuple(f"{other}.yaml" for other, (_, _, inc) in read.items() if stem in inc),
        )
        for stem, (schema, chosen, _) in read.items()
    ]


def _group_options(configs_dir: Path) -> dict[str, list[str]]:
    """``{"data": ["brats2021", ...], "hydra/launcher": [...]}``: every folder of configs/ holding YAML files."""
    options = {}
    for folder in sorted(p for p in configs_dir.rglob("*") if p.is_dir()):
        names = sorted(p.stem for p in folder.glob("*.yaml"))
        if names:
            options[folder.relative_to(configs_dir).as_posix()] = names
    return options


def _field_table(schema: SchemaDoc, group_headings: dict[str, str]) -> list[str]:
    out = ["| key | type | default | what |", "|---|---|---|---|"]
    for f in schema.fields:
        if f.group:
            kind = f"group `{f.type}`"
            default = f"[`{f.group}`](#{_slug(group_headings[f.group])})"
        else:
            kind = _code(f.type) + (": " + " \\| ".join(_code(c) for c in f.choices) if f.choices else "")
            default = _code(f.default)
        what = _prose(f.comment) if f.comment else (f"the `{f.group}` group's keys" if f.group else NO_COMMENT)
        out.append(f"| `{f.key}` | {kind} | {default} | {what} |")
    return out


def _markdown(
    modules: Sequence[ModuleType],
    choices: dict,
    groups: list[SchemaDoc],
    roots: list[SchemaDoc],
    configs_dir: Path | None,
) -> str:
    group_headings = {g.key: f"`{g.key}`" for g in groups}
    sources = " and ".join(f"`{m.__name__.replace('.', '/')}.py`" for m in modules)
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from {sources.replace('`', '')} by `python scripts/config_reference.py`; "
        "do not edit by hand. -->",
        "",
        f"Every key a command takes, generated from the config schemas in {sources}",
        "(the dataclasses Hydra composes `configs/` on) and the comment each field carries there. Set a key",
        "on the command line (`python train.py trainer.epochs=30 model.depth=4`) or choose a group's",
        "option (`resolution=full`, which sets several keys of the `resolution` group from",
        "`configs/resolution/full.yaml`). The defaults below are the schemas'; a group option and the",
        "entry point's own config file (`configs/train.yaml` and the others, listed at the end) set",
        "some of them otherwise, so the value a run used is in its `config.json`. A value outside a",
        "closed set, an unknown key or a wrong type is refused when the config is composed, naming",
        "what is allowed.",
        "",
        "Contents: [closed sets](#closed-sets) · groups: "
        + ", ".join(f"[`{g.key}`](#{_slug(group_headings[g.key])})" for g in groups)
        + " · entry points: "
        + ", ".join(f"[{r.name}](#{_slug(r.name)})" for r in roots)
        + (" · [config files](#config-files)" if configs_dir else ""),
        "",
        "## Closed sets",
        "",
        "| key | values |",
        "|---|---|",
    ]
    for key, values in choices.items():
        lines.append(f"| `{key}` | " + " \\| ".join(_code(str(m.value)) for m in values) + " |")
    lines += ["", "## Groups", ""]
    options = _group_options(configs_dir) if configs_dir else {}
    for g in groups:
        lines += [f"### {group_headings[g.key]}", ""]
        intro = [_prose(g.doc)] if g.doc else []
        intro.append(f"Schema `{g.name}`; in " + ", ".join(g.used_by) + ".")
        if g.key.replace(".", "/") in options:
            folder = g.key.replace(".", "/")
            intro.append(
                f"Options (`{g.key}=<option>`, `configs/{folder}/<option>.yaml`): "
                + ", ".join(f"`{o}`" for o in options[folder])
                + "."
            )
        lines += [" ".join(intro), "", *_field_table(g, group_headings), ""]
    lines += ["## Entry points' schemas", ""]
    for r in roots:
        lines += [f"### {r.name}", ""]
        if r.doc:
            lines += [_prose(r.doc), ""]
        lines += [*_field_table(r, group_headings), ""]
    if configs_dir:
        lines += [
            "## Config files",
            "",
            'Each command composes one top-level file of `configs/` (`hydra_entry("../configs", <name>)`);',
            "its `defaults` choose the schema and one option per group (those of the files it",
            "includes, then its own overrides).",
            "",
            "| file | schema | group options it starts from |",
            "|---|---|---|",
        ]
        for entry in _entry_configs(configs_dir, modules):
            if entry.included_by:
                schema_cell = "a defaults list, included by " + ", ".join(f"`{n}`" for n in entry.included_by)
            elif entry.schema:
                schema_cell = f"[{entry.schema}](#{_slug(entry.schema)})"
            else:
                schema_cell = "none (its keys are in the file)"
            chosen = _cell(", ".join(f"`{c}`" for c in entry.options)) or NO_COMMENT
            lines.append(f"| `configs/{entry.name}` | {schema_cell} | {chosen} |")
        keys = {g.key.replace(".", "/") for g in groups}
        other = {k: v for k, v in options.items() if k not in keys}
        if other:
            lines += ["", "Other folders of `configs/` (groups of their own, or files a key names):", ""]
            lines += [f"- `configs/{k}/`: " + ", ".join(f"`{o}`" for o in v) for k, v in other.items()]
        lines.append("")
    return "\n".join(lines)


def build_config_reference(*modules: ModuleType, configs_dir: str | Path | None = None) -> ConfigReference:
    """The reference page of the ``modules``' schemas (default :mod:`brats_seg.config` and
    :mod:`brats_seg.script_configs`).

    Args:
        modules: the modules whose dataclasses are the schemas, the run's first (a test passes its own).
        configs_dir: the ``configs/`` folder; when given, the page also lists each group's
            options and the top-level config files with the schema each composes.

    Returns:
        The Markdown, the schemas as read, and the fields that have no comment.
    """
    if not modules:
        from brats_seg import config, script_configs

        modules = (config, script_configs)
    walk = _Walk(modules)
    comments = {k: v for module in modules for k, v in read_field_comments(inspect.getsource(module)).items()}
    choices = {k: v for module in modules for k, v in getattr(module, "CHOICES", {}).items()}
    groups = [walk.schema_doc(c, comments, choices) for c in walk.groups()]
    roots = [walk.schema_doc(c, comments, choices) for c in walk.roots]
    order = {c.__name__: i for i, c in enumerate(walk.classes)}  # source order
    undocumented = tuple(
        f"{s.name}.{f.name}"
        for s in sorted(groups + roots, key=lambda s: order[s.name])
        for f in s.fields
        if not f.comment and not f.group
    )
    markdown = _markdown(modules, choices, groups, roots, Path(configs_dir) if configs_dir else None)
    return ConfigReference(markdown=markdown, schemas=tuple(groups + roots), undocumented=undocumented)
