"""Backends: environment first, TensorFlow second.

oneDNN, thread pools, the GPU allocator and the log level only take effect if set before
TensorFlow is imported. Entry points therefore call :func:`configure` before anything
imports tensorflow; it sets the environment, then imports TensorFlow and applies the
runtime switches (threads, memory growth, mixed-precision policy). Which backend, device,
precision and XLA a process uses is decided in one function, :func:`decide_backend` (``auto``
picks a GPU if one is visible, else ``cpu_onednn``, and says why), called once per start by
:func:`brats_seg.resolve.resolve_run` (training, planning) or
:func:`brats_seg.resolve.resolve_inference` (evaluate, predict, export) before TensorFlow is
imported. :func:`configure` applies that decision and checks that TensorFlow agrees (a GPU
decided on ``nvidia-smi``'s word must be one TensorFlow sees); it decides nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from brats_seg.config import BackendConfig
from brats_seg.model.checks import PRECISION_POLICIES  # backend.precision -> Keras policy

__all__ = [
    "PRECISION_POLICIES",
    "BackendError",
    "ResolvedBackend",
    "applied_backend",
    "check_precision",
    "concrete_backend",
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
    """The backend decided for a process (:func:`decide_backend`); :func:`configure` applies it.

    Attributes:
        name: cpu_onednn | gpu | gpu_lms (never auto).
        device: ``GPU`` or ``CPU``.
        precision: fp32 | fp16 | bf16.
        policy: the Keras dtype policy (float32, mixed_float16, mixed_bfloat16).
        n_gpus: visible GPUs.
        intra_op_threads, inter_op_threads: thread pools.
        reason: why ``auto`` chose this backend (empty otherwise).
        xla: XLA auto-clustering on (``backend.xla=true`` on a GPU, without LMS: XLA would drop
            the host placements of recomputed or offloaded blocks).
        settings: the ``backend`` group it was decided from (what :func:`configure` applies:
            oneDNN, log level, memory growth, a GPU cap).
    """

    name: str
    device: str
    precision: str
    policy: str
    n_gpus: int
    intra_op_threads: int
    inter_op_threads: int
    reason: str = ""
    xla: bool = False
    settings: BackendConfig = field(default_factory=BackendConfig, compare=False, repr=False)


def physical_cores() -> int:
    """The physical cores this process may use (its affinity and its cgroup's CPU quota; hyper-threads
    excluded), at least 1: :func:`brats_seg.cpu.usable_cores`."""
    from brats_seg.cpu import usable_cores

    return usable_cores()


def configure_environment(backend: ResolvedBackend) -> None:
    """Set the environment switches of ``backend`` that TensorFlow reads at import. Imports nothing heavy."""
    cfg = backend.settings
    if "tensorflow" in sys.modules:
        if _applied is None:
            log.warning("TensorFlow was imported before backend.configure: oneDNN/thread/log switches may not apply")
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", str(cfg.log_level))
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if cfg.onednn else "0"
    if backend.device == "CPU":
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # a CPU run stays on the CPU even on a GPU box
    os.environ.setdefault("OMP_NUM_THREADS", str(backend.intra_op_threads))
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if backend.xla:
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
        raise BackendError(
            "backend.precision=fp16 needs a GPU; on CPU use fp32 (or bf16 on a CPU with AMX/AVX512-BF16)."
        )
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
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
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


def concrete_backend(name: str, gpus: int) -> tuple[str, str]:
    """``(name, reason)``: ``auto`` made concrete (a GPU if one is visible, else ``cpu_onednn``,
    and why); any other name as it is, with no reason."""
    name = str(getattr(name, "value", name))
    if name != "auto":
        return name, ""
    return ("gpu", f"{gpus} GPU(s) visible") if gpus else ("cpu_onednn", "no GPU visible")


def decide_backend(
    cfg: BackendConfig, gpus: int | None = None, cpuinfo: str | None = None, *, require_gpu: bool = True
) -> ResolvedBackend:
    """The backend, device, precision policy and XLA a process runs under, and why: the one
    place they are decided (a run's LMS may still turn ``gpu`` into ``gpu_lms``, without XLA:
    :func:`brats_seg.resolve.resolve_run`).

    Args:
        cfg: the ``backend`` group, its values checked (:func:`brats_seg.checks.check_backend_config`,
            which :func:`brats_seg.checks.check_train_config` and :func:`brats_seg.resolve.resolve_inference` call).
        gpus: the GPUs visible; None counts them (:func:`visible_gpus`).
        cpuinfo: ``/proc/cpuinfo`` text to judge bf16 support by (tests); None reads the host's.
        require_gpu: False to decide for a GPU this machine lacks (planning a GPU run on a laptop:
            ``scripts/plan_memory.py backend=gpu_lms``).

    Raises:
        BackendError: ``gpu``/``gpu_lms`` without a visible GPU; a precision the device cannot
            train in (:func:`check_precision`).
    """
    precision = str(getattr(cfg.precision, "value", cfg.precision))
    name = str(getattr(cfg.name, "value", cfg.name))
    gpus = visible_gpus() if gpus is None else gpus
    name, reason = concrete_backend(name, gpus)
    if name in ("gpu", "gpu_lms") and not gpus and require_gpu:
        raise BackendError(
            f"backend={name} needs a GPU, and none is visible here. Use backend=cpu_onednn "
            "(with lms=recompute to fit a RAM budget), or check the CUDA install (pip install -c requirements.lock '.[gpu]')."
        )
    device = "GPU" if name != "cpu_onednn" else "CPU"
    check_precision(precision, device, cpuinfo)
    return ResolvedBackend(
        name=name,
        device=device,
        precision=precision,
        policy=PRECISION_POLICIES[precision],
        n_gpus=gpus,
        intra_op_threads=cfg.intra_op_threads or physical_cores(),
        inter_op_threads=cfg.inter_op_threads,
        reason=reason,
        xla=bool(cfg.xla) and name == "gpu",
        settings=cfg,
    )


#: The backend :func:`configure` last applied (a second call in one process re-applies the policy only).
_applied: ResolvedBackend | None = None


def applied_backend() -> ResolvedBackend | None:
    """The backend :func:`configure` applied in this process (None before it has)."""
    return _applied


def configure(backend: ResolvedBackend) -> ResolvedBackend:
    """Apply the decided ``backend``: set the environment, import TensorFlow, apply threads,
    memory growth, a GPU cap and the precision policy; then check TensorFlow agrees.

    Returns:
        ``backend``, as decided.

    Raises:
        BackendError: the decision is a GPU run but TensorFlow sees no GPU (``nvidia-smi`` lists
            one, TensorFlow's CUDA libraries do not load it).
    """
    global _applied
    if backend == _applied and "tensorflow" in sys.modules:
        return backend  # applied already (train.py configured before train() checks)
    configure_environment(backend)
    import keras
    import tensorflow as tf

    cfg = backend.settings
    try:
        tf.config.threading.set_intra_op_parallelism_threads(backend.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(backend.inter_op_threads)
    except RuntimeError:
        if _applied is None:
            log.warning("TensorFlow already initialised; thread pools left as they are")
    gpus = tf.config.list_physical_devices("GPU")
    if backend.device == "GPU" and not gpus:
        raise BackendError(
            f"backend {backend.name} was decided for {backend.n_gpus} GPU(s) (nvidia-smi), but TensorFlow sees "
            "none: its CUDA libraries did not load. Check the CUDA install (pip install -c requirements.lock "
            "'.[gpu]'), or use backend=cpu_onednn."
        )
    if backend.device == "GPU" and len(gpus) != backend.n_gpus:
        log.warning(
            "nvidia-smi lists %d GPU(s), TensorFlow sees %d: distribute=mirrored uses TensorFlow's",
            backend.n_gpus,
            len(gpus),
        )
    if gpus and cfg.gpu_memory_limit_mb > 0 and _applied is None:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=cfg.gpu_memory_limit_mb)]
        )
        log.info("GPU 0 limited to %d MB (backend.gpu_memory_limit_mb)", cfg.gpu_memory_limit_mb)
    for gpu in gpus:
        if cfg.memory_growth and cfg.gpu_memory_limit_mb <= 0:
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:
                log.warning("GPUs already initialised; memory growth left as it is")
    keras.mixed_precision.set_global_policy(backend.policy)
    log.info(
        "backend %s on %s, policy %s, %d intra-op threads%s",
        backend.name,
        backend.device,
        backend.policy,
        backend.intra_op_threads,
        ", XLA auto-clustering" if backend.xla else "",
    )
    _applied = backend
    return backend
