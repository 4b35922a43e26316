"""Evaluation and prediction, scored the way BraTS scores, always on the native grid.

::

    inference/         a trained run's model turned into label maps on each case's native grid: the run
                       loaded (run), its cases (entries), whole or sliding windows (sliding), the
                       native-grid label map saved, resumable (predict); its __init__ is its map
    scoring/           label maps scored as BraTS scores them (legacy, lesion-wise 2023/2024 and
                       2025+ by panoptica), metrics.csv and summary.json: score_case, score_masks,
                       MetricsTable; its __init__ is its map
    overlays           contours on three orthogonal slices, for people to look at
    postprocess        rules for a predicted label map (small components, small ET as necrosis)
                       and how they are chosen on validation cases: PostProcessing,
                       choose_postprocessing (no TensorFlow, no run folder)
    postprocess_run    the run's postprocess.json read back, or chosen on its val split and written:
                       postprocessing_for_run
    evaluate           a run's held-out split end to end: evaluate_run, continuing where a stopped
                       evaluation left off (each case's record in eval/<split>/cases/)
    studies/           many runs of one recipe compared: a sweep's runs as arms, mean ± std over seeds
                       (study), its driver (study_run: scripts/study.py), make demo's recipe over
                       seeds (demo_seeds); its __init__ is its map
    serving/           a run's model outside brats_seg: a SavedModel and its preprocessing.json
                       (export), read back for predict.py (exported), logged to MLflow as a pyfunc
                       model (mlflow_model); its __init__ is its map

A case is scored by scoring.score.score_case (scoring/ imports nothing else of evaluation). Files go to the run
folder's eval/<split>/ (:class:`brats_seg.run_dir.RunFolder`). An export carries the run's config in
its preprocessing.json, so predicting with it (exported) goes through predict as the run does.
"""
