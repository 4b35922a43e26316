"""Large Model Support: fit a 3D U-Net's training step into a memory budget, planned then run.

Two subpackages, one rule between them:

- :mod:`brats_seg.lms.planner` never imports TensorFlow. It prices the U-Net that
  :mod:`brats_seg.model.topology` describes, simulates one training step's memory and
  time, and chooses per block ``keep | recompute | offload`` so the predicted peak fits
  ``lms.limit`` less the preset's planning margin. ``train.py``, ``scripts/plan_memory.py``,
  evaluation and prediction ask it before anything is built.
- :mod:`brats_seg.lms.runtime` is TensorFlow: the block wrapper that carries a plan out
  (``tf.custom_gradient``, host copies), the checks that refuse a block unsafe to
  recompute, what a traced step really keeps, and the memory statistics of a run.

Arrows point from runtime to planner (the wrapper takes the planner's policy names), never
back. ``presets/cpu_<kind>.json`` are the calibrated coefficients per CPU kind that
:mod:`brats_seg.benchmark.memory_calibration` (``scripts/calibrate_memory.py``, a measurement of
this machine, above the planner) measures, fits and writes and
:mod:`brats_seg.lms.planner.memory_model` reads.
Nothing is imported here, so importing the planner never pulls in TensorFlow.
"""
