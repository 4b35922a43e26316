"""Every file a later step reads is written through brats_seg.files (issue 21, "atomic everywhere").

A static check reads brats_seg/, scripts/ and train.py with ``ast`` and fails on any call that
writes a file (open in a w/a/x/+ mode, Path.write_text/write_bytes, np.save, json.dump to a
file, savefig, nib.save, model.save, sitk.WriteImage, shutil.copy*, extractall, ...) unless it
writes the temporary path of a ``with atomic_path(...)``/``atomic_dir(...)`` block, or is in
files.py itself, or is on the short allow-list below with its reason. A planted module shows
the check finds each kind of write, so it cannot pass by finding nothing.

Then files.py itself: a failed writer leaves the old file or folder, DiskFullError names the
file and the free bytes and survives pickling, the crash points really SIGKILL a process
(the target intact, the next write working, the leftover temporary skipped and cleaned), and
remove_stale_temporaries cleans what killed writers leave, except under a live holder's lock.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import pickle
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from brats_seg.files import DiskFullError, atomic_dir, atomic_path, disk_full_error, is_temporary, write_text_atomic
from brats_seg.locks import remove_stale_temporaries

REPO = Path(__file__).resolve().parents[2]

# --- the static check -------------------------------------------------------------------------

_ATOMIC = {"atomic_path", "atomic_dir"}
_MEMORY = {"StringIO", "BytesIO"}  # in-memory buffers are not files
_STREAMS = {"stdout", "stderr"}  # sys.stdout and sys.stderr are not files a later step reads
_NUMPY = {"np", "numpy"}
_NIBABEL = {"nib", "nibabel"}
_OPEN_MODULES = {"gzip", "bz2", "lzma", "io", "codecs", "tarfile", "builtins"}
_DUMPERS = {"json", "pickle", "yaml", "marshal", "ruamel"}


@dataclass(frozen=True)
class Write:
    """A file-writing call the check found unguarded."""

    path: str  # relative to the scanned root
    function: str  # the enclosing def's qualified name, "<module>" at the top level
    call: str  # what writes: "open", "write_text", "np.save", ...
    line: int

    @property
    def key(self) -> str:  # what the allow-list names (line numbers move; these do not)
        return f"{self.path}:{self.function}: {self.call}"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _dotted(node.func) + "()"
    return "?"


def _arg(call: ast.Call, index: int, *names: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg in names:
            return kw.value
    return call.args[index] if len(call.args) > index else None


def _writes_mode(mode: ast.AST | None, default_write: bool = False) -> bool:
    if mode is None:
        return default_write  # open()'s default mode reads
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return any(c in mode.value for c in "wax+")
    return True  # a mode computed at run time may write: the check assumes it does


def _os_open_writes(flags: ast.AST | None) -> bool:
    if not isinstance(flags, (ast.Attribute, ast.BinOp)):
        return True  # flags computed elsewhere may write: the check assumes they do
    names = {n.attr for n in ast.walk(flags) if isinstance(n, ast.Attribute)}
    return bool(names & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"})


_NO_DESTINATION = ast.Constant(value=None)  # a write whose target the check cannot see (an fd)


def _write_target(call: ast.Call) -> tuple[str, ast.AST] | None:
    """``(what, destination expression)`` if ``call`` writes a file, else None."""
    func = call.func
    name = _dotted(func)
    head, _, attr = name.rpartition(".")
    receiver = func.value if isinstance(func, ast.Attribute) else None
    if name == "open" or (attr == "open" and head in _OPEN_MODULES):
        if _writes_mode(_arg(call, 1, "mode")):
            return name, _arg(call, 0, "file", "filename", "name") or _NO_DESTINATION
        return None
    if name == "os.fdopen":
        return (name, _NO_DESTINATION) if _writes_mode(_arg(call, 1, "mode")) else None
    if name == "os.open":
        return (name, _arg(call, 0, "path")) if _os_open_writes(_arg(call, 1, "flags")) else None
    if attr == "open" and receiver is not None:  # Path.open("w")
        return ("Path.open", receiver) if _writes_mode(_arg(call, 0, "mode")) else None
    if attr in ("write_text", "write_bytes", "touch") and receiver is not None:
        return attr, receiver
    if head in _NUMPY and attr in ("save", "savez", "savez_compressed", "savetxt"):
        return name, _arg(call, 0, "file", "fname")
    if (head in _NUMPY and attr == "memmap") or attr == "open_memmap":  # their default mode, r+, writes
        mode = _arg(call, 2 if attr == "memmap" else 1, "mode")
        return (name, _arg(call, 0, "filename")) if _writes_mode(mode, default_write=True) else None
    if attr == "tofile" and receiver is not None:
        return attr, _arg(call, 0, "fid", "file")
    if head.split(".")[-1] in _DUMPERS and attr in ("dump", "safe_dump", "dump_all"):
        dest = _arg(call, 1, "fp", "file", "stream")
        return (name, dest) if dest is not None else None  # yaml.dump(data) returns a string
    if attr == "savefig":
        return attr, _arg(call, 0, "fname")
    if head in _NIBABEL and attr == "save":
        return name, _arg(call, 1, "filename")
    if attr in ("to_filename", "to_csv", "to_json", "to_parquet", "save_weights"):
        dest = _arg(call, 0, "filename", "filepath", "path_or_buf", "path")
        return (attr, dest) if dest is not None else None  # df.to_csv() returns a string
    if attr == "save" and receiver is not None and head not in _NUMPY | _NIBABEL:  # model.save, img.save
        dest = _arg(call, 0, "filepath", "fp", "path", "filename")
        return (attr, dest) if dest is not None else None
    if attr in ("WriteImage", "imwrite") and head in ("sitk", "SimpleITK"):
        return name, _arg(call, 1, "fileName")
    if head == "shutil" and attr in ("copy", "copy2", "copyfile", "copytree", "move", "copyfileobj"):
        return name, _arg(call, 1, "dst", "fdst")
    if attr == "extractall":
        return attr, _arg(call, 0, "path") or _NO_DESTINATION
    if attr in ("GzipFile", "ZipFile", "File", "TarFile") and _writes_mode(_arg(call, 1, "mode")):
        return name, _arg(call, 3, "fileobj") or _arg(call, 0, "filename", "file", "name")
    if attr in ("NamedTemporaryFile",) and any(
        kw.arg == "delete" and isinstance(kw.value, ast.Constant) and kw.value.value is False for kw in call.keywords
    ):
        return name, _NO_DESTINATION  # a temporary file kept: a hand-made atomic write
    return None


def _bound(target: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target is not None else set()


def _is_atomic(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and _dotted(expr.func).rpartition(".")[2] in _ATOMIC


def _is_memory(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and _dotted(expr.func).rpartition(".")[2] in _MEMORY


class _Checker(ast.NodeVisitor):
    """Finds the writing calls whose destination is not an atomic helper's temporary path.

    A name is *safe* where it is the ``as`` target of ``atomic_path``/``atomic_dir`` in an
    enclosing ``with``, or is bound (by ``with ... as`` or an assignment inside that block) to
    an expression using a safe name (``open(tmp, "wb") as f``, ``part = tmp / "x.npy"``). A
    write is fine if its destination uses a safe name, or is an in-memory buffer or sys.stdout.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.found: list[Write] = []
        self.scopes: list[str] = []
        self.safe: list[set[str]] = [set()]
        self.memory: list[set[str]] = [set()]

    # scopes
    def _scoped(self, node) -> None:
        self.scopes.append(node.name)
        self.memory.append(set())
        self.generic_visit(node)
        self.memory.pop()
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _is_safe(self, expr: ast.AST | None) -> bool:
        if expr is None or expr is _NO_DESTINATION:
            return False
        if _is_memory(expr):
            return True
        names = _bound(expr)
        if any(isinstance(n, ast.Attribute) and n.attr in _STREAMS for n in ast.walk(expr)):
            return True
        return bool(names & (set().union(*self.safe) | set().union(*self.memory)))

    def visit_With(self, node: ast.With) -> None:
        safe = set()
        self.safe.append(safe)
        for item in node.items:
            self.visit(item.context_expr)  # a writer opened as a with item is itself checked
            if _is_atomic(item.context_expr) or self._is_safe(item.context_expr):
                safe |= _bound(item.optional_vars)
        for stmt in node.body:
            self.visit(stmt)
        self.safe.pop()

    visit_AsyncWith = visit_With

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        targets = set().union(*(_bound(t) for t in node.targets))
        if _is_memory(node.value):
            self.memory[-1] |= targets
        elif len(self.safe) > 1 and self._is_safe(node.value):
            self.safe[-1] |= targets

    def visit_Call(self, node: ast.Call) -> None:
        target = _write_target(node)
        if target is not None and not self._is_safe(target[1]):
            self.found.append(Write(self.path, ".".join(self.scopes) or "<module>", target[0], node.lineno))
        self.generic_visit(node)


