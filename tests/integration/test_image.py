"""The Docker image built and run for real: the Dockerfile over the local Debian base
(``scripts/image/make_base.sh``), built by podman, then run as the image's own user with host
folders on its volumes, as docs/installation.md ("Docker") shows it:

    python train.py experiment=demo trainer.epochs=2   # generates the synthetic dataset into the data volume
    python scripts/evaluate.py run_dir=outputs/demo
    python scripts/export.py run_dir=outputs/demo       # -> outputs/demo/export
    the image's CMD (read from the image)               # that export on /workspace/model, a test case in /input

Asserts: every step exits 0; the image runs as its non-root user with the declared volumes; the
dataset, cache, run folder (checkpoints), evaluation summary, export (``preprocessing.json``),
MLflow store and ``/output/<case_id>.nii.gz`` land in the host folders, owned by that user; the
mask has the input case's shape and affine, only labels of the run's layout, and is evaluate.py's
prediction of that case voxel for voxel. Bad input in the container (a case without its T1ce, a
file that is not NIfTI, contrasts on two grids; an export onto the model volume) exits 2 with one
``error:`` line naming the case and file. The time of each
phase is printed (``pytest -s``) and, with ``BRATS_IMAGE_TIMINGS=<file>``, written there as JSON.

Needs root, podman, buildah and mmdebstrap (Debian: ``apt-get install podman buildah mmdebstrap``;
``.ci/run`` installs them), so in CI (``CI`` set) their absence fails the test; elsewhere it skips
with the reason. ``podman run`` cannot start containers on this project's machines (the OCI runtime
may not set rlimits there), so buildah runs the commands in a working container of the image
(chroot isolation). The images stay in podman's store: they are the cache that makes the next
build take seconds (docs/installation.md has the cold and cached times); the container is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import skip_outside_ci
from tests.integration.scripts import REPO

BASE = "localhost/brats-seg-base:bookworm"  # scripts/image/make_base.sh's
IMAGE = "localhost/brats-seg:cpu"
USER_ID = GROUP_ID = 1000  # the build args: the image's user, who owns everything a run writes
CASE_IMAGES = ("flair", "t1", "t1ce", "t2")  # a BraTS 2021 case folder's images (its _seg is not input)
BUILD_TIMEOUT_S = 1800  # cold on 2 cores: ~4 min, most of it pip downloading and unpacking TensorFlow
RUN_TIMEOUT_S = 900

# Host folder (under the test's tmp dir) -> the image's VOLUME it is mounted on.
VOLUMES = {
    "data": "/workspace/data",
    "data/cache": "/workspace/data/cache",
    "outputs": "/workspace/outputs",
    "multirun": "/workspace/multirun",
    "mlflow": "/workspace/mlflow",
    "model": "/workspace/model",
    "input": "/input",
    "output": "/output",
}
TRAINING_VOLUMES = ("data", "data/cache", "outputs", "multirun", "mlflow")


def _require_tools() -> None:
    missing = [tool for tool in ("podman", "buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        skip_outside_ci(
            f"{', '.join(missing)} not on PATH (Debian: apt-get install podman buildah mmdebstrap; .ci/run does it)"
        )
    if os.geteuid() != 0:
        skip_outside_ci("building the image needs root here (mmdebstrap's root mode, podman's system store)")


def _run(cmd: list[str], what: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``cmd``; fails the test with its last 3000 characters of stdout and stderr unless it exits 0."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{what} exited {proc.returncode}: {shlex.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def _build_command() -> list[str]:
    """podman's build over the local base, with the host's network, DNS and CA certificates for
    the RUN steps' pip (some machines reach PyPI only through a proxy whose CA the host trusts)."""
    host = ["--isolation", "chroot", "--network", "host", "-v", "/etc/resolv.conf:/etc/resolv.conf:ro"]
    if Path("/etc/ssl/certs/ca-certificates.crt").is_file():
        host += ["-v", "/etc/ssl/certs:/etc/ssl/certs:ro"]
    args = [f"BASE_IMAGE={BASE}", f"UID={USER_ID}", f"GID={GROUP_ID}"]
    return [
        "podman",
        "build",
        *host,
        "--layers",
        *(w for a in args for w in ("--build-arg", a)),
        "-t",
        IMAGE,
        str(REPO),
    ]


