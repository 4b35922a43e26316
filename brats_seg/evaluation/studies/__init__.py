"""Studies: many runs of one recipe compared, each arm's mean ± std over seeds.

::

    study       a sweep's runs grouped into arms, mean ± std over seeds, time to a given
                validation Dice: compute_study, compute_run_record, format_study_markdown
                (plain values: no run folder, no TensorFlow)
    study_run   a study's run folders found, evaluated where a set is missing, read, written,
                drawn and logged: run_study (scripts/study.py), and run_logged, the one way a
                driver runs a command into a log
    demo_seeds  make demo's recipe trained and evaluated per seed, mean ± std: run_demo_seeds
                (scripts/demo_seeds.py)

study_run reads the run folders into study's plain records and draws them with
brats_seg.plots.study; demo_seeds runs its commands through study_run.run_logged. Both run
train.py and scripts/evaluate.py as commands in the project's folder
(:func:`brats_seg.project.project_dir`), each a normal run folder, so nothing here imports the
rest of evaluation: a study is the top floor, reading what evaluations wrote.
"""
