"""Per run of the study: the post-processing its 9 validation cases chose, and the held-out scores
without and with it (both from evaluate.py's summary.json: ``unprocessed_mean`` and the means).

    python docs/measurements/patch_schedule_emr/postprocess_effect.py docs/measurements/patch_schedule_emr
"""

import json
import statistics
import sys
from pathlib import Path

folder = Path(sys.argv[1])
SET = "all@mni_gliomas_heldout2"
by_arm = {}
print("| run | rules chosen on validation (9 cases) | held-out lesion-wise TC unprocessed -> processed | ET | legacy TC |")
print("|---|---|---|---|---|")
for run in sorted(p for p in folder.glob("arm-*") if p.is_dir()):
    summary = run / "eval" / SET / "summary.json"
    if not summary.is_file():
        continue
    s = json.loads(summary.read_text())
    pp = s.get("postprocess") or {}
    raw = pp.get("unprocessed_mean") or {}
    mean = {k: v["mean"] for k, v in s.items() if isinstance(v, dict) and "mean" in v}
    cells = []
    for key in ("lesion23_dice_tc", "lesion23_dice_et", "dice_tc"):
        before = raw.get(key, mean[key])
        cells.append(f"{before:.3f} -> {mean[key]:.3f}")
    print(f"| {run.name} | {pp.get('described', 'none')} | " + " | ".join(cells) + " |")
    arm = run.name.split("_seed-")[0]
    by_arm.setdefault(arm, []).append((raw.get("lesion23_dice_tc", mean["lesion23_dice_tc"]), mean["lesion23_dice_tc"]))
print()
for arm, pairs in by_arm.items():
    before, after = zip(*pairs)
    sd = statistics.stdev if len(pairs) > 1 else (lambda v: 0.0)
    print(
        f"{arm}: lesion-wise TC unprocessed {statistics.fmean(before):.3f} ± {sd(before):.3f}, "
        f"processed {statistics.fmean(after):.3f} ± {sd(after):.3f} ({len(pairs)} seeds)"
    )
