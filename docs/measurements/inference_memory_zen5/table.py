#!/usr/bin/env python
"""The table of run.sh's points: each log's measured peak above the runtime against the planner's
prediction (the line evaluate.py and predict.py print), and the served case's JSON line.

    python docs/measurements/inference_memory_zen5/table.py /tmp/w/inference_memory > docs/measurements/inference_memory_zen5/table.md
"""

import json
import re
import sys
from pathlib import Path

POINTS = {
    "eval_half_whole": "evaluate.py, half (96x112x80), whole-volume model, fp32, 4 test cases",
    "eval_half_patch48": "evaluate.py, half, 48³-patch model (sliding windows), fp32, 4 test cases",
    "eval_full_whole_bf16": "evaluate.py, full (192x224x160), whole-volume model, bf16, 4 test cases",
    "eval_full_grow_bf16": "evaluate.py, full, grow model, bf16, 4 test cases",
    "eval_full_grow_fp32": "evaluate.py, full, grow model, fp32, 4 test cases",
    "eval_full_patch96_bf16": "evaluate.py, full, 96³-patch model (sliding windows), bf16, 4 test cases",
    "predict_full_fp32": "predict.py, full, fp32, 2 raw cases 240x240x155 (1 mm)",
    "predict_full_bf16": "predict.py, full, bf16, the same 2 cases",
    "predict_half": "predict.py, half, fp32, the same 2 cases",
    "predict_full_fp32_08mm": "predict.py, full, fp32, 1 raw case 300x300x194 (0.8 mm)",
    "predict_half_08mm": "predict.py, half, fp32, the same 0.8 mm case",
}
LINE = re.compile(r"peak ([\d.]+) GB above the runtime \(predicted ([\d.]+) GB, at its (\w+) step\)")


def main(work: str) -> None:
    work = Path(work)
    print("| point | measured peak above the runtime | predicted | at | error of the prediction |")
    print("|---|---|---|---|---|")
    for point, what in POINTS.items():
        log = work / f"{point}.log"
        found = LINE.search(log.read_text()) if log.is_file() else None
        if found is None:
            print(f"| {what} | (no line in {log.name}) | | | |")
            continue
        measured, predicted, at = float(found[1]), float(found[2]), found[3]
        print(f"| {what} | {measured:.2f} GB | {predicted:.2f} GB | {at} | {100 * (predicted / measured - 1):+.1f}% |")
    served = work / "serve_full.log"
    lines = [ln for ln in served.read_text().splitlines() if ln.startswith("{")] if served.is_file() else []
    if lines:
        rec = json.loads(lines[-1])
        measured, predicted = rec["worker_peak_above_ready_gb"], rec["planned_above_runtime_gb"]
        print(
            f"| `mlflow models serve`, full, fp32 export, 1 raw case (worker's peak above its RSS when ready) | "
            f"{measured:.2f} GB | {predicted:.2f} GB | {rec['planned_peak_at']} | {100 * (predicted / measured - 1):+.1f}% |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