def find_unguarded_writes(source: str, path: str) -> list[Write]:
    """The file-writing calls of ``source`` that do not write an atomic helper's temporary path."""
    checker = _Checker(path)
    checker.visit(ast.parse(source, filename=path))
    return checker.found


def _sources() -> dict[str, str]:
    """``relative path -> source`` of every module the check covers: brats_seg/, scripts/, train.py."""
    files = [*sorted((REPO / "brats_seg").rglob("*.py")), *sorted((REPO / "scripts").rglob("*.py")), REPO / "train.py"]
    return {p.relative_to(REPO).as_posix(): p.read_text() for p in files}


# Writes that do not go through brats_seg.files, each with its reason. Keys are
# "<path>:<function>: <call>"; an entry that matches nothing fails the test (remove it).
ALLOWED = {
    "brats_seg/lms/runtime/stats.py:reset_peak_rss: write_text": (
        "/proc/self/clear_refs is a kernel control file: nothing reads it back, and it cannot be renamed onto"
    ),
    "brats_seg/evaluation/studies/study_run.py:run_logged: open": (
        "the training's console output appended to <res>.log for a person to read; no step reads it back"
    ),
}
EXEMPT = {
    "brats_seg/files.py",
    "brats_seg/locks.py",
}  # the helpers themselves (temporary file; the lock file's O_EXCL create)


