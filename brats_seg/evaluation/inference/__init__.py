"""Inference: a trained run's model turned into label maps on each case's native grid.

::

    run       a trained run as inference sees it: its config, checkpoint, model and the device
              it was configured for (the memory check before loading is brats_seg.oom_inference's):
              load_run_config, load_run_model, inference_settings, check_evaluate_config, RunError
    start     the TensorFlow-free start evaluate.py and predict.py share: check_run_dir, and
              start_inference (the run, its inference settings, the backend resolve_inference decided)
    entries   a run's cases: split_case_ids, prepare_run_entries (their cache entries)
    sliding   inference of one image on the network grid: whole volume or Gaussian windows
              (evaluate.mode), with test-time mirroring: predict_volume
    predict   a case's probabilities back on its native grid, thresholded, nested, post-processed
              and saved: predict_case_native, predict_case_labels; new cases predicted where a
              stopped prediction left off (predict.json): predict_new_cases

run loads the model and says which window sliding uses; predict runs sliding on a preprocessed
case, undoes the crop, resamples and thresholds, and applies the rules of
brats_seg.evaluation.postprocess (and draws brats_seg.evaluation.overlays when asked). Nothing
here scores: evaluate and postprocess_run (above) score what predict returns, and serving/
(above) exports the model run loads. TensorFlow and Keras are imported inside functions, after
``brats_seg.backend.configure``.
"""
