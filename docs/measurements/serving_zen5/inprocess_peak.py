#!/usr/bin/env python
"""One raw case segmented in this process, as the served model does (``export``: NiftiServer over
the export's SavedModel) or as predict.py run_dir= does (``keras``: segment_case over the run's
.keras model): the RSS peak above the RSS once the model is loaded, against the planner's estimate.

    python docs/measurements/serving_zen5/inprocess_peak.py /tmp/serve_full data/mni_gliomas_heldout/MNIG_00000 export
    python docs/measurements/serving_zen5/inprocess_peak.py /tmp/serve_full data/mni_gliomas_heldout/MNIG_00000 keras

<work> is serve_full.py's folder (its run/ and export/). One mode per fresh process.
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def main(work: str, case_dir: str, mode: str) -> None:
    sys.path.insert(0, str(REPO))
    from brats_seg.backend import configure, decide_backend
    from brats_seg.config import BackendConfig, EvaluateConfig
    from brats_seg.data.layouts import case_from_dir

    configure(decide_backend(BackendConfig(name="cpu_onednn")))
    import tensorflow as tf  # noqa: F401 - the runtime, imported before the baseline

    work = Path(work)
    case = case_from_dir(Path(case_dir), "brats2021")
    runtime = _kb("VmRSS")
    if mode == "export":
        from brats_seg.evaluation.serving.nifti_request import NiftiServer

        server = NiftiServer.load(work / "export")
        loaded = _kb("VmRSS")
        server.segment([{"case_id": case.case_id, **dict(zip(("flair", "t1", "t1ce", "t2"), map(str, case.images)))}])
    else:
        from brats_seg.evaluation.inference.predict import segment_case
        from brats_seg.evaluation.inference.run import load_run_config, load_run_model

        config = load_run_config(work / "run")
        model = load_run_model(work / "run", "best", config)
        loaded = _kb("VmRSS")
        segment_case(model, case, config, EvaluateConfig(overlays=False))
    peak = _kb("VmHWM")
    print(
        json.dumps(
            {
                "mode": mode,
                "runtime_gb": round(runtime / 1e9, 3),
                "loaded_gb": round(loaded / 1e9, 3),
                "peak_gb": round(peak / 1e9, 3),
                "peak_above_runtime_gb": round((peak - runtime) / 1e9, 3),
                "peak_above_loaded_gb": round((peak - loaded) / 1e9, 3),
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
