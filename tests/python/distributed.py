"""Runs a function on N real processes that meet through a temp-file store (no ports)."""

import multiprocessing as mp
import os
import tempfile
import time
import traceback
from datetime import timedelta


def _worker(fn, rank, world, store_path, queue, args, pg_timeout, backend):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend, init_method=f"file://{store_path}", rank=rank, world_size=world,
            timeout=timedelta(seconds=pg_timeout))
        result = fn(rank, world, *args)
        queue.put((rank, "ok", result))
    except BaseException as e:  # reported to the parent, which fails the test
        queue.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        # Flush the result, then skip destroy_process_group: a failed peer may make it block.
        queue.close()
        queue.join_thread()
        os._exit(0)


def run_world(world, fn, *args, timeout=120.0, pg_timeout=60.0, allow_exit=(), backend="gloo"):
    """Runs ``fn(rank, world, *args)`` on ``world`` spawned ranks; returns the results by rank.

    ``backend="nccl"`` gives rank ``r`` CUDA device ``r`` (modulo the device count).

    Ranks in ``allow_exit`` may die without reporting (their result is None). Raises
    AssertionError when a rank raised, died unexpectedly, or the world ran past ``timeout``.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker, args=(fn, r, world, store, queue, args, pg_timeout, backend))
                 for r in range(world)]
        for p in procs:
            p.start()
        results, errors = {}, {}
        deadline = time.monotonic() + timeout
        expected = world - len(allow_exit)
        try:
            while len(results) + len(errors) < world and time.monotonic() < deadline:
                if len(results) + len(errors) >= expected and all(
                        not procs[r].is_alive() for r in allow_exit):
                    break
                try:
                    rank, status, value = queue.get(timeout=0.2)
                except Exception:
                    if not any(p.is_alive() for p in procs) and queue.empty():
                        break
                    continue
                (results if status == "ok" else errors)[rank] = value
        finally:
            for p in procs:
                p.join(timeout=max(0.1, deadline - time.monotonic()))
            hung = [r for r, p in enumerate(procs) if p.is_alive()]
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        assert not hung, f"ranks {hung} still running after {timeout} s"
        assert not errors, "\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items()))
        missing = [r for r in range(world) if r not in results and r not in allow_exit]
        assert not missing, f"ranks {missing} died without a result"
        return [results.get(r) for r in range(world)]
