"""Measurements of this machine: what the scripts that time and weigh things call.

::

    step       the training step as train.py runs it, timed, its memory measured beside the
               planner's predictions: build_benchmark_step, run_benchmark (scripts/benchmark.py)
    sweep      a grid of benchmark overrides (configs/benchmark_sweeps/), each point in a fresh
               process, JSON lines and figures: load_sweep_spec, run_sweep
    onednn     oneDNN's verbose lines caught and summed per primitive: capture_stdout,
               onednn_profile, onednn_seconds
    profile    where a step's time goes, in a child process: profile_child, read_profile
               (scripts/profile_step.py)
    inference  whole-volume inference's first-call memory against the planner's estimate:
               measure_inference_peak (scripts/measure_inference_peak.py)
    augment    what each transform of the nnunet augmentation preset costs a volume:
               profile_augment (scripts/profile_augment.py)
    scaling    data-parallel workers against one process on the same cores: measure_scaling
               (scripts/scaling.py)
    memory_calibration
               the planner's CPU memory preset measured (benchmark points in processes of
               their own), fitted and judged on points not fitted: calibrate, predict
               (scripts/calibrate_memory.py)

Each measurement that needs a process of its own (its own peak RSS, oneDNN's environment set
before TensorFlow loads, a worker of a cluster) is started by its caller with the command it is
given; TensorFlow is imported inside functions, after :func:`brats_seg.backend.configure`.
Nothing here is imported by training, evaluation or the planner.
"""