def _assert_every_write_is_atomic(sources: dict[str, str]) -> None:
    found = [w for rel, text in sources.items() if rel not in EXEMPT for w in find_unguarded_writes(text, rel)]
    unguarded = [f"{w.path}:{w.line} {w.function}: {w.call}" for w in found if w.key not in ALLOWED]
    assert not unguarded, (
        "write these through brats_seg.files (write_text_atomic, write_bytes_atomic, "
        "`with atomic_path(path) as tmp:`, `with atomic_dir(folder) as tmp:`):\n" + "\n".join(unguarded)
    )
    stale = sorted(set(ALLOWED) - {w.key for w in found})
    assert not stale, f"allow-list entries that match no write any more; remove them from ALLOWED: {stale}"


def test_every_file_write_goes_through_the_atomic_helpers():
    sources = _sources()
    assert len(sources) > 100 and "brats_seg/training/callbacks.py" in sources  # the whole tree, not an empty glob
    _assert_every_write_is_atomic(sources)


PLANTED = """
import gzip, io, json, os, shutil, sys, tempfile, zipfile
import nibabel as nib
import numpy as np
import SimpleITK as sitk
from pathlib import Path
from brats_seg.files import atomic_dir, atomic_path

def bad(path, model, fig, img, df, arr, d):
    open(path, "w").write("x")                       # BAD
    with open(path, "ab") as f:                      # BAD
        f.write(b"x")
    Path(path).open("w")                             # BAD
    os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT), "w")  # BAD BAD
    Path(path).write_text("x")                       # BAD
    path.write_bytes(b"x")                           # BAD
    np.save(path, arr)                               # BAD
    np.savez_compressed(path, a=arr)                 # BAD
    with open(path, "w") as f:                       # BAD
        json.dump({}, f)                             # BAD
    fig.savefig(path)                                # BAD
    nib.save(img, path)                              # BAD
    model.save(path)                                 # BAD
    sitk.WriteImage(img, str(path))                  # BAD
    shutil.copy2(path, d)                            # BAD
    shutil.copytree(path, d)                         # BAD
    df.to_csv(path)                                  # BAD
    zipfile.ZipFile(path).extractall(d)              # BAD
    gzip.GzipFile(path, "wb")                        # BAD
    tempfile.NamedTemporaryFile("w", delete=False)   # BAD
    with atomic_path(path) as tmp:
        other = Path(d) / "x"
        other.write_text("x")                        # BAD  (inside the block, but not its temporary)

def good(path, model, fig, img, df, arr, d):
    open(path).read()
    open(path, "rb").read()
    os.close(os.open(path, os.O_RDONLY))
    with open(path, mode="r") as f:
        f.read()
    with atomic_path(path) as tmp:
        tmp.write_text("x")
        np.save(tmp, arr)
        part = str(tmp)
        nib.save(img, part)
    with atomic_path(path, suffix=".keras") as tmp:
        model.save(tmp)
    with atomic_path(path) as tmp, open(tmp, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f) as gz:
        gz.write(b"x")
        json.dump({}, f)
    with atomic_dir(d) as folder:
        np.save(folder / "image.npy", arr)
        (folder / "meta.json").write_text("{}")
        zipfile.ZipFile(path).extractall(folder)
    buf = io.StringIO()
    json.dump({}, buf)
    json.dump({}, sys.stdout)
    fig.savefig(io.BytesIO())
    text = json.dumps({})
    csv_text = df.to_csv()
"""


