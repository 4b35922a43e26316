"""The 3D U-Net: one description, the rules it follows, and the Keras model made from it.

::

    checks     the rules a model config, input shape, batch size and dtype policy follow
               (check_unet_config, check_model_config, check_input_shape, check_policy,
               DTYPE_POLICIES): each bad value named once, with what to use instead
    topology   the one description of the U-Net (blocks enc{l}, bottleneck, dec{l}, head; their
               layers, tensors and dtypes; unet_topology, UNetTopology): the model is built from
               it and the LMS planner prices it, so the two cannot disagree
    unet3d     the Keras model, block by block, each block callable through a wrapper (how LMS
               recomputes or offloads it)
    norm       instance and group normalisation that keep only their input, in its own dtype,
               for backward (oneDNN's fused kernel underneath)

checks and topology are pure Python (the planner in brats_seg.lms.planner imports them and
never TensorFlow); topology applies checks before it describes a network, and unet3d, the
only module here that imports Keras, reads both: it checks the config and the input shape,
then makes one Keras layer per layer of the topology.
"""
