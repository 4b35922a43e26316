"""The project's entry points run as a user runs them: a fresh Python process from the repository,
its output kept for the assertion message; and ``mlflow models serve`` of a logged model, asked
over HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_script(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python *args`` in ``cwd`` (15 minutes at most); fails the test with the last 3000 characters
    of its stdout and stderr unless it exits 0."""
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def serve_model(uri: str, store: str, folder: Path, threads: tuple[int, int]) -> tuple[subprocess.Popen, int]:
    """``mlflow models serve -m <uri> --env-manager local`` (the README's command) on a free port,
    TensorFlow's intra/inter-op ``threads`` as given, its log in ``folder/serve.log``, once it answers
    ``/ping`` (3 minutes at most): the process (its own session: :func:`stop_server`) and the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = Path(sys.executable).parent  # the environment's mlflow, and the uvicorn it runs by name
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        MLFLOW_TRACKING_URI=store,
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        TF_NUM_INTRAOP_THREADS=str(threads[0]),
        TF_NUM_INTEROP_THREADS=str(threads[1]),
    )
    with (folder / "serve.log").open("w") as log_file:
        server = subprocess.Popen(
            [str(bin_dir / "mlflow"), "models", "serve", "-m", uri, "--env-manager", "local", "-p", str(port)],
            cwd=folder,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            raise AssertionError(f"the server did not answer /ping: {(folder / 'serve.log').read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
            return server, port
        except OSError:
            time.sleep(0.5)


def post_json(port: int, body: dict) -> tuple[int, dict]:
    """POST ``body`` to the server's ``/invocations``: the status and the JSON answer (an error's too)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def stop_server(server: subprocess.Popen) -> None:
    """Stop the server's process group (mlflow and its uvicorn)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=60)