def test_the_check_finds_every_kind_of_planted_write(tmp_path):
    """Each BAD line of a planted module is found (as often as it says), no other line is."""
    module = tmp_path / "planted.py"
    module.write_text(PLANTED)
    found = find_unguarded_writes(module.read_text(), "planted.py")
    expected = {}
    for n, line in enumerate(PLANTED.splitlines(), 1):
        if "# BAD" in line:
            expected[n] = line.split("#", 1)[1].split("(")[0].split().count("BAD")
    got = {}
    for w in found:
        got[w.line] = got.get(w.line, 0) + 1
    assert got == expected, "\n".join(
        f"{n}: {PLANTED.splitlines()[n - 1].strip()} (found {got.get(n, 0)}, expected {expected.get(n, 0)})"
        for n in sorted(set(got) | set(expected))
        if got.get(n) != expected.get(n)
    )
    assert {w.function for w in found} == {"bad"}


def test_the_check_fails_on_a_module_planted_in_the_tree(tmp_path):
    """The whole-tree assertion, given the tree plus one planted module, fails naming its write."""
    planted = tmp_path / "planted.py"
    planted.write_text("def save(path):\n    path.write_text('half a file if killed')\n")
    sources = {**_sources(), "brats_seg/planted.py": planted.read_text()}
    with pytest.raises(AssertionError, match=r"brats_seg/planted\.py:2 save: write_text"):
        _assert_every_write_is_atomic(sources)


# --- files.py ------------------------------------------------------------------------------------


def test_atomic_path_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="writer broke"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer broke")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_atomic_dir_keeps_the_old_folder_when_the_writer_fails_and_replaces_it_whole(tmp_path):
    entry = tmp_path / "case_000"
    with atomic_dir(entry) as tmp:
        (tmp / "image.npy").write_bytes(b"old image")
        (tmp / "meta.json").write_text("{}")
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(entry) as tmp:
            (tmp / "image.npy").write_bytes(b"half")
            raise KeyboardInterrupt
    assert (entry / "image.npy").read_bytes() == b"old image"
    with atomic_dir(entry) as tmp:
        (tmp / "image.npy").write_bytes(b"new image")
    assert sorted(p.name for p in entry.iterdir()) == ["image.npy"]  # the old meta.json went with the old folder
    assert (entry / "image.npy").read_bytes() == b"new image"
    assert [p.name for p in tmp_path.iterdir()] == ["case_000"]  # no .tmp- or .old- folder left


def test_disk_full_error_names_the_file_and_the_free_bytes_and_pickles(tmp_path):
    err = DiskFullError(tmp_path / "checkpoints" / "last.keras", 12_345, "The run resumes from epoch 3.")
    text = str(err)
    assert f"{tmp_path}/checkpoints/last.keras" in text and "12.3 kB free" in text
    assert "The run resumes from epoch 3." in text and "run the same command again" in text
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.path, back.free_bytes, back.what, str(back)) == (
        DiskFullError,
        err.path,
        12_345,
        err.what,
        text,
    )
    assert "unknown free" in str(DiskFullError("x", None)) and "intact" in str(DiskFullError("x", None))
    told = disk_full_error(DiskFullError(err.path, 10), err.path, "The run resumes from epoch 2.")
    assert told.what == "The run resumes from epoch 2." and told.free_bytes == 10  # what is intact, added
    assert disk_full_error(err, err.path, "other words") is err  # already said: kept


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        sqlite3.OperationalError("database or disk is full"),
        RuntimeError(
            "Unable to synchronously write data (file write failed: errno = 28, error message = "
            "'No space left on device')"
        ),  # h5py's words
        OSError("1048576 requested and 131056 written"),  # numpy's np.save/tofile to a path: a short write, no errno
    ],
)
def test_library_wrapped_out_of_space_errors_are_recognised(tmp_path, exc):
    full = disk_full_error(exc, tmp_path / "x.h5")
    assert isinstance(full, DiskFullError) and full.path == tmp_path / "x.h5"
    assert full.free_bytes is not None and full.free_bytes > 0
    try:  # ENOSPC as the cause of another library's exception
        raise ValueError("save failed") from exc
    except ValueError as wrapped:
        assert disk_full_error(wrapped, tmp_path / "x.h5") is not None


