"""Fitting a CPU's step-time model to measured benchmark steps, and judging it on points it did not see.

The model is :mod:`brats_seg.lms.planner.step_time`'s; :func:`calibrate` fits it to the ``lms=off``
records of benchmark sweeps (``scripts/benchmark.py benchmark.sweep=...``) measured on this CPU, per
compute dtype, choosing the channel paddings (of the convolutions' FLOPs and of the bytes
touched) whose leave-one-out error is smallest, and predicts
held-out records (any strategy: recomputation priced by the planner) with it. Used by
``scripts/calibrate_step_time.py`` (the shipped presets) and by the calibration of a CPU the presets
do not know (:mod:`brats_seg.benchmark.self_calibration`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import itertools
import json
import statistics
from pathlib import Path

__all__ = ["ALIGNS", "BLOCKS", "BYTES_BLOCKS", "calibrate", "summary_line"]


@functools.cache
def _network(overrides: tuple[str, ...]):
    """The cost tables and the options of the benchmark's composed config for ``overrides``."""
    from brats_seg.lms.planner.cost import compute_network_cost
    from brats_seg.lms.planner.workload import Workload
    from brats_seg.project import compose_config

    conf = compose_config("benchmark", [o for o in overrides if "sweep" not in o])
    workload = dataclasses.replace(Workload.from_config(conf), input_batches=0, validates=False)
    return compute_network_cost(workload), conf.lms


def _read(paths) -> list[dict]:
    from brats_seg.cpu import cpu_id

    records = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ValueError(f"{path}: no such file; give the results.jsonl of a benchmark sweep.")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                r["step_s"], r["overrides"], r["strategy"]
            except (ValueError, KeyError) as e:
                raise ValueError(f"{path}:{n} is not a benchmark record ({e}).") from e
            r["_file"] = str(path)
            records.append(r)
    here = cpu_id()
    other = {r.get("cpu_id") for r in records if r.get("cpu_id") not in (None, here)}
    if other:
        raise ValueError(
            f"records from another CPU ({', '.join(sorted(other))}); this one is {here}: "
            "calibrate on the CPU that measured them."
        )
    return records


BLOCKS = (1, 4, 8, 16)  # channel counts convolutions may be padded to; the fit keeps the one that predicts best
#: channel counts activations may be counted padded to in the bytes term (1: as stored; oneDNN's
#: blocked layouts hold 8 or 16), chosen the same way; on a tie the plainer form (1 first) is kept
BYTES_BLOCKS = (1, 8, 16)
#: per compute dtype, the channel multiples off which an activation's bytes are priced at an extra
#: rate of their own (0: one rate for all), each tried with every padding and kept by leave-one-out
#: error. Steps with levels off oneDNN's blocks run slower than their FLOPs say: a full-resolution
#: step of 6 filters took as long as one of 8 in float32 on both an Emerald Rapids and a Zen 5, and
#: one of 12 filters longer than one of 16 in bfloat16 (10 against 6.7 s on the Emerald Rapids,
#: AMX), where oneDNN's verbose log puts the cost in the norms' and reorders' traffic around those
#: layers (docs/measurements/onednn_kernels_emr/). Fixed at 8 and 16, not chosen among (0, 8, 16):
#: fitted to the quick sweep with full-resolution 12 and 16 filters, a fixed off-block term missed
#: ±25% on 1 of 48 held-out points of four recorded sessions on the two CPUs, choosing it by
#: leave-one-out on 3, one rate for all on 6 (docs/measurements/forms_offline/forms.txt); priced
#: on activation bytes rather than on the FLOPs of such convolutions it missed 1 of 46 over five
#: sessions against 4 (forms_offline/bytes_form.txt) and 0 of 7 points in no earlier record against
#: 1 (docs/measurements/blind_bytes_emr/); as shipped, 3 of 8 more on a fresh calibration
#: (docs/measurements/bytes_shipped_emr/). The rate is non-negative: with nothing to price apart it
#: fits to 0. A dtype with fewer than five points gets one rate (four coefficients need points to
#: spare).
ALIGNS: dict[str, tuple[int, ...]] = {"float32": (8,), "bfloat16": (16,)}
ALIGN_COST = 0.01  # where 0 is a candidate too: what the extra coefficient must gain in worst left-out error


def _point(record: dict, block: int, bytes_block: int = 1, align: int = 0) -> tuple[float, float, float, float]:
    """``(padded FLOPs, bytes, measured seconds, off-block bytes)`` of the record's step, as
    :func:`~brats_seg.lms.planner.step_time.fit_coefficients` takes it."""
    from brats_seg.lms.planner.step_time import step_features

    net, _ = _network(tuple(record["overrides"]))
    f = step_features(net, block, bytes_block, align)
    return f["padded_flops"], f["bytes"], record["step_s"], f["unaligned_bytes"]


def _dtype(record: dict) -> str:
    return "bfloat16" if record["precision"] == "bf16" else "float32" if record["precision"] == "fp32" else "float16"


