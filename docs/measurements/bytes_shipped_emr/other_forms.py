"""Offline, nothing measured, not shipped: two variants of the off-block-bytes term tried after this
record's misses (wide bf16 off the 16-block over-predicted), on the same 59 held-out points as
``all_sessions.py``, each fitted the same way:

- ``padding-weighted``: each off-block activation's bytes times its padding's share,
  (channels rounded up to the block - channels) / channels (what a padded layout wastes);
- ``remainder-weighted``: times the share of its channels past the last full block,
  (channels mod block) / channels (what a kernel's tail would run outside its vector blocks).

    python docs/measurements/bytes_shipped_emr/other_forms.py > docs/measurements/bytes_shipped_emr/other_forms.txt
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "forms_offline"))
import all_sessions  # noqa: E402
import bytes_form  # noqa: E402

from brats_seg.benchmark import step_time_fit as stf  # noqa: E402
from brats_seg.lms.planner.step_time import step_features  # noqa: E402

SHIPPED = bytes_form.features
WEIGHTS = {
    "padding-weighted": lambda c, align: (-(-c // align) * align - c) / c,
    "remainder-weighted": lambda c, align: (c % align) / c,
}


def features(r: dict, block: int, bytes_block: int, form: str) -> list[float]:
    if form not in WEIGHTS:
        return SHIPPED(r, block, bytes_block, form)
    net, _ = stf._network(tuple(r["overrides"]))
    align = bytes_form.ALIGN[r["precision"]]
    f = step_features(net, block, bytes_block, align)
    extra = 0.0
    for blk in net.blocks:
        for layer in blk.layers:
            for t in (*layer.inputs, layer.output):
                c = blk.tensor_channels.get(t, 0)
                if c and c % align:
                    extra += 3.0 * blk.tensor_bytes.get(t, 0) * WEIGHTS[form](c, align)
    return [f["padded_flops"], f["bytes"], 1.0, extra]


def main() -> None:
    bytes_form.features = features
    all_sessions.FORMS = ("off-block bytes", *WEIGHTS)
    all_sessions.main()


if __name__ == "__main__":
    main()
