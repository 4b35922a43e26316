"""The image's and the lock's contracts, checked by reading the files (no Docker daemon here).

Dockerfile: a non-root USER before CMD/ENTRYPOINT; VOLUMEs for the datasets, the prepared
cache, run folders and the MLflow store; every path the image's environment or the project's
relative defaults point at (resolved from WORKDIR, through the links the image makes) inside
a declared volume; every volume made and owned by that user; pip installs that are not
editable, skip the dev extra, are constrained by the lock and go into a venv (over the base's
site-packages, first on PATH) made before them; the user's build args declared after them; the
default command the BraTS challenges' container (predict.py from the exported model in
/workspace/model, /input to /output); the base image's TensorFlow the lock's; a .dockerignore
that keeps the venv, datasets and stores out of the build context but not what the Dockerfile
copies. tests/integration/test_image.py builds the image and runs it.

requirements.lock: every requirement of ``[project.dependencies]`` and of the ``dev`` and
``gpu`` extras pinned, for each supported Python on Linux by exactly one pin that satisfies
the pyproject range; the Makefile installs from it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path, PurePosixPath

import pytest
import yaml
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

from brats_seg.config import DataConfig, TrackingConfig
from brats_seg.script_configs import PredictScriptConfig

ROOT = Path(__file__).resolve().parents[2]
LOCK = "requirements.lock"
SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")  # pyproject's requires-python, Linux only


# ---------------------------------------------------------------------------------------------
# Dockerfile parsing


@dataclasses.dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest of the logical line, continuations joined, variables not yet expanded
    workdir: str  # the WORKDIR in force for this instruction


@dataclasses.dataclass
class Dockerfile:
    instructions: list[Instruction]
    variables: dict[str, str]  # ARG defaults and ENV values, in force at the end of the file

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def index(self, instruction: Instruction) -> int:
        return self.instructions.index(instruction)

    def expand(self, text: str) -> str:
        """``${NAME}``, ``${NAME:-default}`` and ``$NAME`` replaced by ARG/ENV values."""

        def sub(match: re.Match) -> str:
            name = match.group(1) or match.group(3)
            default = match.group(2)
            return self.variables.get(name, default if default is not None else "")

        return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", sub, text)


def logical_lines(text: str) -> list[str]:
    """Instruction lines with ``\\`` continuations joined; comment lines dropped (also inside
    a continuation, as Docker does)."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse_key_values(args: str) -> dict[str, str]:
    """``ENV A=1 B="two words"`` (or the legacy ``ENV A 1``) as a dict."""
    tokens = shlex.split(args)
    if tokens and "=" not in tokens[0]:
        return {tokens[0]: " ".join(tokens[1:])}
    return dict(token.split("=", 1) for token in tokens)


def parse_dockerfile(text: str) -> Dockerfile:
    instructions, variables, workdir = [], {}, "/"
    for line in logical_lines(text):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "ARG":
            name, _, default = args.partition("=")
            variables.setdefault(name.strip(), default.strip().strip('"'))
        elif keyword == "ENV":
            variables.update(parse_key_values(args))
        elif keyword == "WORKDIR":
            path = Dockerfile([], variables).expand(args)
            workdir = str(PurePosixPath(workdir) / path)
        instructions.append(Instruction(keyword, args, workdir))
    return Dockerfile(instructions, variables)


def exec_or_shell(args: str) -> list[str]:
    """The words of a JSON (exec) form or a shell form argument."""
    if args.startswith("["):
        return json.loads(args)
    return shlex.split(args)


def normalise(path: str, cwd: str = "/") -> PurePosixPath:
    """An absolute path with ``.`` and ``..`` removed (no file system involved)."""
    parts: list[str] = []
    for part in (PurePosixPath(cwd) / path).parts[1:]:
        if part == "..":
            parts = parts[:-1]
        elif part != ".":
            parts.append(part)
    return PurePosixPath("/", *parts)


