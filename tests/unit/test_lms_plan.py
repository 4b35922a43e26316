"""The plan object (brats_seg.lms.planner.plan): its JSON, its table, its rows."""

from __future__ import annotations

import json

import pytest

from brats_seg.lms.planner.plan import Plan
from brats_seg.lms.planner.search import plan_lms
from brats_seg.lms.planner.workload import LMSOptions, Workload
from tests.unit.lms_workloads import FULL, HALF, ModelConfig, network, peaks


def test_json_round_trip_has_the_required_keys():
    cfg = ModelConfig(depth=4)
    p = peaks(cfg, FULL)
    plan = plan_lms(Workload(cfg, FULL, 1), LMSOptions(limit_bytes=(p["off"] + p["offload"]) // 2, strategy="auto"))
    data = json.loads(plan.to_json())
    assert data["limit_bytes"] == plan.limit_bytes
    assert set(data["strategies"]) == {"off", "recompute", "offload", "auto"}
    for summary in data["strategies"].values():
        assert {"predicted_peak_bytes", "recomputed_flops", "moved_bytes"} <= set(summary)
    assert [row["block"] for row in data["plan"]] == [b.name for b in network(cfg, FULL, 1).blocks]
    for row in data["plan"]:
        assert {"block", "policy", "kept_bytes", "moved_bytes", "recomputed_flops", "skip_offloaded"} <= set(row)
    assert {"recomputed_flops", "moved_bytes", "overhead_s"} <= set(data["totals"])
    assert Plan.from_json(plan.to_json()) == plan


def test_from_dict_rejects_other_json():
    with pytest.raises(ValueError, match="not a saved LMS plan"):
        Plan.from_dict({"hello": 1})


def test_format_table_names_every_block():
    plan = plan_lms(Workload(ModelConfig(depth=3), HALF, 1), LMSOptions(limit_bytes=10**15, strategy="recompute"))
    table = plan.format_table()
    for name in ["enc0", "enc1", "enc2", "bottleneck", "dec2", "dec1", "dec0", "head"]:
        assert f"\n{name} " in table
    assert "GB" in table and "GFLOP" in table and "recompute" in table
