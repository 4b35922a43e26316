"""Evaluation and prediction, scored the way BraTS scores, always on the native grid.

::

    run          a trained run as inference sees it: its config, checkpoint, model, device,
                 precision, and the memory check before loading
    sliding      inference of one image on the network grid: whole volume or Gaussian windows
                 (MODES), with test-time mirroring
    predict      a case's probabilities back on its native grid, thresholded, nested, saved
    metrics      legacy BraTS metrics (Dice, HD95, sensitivity, specificity)
    lesionwise   the lesion-wise definitions BraTS ranks by since 2023
    scoring      every metric of a case from the label map that is written
    table        metrics.csv, summary.json and the printed summary
    overlays     contours on three orthogonal slices, for people to look at
    evaluate     a run's held-out split end to end: evaluate_run

Files go to the run folder's eval/<split>/ (:class:`brats_seg.run_dir.RunFolder`).
"""
