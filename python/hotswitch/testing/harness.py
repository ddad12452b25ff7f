"""The multi-process harness of tests and benchmarks: ``run_world(world, fn, *args)`` runs
``fn(rank, world, *args)`` on spawned gloo (or NCCL) ranks that meet through a temp-file store,
and fails with ``AssertionError`` when a rank raises, dies or hangs (``hotswitch.distributed.spawn``
underneath, which raises ``RuntimeError``/``TimeoutError``)."""

from hotswitch.distributed import spawn

__all__ = ["run_world"]


def run_world(world, fn, *args, timeout=120.0, pg_timeout=60.0, allow_exit=(), backend="gloo"):
    """Runs ``fn(rank, world, *args)`` on ``world`` spawned ranks; returns the results by rank.

    Ranks in ``allow_exit`` may die without reporting (their result is None). Raises
    AssertionError when a rank raised, died unexpectedly, or the world ran past ``timeout``.
    """
    try:
        return spawn(world, fn, *args, timeout=timeout, pg_timeout=pg_timeout, allow_exit=allow_exit,
                     backend=backend)
    except (RuntimeError, TimeoutError) as e:
        raise AssertionError(str(e)) from None
