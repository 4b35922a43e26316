"""The step functions of training: one ``strategy.run`` step for every ``distribute=`` strategy.

Keras 3's ``model.fit`` does not run under ``MultiWorkerMirroredStrategy`` with TF 2.21, so
training is this ``tf.function`` around ``strategy.run``, single device
(``OneDeviceStrategy``) included: one code path for one device, several devices and several
machines.

Per step every replica computes its per-sample losses ``(b,)`` on its share ``b`` of the
global batch ``B`` and differentiates ``sum(losses) / B`` (``tf.nn.compute_average_loss``).
The Keras optimizer sums the replicas' gradients, so the update is that of the mean loss
over the global batch: the same update as one device training on the whole batch.
Metric values (per sample, see :meth:`brats_seg.training.metrics.make_dice_metrics`) are
summed over replicas with their count and accumulated per epoch on the host
(:class:`EpochSums`), exact under any split of the batch.

Evaluation runs outside ``strategy.run`` on the local device, every worker over every
validation case: no collective, and every worker gets the same numbers (so early stopping
is decided alike everywhere).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf

__all__ = [
    "EpochSums",
    "broadcast_from_chief",
    "chief_value",
    "chief_values",
    "make_eval_step",
    "make_sliding_eval_step",
    "make_train_step",
]

COUNT = "count"  # the per-sample sums' denominator


@dataclasses.dataclass
class EpochSums:
    """Per-sample sums of the loss and metrics over an epoch, and their count.

    ``means()`` gives the epoch values Keras would log (``loss``, ``dice_wt``, ...).
    ``to_dict``/``from_dict`` store a partial epoch in ``state.json`` (a preempted run).
    """

    sums: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, step_sums: Mapping[str, object]) -> None:
        for k, v in step_sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def means(self, prefix: str = "") -> dict[str, float]:
        n = self.sums.get(COUNT, 0.0)
        return {f"{prefix}{k}": (v / n if n else 0.0) for k, v in self.sums.items() if k != COUNT}

    def to_dict(self) -> dict[str, float]:
        return dict(self.sums)

    @classmethod
    def from_dict(cls, d: Mapping[str, float] | None) -> EpochSums:
        return cls({k: float(v) for k, v in (d or {}).items()})


def _metric_sums(metrics: Sequence, y, pred) -> dict[str, tf.Tensor]:
    return {m.name: tf.reduce_sum(m.per_sample(y, pred)) for m in metrics}


def make_train_step(strategy: tf.distribute.Strategy, model, loss, metrics: Sequence, global_batch: int) -> Callable:
    """``step(iterator, stop) -> {name: sum over the global batch, "count", "stop"}``.

    Args:
        strategy: the run's strategy; ``model`` and its optimizer (``model.optimizer``,
            built) were created under its scope.
        model: the training model (LMS wrappers inside work per replica).
        loss: a Keras loss whose ``call(y, pred)`` gives per-sample values ``(b,)``.
        metrics: per-sample metrics (``per_sample(y, pred) -> (b,)``), named.
        global_batch: cases per step over all replicas (``trainer.batch_size``).

    ``stop`` is this worker's preemption flag (a bool tensor); the returned ``stop`` is
    the number of workers' replicas that had it set, so every worker sees a preemption
    of any of them at the same step.
    """
    optimizer = model.optimizer

    def replica_step(x, y, stop):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            per_sample = loss.call(y, pred)  # (b,) float32
            value = tf.nn.compute_average_loss(per_sample, global_batch_size=global_batch)
            if model.losses:
                value += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(value)  # loss scaling under mixed_float16, else unchanged
            # The metrics read the prediction and targets before backward starts (its seed
            # waits for them), so neither outlives the loss's backward: the step's memory
            # peaks early in backward (LMS planner).
            out = {"loss": tf.reduce_sum(per_sample), COUNT: tf.cast(tf.shape(per_sample)[0], tf.float32)}
            out.update(_metric_sums(metrics, y, pred))
            with tf.control_dependencies(list(out.values())):
                scaled = tf.identity(scaled)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        out["stop"] = tf.cast(stop, tf.float32)
        return out

    @tf.function
    def step(iterator, stop):
        x, y = next(iterator)
        per_replica = strategy.run(replica_step, args=(x, y, stop))
        return {k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in per_replica.items()}

    return step


def make_eval_step(model, metrics: Sequence, loss=None) -> Callable:
    """``step(x, y) -> {"loss", name: sum over the batch, "count"}`` on the local device, no collective."""

    @tf.function
    def step(x, y):
        pred = model(x, training=False)
        out = {COUNT: tf.cast(tf.shape(pred)[0], tf.float32)}
        if loss is not None:
            out["loss"] = tf.reduce_sum(loss.call(y, pred))
        out.update(_metric_sums(metrics, y, pred))
        return out

    return step


def make_sliding_eval_step(
    model, metrics: Sequence, loss, window: Sequence[int], overlap: float, depth: int
) -> Callable:
    """:func:`make_eval_step` for a model trained on patches: each whole volume of the batch is
    inferred by windows of the patch size with Gaussian blending
    (:func:`brats_seg.evaluation.inference.sliding.predict_volume`, as evaluation infers it), then scored
    like a whole-volume prediction. Runs eagerly around the windows' ``tf.function``."""
    from brats_seg.evaluation.inference.sliding import predict_volume

    window = tuple(int(w) for w in window)

    @tf.function
    def score(y, pred):
        out = {COUNT: tf.cast(tf.shape(pred)[0], tf.float32)}
        if loss is not None:
            out["loss"] = tf.reduce_sum(loss.call(y, pred))
        out.update(_metric_sums(metrics, y, pred))
        return out

    def step(x, y):
        images = x.numpy()
        pred = [predict_volume(model, image, "sliding", window, overlap, depth) for image in images]
        return score(y, tf.constant(pred))

    return step


def chief_values(strategy: tf.distribute.Strategy, values: Sequence) -> list[tf.Tensor]:
    """The chief's ``values`` (tensors of the same shapes and dtypes on every worker), on every worker.

    Each replica contributes ``values`` on the chief's first replica (replica 0) and zeros
    elsewhere; the sums over replicas are the chief's. One traced all-reduce for all of
    them; identity with one replica.
    """
    values = [tf.convert_to_tensor(v) for v in values]
    if strategy.num_replicas_in_sync == 1:
        return values

    def contribute(*vs):
        first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
        return [tf.where(first, v, tf.zeros_like(v)) for v in vs]

    @tf.function
    def reduce_all(*vs):
        per_replica = strategy.run(contribute, args=vs)
        return [strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in per_replica]

    return list(reduce_all(*values))


def chief_value(strategy: tf.distribute.Strategy, value) -> tf.Tensor:
    """The chief's ``value`` on every worker (:func:`chief_values` of one tensor)."""
    return chief_values(strategy, [value])[0]


def broadcast_from_chief(strategy: tf.distribute.Strategy, variables: Sequence) -> None:
    """Assign the chief's values of ``variables`` (model, optimizer) on every worker.

    Run by every worker after the chief restored a checkpoint, so that workers without the
    chief's files (no shared file system) continue from the same weights.
    """
    if strategy.num_replicas_in_sync == 1 or not variables:
        return
    values = chief_values(strategy, [tf.identity(v.value if hasattr(v, "value") else v) for v in variables])
    for v, value in zip(variables, values):
        v.assign(tf.cast(value, v.dtype))