def _predict(record: dict, model) -> float:
    """The planner's step time for the record's configuration: the step, plus recomputing what
    its fixed strategy recomputes, priced by ``model``."""
    from brats_seg.lms.planner.accounting import plan_overhead
    from brats_seg.lms.planner.search import fixed_config
    from brats_seg.lms.planner.workload import LMSOptions

    net, lms = _network(tuple(record["overrides"]))
    seconds = model.step_s(net)
    if record["strategy"] != "off":
        options = dataclasses.replace(
            LMSOptions.from_config(lms, None, allow_offload=False, strategy=record["strategy"]), time_model=model
        )
        policies, skips = fixed_config(net, record["strategy"], options)
        seconds += plan_overhead(net, policies, skips, options)
    return seconds


def _label(record: dict) -> str:
    keep = ("resolution", "model.", "backend.precision", "trainer.batch_size", "lms")
    return " ".join(o for o in record["overrides"] if o.startswith(keep) and not o.startswith("resolution=tiny"))


def _row(record: dict, predicted: float) -> dict:
    return {
        "point": _label(record),
        "file": record["_file"],
        "measured_s": record["step_s"],
        "predicted_s": round(predicted, 3),
        "error": round(predicted / record["step_s"] - 1, 4),
    }


def summary_line(rows: list[dict]) -> str:
    if not rows:
        return "no points"
    errors = [r["error"] for r in rows]
    return (
        f"{len(rows)} points, error {min(errors):+.1%} to {max(errors):+.1%}, "
        f"median |error| {statistics.median(abs(e) for e in errors):.1%}"
    )


def calibrate(fit_paths, held_out_paths) -> dict:
    """The step-time model of this CPU fitted to the ``lms=off`` records of ``fit_paths`` (per compute
    dtype, the channel padding chosen by leave-one-out error) and judged on ``held_out_paths``: the
    entry ``step_time.json`` (or a calibration cached per CPU) keeps for it."""
    from brats_seg.cpu import cpu_id, cpu_kind, cpu_model_name
    from brats_seg.lms.planner.step_time import CpuTimeModel, channel_block, fit_coefficients

    block = channel_block(cpu_kind())
    fitted = [r for r in _read(fit_paths) if r["strategy"] == "off"]
    held = _read(held_out_paths)
    if not fitted:
        raise ValueError("no lms=off point in the fit files: fit on a sweep with lms=off (e.g. benchmark.sweep=width).")
    by_dtype: dict[str, list[dict]] = {}
    for r in fitted:
        by_dtype.setdefault(_dtype(r), []).append(r)
    coefficients, fit_rows, loo_rows = {}, [], []
    for dtype, records in sorted(by_dtype.items()):
        best = None
        # the paddings (and, where 0 is a candidate too, the off-block rate) whose fit predicts the
        # points it did not see best; plainer forms come first, so a tie keeps them
        aligns = ALIGNS.get(dtype, (0,)) if len(records) > 4 else (0,)
        for align, bytes_pad, pad in itertools.product(aligns, BYTES_BLOCKS, BLOCKS):
            points = [_point(r, pad, bytes_pad, align) for r in records]
            loo = []
            for k, r in enumerate(records):  # each point predicted by a fit that did not see it
                if len(points) > 3 + (align > 1):  # more points than coefficients
                    rest = points[:k] + points[k + 1 :]
                    alone = CpuTimeModel(
                        cpu=cpu_id(), block=pad, coefficients={dtype: fit_coefficients(rest, pad, bytes_pad, align)}
                    )
                    loo.append(_row(r, _predict(r, alone)))
            # the unaligned rate, a fourth coefficient, must lower the worst left-out error by a point
            worst = max((abs(row["error"]) for row in loo), default=0.0) + (ALIGN_COST if align > 1 else 0.0)
            if best is None or worst < best[0]:
                best = (worst, pad, fit_coefficients(points, pad, bytes_pad, align), loo)
        _, pad, coefficients[dtype], loo = best
        model = CpuTimeModel(cpu=cpu_id(), block=pad, coefficients={dtype: coefficients[dtype]})
        fit_rows += [_row(r, _predict(r, model)) for r in records]
        loo_rows += loo
    model = CpuTimeModel(cpu=cpu_id(), block=block, coefficients=coefficients)
    held_rows = [_row(r, _predict(r, model)) for r in held if _dtype(r) in coefficients]
    return {
        "cpu_name": cpu_model_name(),
        "kind": cpu_kind(),
        "block": block,
        "fit": {d: dataclasses.asdict(c) for d, c in coefficients.items()},
        "fitted_on": sorted({r["_file"] for r in fitted}),
        "held_out_files": sorted({r["_file"] for r in held}),
        "date": datetime.date.today().isoformat(),
        "fitted_points": fit_rows,
        "leave_one_out": loo_rows,
        "held_out": held_rows,
        "summary": {
            "fitted_points": summary_line(fit_rows),
            "leave_one_out": summary_line(loo_rows),
            "held_out": summary_line(held_rows),
        },
    }