def shell_commands(run_args: str) -> list[list[str]]:
    """The simple commands of a RUN's shell form (split at ``&&``, ``||``, ``;``)."""
    lexer = shlex.shlex(run_args, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|", "&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def links(dockerfile: Dockerfile) -> dict[PurePosixPath, PurePosixPath]:
    """Symbolic links the image makes with ``ln -s TARGET NAME``: absolute name -> target."""
    made = {}
    for run in dockerfile.all("RUN"):
        for words in shell_commands(dockerfile.expand(run.args)):
            if words[:1] == ["ln"] and any(w.startswith("-") and "s" in w for w in words[1:-2]):
                target, name = [w for w in words[1:] if not w.startswith("-")][-2:]
                name_path = normalise(name, run.workdir)  # a `cd` inside the RUN is not followed
                made[name_path] = normalise(target, str(name_path.parent))
    return made


def follow(path: PurePosixPath, made: dict[PurePosixPath, PurePosixPath]) -> PurePosixPath:
    """``path`` with every link (of ``made``) on the way resolved, as ``Path.resolve`` would."""
    for _ in range(40):
        for name, target in made.items():
            if path == name or name in path.parents:
                path = target / path.relative_to(name)
                break
        else:
            return path
    raise AssertionError(f"link loop resolving {path}")


def volumes(dockerfile: Dockerfile) -> list[PurePosixPath]:
    declared = []
    for volume in dockerfile.all("VOLUME"):
        args = dockerfile.expand(volume.args)
        paths = json.loads(args) if args.startswith("[") else args.split()
        declared += [normalise(p, volume.workdir) for p in paths]
    return declared


def in_volume(path: PurePosixPath, declared: list[PurePosixPath]) -> bool:
    return any(path == v or v in path.parents for v in declared)


@dataclasses.dataclass
class PipInstall:
    run: Instruction  # the RUN it is in
    launcher: list[str]  # the words before ``install``: ["python", "-m", "pip"], ["/opt/venv/bin/pip"]
    args: list[str]  # the words after ``install``


def pip_install_commands(dockerfile: Dockerfile) -> list[PipInstall]:
    """Every ``pip install`` command in the RUN instructions."""
    found = []
    for run in dockerfile.all("RUN"):
        for words in shell_commands(dockerfile.expand(run.args)):
            for i, word in enumerate(words):  # pip, pip3, /path/to/pip, python -m pip
                if re.fullmatch(r"pip(3(\.\d+)?)?", PurePosixPath(word).name):
                    if words[i + 1 : i + 2] == ["install"]:
                        found.append(PipInstall(run, words[: i + 1], words[i + 2 :]))
                    break
    return found


def pip_installs(dockerfile: Dockerfile) -> list[list[str]]:
    """The words after ``install`` of every ``pip install`` command in the RUN instructions."""
    return [install.args for install in pip_install_commands(dockerfile)]


def option_values(words: list[str], *names: str) -> list[str]:
    """Values of ``--name value``, ``--name=value`` and ``-n value`` options."""
    values = []
    for i, word in enumerate(words):
        for name in names:
            if word == name and i + 1 < len(words):
                values.append(words[i + 1])
            elif name.startswith("--") and word.startswith(name + "="):
                values.append(word.split("=", 1)[1])
    return values


def copied(dockerfile: Dockerfile) -> dict[str, PurePosixPath]:
    """``{source in the build context: where it lands in the image}`` for every COPY/ADD."""
    result = {}
    for instruction in dockerfile.all("COPY") + dockerfile.all("ADD"):
        words = exec_or_shell(dockerfile.expand(instruction.args))
        if any(w.startswith("--from") for w in words):
            continue
        *sources, dest = [w for w in words if not w.startswith("--")]
        into_folder = len(sources) > 1 or dest.endswith("/")
        for source in sources:
            target = normalise(dest, instruction.workdir)
            result[source.rstrip("/")] = target / PurePosixPath(source).name if into_folder else target
    return result


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


# ---------------------------------------------------------------------------------------------
# Where the project writes by default, relative to the cwd (= the image's WORKDIR)


def _hydra_dir_prefix(value: str) -> str:
    """The literal folder an interpolated Hydra dir starts with: ``outputs/${now:...}`` ->
    ``outputs``; ``${or_else:${run_dir},outputs/${now:..}}`` -> ``outputs``."""
    literal = re.sub(r"\$\{now:[^}]*\}", "", value)
    literal = literal.rsplit(",", 1)[-1]  # the fallback of or_else / oc.select
    return literal.strip("${}").split("/", 1)[0]


def project_relative_defaults() -> dict[str, str]:
    """What the project reads and writes by default, as paths relative to the cwd."""
    train = yaml.safe_load((ROOT / "configs" / "train.yaml").read_text())
    tracking = yaml.safe_load((ROOT / "configs" / "tracking" / "mlflow.yaml").read_text())
    defaults = {
        "data.cache_dir": DataConfig().cache_dir,
        "hydra.run.dir": _hydra_dir_prefix(train["hydra"]["run"]["dir"]),
        "hydra.sweep.dir": _hydra_dir_prefix(train["hydra"]["sweep"]["dir"]),
        "tracking.uri (schema)": TrackingConfig().uri,
        "tracking.uri (configs/tracking/mlflow.yaml)": tracking["uri"],
    }
    experiment = yaml.safe_load((ROOT / "configs" / "experiment" / "demo.yaml").read_text())
    defaults["experiment=demo run_dir"] = experiment["run_dir"]
    for path in sorted((ROOT / "configs" / "data").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        for key in ("root", "cache_dir"):
            if data.get(key):
                defaults[f"data={path.stem} data.{key}"] = data[key]
    return defaults


def sqlite_file(uri: str) -> str | None:
    """The file of a ``sqlite:///`` URI (relative or absolute), else None."""
    return uri[len("sqlite:///") :].partition("?")[0] if uri.startswith("sqlite:///") else None


def workdir_at_cmd(dockerfile: Dockerfile) -> str:
    return dockerfile.all("CMD")[-1].workdir if dockerfile.all("CMD") else dockerfile.instructions[-1].workdir


def landing(dockerfile: Dockerfile, relative: str) -> PurePosixPath:
    """Where a cwd-relative default lands in the image (links followed)."""
    file = sqlite_file(relative)
    path = file if file is not None else relative
    return follow(normalise(path, workdir_at_cmd(dockerfile)), links(dockerfile))


# ---------------------------------------------------------------------------------------------
# The Dockerfile's contract


def test_runs_as_a_non_root_user_before_the_command(dockerfile):
    users = dockerfile.all("USER")
    assert users, "the Dockerfile sets no USER: the container would run as root"
    last_user = users[-1]
    user = dockerfile.expand(last_user.args).split(":", 1)[0].strip()
    assert user and user not in ("root", "0"), f"USER {last_user.args} resolves to root ({user!r})"
    starts = dockerfile.all("CMD") + dockerfile.all("ENTRYPOINT")
    assert starts, "no CMD or ENTRYPOINT"
    for start in starts:
        assert dockerfile.index(last_user) < dockerfile.index(start), (
            f"USER comes after {start.keyword}: {start.keyword} {start.args}"
        )
    groups = [i for i in dockerfile.all("RUN") if "useradd" in i.args]
    assert groups and dockerfile.index(groups[0]) < dockerfile.index(last_user), (
        "the user is not created (useradd) before USER"
    )


def test_volumes_hold_datasets_cache_outputs_and_the_mlflow_store(dockerfile):
    declared = volumes(dockerfile)
    defaults = project_relative_defaults()
    # Each of these is its own volume, so it can be mounted (and kept) on its own.
    own_volume = {
        "the prepared cache (data.cache_dir)": landing(dockerfile, defaults["data.cache_dir"]),
        "the datasets (data=synthetic data.root's folder)": landing(
            dockerfile, str(PurePosixPath(defaults["data=synthetic data.root"]).parent)
        ),
        "the run folders (hydra.run.dir)": landing(dockerfile, defaults["hydra.run.dir"]),
        "the MLflow store (tracking.uri's database folder)": landing(
            dockerfile, defaults["tracking.uri (configs/tracking/mlflow.yaml)"]
        ).parent,
    }
    for what, path in own_volume.items():
        assert path in declared, f"{what} lands in {path}, which is not a declared VOLUME {declared}"


def test_every_path_the_image_points_at_is_in_a_volume(dockerfile):
    declared = volumes(dockerfile)
    made = links(dockerfile)
    for what, relative in project_relative_defaults().items():
        path = landing(dockerfile, relative)
        assert in_volume(path, declared), f"{what}={relative!r} lands in {path}, outside the volumes {declared}"
    env = {}
    for instruction in dockerfile.all("ENV"):
        env.update(parse_key_values(instruction.args))
    pointed = 0
    for name, value in env.items():
        value = dockerfile.expand(value)
        file = sqlite_file(value)
        path = file if file is not None else value.removeprefix("file://")
        if not path.startswith("/") or name in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH"):
            continue
        pointed += 1
        resolved = follow(normalise(path), made)
        assert in_volume(resolved, declared), f"ENV {name}={value} points at {resolved}, outside the volumes {declared}"
    assert pointed, "no ENV points the MLflow tools at the store's volume (MLFLOW_TRACKING_URI, ...)"


def test_mlflow_variables_name_the_store_the_project_writes(dockerfile):
    """`mlflow ui` in the image (MLFLOW_BACKEND_STORE_URI) shows the runs training wrote."""
    store = landing(dockerfile, project_relative_defaults()["tracking.uri (configs/tracking/mlflow.yaml)"])
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_BACKEND_STORE_URI"):
        value = dockerfile.variables.get(name)
        assert value is not None, f"ENV {name} is not set"
        assert sqlite_file(value) == str(store), f"ENV {name}={value}, but training writes sqlite:///{store}"


def test_installs_non_editable_without_dev_extra_constrained_by_the_lock(dockerfile):
    installs = pip_installs(dockerfile)
    assert installs, "no `pip install` in any RUN"
    assert LOCK in copied(dockerfile), f"{LOCK} is not copied into the image"
    for words in installs:
        command = "pip install " + " ".join(words)
        assert not {"-e", "--editable"} & set(words) and not any(w.startswith("--editable=") for w in words), (
            f"editable install: {command}"
        )
        assert not any(re.search(r"\[[^\]]*\bdev\b[^\]]*\]", w) for w in words), f"dev extra installed: {command}"
        assert not option_values(words, "-r", "--requirement"), (
            f"installs a requirements file (the lock as requirements would bring every extra): {command}"
        )
        constraints = option_values(words, "-c", "--constraint")
        assert constraints, f"not constrained by the lock: {command}"
        assert all(PurePosixPath(c).name == LOCK for c in constraints), f"constraints other than {LOCK}: {command}"


def venv_made(dockerfile: Dockerfile) -> tuple[Instruction, list[str]]:
    """The RUN that makes the image's venv (``python3 -m venv ... DIR``) and that command's words."""
    for run in dockerfile.all("RUN"):
        for words in shell_commands(dockerfile.expand(run.args)):
            if "-m" in words and words[words.index("-m") + 1 : words.index("-m") + 2] == ["venv"]:
                return run, words
    raise AssertionError("no RUN makes a venv (python3 -m venv): pip would install into the base's system Python")


def test_installs_into_a_venv_first_on_path_over_the_base_packages(dockerfile):
    """Debian 12 and Ubuntu 23.04+ refuse pip installs into the system Python (PEP 668); a venv
    over the base's site-packages keeps TensorFlow's image's own TensorFlow (the lock pins the
    same version); first on PATH, `python` and `pip` in every later RUN and command are the venv's."""
    made, words = venv_made(dockerfile)
    venv = normalise(words[-1], made.workdir)
    assert "--system-site-packages" in words, (
        f"{' '.join(words)}: without --system-site-packages the base image's TensorFlow is hidden and pip installs another"
    )
    paths = [(i, parse_key_values(i.args).get("PATH")) for i in dockerfile.all("ENV")]
    paths = [(i, value) for i, value in paths if value is not None]
    assert paths, "no ENV PATH: `python` and `pip` are the base image's, not the venv's"
    path_env, value = paths[-1]
    assert value.split(":")[0] == str(venv / "bin"), f"ENV PATH={value}: {venv}/bin is not first"
    assert value.split(":")[1:] == ["$PATH"], f"ENV PATH={value} drops the base image's PATH"
    installs = pip_install_commands(dockerfile)
    assert installs
    for install in installs:
        command = " ".join([*install.launcher, "install", *install.args])
        assert dockerfile.index(made) < dockerfile.index(install.run), f"{command} runs before the venv is made"
        assert dockerfile.index(path_env) < dockerfile.index(install.run), f"{command} runs before ENV PATH"
        launcher = install.launcher[0]
        assert launcher in ("python", "pip") or PurePosixPath(launcher).parent == venv / "bin", (
            f"{command}: not the venv's pip (python -m pip, pip or {venv}/bin/...)"
        )


def test_the_user_build_args_come_after_the_installs(dockerfile):
    """A build arg is in the environment of every RUN after its ARG, so a UID of one's own
    (--build-arg UID=$(id -u)) would otherwise rebuild the dependencies (minutes, gigabytes)."""
    last_install = max(dockerfile.index(install.run) for install in pip_install_commands(dockerfile))
    for name in ("UID", "GID"):
        args = [i for i in dockerfile.all("ARG") if i.args.partition("=")[0].strip() == name]
        assert args, f"no ARG {name}"
        assert all(dockerfile.index(a) > last_install for a in args), f"ARG {name} comes before a pip install"


def test_every_volume_is_made_and_owned_by_the_user(dockerfile):
    """An anonymous volume, and a named one on first use, starts with the image's folder and its
    owner: a volume the user does not own is one a run cannot write. (A RUN's chown of a missing
    folder fails the build, so a volume chowned is a volume made.)"""
    user = dockerfile.expand(dockerfile.all("USER")[-1].args).strip()
    owned: set[PurePosixPath] = set()
    for run in dockerfile.all("RUN"):
        if dockerfile.index(run) > dockerfile.index(dockerfile.all("USER")[-1]):
            continue
        for words in shell_commands(dockerfile.expand(run.args)):
            if words[:1] == ["chown"]:
                owner, *paths = [w for w in words[1:] if not w.startswith("-")]
                if owner == user:
                    owned |= {normalise(path, run.workdir) for path in paths}
    for volume in volumes(dockerfile):
        assert volume in owned, f"VOLUME {volume} is not chowned to USER {user} before USER"


PREDICT_CONTAINER = {  # the BraTS challenges' container: cases in /input, one mask each in /output
    "export": "/workspace/model",
    "input": "/input",
    "output": "/output",
    "evaluate.overlays": "false",
}


def test_default_command_is_the_challenge_container(dockerfile):
    """``docker run -v cases:/input:ro -v masks:/output -v export:/workspace/model brats-seg``
    segments every case; exec form, so SIGTERM reaches predict.py (exit 75, resumable)."""
    cmd = dockerfile.all("CMD")[-1]
    assert cmd.args.startswith("["), f"CMD {cmd.args}: shell form, /bin/sh would not pass SIGTERM on"
    words = exec_or_shell(cmd.args)
    assert words[:2] == ["python", "scripts/predict.py"], f"CMD {words}"
    assert copied(dockerfile)["scripts"] == normalise("scripts", cmd.workdir), "scripts/ is not in CMD's WORKDIR"
    overrides = dict(word.split("=", 1) for word in words[2:])
    assert overrides == PREDICT_CONTAINER, f"CMD {words}"
    for key in overrides:  # keys of predict.py's schema, so the command composes
        node = PredictScriptConfig()
        for part in key.split("."):
            assert dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}, (
                f"CMD's {key}= is not a key of scripts/predict.py"
            )
            node = getattr(node, part)
    declared = volumes(dockerfile)
    for key in ("export", "input", "output"):
        assert PurePosixPath(overrides[key]) in declared, f"CMD's {key}={overrides[key]} is not a declared VOLUME"


def test_entry_points_and_configs_sit_in_workdir_without_the_package_source(dockerfile):
    """Hydra reads configs/ beside train.py (../configs beside scripts/); a brats_seg/ folder in
    WORKDIR would shadow the installed package (``python train.py`` puts WORKDIR first on sys.path)."""
    workdir = PurePosixPath(workdir_at_cmd(dockerfile))
    destinations = copied(dockerfile)
    for source in ("train.py", "configs", "scripts"):
        assert source in destinations, f"{source} is not copied into the image"
        assert destinations[source].parent == workdir, f"{source} goes to {destinations[source]}, not {workdir}/"
    package = destinations.get("brats_seg")
    assert package is None or workdir not in (package, *package.parents), (
        f"brats_seg/ is copied to {package}, inside WORKDIR {workdir}: the scripts would import it instead of the install"
    )


def test_base_image_tensorflow_is_the_locked_one(dockerfile):
    base = dockerfile.expand(dockerfile.all("FROM")[0].args.split()[0])
    match = re.fullmatch(r"tensorflow/tensorflow:(\d+\.\d+\.\d+)(-gpu)?", base)
    assert match, f"base image {base}: expected tensorflow/tensorflow:<version>[-gpu]"
    pins = {v for v, _ in lock_pins()[canonicalize_name("tensorflow")]}
    assert pins == {match.group(1)}, f"base image TensorFlow {match.group(1)}, lock pins {pins}"


def test_mlflow_port_is_exposed(dockerfile):
    ports = [p.split("/")[0] for e in dockerfile.all("EXPOSE") for p in e.args.split()]
    assert "5000" in ports


def dockerignore_patterns() -> list[tuple[bool, str]]:
    """``(excluded, pattern)`` in file order, as Docker reads .dockerignore."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        rules.append((not negated, pattern))
    return rules


def ignored(path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the context) out: the last matching rule
    wins, and a pattern matching a folder also matches everything below it."""
    verdict = False
    parts = PurePosixPath(path).parts
    for excluded, pattern in dockerignore_patterns():
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        regex = re.sub(r"\\\[([^\]]*)\\\]", lambda m: "[" + m.group(1).replace("\\", "") + "]", regex)
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            verdict = excluded
    return verdict


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".venv",
        "data/BraTS2021/x.nii.gz",
        "data/cache/synthetic/meta.json",
        "data/synthetic/case/case_seg.nii.gz",
        ".git/HEAD",
        "outputs/demo/state.json",
        "mlruns.db",
        "mlartifacts/brats-seg/x.png",
        "multirun/a/0/config.json",
        "scripts/image/make_base.sh",  # makes the base image; a change to it rebuilds nothing
    ],
)
def test_dockerignore_keeps_environment_data_and_stores_out(path):
    assert ignored(path), f"{path} would be sent to the Docker daemon (.dockerignore)"