class Phases:
    """Wall time of each phase, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, name: str):
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(time.monotonic() - start, 1)

    def report(self, notes: dict) -> None:
        width = max(map(len, self.seconds))
        print("\nimage test phases (s):", *(f"  {n:<{width}}  {s:7.1f}" for n, s in self.seconds.items()), sep="\n")
        print(*(f"  {k}: {v}" for k, v in notes.items()), sep="\n")
        out = os.environ.get("BRATS_IMAGE_TIMINGS")
        if out:
            Path(out).write_text(json.dumps({"seconds": self.seconds, **notes}, indent=1) + "\n")


class WorkingContainer:
    """A buildah working container of the image; ``run`` is ``docker run --user U:G -v ...`` for one command."""

    def __init__(self, image: str, user: str) -> None:
        self.name = f"brats-seg-test-{uuid.uuid4().hex[:8]}"
        self.user = user
        _run(["buildah", "from", "--pull=never", "--name", self.name, image], "buildah from")

    def drop_volumes(self, paths) -> None:
        """Forget the image's VOLUMEs in this container only: buildah 1.28 gives each one a folder
        of its own and, at random (one run of six in a trial here), mounts it over the -v of the
        same path, so a run's files would land there instead of in the host folder."""
        for path in paths:
            _run(["buildah", "config", "--volume", f"{path}-", self.name], "buildah config")

    def run(self, cmd: list[str], mounts: dict[Path, str], check: bool = True) -> subprocess.CompletedProcess:
        volumes = [w for host, ctr in mounts.items() for w in ("-v", f"{host}:{ctr}")]
        buildah = ["buildah", "run", "--isolation", "chroot", "--user", self.user, *volumes, self.name, "--", *cmd]
        if not check:  # a refusal the test reads
            return subprocess.run(buildah, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        return _run(buildah, shlex.join(cmd))

    def remove(self) -> None:
        subprocess.run(["buildah", "rm", self.name], capture_output=True, timeout=120)


def _other_grid(path: Path) -> None:
    """``path`` cut by one slice: the case's four files on two grids."""
    import nibabel as nib
    import numpy as np

    image = nib.load(path)
    nib.save(nib.Nifti1Image(np.asarray(image.dataobj)[..., :-1], image.affine), path)


def _chown_tree(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        os.chown(path, USER_ID, GROUP_ID, follow_symlinks=False)


def _not_owned_by_the_user(root: Path) -> list[str]:
    return [str(p) for p in [root, *root.rglob("*")] if (p.lstat().st_uid, p.lstat().st_gid) != (USER_ID, GROUP_ID)]


@pytest.mark.slow
def test_the_image_builds_trains_evaluates_exports_and_segments_as_a_challenge_container(tmp_path):
    _require_tools()
    import nibabel as nib
    import numpy as np

    phases, notes = Phases(), {}
    try:
        with phases.timed("base (scripts/image/make_base.sh)"):
            notes["base"] = _run(["bash", str(REPO / "scripts/image/make_base.sh")], "make_base.sh").stdout.strip()
        with phases.timed("build (podman build)"):
            build = _run(_build_command(), "podman build", timeout=BUILD_TIMEOUT_S)
        steps = [line for line in build.stdout.splitlines() if line.startswith("STEP ")]
        notes["build steps cached"] = f"{build.stdout.count('--> Using cache')} of {len(steps) - 1}"  # FROM: never
        (inspected,) = json.loads(_run(["podman", "image", "inspect", IMAGE], "podman image inspect").stdout)
        config = inspected["Config"]
        notes["image size (bytes)"] = inspected["Size"]

        # The image as `docker run` sees it: its own non-root user, every volume declared.
        assert config["User"] == f"{USER_ID}:{GROUP_ID}", config["User"]
        assert set(config["Volumes"]) == set(VOLUMES.values()), sorted(config["Volumes"])

        host = {name: tmp_path / name for name in VOLUMES}  # model: empty (the export's folder is mounted there)
        for folder in host.values():
            folder.mkdir(parents=True, exist_ok=True)
        _chown_tree(tmp_path)
        container = WorkingContainer(IMAGE, config["User"])
        try:
            container.drop_volumes(config["Volumes"])
            training = {host[name]: VOLUMES[name] for name in TRAINING_VOLUMES}
            for name, cmd in (
                ("train", ["python", "train.py", "experiment=demo", "trainer.epochs=2"]),
                ("evaluate", ["python", "scripts/evaluate.py", "run_dir=outputs/demo"]),
                ("export", ["python", "scripts/export.py", "run_dir=outputs/demo"]),
            ):
                with phases.timed(f"{name} ({shlex.join(cmd[1:3])})"):
                    container.run(cmd, training)

            # A held-out case as a challenge hands it over: its images only, in a folder of its own.
            run_dir = host["outputs"] / "demo"
            case_id = json.loads((run_dir / "split.json").read_text())["test"][0]
            case = host["input"] / case_id
            case.mkdir()
            for modality in CASE_IMAGES:
                shutil.copy2(host["data"] / "synthetic" / case_id / f"{case_id}_{modality}.nii.gz", case)
            _chown_tree(host["input"])
            challenge = {
                run_dir / "export": f"{VOLUMES['model']}:ro",
                host["input"]: f"{VOLUMES['input']}:ro",
                host["output"]: VOLUMES["output"],
            }
            with phases.timed(f"default command ({shlex.join(config['Cmd'][1:2])})"):
                container.run(config["Cmd"], challenge)

            # Bad input in the container: a case without its T1ce gets one line naming the case and
            # the file, exit 2; an export onto the model volume (a mount point) is refused likewise.
            # Bad input in the container, each a challenge /input of one broken case: one line naming
            # the case and the file, exit 2; an export onto the model volume (a mount point) likewise.
            faults = {
                "missing t1ce": lambda folder: (folder / f"{case_id}_t1ce.nii.gz").unlink(),
                "not nifti": lambda folder: (folder / f"{case_id}_t2.nii.gz").write_bytes(b"not a NIfTI file" * 64),
                "other grid": lambda folder: _other_grid(folder / f"{case_id}_t1.nii.gz"),
            }
            refused = {}
            for what, fault in faults.items():
                broken = tmp_path / f"input_{what.replace(' ', '_')}" / case_id
                shutil.copytree(case, broken)
                fault(broken)
                _chown_tree(broken.parent)
                others = {h: c for h, c in challenge.items() if h != host["input"]}
                with phases.timed(f"default command, {what}"):
                    refused[what] = container.run(
                        config["Cmd"], {**others, broken.parent: f"{VOLUMES['input']}:ro"}, check=False
                    )
            refused |= {
                "export onto the volume": container.run(
                    ["python", "scripts/export.py", "run_dir=outputs/demo", f"output={VOLUMES['model']}"],
                    {**training, host["model"]: VOLUMES["model"]},
                    check=False,
                ),
            }
            notes |= {
                f"refused, {what}": " / ".join(
                    line.strip() for line in proc.stderr.splitlines() if "error:" in line or case_id in line
                )
                for what, proc in refused.items()
            }
        finally:
            container.remove()
    finally:
        phases.report(notes)

    # Everything the runs wrote is in the host folders, and the image's user owns all of it.
    assert (host["data"] / "synthetic" / case_id / f"{case_id}_seg.nii.gz").is_file()
    assert any(host["data/cache"].iterdir()), "the prepared cache is not in the cache volume"
    assert (run_dir / "checkpoints" / "best.keras").is_file()
    assert json.loads((run_dir / "state.json").read_text())["epoch"] == 2
    assert json.loads((run_dir / "eval" / "test" / "summary.json").read_text())
    description = json.loads((run_dir / "export" / "preprocessing.json").read_text())
    assert (host["mlflow"] / "mlruns.db").is_file()
    mask_path = host["output"] / f"{case_id}.nii.gz"
    assert mask_path.is_file(), sorted(p.name for p in host["output"].iterdir())
    for name in ("data", "outputs", "mlflow", "output"):
        assert not _not_owned_by_the_user(host[name]), f"not {USER_ID}:{GROUP_ID}'s in {name}/"

    # The mask: on the case's own grid, with its affine, in the run's layout's labels.
    reference = nib.load(case / f"{case_id}_flair.nii.gz")
    mask = nib.load(mask_path)
    assert mask.shape == reference.shape
    np.testing.assert_allclose(mask.affine, reference.affine, atol=1e-4)
    # the default command's mask is evaluate.py's prediction of the same case (export and .keras alike)
    predicted = nib.load(run_dir / "eval" / "test" / "predictions" / f"{case_id}.nii.gz")
    np.testing.assert_array_equal(np.asarray(mask.dataobj), np.asarray(predicted.dataobj))
    for what, proc in refused.items():
        lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(lines) == 1, (what, proc.returncode, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, (what, proc.stderr[-2000:])
    # one line names the case and its file (a case that fails while predicting is listed under the
    # error line's count, as predict.py lists every failed case of a folder)
    for what, name in (("missing t1ce", "t1ce"), ("not nifti", "t2"), ("other grid", "t1")):
        stderr = refused[what].stderr
        named = [line for line in stderr.splitlines() if case_id in line and f"{case_id}_{name}.nii.gz" in line]
        assert len(named) == 1, (what, stderr[-2000:])
    onto = next(line for line in refused["export onto the volume"].stderr.splitlines() if line.startswith("error:"))
    assert "/workspace/model is a mount point" in onto and not any(host["model"].iterdir()), onto
    labels = {0, *(int(v) for v in description["labels"]["names"])}
    values = set(np.unique(np.asarray(mask.dataobj)).tolist())
    assert values <= labels, (
        f"labels {sorted(values)} outside the {description['labels']['layout']} set {sorted(labels)}"
    )
