"""The coefficients of the LMS memory model: the one place to calibrate the planner.

Every memory coefficient the cost tables and the timeline use is a field of
:class:`MemoryModel`; :data:`CPU_MEMORY_MODELS` holds the calibrated CPU presets and
:func:`memory_model_for` picks the one of the device a run trains on. How they were
measured and fitted: ``docs/lms_calibration.md``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BASE_PRESETS",
    "CPU_MEMORY_MODELS",
    "PREVIOUS_FITS",
    "MemoryModel",
    "base_preset",
    "load_preset",
    "memory_model_for",
    "upper_bound",
]


#: Fields that may be None (a rule not set: its documented fallback applies).
OPTIONAL_FIELDS = ("bf16_scratch_bytes_per_voxel_beyond",)


@dataclass(frozen=True)
class MemoryModel:
    """Coefficients of the memory model: the one place to calibrate against measurements.

    ``peak = runtime + weights + weight grads + optimizer slots + data + workspace
    + activation_factor * (kept activations + activation gradients + transient)
    + rebuild allowance`` at the worst step of the simulated timeline, where ``runtime =
    runtime_bytes + (runtime_bytes_per_conv + runtime_bytes_per_conv_filter * base_filters)
    * convolutions`` and the rebuild allowance
    (recompute/offload only) is ``rebuild_runtime_bytes + rebuild_fragmentation *`` the
    largest block's rebuilt internals. ``runtime_bytes`` and ``activation_factor`` are
    the intercept and slope of a least-squares fit to measured peaks; the other fields
    are per-layer assumptions (see :mod:`brats_seg.lms.planner.layer_cost`) or were
    fitted once (the docs).

    Calibrated on CPU (oneDNN, float32, Adam, batch 1) against the peak RSS that
    ``scripts/benchmark.py`` measures above the already-imported runtime after four
    steps (the BFC pool keeps touching new pages for a few steps); the measurements,
    the per-component evidence and the commands are in ``docs/lms_calibration.md``.
    GPU backends are not calibrated: there cuDNN takes real convolution workspace
    (raise ``workspace_factor``) and the allocator is the GPU BFC.

    Attributes:
        runtime_bytes: a fixed allowance for what the runtime adds besides tensors;
            0, as everything measured scales with the model (next field). TensorFlow's
            own import (~0.85 GB RSS on CPU) is NOT in it: the benchmark's baseline (and
            any budget taken from the RAM available after start-up) already contains it.
        runtime_bytes_per_conv: per convolution (transposed ones included): its traced
            and Grappler-optimised graph nodes, the oneDNN primitives and JIT kernels of
            its forward and two backward passes. RSS beyond the allocator's peak at the
            smallest workloads is 0.15 GB for the depth-3 U-Net (18 convolutions) and
            0.18-0.2 GB at depth 4 (23): 8 MB each.
        runtime_bytes_per_conv_filter: the part of the per-convolution runtime that grows
            with the network's width, per base filter. 0 on AVX-512 (not resolved by its
            calibration grid of 8 and 16 filters); on AVX2 the RSS beyond the allocator at
            64x64x48 was 8.7 / 10.6 / 13.2 MB per convolution at 8 / 16 / 32 filters
            under Keras' ``train_on_batch``; on the training step the AVX2 fit puts it at
            about nothing (6 kB).
        activation_factor: multiplies every activation/gradient/transient byte. Two
            effects meet here and nearly cancel, hence 1.0: allocator rounding and
            fragmentation (oneDNN's BFC allocator rounds chunks up and never gives touched
            pages back: RSS +4..+34% over the allocator's own peak at full resolution) and
            the block granularity of :func:`simulate` (the worst layer's working set, the
            block's saved tensors and its input gradients are counted at once, though the
            saved tensors are freed layer by layer in backward and the input gradients
            appear only at the block's end: +6..+25% over the allocator's peak).
        workspace_factor: convolution scratch = this x the largest convolution's
            max(input, output) bytes. 0 on CPU: oneDNN's direct 3D convolutions (forward
            and both backward passes) allocate no workspace tensor (a profiler trace of
            every allocation of the step shows none); cuDNN's algorithms on a GPU do (1.0,
            about one activation, was the previous, unmeasured, default).
        norm_upcast_forward_tensors: instance and group norm (``brats_seg.model.norm``) keep
            only their input, in its dtype, and float32 statistics. Group norm's XLA path
            under a 16-bit policy materialises its float32 upcast: forward temporaries of
            1.25 float32 copies of the norm's tensor (measured 1.22 with TensorFlow's
            allocator on the layer alone); none under float32 (measured 0.01-0.06).
        norm_upcast_backward_tensors: the same in backward, besides the input and output
            gradients: 2.0 (measured 2.0).
        norm_split_tensors: instance norm runs oneDNN's kernel, which makes no temporaries
            (measured 0.00 in float32 and bfloat16); with several samples per replica the
            batch is split and the results concatenated: one copy of the tensor, in its
            dtype, in each pass (measured 1.0 float32, 0.72 x 2 bfloat16).
        norm_planar_tensors: instance norm of a channel count oneDNN's channels-last kernel
            does not vectorise (:func:`brats_seg.model.topology.instance_norm_is_planar`) runs on
            a transposed (planar) copy and transposes its output back: one more tensor of the
            norm's size alive in each pass (the input and its copy, then the output and its copy).
        batch_norm_saved_tensors: ``model.norm=batch`` (Keras' BatchNormalization, which
            computes in float32): full-size float32 tensors it saves, its upcast input. Under
            a float32 policy that is the conv output itself.
        batch_norm_forward_scratch_tensors: its float32 forward temporaries besides its
            output: one (the squared difference of the variance, or under mixed precision
            the float32 normalised output before its downcast).
        batch_norm_backward_scratch_tensors: its float32 backward temporaries besides the
            gradients of its input and output: one.
        trilinear_scratch_factor: forward transient of TrilinearUpSampling3D besides its
            output, as a multiple of its output (the shifted copies, the scaled halves and
            the interleaved stack of the last axis). Measured with TensorFlow's allocator
            on the layer alone: 1.1-1.9 (``tests/unit/test_lms_layer_rules.py``).
        trilinear_backward_scratch_factor: backward transient of TrilinearUpSampling3D
            besides the gradients of its input and output, as a multiple of its output:
            the unstacked halves of the output gradient, their scaled copies and the
            gathers' segment sums. Measured the same way: 3.1-3.75.
        loss_tensors: head-output-sized float32 tensors alive in the loss step besides the
            head output, the labels and the gradient: the loss's value and gradient are
            XLA-compiled passes (``brats_seg.training.losses``), measured 1.0 on the loss
            alone (8.5 for the autodiff loss before).
        backward_flops_factor: backward FLOPs of a block / its forward FLOPs (a conv's
            backward is two convs); used to cost how much transfer compute can hide.
        rebuild_runtime_bytes: added once any block is recomputed or offloaded: the
            traced recompute graphs (each wrapped block's backward traces its forward
            again). Fitted: 25 MB.
        rebuild_fragmentation: the share of the largest block's rebuilt internals that
            stays resident beyond the allocator's peak for the rest of the run. Rebuilt
            tensors leave chunks of their sizes in the BFC pool that differently sized
            later tensors only partly reuse; the pool's touched pages grow over the
            first steps (RSS +0.03..+0.08 GB after step 1 at half resolution while the
            allocator's peak stays put) and never shrink. Fitted per preset (the JSON);
            on AVX2 it also stands for what recomputation holds at its peak beyond the
            modelled rebuild: the allocator's own peak under ``recompute`` is 5-25% above
            the model's tensors where ``off`` agrees within a few percent.
        conv_weight_grad_scratch: memory oneDNN allocates itself (outside TensorFlow's
            allocator) for a 3x3x3 convolution's gradient by weights, in units of one
            sample's input plus one im2col slice ``cin x 27 x y x z`` (the gemm
            implementation's transposed input copy and column buffer); the largest one is
            added to the step. 0 with AVX-512 (direct kernels, no such buffer); 1 on
            AVX2-only CPUs, where oneDNN picks ``gemm:jit`` for it (RSS beyond the
            allocator's peak +0.55 GB at full resolution, 8 filters, against 0.50 GB for
            ``dec0``'s first convolution by this formula).
        bf16_scratch_bytes, bf16_scratch_bytes_per_voxel: memory outside TensorFlow's
            allocator that a bfloat16 step holds on a CPU, ``bf16_scratch_bytes +
            bf16_scratch_bytes_per_voxel * voxels`` (voxels of one input volume; neither
            the batch nor the width moves it). Measured on a Sapphire Rapids (AMX): under
            bfloat16 the RSS beyond the allocator's peak grows, against the same float32
            step, by 43 MB at 48x64x48, 0.11-0.15 GB at 96x112x80 (8 and 16 filters alike),
            0.27 GB at 128x160x128 (batch 1 and 2 alike) and 0.35-0.83 GB at 192x224x160:
            about 120 bytes a voxel, i.e. 30 float32 values, the size of oneDNN's copies of
            the thin convolutions' tensors (4 channels in, 3 out) padded to its 16-channel
            blocks. Left out, bf16 was under-predicted by 14% at 64x64x48 and 27% at full
            resolution (and by 6 GB at 2x). Fitted on its own grid of bfloat16 points
            (``calibrate_memory.py``, ``calibration_bf16``); 0 for float32.
        bf16_scratch_knee_voxels, bf16_scratch_bytes_per_voxel_beyond: past ``knee`` voxels
            (full resolution, 192x224x160) the bfloat16 scratch grows by ``..._beyond`` bytes a
            voxel instead of ``bf16_scratch_bytes_per_voxel``: the calibration grid stops at full
            resolution, and beyond it the scratch grows more slowly (a base rule per kind, measured
            on points the calibration never sees: 288x336x240 and 2x; None = the same slope).
            On the Sapphire Rapids (6 filters, ``lms=recompute``): 0.82 GB beyond the allocator at
            full resolution, 1.70 GB at 288x336x240, about 3.7 GB at 2x: 54 bytes a voxel past
            full resolution, where the fitted line's 125-137 predicted 7.57 GB at 2x
            (``docs/measurements/2x_avx512_amx/``).
        bf16_scratch_bytes_per_voxel_filter: on a CPU whose bfloat16 kernels are AVX512-BF16
            without AMX (AMD Zen 4 and 5), what a bfloat16 step holds outside TensorFlow's
            allocator grows with the width too: the scratch is the larger of the per-voxel rule
            above and this many bytes per voxel and base filter. Measured on a Zen 5 (peak RSS
            less the allocator's peak, depth 4, batch 1): 12-16 B at full resolution (6-12
            filters; 8-10 at 16 and 24 filters, whose channels fill oneDNN's blocks), 16.3 at
            288x336x240 (8 filters), 18.9 at 2x (10 filters): 10.4 GB, which the per-voxel rule
            put at 3.5 GB (docs/measurements/2x_zen5/). Applied where the first level's channels
            are not a multiple of 16 (at 16 filters the per-voxel rule predicts within 6%; 24
            filters are over-predicted by 29%, on the safe side). 0 elsewhere (the Sapphire
            Rapids' scratch was the same at 8 and 16 filters).
        inference_scratch_bytes_per_voxel: memory outside TensorFlow's allocator that a
            float32 forward pass holds at its first call (tracing, oneDNN's primitives and
            their scratch, glibc's per-thread arenas), beyond ``runtime_bytes_per_conv``, per
            voxel of the network grid; used by the inference estimate only. 0 on AVX-512,
            whose forward-only estimate measured 9-26% above the allocator's peak. On the
            AVX2-only AMD EPYC (uncalibrated) the first call's RSS peak exceeded the estimate
            without it by -42 to +295 MB over seven shapes and widths (depth 2-4, 4-16
            filters, 0.2-2.3 M voxels; 1.44x at 128x160x112): 130 bytes a voxel is the
            largest excess per voxel of that series. The same points measured again with it
            read 0.71-1.12 of the estimate (one point moves ~20% between runs), the worst
            inside the planning margin. An allowance, not a fit judged on held-out points,
            until the AVX2 preset is calibrated again (docs/measurements/inference_first_call_avx2).
            On the AVX-512 Zen 5 in float32 (mirrored passes one after the other): -90 to +51
            bytes a voxel at 96x112x80 to full resolution (6-16 filters), so 51; held out,
            288x336x240 at 6 and 10 filters (+47 and +61 B a voxel) are then predicted at +1.7%
            and -3.6% (docs/measurements/inference_first_call_zen5/). Under bfloat16 the larger
            of it and the training step's bf16 scratch counts (the latter, on that CPU).
        training_loop_bytes: what a training process holds beyond the benchmark's step
            and the pipeline batches the plan counts (``Workload.input_batches > 0``): the
            input pipeline's threads and buffers, the validation function's graph. Measured
            at 96x112x80, batch 1 (Sapphire Rapids): ``train.py`` peaked 56-95 MB above
            ``benchmark.py`` on the same configuration (depth 3 and 4, 8 and 16 filters,
            float32 and bfloat16), 28 MB of which the plan already counted; the largest
            remainder, 79 MB, rounded up. A constant: not calibrated by the script (its
            points run the benchmark, without a pipeline), so not judged on held-out
            points; it matters at small sizes only (the slow 2x-path test's run was
            under-predicted by up to 14% without it).
        backward_release_lag_layers: how many layers after its own a saved tensor outlives
            in backward, in layers of the block walked backward. TensorFlow frees a saved
            tensor once every backward op reading it has run, and the executor may run a
            layer's weight gradient after the next layer's input gradient. An allocator
            trace of ``dec0``'s backward (depth 3, 12 filters, 64x64x48, batch 2,
            trilinear up-sampling) at its up-sampling layer: the concatenation that the
            convolution two layers later saved is still alive, the convolution output
            that the norm three layers later saved is freed: 2. Matters where an early
            layer of a block has a large backward working set (TrilinearUpSampling3D);
            a very large value gives the block-level count (all saved tensors alive
            through the block's backward), which over-predicted trilinear up-sampling
            at batch 2 by 25%.
        planning_margin: the share of ``lms.limit`` the planner keeps free for its own
            error: a plan fits when its predicted peak is at most ``(1 - planning_margin)
            * lms.limit``. Set by ``calibrate_memory.py`` to the worst under-prediction of
            its leave-one-configuration-out cross-validation (a configuration's peak
            predicted by a fit that did not see it): 11.9% in the shipped Sapphire Rapids
            preset, which the other CPU kinds' presets take as their upper bound (the
            withdrawn per-kind fits had 10.8% on AVX2, 10.6% on AVX-512).
            Without it ``lms=auto`` at full resolution, predicted 3% under its limit,
            measured 6% over it (the allocator pool of a plan mixing kept and rebuilt
            full-resolution blocks; one plan's RSS spread 7.9-9.3 GB over two runs).
            0.1 for an uncalibrated device.
    """

    runtime_bytes: int = 0
    runtime_bytes_per_conv: int = 8_000_000
    runtime_bytes_per_conv_filter: int = 0
    activation_factor: float = 1.0
    workspace_factor: float = 0.0
    norm_upcast_forward_tensors: float = 1.25
    norm_upcast_backward_tensors: float = 2.0
    norm_split_tensors: float = 1.0
    norm_planar_tensors: float = 1.0
    batch_norm_saved_tensors: float = 1.0
    batch_norm_forward_scratch_tensors: float = 1.0
    batch_norm_backward_scratch_tensors: float = 1.0
    trilinear_scratch_factor: float = 2.0
    trilinear_backward_scratch_factor: float = 3.75
    loss_tensors: float = 1.0
    backward_flops_factor: float = 2.0
    rebuild_runtime_bytes: int = 25_000_000
    rebuild_fragmentation: float = 0.15
    conv_weight_grad_scratch: float = 0.0
    bf16_scratch_bytes: int = 0
    bf16_scratch_bytes_per_voxel: float = 0.0
    bf16_scratch_knee_voxels: int = 192 * 224 * 160
    bf16_scratch_bytes_per_voxel_beyond: float | None = None
    bf16_scratch_bytes_per_voxel_filter: float = 0.0
    inference_scratch_bytes_per_voxel: float = 0.0
    training_loop_bytes: int = 80_000_000
    backward_release_lag_layers: int = 2
    planning_margin: float = 0.1

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in OPTIONAL_FIELDS:
                continue
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"MemoryModel.{f.name} must be a number >= 0, got {value!r}.")
        if self.planning_margin >= 0.5:
            raise ValueError(
                f"MemoryModel.planning_margin must be below 0.5 (a share of lms.limit kept free), "
                f"got {self.planning_margin!r}."
            )
        if self.batch_norm_saved_tensors < 1:
            raise ValueError(
                f"MemoryModel.batch_norm_saved_tensors must be >= 1 (a norm layer keeps at least its input), "
                f"got {self.batch_norm_saved_tensors!r}."
            )


#: The per-layer rules of each CPU kind's preset (:func:`brats_seg.cpu.cpu_kind`), before
#: calibration. With AVX-512 (Sapphire Rapids with AMX; Zen 4 without) the defaults of
#: :class:`MemoryModel`. On an AVX2-only CPU (AMD EPYC) oneDNN computes the gradient by
#: weights with its gemm implementation and scratch of its own (``conv_weight_grad_scratch``),
#: a convolution's JIT kernels grow with its width (``runtime_bytes_per_conv_filter``), and a
#: forward pass's first call holds more outside the allocator (``inference_scratch_bytes_per_voxel``).
BASE_PRESETS: dict[str, dict[str, float]] = {
    # past full resolution, from 288x336x240 against full resolution (docs/measurements/2x_avx512_amx/
    # bf16_scratch_scan.jsonl): (1.70 - 0.82) GB over 16.3 M voxels
    "avx512_amx": {"bf16_scratch_bytes_per_voxel_beyond": 54.0},
    # the larger of the per-voxel rule and 16.3 B a voxel and base filter: the Zen 5's largest below 2x
    # (full resolution, 6-24 filters; 288x336x240, 8 filters), its 2x run held out
    "avx512": {
        "bf16_scratch_bytes_per_voxel_filter": 16.3,
        # float32 inference's first call beyond the forward estimate: the largest excess a voxel
        # at full resolution and below on a Zen 5 (6-16 filters), 288x336x240 held out
        # (docs/measurements/inference_first_call_zen5/)
        "inference_scratch_bytes_per_voxel": 51.0,
    },
    "avx2": {
        "conv_weight_grad_scratch": 1.0,
        "runtime_bytes_per_conv_filter": 120_000,
        "rebuild_runtime_bytes": 0,
        "inference_scratch_bytes_per_voxel": 130.0,
    },
}

#: Fields last fitted on a kind whose preset was withdrawn (measured on an earlier model),
#: kept in its safe side until it is calibrated again: an AVX2 EPYC's allocator held 5-25%
#: more than the model's tensors under recompute (``rebuild_fragmentation``), which the
#: calibrated AVX-512 preset does not show (docs/measurements/cpu_avx2_before_fused_norm.json).
PREVIOUS_FITS: dict[str, dict[str, float]] = {
    "avx2": {"activation_factor": 1.0533, "rebuild_fragmentation": 0.7322, "planning_margin": 0.108},
}

#: Where ``scripts/calibrate_memory.py`` writes each kind's measurements and fit
#: (``cpu_<kind>.json``); the fitted fields found there override the base preset.
PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"  # brats_seg/lms/presets: data beside the package


def base_preset(kind: str) -> MemoryModel:
    """The rules of ``kind``'s preset without its fitted fields (what calibration starts from)."""
    return MemoryModel(**BASE_PRESETS[kind])


def _read_preset(kind: str, preset_dir: Path) -> MemoryModel | None:
    """``kind``'s base rules plus the fitted fields of ``preset_dir/cpu_<kind>.json``; None
    without a fitted file (a kind not calibrated with ``calibrate_memory.py``)."""
    path = Path(preset_dir) / f"cpu_{kind}.json"
    if not path.exists():
        return None
    base = base_preset(kind)
    try:
        record = json.loads(path.read_text())
        if "fit" not in record:  # measured, not fitted yet (a calibration under way)
            return None
        fields = record["fit"]["fields"]
        return dataclasses.replace(base, **{k: type(getattr(base, k))(v) for k, v in fields.items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path} is not a memory calibration (fit.fields of MemoryModel): {e}. Re-run "
            f"scripts/calibrate_memory.py fit_only=true, or delete the file to plan with the base preset."
        ) from e


def load_preset(kind: str, preset_dir: Path = PRESET_DIR) -> MemoryModel:
    """``kind``'s preset: the base rules plus the fitted fields of ``preset_dir/cpu_<kind>.json``;
    without that file (or before its fit is written), the base rules alone.

    Raises:
        ValueError: a preset file that is not the calibration's output, naming the file.
    """
    return _read_preset(kind, preset_dir) or base_preset(kind)


def upper_bound(*models: MemoryModel) -> MemoryModel:
    """The field-by-field largest of ``models``: every field raises a prediction (or, the
    planning margin, lowers the budget), so this predicts at least what each of them does."""

    def largest(name: str):
        values = [getattr(m, name) for m in models if getattr(m, name) is not None]
        return max(values) if values else None

    return MemoryModel(**{f.name: largest(f.name) for f in dataclasses.fields(MemoryModel)})


#: The CPU coefficients of the kinds calibrated with ``calibrate_memory.py`` (their files exist).
CPU_MEMORY_MODELS: dict[str, MemoryModel] = {
    kind: model for kind in BASE_PRESETS if (model := _read_preset(kind, PRESET_DIR)) is not None
}


def memory_model_for(device: str, kind: str | None = None) -> MemoryModel:
    """The coefficients for the device a run trains on.

    Args:
        device: ``CPU`` or ``GPU``.
        kind: the CPU's kind (:func:`brats_seg.cpu.cpu_kind`: ``avx512_amx`` | ``avx512`` |
            ``avx2`` | ``other``); detected when None.

    Returns:
        The calibrated preset of the host's kind; for a kind without one (AVX-512 without
        AMX, such as AMD Zen 4, and AVX2-only CPUs, until calibrated with the current model;
        an unknown CPU) the safe side: the field-by-field largest (:func:`upper_bound`) of
        the calibrated presets, of the kind's own rules (:data:`BASE_PRESETS`, with the
        uncalibrated planning margin of 10%) and of the fields last fitted on the kind
        (:data:`PREVIOUS_FITS`). On a GPU the uncalibrated default.
    """
    if device != "CPU":
        return MemoryModel()
    if kind is None:
        from brats_seg.cpu import cpu_kind

        kind = cpu_kind()
    if kind in CPU_MEMORY_MODELS:
        return CPU_MEMORY_MODELS[kind]
    rules = base_preset(kind) if kind in BASE_PRESETS else MemoryModel()
    previous = [dataclasses.replace(rules, **PREVIOUS_FITS[kind])] if kind in PREVIOUS_FITS else []
    return upper_bound(rules, *previous, *CPU_MEMORY_MODELS.values())
