#!/usr/bin/env python
"""Why the moments after the forward pass add to it on CPU: one raw case predicted step by step in
this process, each step's RSS before, peak (VmHWM reset at its start) and after, in GB above the
imported runtime, with TensorFlow's allocator statistics after the forward pass and the effect of
glibc's malloc_trim.

    python docs/measurements/inference_memory_zen5/phases.py outputs/patch_schedule_full/arm-grow_seed-0 data/mni_gliomas_heldout/MNIG_00000

Run on an otherwise idle machine; output in phases.txt.
"""

import ctypes
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def main(run: str, case_dir: str) -> None:
    sys.path.insert(0, str(REPO))
    from brats_seg.backend import configure, decide_backend
    from brats_seg.config import BackendConfig

    configure(decide_backend(BackendConfig(name="cpu_onednn")))  # fp32
    import numpy as np
    import tensorflow as tf

    from brats_seg.data.case_io import load_case_image
    from brats_seg.data.layouts import case_from_dir
    from brats_seg.data.preprocess import invert_to_native, preprocess_case
    from brats_seg.evaluation.inference.run import load_run_config, load_run_model
    from brats_seg.evaluation.inference.sliding import predict_volume
    from brats_seg.lms.runtime.stats import current_rss_bytes, peak_rss_bytes, reset_peak_rss

    runtime = current_rss_bytes()

    def gb(b: int) -> float:
        return round((b - runtime) / 1e9, 3)

    def step(name, fn):
        before = current_rss_bytes()
        reset_peak_rss()
        out = fn()
        print(json.dumps({"step": name, "before": gb(before), "peak": gb(peak_rss_bytes()), "after": gb(current_rss_bytes())}))
        return out

    def allocator(when: str) -> None:
        info = tf.config.experimental.get_memory_info("CPU:0")
        print(json.dumps({"allocator": when, "current_gb": round(info["current"] / 1e9, 3), "peak_gb": round(info["peak"] / 1e9, 3)}))

    config = load_run_config(Path(run))
    model = step("load the model", lambda: load_run_model(Path(run), "best", config))
    case = case_from_dir(Path(case_dir), "brats2021")
    image, ref = step("read the four files", lambda: load_case_image(case))
    net_image, _, record = step(
        "preprocess",
        lambda: preprocess_case(
            case.case_id, image, ref.spacing_mm, config.resolution.spacing_mm, config.resolution.shape
        ),
    )
    flair = np.array(image[..., 0])  # as segment_case keeps it
    del image, ref
    step("forward (mirrored), first call", lambda: predict_volume(model, net_image, mirror=True))
    allocator("after the first forward")
    step("malloc_trim(0)", lambda: ctypes.CDLL("libc.so.6").malloc_trim(0))
    probs = step("forward (mirrored), second call", lambda: predict_volume(model, net_image, mirror=True))
    allocator("after the second forward")
    step("back to the native grid", lambda: invert_to_native(probs, record))
    del flair


if __name__ == "__main__":
    main(*sys.argv[1:3])
