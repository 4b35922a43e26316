"""How long a training step takes on a CPU: the planner's time model, measured per CPU.

A GPU runs convolutions near its FLOP rate, which ``lms.device_tflops`` prices. A CPU does
not: oneDNN's kernels work on blocks of channels (16 with AVX-512, 8 with AVX2), so a
convolution of 6 channels costs about what one of 16 does, and the thin layers of a narrow
U-Net (norms, activations, casts, concatenations) are bound by memory traffic, not
arithmetic. The model, per compute dtype:

    seconds = per_flop_s * padded FLOPs + per_byte_s * bytes touched
              + per_unaligned_byte_s * off-block bytes + per_step_s

where *padded FLOPs* are the step's convolution FLOPs with each convolution's input and
output channels rounded up to a block (the one whose fit predicts left-out points best: 16 for
bfloat16 and 4 for float32 on a Zen 5; :func:`step_features`), and *bytes
touched* are what every layer reads and writes, each activation's channels rounded up to a block
of their own (1: as stored; 8 or 16: as oneDNN's blocked layouts store them, which is how an
Emerald Rapids' bfloat16 steps scale), also chosen by leave-one-out error. *Off-block bytes*
are the bytes (as stored) of the activations whose channels are not a multiple of ``align`` (0:
the term is off): steps with such levels run slower than their FLOPs say (on an Emerald Rapids in
bfloat16, 12 filters at full resolution took 10.0 s a step and 16 filters 6.5 s), and oneDNN's
verbose log puts that cost in the traffic around those layers (instance norm 3x, reorders 2.6x),
not in the convolutions, which run the same AMX kernels on the block or off it
(docs/measurements/onednn_kernels_emr/); this term prices that traffic. It replaced a rate on
the FLOPs of such convolutions (``per_unaligned_flop_s``, still read from calibrations cached
before it): over the 59 held-out points of seven recorded sets it misses ±25% on 3, the FLOPs form
on 7; judged as shipped on a fresh calibration and eight points in no earlier record it held 5
(wide bfloat16 off the block over-predicted; docs/measurements/bytes_shipped_emr/). ``align`` is fixed per
dtype by the calibration (:data:`brats_seg.benchmark.step_time_fit.ALIGNS`: 8 for float32, 16
for bfloat16) and the rate is
fitted non-negative. The coefficients are fitted per CPU model
(:func:`brats_seg.cpu.cpu_id`: CPUs of one kind, Zen 4 and Zen 5, run the same kernels at
different speeds) to benchmark sweeps by ``scripts/calibrate_step_time.py`` and kept in
``brats_seg/lms/presets/step_time.json`` with the error on points the fit did not see.

A CPU the presets do not know is calibrated on the user's machine, in minutes
(:mod:`brats_seg.benchmark.self_calibration`: ``lms.calibrate=auto|now``, or
``scripts/calibrate_step_time.py quick=true``): a short measured sweep fitted the same way and cached
per CPU id in the user's cache folder (:func:`user_calibration_path`), which is read before the
shipped presets. A CPU with neither gets the slowest calibrated coefficients times
:data:`UNCALIBRATED_FACTOR`: recomputation is priced high rather than low, and the step
time printed is an upper estimate, said so (:attr:`CpuTimeModel.calibrated`, :attr:`CpuTimeModel.source`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brats_seg.model.checks import DTYPE_POLICIES

# The cost tables (brats_seg.lms.planner.cost.NetworkCost) are read here, never built: this module
# imports nothing of the planner, whose options (workload.py) load the model of this CPU from it.
NetworkCost = Any

__all__ = [
    "PRESET_FILE",
    "UNCALIBRATED_FACTOR",
    "CpuTimeModel",
    "TimeCoefficients",
    "channel_block",
    "cpu_time_model",
    "load_time_presets",
    "read_user_calibration",
    "step_features",
    "user_calibration_path",
]

PRESET_FILE = Path(__file__).resolve().parents[1] / "presets" / "step_time.json"

#: A CPU without its own calibration is priced at the slowest calibrated CPU's coefficients
#: times this. Measured spread between CPUs: the full-resolution fp32 step of 16 filters took
#: 13.9 s on a Zen 4 (issue 32), 10.4 s on a Sapphire Rapids and 7.3-7.9 s on a Zen 5 (README);
#: 3 keeps the stand-in above the slowest of them when the Zen 5 is the one calibrated.
UNCALIBRATED_FACTOR = 3.0

#: oneDNN's channel blocking per CPU kind (:func:`brats_seg.cpu.cpu_kind`): AVX-512 registers
#: hold 16 float32 values, AVX2 8.
_CHANNEL_BLOCK = {"avx512_amx": 16, "avx512": 16, "avx2": 8, "other": 8}


def channel_block(kind: str) -> int:
    """The channel block oneDNN's convolutions pad to on a CPU kind."""
    return _CHANNEL_BLOCK.get(kind, 8)