def test_dockerignore_keeps_what_the_dockerfile_copies(dockerfile):
    sources = list(copied(dockerfile))
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignored(source), f"COPY {source}, but .dockerignore leaves it out of the build context"


def test_dockerignore_matcher_is_not_vacuous():
    assert not ignored("brats_seg/config.py") and not ignored("train.py") and not ignored("data/README.md")


# ---------------------------------------------------------------------------------------------
# The lock


def lock_pins() -> dict[str, list[tuple[str, Marker | None]]]:
    """``{canonical name: [(version, marker or None), ...]}`` from the ``name==version ; marker`` lines."""
    pins: dict[str, list[tuple[str, Marker | None]]] = {}
    for line in (ROOT / LOCK).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        assert not line.startswith("-"), f"{LOCK}: options are not allowed in a constraints file: {line}"
        requirement = Requirement(line)
        specs = list(requirement.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{LOCK}: not an exact pin: {line}"
        assert not requirement.extras, f"{LOCK}: pip constraints cannot carry extras: {line}"
        pins.setdefault(canonicalize_name(requirement.name), []).append((specs[0].version, requirement.marker))
    return pins


def linux_environment(python: str) -> dict[str, str]:
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_version": "",
        "implementation_version": f"{python}.0",
        "extra": "",
    }


