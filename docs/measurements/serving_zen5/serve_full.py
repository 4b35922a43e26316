#!/usr/bin/env python
"""`mlflow models serve` of a full-resolution model answering one raw 1 mm case, against the
memory the planner predicts for that case's inference (issue 48).

    python docs/measurements/serving_zen5/serve_full.py outputs/patch_schedule_full/arm-grow_seed-0 \
        data/mni_gliomas_heldout/MNIG_00000 /tmp/serve_full

Copies the run's small files and best checkpoint to <work>/run (its own MLflow run in
<work>/mlruns.db, the original run untouched), exports it in fp32 (scripts/export.py's default),
logs the export as the run's MLflow model (brats_seg.evaluation.serving.mlflow_model), serves it
with `mlflow models serve --env-manager local`, posts the case's four NIfTI files as base64
(`dataframe_records`), and prints one JSON line: the answer's status and time, its label map's
shape and labels, the serving processes' RSS when /ping first answers (runtime, mlflow, the loaded
model) and their peak (VmHWM) after the answer, and the planner's prediction for this case
(`check_inference_memory(..., scoring=False)`: bytes above the imported runtime, prediction with
test-time mirroring, as predict.py plans it). Run on an otherwise idle machine.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONTRASTS = ("flair", "t1", "t1ce", "t2")


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root.pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def _status(pid: int, key: str) -> int:
    """``VmRSS``/``VmHWM`` of a process in bytes (0 if gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main(run: str, case_dir: str, work: str) -> None:
    sys.path.insert(0, str(REPO))
    from brats_seg.backend import configure, decide_backend
    from brats_seg.config import BackendConfig, EvaluateConfig, TrackingConfig
    from brats_seg.data.layouts import case_from_dir
    from brats_seg.data.prep_memory import prediction_records
    from brats_seg.evaluation.inference.run import load_run_config
    from brats_seg.evaluation.serving.export import export_run
    from brats_seg.evaluation.serving.mlflow_model import log_export_to_run
    from brats_seg.oom_inference import check_inference_memory
    from brats_seg.tracking import Tracker

    work = Path(work)
    shutil.rmtree(work, ignore_errors=True)
    (work / "run" / "checkpoints").mkdir(parents=True)
    for name in ("config.json", "split.json", "state.json", "postprocess.json"):
        if (Path(run) / name).is_file():
            shutil.copy(Path(run) / name, work / "run" / name)
    shutil.copy(Path(run) / "checkpoints" / "best.keras", work / "run" / "checkpoints" / "best.keras")
    run_dir = work / "run"
    configure(decide_backend(BackendConfig(name="cpu_onednn")))
    config = load_run_config(run_dir)
    store = f"sqlite:///{work}/mlruns.db"
    tracking = TrackingConfig(uri=store, experiment="serve-full", system_metrics=False)
    with Tracker.start(tracking, run_dir, "serve-full", {}, {}):
        pass
    start = time.perf_counter()
    export = export_run(run_dir, work / "export", "best")
    export_s = time.perf_counter() - start
    logged = log_export_to_run(run_dir, export, "best", dataclasses.replace(config, tracking=tracking))
    assert logged is not None, "the export was not logged"

    case = case_from_dir(Path(case_dir), "brats2021")
    records = prediction_records([case], config.resolution.spacing_mm, config.resolution.shape)  # as predict.py plans
    estimate = check_inference_memory(config, EvaluateConfig(), "CPU", "float32", records=records, scoring=False)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MLFLOW_TRACKING_URI=store, PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    log = (work / "serve.log").open("w")
    server = subprocess.Popen(
        [str(bin_dir / "mlflow"), "models", "serve", "-m", logged.run_uri, "--env-manager", "local", "-p", str(port)],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        started = time.perf_counter()
        while True:
            if server.poll() is not None:
                raise SystemExit((work / "serve.log").read_text()[-3000:])
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        ready_s = time.perf_counter() - started
        time.sleep(2)
        pids = _tree(server.pid)
        before = {p: _status(p, "VmRSS") for p in pids}
        record_in = {
            "case_id": case.case_id,
            **{c: base64.b64encode(p.read_bytes()).decode() for c, p in zip(CONTRASTS, case.images)},
        }
        body = json.dumps({"dataframe_records": [record_in]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=1800) as answer:
            status, payload = answer.status, json.load(answer)
        answer_s = time.perf_counter() - start
        pids = _tree(server.pid)
        peaks = {p: _status(p, "VmHWM") for p in pids}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
    import gzip

    import nibabel as nib
    import numpy as np

    labels = nib.Nifti1Image.from_bytes(gzip.decompress(base64.b64decode(payload["predictions"][0]["labels"])))
    data = np.asarray(labels.dataobj)
    worker = max(peaks, key=peaks.get)  # the process that loaded TensorFlow and the model
    print(
        json.dumps(
            {
                "run": str(run),
                "case": case.case_id,
                "grid": config.resolution.shape,
                "native_shape": list(data.shape),
                "labels": sorted(int(v) for v in np.unique(data)),
                "status": status,
                "request_mb": round(len(body) / 1e6, 1),
                "export_s": round(export_s, 1),
                "server_ready_s": round(ready_s, 1),
                "answer_s": round(answer_s, 1),
                "worker_rss_at_ready_gb": round(before.get(worker, 0) / 1e9, 3),
                "worker_peak_gb": round(peaks[worker] / 1e9, 3),
                "worker_peak_above_ready_gb": round((peaks[worker] - before.get(worker, 0)) / 1e9, 3),
                "processes": {str(p): [round(before.get(p, 0) / 1e9, 3), round(peaks[p] / 1e9, 3)] for p in pids},
                "planned_above_runtime_gb": round(estimate.peak_bytes / 1e9, 3),
                "planned_peak_at": estimate.peak_at,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
