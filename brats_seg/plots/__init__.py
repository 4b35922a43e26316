"""brats_seg.plots: the project's figures, as PNG files (matplotlib without a display).

::

    common      matplotlib's file-only backend, one colour per region, the atomic PNG writer
    training    plot_training_curves: loss and Dice per region per epoch, training and
                validation (<run_dir>/training_curves.png, redrawn each epoch)
    evaluation  plot_case_scores: each case's Dice and HD95 per region
                (eval/<split>/per_case.png beside summary.json)
    benchmark   plot_benchmark_sweep (throughput, memory, FLOP/s), plot_width_sweep and plot_resolution_study
    study       plot_study: a study's arms (brats_seg.evaluation.studies.study) compared: validation
                Dice against training time, throughput, metrics per evaluated set, and
                plot_resolution_study's chart when the arms differ in resolution

Each function takes plain values (history rows, arrays, JSON records), never a model or a
config, writes one PNG through a temporary name and returns its path; nothing here imports
TensorFlow, and the run folder decides where figures go (:class:`brats_seg.run_dir.RunFolder`).
"""

from brats_seg.plots.benchmark import plot_benchmark_sweep, plot_resolution_study, plot_step_time_fit, plot_width_sweep
from brats_seg.plots.evaluation import plot_case_scores
from brats_seg.plots.study import plot_study
from brats_seg.plots.training import plot_training_curves

__all__ = [
    "plot_benchmark_sweep",
    "plot_case_scores",
    "plot_resolution_study",
    "plot_step_time_fit",
    "plot_study",
    "plot_training_curves",
    "plot_width_sweep",
]