def pyproject_requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra in ("dev", "gpu"):
        found += [(f"extra {extra}", Requirement(r)) for r in project["optional-dependencies"][extra]]
    return found


def test_supported_pythons_are_the_pyproject_ones():
    specifier = Requirement(
        f"x{tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['requires-python']}"
    ).specifier
    assert [p for p in SUPPORTED_PYTHONS if Version(p) in specifier] == list(SUPPORTED_PYTHONS)
    assert Version("3.9") not in specifier and Version("3.14") not in specifier, (
        "requires-python changed: update SUPPORTED_PYTHONS here and relock (`make lock`)"
    )


@pytest.mark.parametrize("python", SUPPORTED_PYTHONS)
def test_lock_pins_every_pyproject_requirement_within_its_range(python):
    pins = lock_pins()
    env = linux_environment(python)
    problems = []
    for where, requirement in pyproject_requirements():
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            continue
        name = canonicalize_name(requirement.name)
        applying = [v for v, marker in pins.get(name, []) if marker is None or marker.evaluate(env)]
        if len(applying) != 1:
            problems.append(
                f"{requirement} ({where}): {len(applying)} pins apply on Python {python} "
                f"(lock has {pins.get(name, [])})"
            )
        elif not requirement.specifier.contains(applying[0], prereleases=True):
            problems.append(f"{requirement} ({where}): the lock pins {applying[0]}")
    assert not problems, f"{LOCK} is out of date with pyproject.toml (run `make lock`):\n" + "\n".join(problems)