def _padded(c: int, block: int) -> int:
    return -(-c // block) * block


def step_features(net: NetworkCost, block: int, bytes_block: int = 1, align: int = 0) -> dict[str, float]:
    """What a training step costs in the model's terms: ``padded_flops`` (forward and backward;
    a convolution's backward is two convolutions, the first one's one, as
    :func:`~brats_seg.lms.planner.cost.compute_step_flops` counts), ``bytes`` (every layer's inputs
    and output, channels padded to ``bytes_block``, forward, and twice that backward: gradients in
    and out), ``unaligned_bytes`` (the part of those, as stored, in activations whose channels are
    not multiples of ``align``) and ``unaligned_flops`` (the padded FLOPs of convolutions whose
    channels are not; the form cached calibrations before the bytes term priced); both 0 without
    ``align``."""
    padded = unaligned = moved = unaligned_moved = 0.0
    first_conv = True
    for i in range(len(net.blocks)):
        _, block_moved, _, block_unaligned_moved = block_features(net, i, block, bytes_block, align)
        moved += 3.0 * block_moved
        unaligned_moved += 3.0 * block_unaligned_moved
        for layer in net.blocks[i].layers:
            if layer.kind in ("conv", "up_transpose"):
                flops = _conv_padded(layer, block) * (2.0 if first_conv else 3.0)
                padded += flops
                unaligned += flops if _unaligned(layer, align) else 0.0
                first_conv = False
    return {"padded_flops": padded, "unaligned_flops": unaligned, "bytes": moved, "unaligned_bytes": unaligned_moved}


def _unaligned(layer, align: int) -> bool:
    return align > 1 and any(c % align for c in layer.channels if c)


def _conv_padded(layer, block: int) -> float:
    cin, cout = layer.channels
    if not (cin and cout):
        return layer.forward_flops
    return layer.forward_flops * _padded(cin, block) * _padded(cout, block) / (cin * cout)


def block_features(
    net: NetworkCost, i: int, block: int, bytes_block: int = 1, align: int = 0
) -> tuple[float, float, float, float]:
    """Block ``i``'s forward ``(padded FLOPs, bytes read and written, unaligned FLOPs, unaligned
    bytes)``: what recomputing it costs (each activation's channels padded to ``bytes_block``; the
    FLOPs of convolutions, and the bytes as stored of activations, whose channels are not multiples
    of ``align``)."""
    blk = net.blocks[i]
    convs = [layer for layer in blk.layers if layer.kind in ("conv", "up_transpose")]
    flops = sum(_conv_padded(layer, block) for layer in convs)
    unaligned = sum(_conv_padded(layer, block) for layer in convs if _unaligned(layer, align))

    def nbytes(t: str) -> float:
        size, channels = blk.tensor_bytes.get(t, 0), blk.tensor_channels.get(t, 0)
        return size * _padded(channels, bytes_block) / channels if channels and bytes_block > 1 else size

    def off_block(t: str) -> float:
        channels = blk.tensor_channels.get(t, 0)
        return float(blk.tensor_bytes.get(t, 0)) if align > 1 and channels and channels % align else 0.0

    moved = unaligned_moved = 0.0
    for layer in blk.layers:
        for t in (*layer.inputs, layer.output):
            moved += nbytes(t)
            unaligned_moved += off_block(t)
    return flops, float(moved), unaligned, unaligned_moved


@dataclass(frozen=True)
class TimeCoefficients:
    """Seconds per padded FLOP, per byte touched and per step, of one compute dtype on one CPU,
    and the extra seconds per byte of an activation whose channels are not multiples of ``align``
    (0: no such term); ``block``: the channel count convolutions are padded to, ``bytes_block``
    the one activations are counted padded to in the bytes term (each chosen by the calibration's
    leave-one-out error: how oneDNN's kernels behave is measured, not assumed; presets without
    them count bytes as stored and every layer alike). ``per_unaligned_flop_s``: the extra seconds
    per FLOP of a convolution off ``align``, the form calibrations cached before the bytes term
    fitted (read as they are; a new calibration fits it 0)."""

    per_flop_s: float
    per_byte_s: float
    per_step_s: float = 0.0
    block: int = 16
    bytes_block: int = 1
    per_unaligned_flop_s: float = 0.0
    align: int = 0
    per_unaligned_byte_s: float = 0.0

    def seconds(
        self,
        padded_flops: float,
        moved_bytes: float,
        steps: float = 1.0,
        unaligned_flops: float = 0.0,
        unaligned_bytes: float = 0.0,
    ) -> float:
        return (
            self.per_flop_s * padded_flops
            + self.per_unaligned_flop_s * unaligned_flops
            + self.per_byte_s * moved_bytes
            + self.per_unaligned_byte_s * unaligned_bytes
            + self.per_step_s * steps
        )

    def scaled(self, factor: float) -> TimeCoefficients:
        return dataclasses.replace(
            self,
            per_flop_s=self.per_flop_s * factor,
            per_byte_s=self.per_byte_s * factor,
            per_step_s=self.per_step_s * factor,
            per_unaligned_flop_s=self.per_unaligned_flop_s * factor,
            per_unaligned_byte_s=self.per_unaligned_byte_s * factor,
        )


@dataclass(frozen=True)
class CpuTimeModel:
    """The step-time model of one CPU.

    Attributes:
        cpu: the CPU it was calibrated on (:func:`brats_seg.cpu.cpu_id`), or for an
            uncalibrated one what it stands in with.
        block: the CPU kind's channel block (each dtype's coefficients carry the padding their
            fit chose, which prices them).
        coefficients: compute dtype (``float32``, ``bfloat16``) -> coefficients.
        calibrated: False for the stand-in of a CPU without its own calibration (an upper
            estimate).
        source: where the coefficients come from: ``preset`` (the shipped ``step_time.json``),
            ``calibrated here`` (this machine's cached calibration, with its file and date) or
            ``uncalibrated``.
        held_out: the calibration's error on points its fit did not see (a summary line), or "".
    """

    cpu: str
    block: int
    coefficients: Mapping[str, TimeCoefficients] = field(default_factory=dict)
    calibrated: bool = True
    source: str = "preset"
    held_out: str = ""

    def _for(self, net: NetworkCost) -> TimeCoefficients:
        dtype = DTYPE_POLICIES[net.policy]
        if dtype in self.coefficients:
            return self.coefficients[dtype]
        # a dtype not measured here (float16 on a CPU): the slowest one measured
        return max(self.coefficients.values(), key=lambda c: c.per_flop_s)

    def step_s(self, net: NetworkCost) -> float:
        """Seconds of one training step without recomputation."""
        c = self._for(net)
        f = step_features(net, c.block, c.bytes_block, c.align)
        return c.seconds(
            f["padded_flops"], f["bytes"], unaligned_flops=f["unaligned_flops"], unaligned_bytes=f["unaligned_bytes"]
        )

    def block_forward_s(self, net: NetworkCost, i: int) -> float:
        """Seconds of block ``i``'s forward pass (what recomputing it costs)."""
        c = self._for(net)
        flops, moved, unaligned, unaligned_moved = block_features(net, i, c.block, c.bytes_block, c.align)
        return c.seconds(flops, moved, steps=0.0, unaligned_flops=unaligned, unaligned_bytes=unaligned_moved)


def load_time_presets(path: Path = PRESET_FILE) -> dict:
    """``cpu id -> record`` of the calibrated CPUs (``{}`` without the file).

    Raises:
        ValueError: a file that is not the calibration's output, naming it.
    """
    if not Path(path).exists():
        return {}
    try:
        record = json.loads(Path(path).read_text())
        for entry in record["cpus"].values():
            for c in entry["fit"].values():
                TimeCoefficients(**{"block": entry["block"], **c})
        return record["cpus"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path} is not a step-time calibration ({e}); re-run scripts/calibrate_step_time.py "
            f"or restore it from git."
        ) from e


