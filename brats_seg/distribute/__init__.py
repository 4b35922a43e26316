"""brats_seg.distribute: ``distribute=none|mirrored|multi_worker`` (tf.distribute).

``cluster`` works out who the workers are (worker list, ``TF_CONFIG`` or the SLURM
environment) in plain Python; ``strategy`` builds the ``tf.distribute.Strategy``.
"""