@pytest.mark.parametrize("python", SUPPORTED_PYTHONS)
def test_lock_has_one_pin_per_package_and_python(python):
    env = linux_environment(python)
    duplicated = {
        name: [v for v, m in versions if m is None or m.evaluate(env)] for name, versions in lock_pins().items()
    }
    assert not {n: v for n, v in duplicated.items() if len(v) > 1}


def test_make_installs_from_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+)\s*[:?]?=\s*(.*?)\s*$", makefile, re.M))

    def expand(text: str) -> str:
        return re.sub(r"\$\((\w+)\)", lambda m: expand(variables.get(m.group(1), "")), text)

    stamp_rule = re.search(r"^\$\(STAMP\):(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert stamp_rule, "no $(STAMP) rule in the Makefile"
    assert LOCK in expand(stamp_rule.group(1)).split(), "the install stamp does not depend on the lock"
    pip_lines = [expand(line) for line in stamp_rule.group(2).splitlines() if "pip install" in line and ".[" in line]
    assert pip_lines, "the install rule installs no extra"
    for line in pip_lines:
        words = shlex.split(line)
        assert option_values(words, "-c", "--constraint") == [LOCK], f"not constrained by {LOCK}: {line}"
    for target in ("test", "demo", "install"):
        assert re.search(rf"^{target}:.*\$\(STAMP\)", makefile, re.M), f"make {target} does not install first"
    lock_rule = re.search(r"^lock:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert lock_rule and "pip compile pyproject.toml" in lock_rule.group(1), (
        "no `make lock` that compiles pyproject.toml"
    )
    assert "--extra dev" in lock_rule.group(1), "`make lock` does not cover the dev extra"