def user_calibration_path(cpu: str | None = None) -> Path:
    """Where this machine's own calibration of ``cpu`` (default this CPU) is cached:
    ``$BRATS_SEG_CACHE_DIR`` or ``$XDG_CACHE_HOME/brats_seg`` (``~/.cache/brats_seg``), then
    ``step_time/<cpu id>.json``."""
    from brats_seg.cpu import cpu_id

    base = os.environ.get("BRATS_SEG_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "brats_seg"
    name = re.sub(r"[^A-Za-z0-9]+", "_", cpu or cpu_id()).strip("_")
    return Path(base).expanduser() / "step_time" / f"{name}.json"


def read_user_calibration(cpu: str | None = None) -> dict | None:
    """This machine's cached calibration entry of ``cpu`` (the shape of a preset's), or None: no
    file, or one that is not a calibration of that CPU (then it is ignored, with a warning, and
    calibrating again replaces it)."""
    import logging

    from brats_seg.cpu import cpu_id

    cpu = cpu or cpu_id()
    path = user_calibration_path(cpu)
    try:
        entry = json.loads(path.read_text())
        if entry.get("cpu_id") != cpu:
            raise ValueError(f"it calibrates {entry.get('cpu_id')!r}")
        for c in entry["fit"].values():
            TimeCoefficients(**{"block": entry["block"], **c})
        return entry
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        logging.getLogger(__name__).warning("%s is not a step-time calibration of this CPU (%s): ignored", path, e)
        return None


def _model(
    cpu: str, entry: Mapping, factor: float = 1.0, calibrated: bool = True, source: str = "preset"
) -> CpuTimeModel:
    summary = entry.get("summary", {}) if isinstance(entry.get("summary"), Mapping) else {}
    return CpuTimeModel(
        cpu=cpu,
        block=int(entry["block"]),
        calibrated=calibrated,
        coefficients={
            d: TimeCoefficients(**{"block": entry["block"], **c}).scaled(factor) for d, c in entry["fit"].items()
        },
        source=source,
        held_out=str(summary.get("held_out") or summary.get("leave_one_out") or ""),
    )


@functools.lru_cache(maxsize=8)
def cpu_time_model(cpu: str | None = None, kind: str | None = None, path: Path = PRESET_FILE) -> CpuTimeModel:
    """The step-time model of this CPU (or of ``cpu``/``kind``): this machine's own cached
    calibration (:func:`user_calibration_path`), else the shipped preset, else for a CPU without
    either the slowest calibrated coefficients times :data:`UNCALIBRATED_FACTOR`, with its
    own kind's channel block (``calibrated=False``). Cached: ``cpu_time_model.cache_clear()`` after
    calibrating."""
    from brats_seg.cpu import cpu_id, cpu_kind

    cpu = cpu or cpu_id()
    kind = kind or cpu_kind()
    own = read_user_calibration(cpu)
    if own is not None:
        return _model(cpu, own, source=f"calibrated here ({user_calibration_path(cpu)}, {own.get('date', '?')})")
    presets = load_time_presets(path)
    if cpu in presets:
        return _model(cpu, presets[cpu], source=f"preset ({path.name})")
    block = channel_block(kind)
    if not presets:  # nothing measured anywhere: a GPU-like guess would be worse than slow
        c = TimeCoefficients(per_flop_s=1 / 20e9, per_byte_s=1 / 2e9, per_step_s=0.1, block=block)
        return CpuTimeModel(
            cpu=f"uncalibrated ({cpu})",
            block=block,
            calibrated=False,
            coefficients={"float32": c, "bfloat16": c},
            source="uncalibrated",
        )
    slowest: dict[str, TimeCoefficients] = {}
    for entry in presets.values():
        for dtype, c in entry["fit"].items():
            c = TimeCoefficients(**{**c, "block": block})  # this CPU's channel block
            old = slowest.get(dtype)
            slowest[dtype] = (
                c
                if old is None
                else TimeCoefficients(
                    per_flop_s=max(old.per_flop_s, c.per_flop_s),
                    per_byte_s=max(old.per_byte_s, c.per_byte_s),
                    per_step_s=max(old.per_step_s, c.per_step_s),
                    block=block,
                    bytes_block=max(old.bytes_block, c.bytes_block),  # more bytes counted: the safe side
                    per_unaligned_flop_s=max(old.per_unaligned_flop_s, c.per_unaligned_flop_s),
                    align=max(old.align, c.align),  # more layers counted off the block: the safe side
                    per_unaligned_byte_s=max(old.per_unaligned_byte_s, c.per_unaligned_byte_s),
                )
            )
    return CpuTimeModel(
        cpu=f"uncalibrated ({cpu}): {UNCALIBRATED_FACTOR:g}x the slowest calibrated CPU",
        block=block,
        calibrated=False,
        coefficients={d: c.scaled(UNCALIBRATED_FACTOR) for d, c in slowest.items()},
        source="uncalibrated",
    )


def fit_coefficients(points, block: int = 16, bytes_block: int = 1, align: int = 0) -> TimeCoefficients:
    """Non-negative least squares of measured seconds on ``(padded FLOPs, bytes, 1, off-block
    bytes)``, each point weighed by its inverse time (relative errors: a 2 s step counts as much
    as a 20 s one).

    Args:
        points: ``(padded_flops, bytes, seconds)`` or ``(padded_flops, bytes, seconds,
            unaligned_bytes)`` per measured step, one compute dtype of one CPU.
        align: the block ``unaligned_bytes`` were counted with (0: none, the term is left out).
    """
    import numpy as np
    from scipy.optimize import nnls

    rows = [(*p, 0.0) if len(p) == 3 else tuple(p) for p in points]
    a = np.array([[f, b, 1.0, u if align > 1 else 0.0] for f, b, _, u in rows], dtype=float)
    y = np.array([t for _, _, t, _ in rows], dtype=float)
    if len(y) < 3:
        raise ValueError(f"a step-time fit needs at least 3 measured steps, got {len(y)}.")
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(a / scale / y[:, None], np.ones_like(y))
    x = x / scale
    return TimeCoefficients(
        per_flop_s=float(x[0]),
        per_byte_s=float(x[1]),
        per_step_s=float(x[2]),
        block=block,
        bytes_block=bytes_block,
        align=align if align > 1 else 0,
        per_unaligned_byte_s=float(x[3]) if align > 1 else 0.0,
    )
