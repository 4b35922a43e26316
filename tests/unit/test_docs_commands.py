"""Every `python train.py ...` and `python scripts/<name>.py ...` command in README.md and docs/*.md
composes as written: the entry point exists, its config takes every key=value given (no unknown
key, no value outside a closed set, no value of the wrong type), and its experiment and group
options exist. Composition is what fails first when a key is renamed or a script's command line
changes; running each command (minutes to hours) is the slow tests' and the studies' business."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:^|\s|`)(?:\S*/)?python3? ((?:scripts/[a-z_0-9]+|train)\.py)((?:[ \t]+[^\s`#|][^\s`|]*)*)")
ENTRY = re.compile(r'@hydra_entry\("(?:\.\./)?configs", "([a-z_]+)"\)')
HYDRA_FLAGS = ("--multirun", "--cfg", "--help", "--hydra-help", "--info", "--resolve", "--package")
PLACEHOLDER = re.compile(r"[<>$]|\.\.\.|\[$|\]$")


def _unbracket(word: str) -> str:
    """``[key=value`` and ``value]`` of an optional argument the page brackets, without the
    brackets; a list value (``shape=[64,64,64]``) keeps its own."""
    word = re.sub(r"^\[(?=[\w.+~]+=)", "", word)
    while word.endswith("]") and word.count("]") > word.count("["):
        word = word[:-1]
    return word


def _joined_lines(lines: list[str]):
    """``(number, line, next index)`` of a page's lines, a line continued with a backslash joined
    to the next (``number`` is the first's, 1-based)."""
    i = 0
    while i < len(lines):
        line, number = lines[i], i + 1
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        yield number, line, i


def _commands() -> list[tuple[str, int, str, list[str], bool]]:
    """``(page, line, script, overrides, refused)`` of every command the pages show (a line continued
    with a backslash is joined; an argument holding a placeholder such as ``<run>``, ``$res`` or
    ``...`` is skipped); ``refused``: the page shows it failing (its next line starts ``error:``)."""
    out = []
    for page in DOCS:
        lines = page.read_text().splitlines()
        for number, line, i in _joined_lines(lines):
            for match in COMMAND.finditer(line):
                try:
                    words = shlex.split(match.group(2).split(" #")[0])
                except ValueError:
                    words = match.group(2).split()
                words = [_unbracket(w) for w in words]  # [optional=args] as the pages mark them
                args = [
                    w
                    for w in words
                    if "=" in w
                    and not w.startswith(("-", "hydra.", "+hydra"))
                    and not PLACEHOLDER.search(w.split("=", 1)[1])
                    and not PLACEHOLDER.search(w.split("=", 1)[0])
                ]
                refused = i < len(lines) and lines[i].strip().startswith("error:")
                flags = [w for w in words if w.startswith("--") and w.split("=")[0] not in HYDRA_FLAGS]
                out.append((page.relative_to(REPO).as_posix(), number, match.group(1), args + flags, refused))
    return out


COMMANDS = _commands()


def test_the_pages_show_commands_of_every_main_entry_point():
    shown = {script for _, _, script, _, _ in COMMANDS}
    for script in (
        "train.py",
        "scripts/evaluate.py",
        "scripts/predict.py",
        "scripts/plan_memory.py",
        "scripts/export.py",
        "scripts/prepare_data.py",
        "scripts/benchmark.py",
        "scripts/study.py",
    ):
        assert script in shown, script


@pytest.mark.parametrize(
    "page, line, script, overrides, refused", COMMANDS, ids=[f"{p}:{n}:{s}" for p, n, s, _, _ in COMMANDS]
)
def test_a_documented_command_composes_as_written(page, line, script, overrides, refused):
    from hydra import compose, initialize_config_dir

    from brats_seg.cli import to_config
    from brats_seg.script_configs import register_configs

    path = REPO / script
    assert path.is_file(), f"{page}:{line}: {script} does not exist"
    source = path.read_text()
    entry = ENTRY.search(source)
    if entry is None:  # a script without options (config_reference.py): shown without any, reads no argv
        assert not overrides and "sys.argv" not in source and "argparse" not in source, f"{page}:{line}: {script}"
        return
    flags = [o for o in overrides if o.startswith("--")]
    assert not flags, f"{page}:{line}: python {script} {' '.join(flags)}: an option of the argparse era; use key=value"
    sweep = [o for o in overrides if "," in o.split("=", 1)[1] and not o.split("=", 1)[1].startswith("[")]
    overrides = [o for o in overrides if o not in sweep] + [
        f"{o.split('=', 1)[0]}={o.split('=', 1)[1].split(',')[0]}" for o in sweep
    ]  # a -m sweep: its first job
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        try:
            to_config(compose(config_name=entry.group(1), overrides=overrides))
            error = None
        except SystemExit:
            error = "refused (see stderr)"
        except Exception as e:  # noqa: BLE001 - Hydra's several errors; the message is the point
            error = f"{type(e).__name__}: {e}"
    if refused:  # the page shows this command's error: it must still be one
        assert error, f"{page}:{line}: python {script} {' '.join(overrides)} is shown failing but composes"
    elif error:
        pytest.fail(f"{page}:{line}: python {script} {' '.join(overrides)}: {error}")


def _shown_commands() -> list[tuple[str, int, str, bool]]:
    """``(page, line, text, in_block)`` of every ``python train.py``/``python scripts/*.py`` command a page
    shows: a code block's line (continued lines joined) from the command on, or an inline code span."""
    out = []
    for page in DOCS:
        for number, line, _ in _joined_lines(page.read_text().splitlines()):
            if line.startswith("    "):
                match = COMMAND.search(line)
                if match:
                    out.append((page.relative_to(REPO).as_posix(), number, line[match.start() :], True))
        text = re.sub(r"(?m)^    .*$", "", page.read_text())  # code blocks blanked, lines kept
        for span in re.finditer(r"`([^`]+)`", text):  # an inline span, continued on the next line or not
            if COMMAND.search(span.group(1)):
                out.append(
                    (
                        page.relative_to(REPO).as_posix(),
                        text.count("\n", 0, span.start()) + 1,
                        " ".join(span.group(1).split()),
                        False,
                    )
                )
    return out


SHELL_TRAPS = (
    (re.compile(r"<[^\s<>]*>"), "an <angle-bracket> placeholder, which bash reads as a redirection"),
    (re.compile(r"[^\s|]\|[^\s|]"), "alternatives joined by |, which bash reads as a pipe"),
    (re.compile(r"(?:^|\s)\[[\w.+~]+="), "an [optional=argument] in brackets, which bash passes on as written"),
)


@pytest.mark.parametrize(
    "page, line, text, in_block", _shown_commands(), ids=[f"{p}:{n}" for p, n, _, _ in _shown_commands()]
)
def test_a_documented_command_pasted_into_bash_is_the_command_the_page_means(page, line, text, in_block):
    """A command pasted into bash runs as written: no placeholder or alternative that the shell reads
    as its own syntax (``outputs/<run>`` is a redirection, ``layout=a|b`` a pipe, ``[split=test]`` a
    word with brackets); a code block's command has no ``...`` for the reader to fill in. A real pipe
    (``2>&1 | grep x``) has spaces around it. Quoted text and a trailing ``# comment`` are not the shell's."""
    bare = re.sub(r"'[^']*'|\"[^\"]*\"", "''", text)
    bare = re.split(r"(?:^|\s)#", bare, maxsplit=1)[0]
    for pattern, what in SHELL_TRAPS:
        found = pattern.search(bare)
        assert not found, f"{page}:{line}: {found.group(0).strip()!r} is {what}: {text.strip()}"
    if in_block:
        assert not re.search(r"(?:^|\s)\.\.\.(?:\s|$)", bare), (
            f"{page}:{line}: '...' in a command to paste: {text.strip()}"
        )


def test_the_shell_check_catches_each_trap():
    for text in (
        "python scripts/export.py run_dir=outputs/<run>",
        "python scripts/make_synthetic.py layout=brats2021|msd",
        "python scripts/evaluate.py run_dir=outputs/full [split=val]",
    ):
        with pytest.raises(AssertionError):
            test_a_documented_command_pasted_into_bash_is_the_command_the_page_means("page", 1, text, True)
    for text in (
        "python scripts/benchmark.py resolution=half 2>&1 | grep Extending",
        "python train.py 'trainer.patch_size=[48,48,48]'   # or [64,64,64] | whole <run>",
    ):
        test_a_documented_command_pasted_into_bash_is_the_command_the_page_means("page", 1, text, True)


def test_the_code_map_names_every_module():
    """docs/development.md's code map names each module and package of brats_seg/ (a new module
    without its line fails here)."""
    page = (REPO / "docs" / "development.md").read_text()
    block = page[page.index("## Code map") : page.index("## GPU acceptance")]
    words = set(re.findall(r"[a-z_0-9]+", block))
    package = REPO / "brats_seg"
    missing = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.stem != "__init__" and "presets" not in p.parts and p.stem not in words
    )
    missing += sorted(
        str(p.relative_to(package))
        for p in package.iterdir()
        if p.is_dir() and (p / "__init__.py").is_file() and p.name not in words
    )
    assert not missing, f"docs/development.md's code map does not name: {', '.join(missing)}"
