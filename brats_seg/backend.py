"""Backends: environment first, TensorFlow second.

oneDNN, thread pools, the GPU allocator and the log level only take effect if set before
TensorFlow is imported. Entry points therefore call :func:`configure` before anything
imports tensorflow; it sets the environment, then imports TensorFlow and applies the
runtime switches (threads, memory growth, mixed-precision policy), and returns what it
resolved. Which backend, device and precision a run uses is decided in one function,
:func:`decide_backend` (``auto`` picks a GPU if one is visible, else ``cpu_onednn``, and says
why): :func:`configure` calls it with the GPUs TensorFlow sees, and code that must decide
before TensorFlow is imported (the planner's entry points, evaluation's precision) calls it
with :func:`visible_gpus`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from brats_seg.choices import check_choice
from brats_seg.config import BackendConfig, BackendName, Precision
from brats_seg.model.checks import PRECISION_POLICIES  # backend.precision -> Keras policy

__all__ = [
    "PRECISION_POLICIES",
    "BackendError",
    "ResolvedBackend",
    "check_precision",
    "configure",
    "configure_environment",
    "decide_backend",
    "device_memory_bytes",
    "physical_cores",
    "visible_gpus",
]

log = logging.getLogger(__name__)



class BackendError(RuntimeError):
    """The requested backend cannot run here; the message says which one can."""


@dataclass(frozen=True)
class ResolvedBackend:
    """What :func:`configure` set up.

    Attributes:
        name: cpu_onednn | gpu | gpu_lms (never auto).
        device: ``GPU`` or ``CPU``.
        precision: fp32 | fp16 | bf16.
        policy: the Keras dtype policy (float32, mixed_float16, mixed_bfloat16).
        n_gpus: visible GPUs.
        intra_op_threads, inter_op_threads: thread pools.
        reason: why ``auto`` chose this backend (empty otherwise).
    """

    name: str
    device: str
    precision: str
    policy: str
    n_gpus: int
    intra_op_threads: int
    inter_op_threads: int
    reason: str = ""


def physical_cores() -> int:
    """Physical CPU cores (hyper-threads excluded), at least 1."""
    import psutil

    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)


def configure_environment(cfg: BackendConfig) -> None:
    """Set the environment switches that TensorFlow reads at import. Imports nothing heavy."""
    check_choice(cfg.precision, Precision, "backend.precision", error=BackendError)
    check_choice(cfg.name, BackendName, "backend", error=BackendError)
    if "tensorflow" in sys.modules:
        log.warning("TensorFlow was imported before backend.configure: oneDNN/thread/log switches may not apply")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", str(cfg.log_level))
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if cfg.onednn else "0"
    if cfg.name == "cpu_onednn":
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # a CPU run stays on the CPU even on a GPU box
    threads = cfg.intra_op_threads or physical_cores()
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if cfg.xla and cfg.name == "gpu":
        os.environ.setdefault("TF_XLA_FLAGS", "--tf_xla_auto_jit=2")


def check_precision(precision: str, device: str, cpuinfo: str | None = None) -> None:
    """Refuse a precision the device cannot train in, before any model is built.

    Args:
        precision: ``backend.precision`` (fp32 | fp16 | bf16).
        device: ``CPU`` or ``GPU``.
        cpuinfo: ``/proc/cpuinfo`` text to judge (tests); None reads the host's.

    Raises:
        BackendError: fp16 on a CPU, or bf16 on a CPU without native bfloat16, saying why and what to use.
    """
    if device != "CPU":
        return
    if precision == "fp16":
        raise BackendError("backend.precision=fp16 needs a GPU; on CPU use fp32 (or bf16 on a CPU with AMX/AVX512-BF16).")
    if precision == "bf16":
        from brats_seg.cpu import cpu_model_name, has_native_bf16

        if not has_native_bf16(cpuinfo):
            raise BackendError(
                f"backend.precision=bf16 needs a CPU that computes bfloat16 natively (AVX512-BF16 or AMX-BF16); "
                f"this one ({cpu_model_name(cpuinfo)}) does not, so oneDNN refuses bf16 and TensorFlow falls back "
                "to its Eigen kernels, which are many times slower and, for a 3D convolution's input gradient, "
                "allocate an im2col buffer of voxels x 27 x channels (11.9 GB for one layer at full resolution, "
                "enough to end the run in an out-of-memory error). Use backend.precision=fp32 here; with "
                "lms=recompute (or lms=auto and lms.limit) it fits the same budgets bf16 would."
            )


def device_memory_bytes(device: str, gpu_memory_limit_mb: int = 0) -> int:
    """Total memory of GPU 0 (via nvidia-smi, or the configured cap) or, on CPU, the memory available
    now (RAM, or the memory cgroup's room if that is less), in bytes."""
    if device == "GPU" and gpu_memory_limit_mb > 0:
        return gpu_memory_limit_mb * 1024 * 1024
    if device == "GPU" and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout
            return int(out.split()[0]) * 1024 * 1024
        except (subprocess.SubprocessError, ValueError, IndexError):
            log.warning("nvidia-smi did not report GPU memory; assuming 16 GB")
            return 16 * 1024**3
    from brats_seg.memory import available_memory_bytes

    return available_memory_bytes()  # a job's or container's memory cgroup may allow less than the machine has


def visible_gpus() -> int:
    """The GPUs this process can use: TensorFlow's count once it is imported, else ``nvidia-smi -L``'s
    (within ``CUDA_VISIBLE_DEVICES``; ``-1`` or empty hides them all), without importing TensorFlow."""
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        return len(tf.config.list_physical_devices("GPU"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.strip().startswith("-1")):
        return 0
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return 0
    gpus = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return min(gpus, len([v for v in visible.split(",") if v.strip()])) if visible else gpus


def decide_backend(cfg: BackendConfig, gpus: int, cpuinfo: str | None = None, *,
                   require_gpu: bool = True) -> ResolvedBackend:
    """The backend, device and precision policy a process runs under, and why: the one place
    they are decided.

    Args:
        cfg: the ``backend`` group.
        gpus: the GPUs visible (:func:`visible_gpus`, or TensorFlow's list in :func:`configure`).
        cpuinfo: ``/proc/cpuinfo`` text to judge bf16 support by (tests); None reads the host's.
        require_gpu: False to decide for a GPU this machine lacks (planning a GPU run on a laptop:
            ``scripts/plan_memory.py backend=gpu_lms``).

    Raises:
        BackendError: an unknown name or precision; ``gpu``/``gpu_lms`` without a visible GPU; a
            precision the device cannot train in (:func:`check_precision`).
    """
    check_choice(cfg.precision, Precision, "backend.precision", error=BackendError)
    name = str(check_choice(cfg.name, BackendName, "backend", error=BackendError))
    reason = ""
    if name == "auto":
        name = "gpu" if gpus else "cpu_onednn"
        reason = f"{gpus} GPU(s) visible" if gpus else "no GPU visible"
    if name in ("gpu", "gpu_lms") and not gpus and require_gpu:
        raise BackendError(
            f"backend={name} needs a GPU, and none is visible here. Use backend=cpu_onednn "
            "(with lms=recompute to fit a RAM budget), or check the CUDA install (pip install -c requirements.lock '.[gpu]')."
        )
    device = "GPU" if name != "cpu_onednn" else "CPU"
    check_precision(str(cfg.precision), device, cpuinfo)
    return ResolvedBackend(name=name, device=device, precision=str(cfg.precision),
                           policy=PRECISION_POLICIES[str(cfg.precision)], n_gpus=gpus,
                           intra_op_threads=cfg.intra_op_threads or physical_cores(),
                           inter_op_threads=cfg.inter_op_threads, reason=reason)


def configure(cfg: BackendConfig) -> ResolvedBackend:
    """Set the environment, import TensorFlow, apply threads/memory growth/precision.

    Raises:
        BackendError: ``gpu``/``gpu_lms`` without a visible GPU, or a precision the chosen
            device cannot train in (:func:`check_precision`).
    """
    configure_environment(cfg)
    import keras
    import tensorflow as tf

    threads = cfg.intra_op_threads or physical_cores()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(cfg.inter_op_threads)
    except RuntimeError:
        log.warning("TensorFlow already initialised; thread pools left as they are")
    gpus = tf.config.list_physical_devices("GPU")
    resolved = decide_backend(cfg, len(gpus))  # the decision, from what TensorFlow sees
    if resolved.reason:
        log.info("backend=auto chose %s (%s)", resolved.name, resolved.reason)
    if gpus and cfg.gpu_memory_limit_mb > 0:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=cfg.gpu_memory_limit_mb)])
        log.info("GPU 0 limited to %d MB (backend.gpu_memory_limit_mb)", cfg.gpu_memory_limit_mb)
    for gpu in gpus:
        if cfg.memory_growth and cfg.gpu_memory_limit_mb <= 0:
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:
                log.warning("GPUs already initialised; memory growth left as it is")
    keras.mixed_precision.set_global_policy(resolved.policy)
    log.info("backend %s on %s, policy %s, %d intra-op threads", resolved.name, resolved.device, resolved.policy,
             resolved.intra_op_threads)
    return resolved
