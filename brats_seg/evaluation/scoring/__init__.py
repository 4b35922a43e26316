"""Scoring label maps the way BraTS scores them: no model, no TensorFlow, no run folder.

::

    score              every metric of a case from the label map that is written: score_case (evaluate's),
                       score_masks (scripts/score.py: folders of existing masks), load_reference
    metrics            legacy BraTS metrics (Dice, HD95, sensitivity, specificity): compute_case_metrics
    lesionwise         the lesion-wise definitions BraTS ranks by since 2023, both at once:
                       compute_lesionwise_metrics
    panoptica_metrics  BraTS 2025+ lesion-wise, NSD and detection metrics by panoptica, as the
                       official evaluation computes them: compute_panoptica_metrics
    lesion23           BraTS 2023/2024 lesion-wise Dice and HD95: compute_lesion23_metrics,
                       lesion23_params_for
    lesion_input       the label-map pair both lesion-wise definitions accept, and LesionwiseError
    table              metrics.csv, summary.json and the printed summary: MetricsTable,
                       metric_columns, format_summary_table
    official_cases     the designed multi-lesion cases score.py is checked on against the official
                       BraTS code (scripts/check_official_metrics.py; the small ones are test data)

A case is scored by score.score_case, which calls metrics for the legacy columns and lesionwise
for the lesion-wise ones, and returns one row of table's columns; lesionwise runs panoptica_metrics and
lesion23, which share only lesion_input, so neither definition imports the other. Label maps are
``(x, y, z)`` in RAS in the layout's own values, on the reference file's grid. This is the bottom
floor of brats_seg.evaluation: it imports nothing of evaluation outside itself (post-processing
scores its candidate rules with metrics and lesion23; everything else reads the table).
"""
