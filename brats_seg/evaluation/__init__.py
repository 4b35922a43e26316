"""Evaluation and prediction, scored the way BraTS scores, always on the native grid.

Its rooms, bottom floor first (a room imports only rooms below it; tests/unit/test_layout.py)::

    scoring/           label maps scored as BraTS scores them, no model: every metric of a case
                       (score_case, score_masks: scripts/score.py), legacy, lesion-wise 2023/2024
                       and 2025+ (panoptica) metrics, metrics.csv and summary.json (MetricsTable)
    postprocess        rules for a predicted label map (small components, small ET as necrosis)
                       and how they are chosen on validation cases: PostProcessing,
                       choose_postprocessing (no TensorFlow, no run folder)
    overlays           contours on three orthogonal slices, for people to look at
    inference/         a trained run's model turned into label maps on each case's native grid: the
                       run loaded (run), its cases (entries), whole or sliding windows (sliding), the
                       native-grid label map saved, resumable (predict: scripts/predict.py)
    postprocess_run    the run's postprocess.json read back, or chosen on its val split and written:
                       postprocessing_for_run
    serving/           a run's model outside brats_seg: a SavedModel and its preprocessing.json
                       (export), read back for predict.py (exported), logged to MLflow as a pyfunc
                       model that loads without brats_seg (mlflow_model)
    evaluate           a run's held-out split end to end: evaluate_run (scripts/evaluate.py),
                       continuing where a stopped evaluation left off (each case's record in
                       eval/<split>/cases/)
    studies/           many runs of one recipe compared: a sweep's runs as arms, mean ± std over
                       seeds (study), its driver (study_run: scripts/study.py), make demo's recipe
                       over seeds (demo_seeds)

Each subpackage's ``__init__`` is its own map. evaluate takes a split's cache entries
(inference.entries), predicts each case (inference.predict, with the rules postprocess_run chose
on the val split), scores the label map that is written (scoring.score.score_case), and writes
the table, per-case records, figures and overlays to the run folder's eval/<split>/
(:class:`brats_seg.run_dir.RunFolder`). An export carries the run's config in its
preprocessing.json, so predicting with it (serving.exported) goes through inference.predict as
the run does. Studies run train.py and scripts/evaluate.py as commands and read what they wrote.
Nothing here imports TensorFlow at module level.
"""
