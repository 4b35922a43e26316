"""Training a run: from prepared data to checkpoints, resumable at any moment.

::

    loop          train(): the conductor: checks -> strategy -> lock -> plan -> data -> run
                  folder (and its train.log) -> model -> resume -> the epoch loop -> tracking,
                  and what ends it (finished, early stop, preempted, a lost worker, out of memory)
    checks        every config value, checked before anything is prepared or written
    build         the optimizer and its schedule, the backend and LMS strategy the run trains
                  under with its memory plan (decided in one function, with the reason), the
                  models and their compilation
    checkpoint    the run folder as training uses it: start or resume, refuse a changed
                  config, restore last.keras and the position it was saved at
    steps         the compiled training and evaluation steps (one strategy.run each)
    epochs        the step loop over epochs and validation, partial epochs on a signal
    losses        soft Dice + BCE on nested or independent region outputs
    metrics       Dice per region and the region monitors
    callbacks     checkpoints with resume state, early stopping, tracking, dead regions
    preemption    SIGTERM/SIGINT: finish the step, save, exit resumably
    oom           training's hooks into brats_seg.oom (which turns ResourceExhaustedError/MemoryError
                  into OutOfMemoryError and tells a kernel OOM kill on the next start): the
                  callback that keeps the lock record at the run's position, and the warning
                  that logs a dead run's diagnosis
    cluster_sync  a multi-worker cluster's workers follow the chief's position

Files go through :class:`brats_seg.run_dir.RunFolder`. Modules that need TensorFlow import it
(loop, steps, epochs, callbacks) or import it inside their functions (build, checkpoint):
entry points import them after :func:`brats_seg.backend.configure`.
"""
