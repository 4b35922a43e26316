"""The 3D U-Net: one description, and the Keras model made from it.

::

    topology   the one description of the U-Net (blocks enc{l}, bottleneck, dec{l}, head; their
               layers, tensors and dtypes): the model is built from it and the LMS planner
               prices it, so the two cannot disagree
    unet3d     the Keras model, block by block, each block callable through a wrapper (how LMS
               recomputes or offloads it)
    norm       instance and group normalisation that keep only their input, in its own dtype,
               for backward (oneDNN's fused kernel underneath)
"""