def test_other_errors_are_not_taken_for_a_full_disk(tmp_path):
    assert disk_full_error(PermissionError(errno.EACCES, "Permission denied"), tmp_path) is None
    assert disk_full_error(ValueError("bad value"), tmp_path) is None


def test_an_injected_enospc_in_the_writer_is_a_disk_full_error_and_the_old_file_stays(tmp_path):
    target = tmp_path / "split.json"
    target.write_text("old")
    with pytest.raises(DiskFullError) as caught:
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert caught.value.path == target and caught.value.free_bytes > 0
    assert str(target) in str(caught.value)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["split.json"]


_WRITER = """
import sys
from brats_seg.data.splits import save_split
for n in range(int(sys.argv[2])):
    save_split({"train": [f"new{n}"], "val": [], "test": []}, sys.argv[1])
"""


@pytest.mark.parametrize(
    "spec,writes,left,temporaries",
    [
        ("split.json", 1, ["old"], 1),  # killed before the first replace: the old file, a temporary left
        ("split.json:1:after", 1, ["new0"], 0),  # killed just after: the new file, nothing left
        ("split.json:2", 3, ["new0"], 1),  # the second write: the first in place, the second not
        ("spl*.json:3:after", 3, ["new2"], 0),  # a name pattern
    ],
)
def test_a_crash_point_kills_the_writer_and_leaves_a_whole_file(tmp_path, spec, writes, left, temporaries):
    from brats_seg.data.splits import load_split, save_split

    target = tmp_path / "run" / "split.json"
    save_split({"train": ["old"], "val": [], "test": []}, target)
    env = {**os.environ, "BRATS_SEG_CRASH_AT": spec, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(target), str(writes)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr[-2000:]  # SIGKILL: nothing ran on the way out
    assert load_split(target)["train"] == left
    leftovers = [p for p in target.parent.iterdir() if p != target]
    assert len(leftovers) == temporaries and all(is_temporary(p) for p in leftovers)
    assert all(p.name.startswith(".tmp-split.json.") for p in leftovers)

    save_split({"train": ["next"], "val": [], "test": []}, target)  # the next write works beside the leftover
    assert load_split(target)["train"] == ["next"]
    assert remove_stale_temporaries(target.parent) == leftovers
    assert [p.name for p in target.parent.iterdir()] == ["split.json"]


def test_a_stop_point_pauses_the_writer_there_and_it_goes_on_when_continued(tmp_path):
    """``:stop`` stops the writer at the chosen write (the second, before its replace) until SIGCONT."""
    import psutil

    from brats_seg.data.splits import load_split, save_split

    target = tmp_path / "run" / "split.json"
    save_split({"train": ["old"], "val": [], "test": []}, target)
    env = {**os.environ, "BRATS_SEG_CRASH_AT": "split.json:2:before:stop", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(target), "3"], env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            assert proc.poll() is None and time.monotonic() < deadline, "the writer never stopped"
            time.sleep(0.01)
        assert load_split(target)["train"] == ["new0"]  # the first write in place, the second waiting
        assert len([p for p in target.parent.iterdir() if is_temporary(p)]) == 1
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-2000:]
    finally:
        proc.kill()
    assert load_split(target)["train"] == ["new2"] and [p.name for p in target.parent.iterdir()] == ["split.json"]


