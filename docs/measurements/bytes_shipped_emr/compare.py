"""The forms before, refitted offline on this record's quick calibration and judged on its held-out
``lms=off`` points (each the median of its draws), beside the shipped form (off-block bytes) as the
same script refits it: one rate, and the off-block rate on convolution FLOPs (``20189d3``). The
recompute points need the planner's pricing and are judged by ``judge.py`` alone. Nothing is
measured here.

    python docs/measurements/bytes_shipped_emr/compare.py > docs/measurements/bytes_shipped_emr/compare.txt
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "blind_bytes_emr"))
import judge_bytes  # noqa: E402

if __name__ == "__main__":
    judge_bytes.main(
        HERE,
        {
            "off-block FLOPs (shipped)": "off-block FLOPs (20189d3)",
            "off-block bytes": "off-block bytes (shipped, 92d8635)",
        },
    )
