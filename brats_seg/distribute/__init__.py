"""brats_seg.distribute: ``distribute=none|mirrored|multi_worker`` (tf.distribute).

How the parts fit: :mod:`~brats_seg.distribute.cluster` is the type (a :class:`Cluster`: the
workers' ``host:port`` list and this process's index) and its checks; :mod:`~.resolve` works
out the cluster of a ``multi_worker`` run from the command line, ``TF_CONFIG`` or, through
:mod:`~.slurm`, the SLURM environment; all three are plain Python, so a bad worker list fails
before TensorFlow loads. :mod:`~.strategy` then builds the ``tf.distribute.Strategy``
(one device, mirrored devices, or the resolved cluster) that training runs its one step under.
"""

from brats_seg.distribute.cluster import Cluster, ClusterError, ClusterFailure, PortInUseError, free_local_ports
from brats_seg.distribute.resolve import resolve_cluster

__all__ = ["Cluster", "ClusterError", "ClusterFailure", "PortInUseError", "free_local_ports", "resolve_cluster"]
