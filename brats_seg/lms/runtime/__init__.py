"""The LMS runtime, TensorFlow: carrying out a plan inside the training step, and measuring it.

::

    offload            BlockWrapper: runs each U-Net block as the plan says (keep; recompute in
                       backward; offload its inputs to host memory and prefetch them back),
                       through tf.custom_gradient
    passes             the bookkeeping of one forward pass of the wrapper (per graph and thread)
    recompute_safety   what makes a block unsafe to run twice (state writes, random ops, XLA),
                       refused with the fix
    saved_tensors      what a traced step really keeps for backward: names, dtypes, bytes (the
                       planner's rules are tested against it)
    stats              peak memory per epoch (GPU allocator, CPU peak RSS), OffloadStats (bytes
                       moved and FLOPs recomputed per step) and the callback that logs them

The modules import TensorFlow at their top, so nothing is imported here: import them after
:func:`brats_seg.backend.configure`. The runtime takes the planner's names (POLICIES); the
planner never imports the runtime.
"""
