"""Keeping the workers of a ``multi_worker`` run together: the chief's state on every
worker at start, and collective failures told apart from local ones."""

from __future__ import annotations

from brats_seg.training.checkpoint import ResumePosition

__all__ = ["COLLECTIVE_ERRORS", "cluster_error", "sync_with_chief"]

#: TF errors a lost peer can surface as in a collective op.
COLLECTIVE_ERRORS = ("UnavailableError", "DeadlineExceededError", "CancelledError", "InternalError", "AbortedError")


def cluster_error(error: Exception, cluster):
    """A ClusterFailure naming the unreachable workers, or None when ``error`` is local.

    Unavailable/DeadlineExceeded come from the collectives; other TF errors count as a lost
    worker only if some worker no longer answers (else they are this process's own fault,
    and re-running would fail the same way).
    """
    import tensorflow as tf

    from brats_seg.distribute.cluster import ClusterFailure, unreachable_workers

    down = unreachable_workers(cluster)
    if not down and not isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
        return None
    who = (
        f"unreachable: {', '.join(down)}" if down else "every worker's port still answers; see the other workers' logs"
    )
    return ClusterFailure(
        f"distributed training stopped: a collective operation failed ({type(error).__name__}: "
        f"{str(error).splitlines()[0][:300]}); {who}. Re-run the same command on every worker to resume "
        "from the last saved epoch."
    )


def sync_with_chief(strategy, cluster, model, steps: int, t, n_train: int, position: ResumePosition) -> ResumePosition:
    """Every worker: the chief's weights, optimizer state and resume position (its epoch and step;
    the partial sums stay this worker's), and a check that all workers agree on the loop's shape
    (else they would meet in different collectives)."""
    import tensorflow as tf

    from brats_seg.training.steps import broadcast_from_chief, chief_value

    try:
        broadcast_from_chief(strategy, [*model.variables, *model.optimizer.variables])
        mine = tf.constant([position.epoch, position.step, steps, t.epochs, t.val_every, n_train], tf.float32)
        chiefs = [int(v) for v in chief_value(strategy, mine).numpy()]
    except tuple(getattr(tf.errors, n) for n in COLLECTIVE_ERRORS) as e:
        raise (cluster_error(e, cluster) or e) from e
    names = ["steps/epoch", "trainer.epochs", "trainer.val_every", "training cases"]
    differ = [
        f"{n} {a} here, {b} on the chief"
        for n, a, b in zip(names, [steps, t.epochs, t.val_every, n_train], chiefs[2:])
        if a != b
    ]
    if differ:
        raise ValueError(
            f"worker {cluster.index} ({cluster.address}) disagrees with the chief: {'; '.join(differ)}. "
            "Start every worker with the same command and data (only distribute.index differs)."
        )
    return position._replace(epoch=chiefs[0], step=chiefs[1])
