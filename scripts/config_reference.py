#!/usr/bin/env python
"""Write docs/configuration.md, the configuration reference, from the schemas in brats_seg/config.py
and brats_seg/script_configs.py.

    python scripts/config_reference.py

Run it after changing a schema, a field's comment or the files of configs/;
tests/unit/test_config_reference.py fails while the page differs from what this writes.
Fields without a comment are listed: give each a trailing ``# why`` in its schema.
"""

from __future__ import annotations

from pathlib import Path

from brats_seg.config_reference import build_config_reference
from brats_seg.files import write_text_atomic

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"


def main() -> None:
    reference = build_config_reference(configs_dir=REPO / "configs")
    write_text_atomic(PAGE, reference.markdown)
    keys = sum(len(s.fields) for s in reference.schemas)
    print(f"wrote {PAGE.relative_to(REPO)}: {len(reference.schemas)} schemas, {keys} fields")
    if reference.undocumented:
        print(
            f"{len(reference.undocumented)} fields have no comment in their schemas: "
            + ", ".join(reference.undocumented)
        )


if __name__ == "__main__":
    main()