def test_remove_stale_temporaries_cleans_killed_writers_leftovers_at_any_depth(tmp_path):
    run = tmp_path / "run"
    keep = [
        run / "state.json",
        run / "checkpoints" / "last.keras",
        run / "eval" / "test" / "metrics.csv",
        run / "notes.tmp",
        run / "tmp-not-ours.json",
        run / "eval" / "test" / ".lock",
    ]
    stale = [
        run / ".tmp-state.json.k2j3.json",
        run / "checkpoints" / ".tmp-last.keras.x1.keras",
        run / "eval" / "test" / "predictions" / ".tmp-case.nii.gz.a1.nii.gz",
    ]
    stale_dirs = [run / ".tmp-cache-1234abcd", run / "eval" / ".old-test-5678abcd"]
    for p in keep + stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    (run / "eval" / "test" / ".lock").write_text(json.dumps({"pid": 999_999_999, "host": socket.gethostname()}))
    for d in stale_dirs:
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "image.npy").write_text("x")
    removed = remove_stale_temporaries(run)
    assert sorted(removed) == sorted(stale + stale_dirs)  # the dead holder's eval folder is cleaned too
    assert all(p.exists() for p in keep) and not any(p.exists() for p in stale + stale_dirs)
    assert remove_stale_temporaries(run) == [] and remove_stale_temporaries(tmp_path / "absent") == []


def test_remove_stale_temporaries_leaves_a_folder_a_live_process_has_locked(tmp_path):
    import psutil

    run = tmp_path / "run"
    evaluating = run / "eval" / "test"  # an evaluation of the same run, in another process, holds its lock
    evaluating.mkdir(parents=True)
    writing = evaluating / "predictions" / ".tmp-case.nii.gz.a1.nii.gz"
    writing.parent.mkdir()
    writing.write_text("being written")
    (run / ".tmp-state.json.k2.json").write_text("x")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (evaluating / ".lock").write_text(
            json.dumps(
                {"pid": holder.pid, "pid_start": psutil.Process(holder.pid).create_time(), "host": socket.gethostname()}
            )
        )
        assert remove_stale_temporaries(run) == [run / ".tmp-state.json.k2.json"]
        assert writing.exists()
    finally:
        holder.kill()
        holder.wait()
    assert remove_stale_temporaries(run) == [writing]  # its holder is gone: its leftovers are stale


def test_a_killed_first_write_does_not_make_the_run_folder_look_foreign(tmp_path):
    """A run killed while writing its first config.json leaves only a temporary: the same command
    may still use the folder (and the state a reader reads by name is the whole one)."""
    from brats_seg.run_dir import RunFolder

    folder = RunFolder(tmp_path / "run")
    folder.root.mkdir()
    leftover = folder.root / ".tmp-config.json.x1y2.json"
    leftover.write_text('{"data": {"na')  # half a file of a killed writer
    assert is_temporary(leftover)
    folder.check_can_hold_a_run()  # not refused as another program's files
    folder.write_state({"epoch": 1, "history": []})
    assert folder.read_state()["epoch"] == 1


def test_write_text_atomic_replaces_and_returns_the_path(tmp_path):
    target = tmp_path / "a" / "b" / "summary.json"
    assert write_text_atomic(target, "é\n") == target  # the folder is created
    assert target.read_bytes() == "é\n".encode()


def test_a_lock_whose_record_is_not_written_yet_is_waited_for_not_misnamed(tmp_path):
    """Two starts at once: the second sees the first's lock file before its record is in it, and
    names the holder (once written) instead of refusing with an unknown PID on an unknown host."""
    import threading

    from brats_seg.locks import LockedError, hold_lock

    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / ".lock"
    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # the first start, between create and record

    def write_record():
        os.write(
            fd,
            json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "since": "now", "command": "train.py first"}
            ).encode(),
        )
        os.close(fd)

    threading.Timer(0.3, write_record).start()
    with pytest.raises(LockedError, match=r"already locked by this process"):
        with hold_lock(folder, "run folder"):
            pass


def test_an_empty_lock_left_long_ago_is_refused_naming_the_file(tmp_path):
    from brats_seg.locks import LockedError, hold_lock

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".lock").write_text("")
    os.utime(folder / ".lock", (0, 0))
    with pytest.raises(LockedError, match=rf"delete {folder / '.lock'}"):
        with hold_lock(folder, "run folder"):
            pass


def test_an_atomic_write_gets_the_mode_open_would_give_not_mkstemps_0600(tmp_path):
    """Run folders are shared (a lab's group folder): a config.json or a mask readable by its owner
    only would lock colleagues out."""
    from brats_seg.files import write_text_atomic

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic = write_text_atomic(tmp_path / "atomic.txt", "x")
    assert (atomic.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777) != 0o600
