"""Joining the job's process group under torchrun or ``python -m hotswitch.launch``, and
running a function on N local ranks that meet through a temp-file store (``spawn``: the one
multi-process harness of the calibration, the tests and the benchmarks)."""

import multiprocessing as mp
import os
import queue as queue_module
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Callable, List, Optional, Sequence

__all__ = ["INIT_METHOD_ENV", "init_distributed", "spawn"]

INIT_METHOD_ENV = "HOTSWITCH_INIT_METHOD"


def init_distributed(backend: Optional[str] = None, timeout_s: float = 300.0):
    """Initialises the default process group from the launcher's environment.

    ``backend`` defaults to NCCL when CUDA is available, else gloo. Under
    ``hotswitch.launch`` the ranks meet through its file store; under torchrun through
    ``env://``. Returns ``(rank, world_size, local_rank)``; ValueError when the environment
    names no rank or world size.
    """
    import torch
    import torch.distributed as dist

    for name in ("RANK", "WORLD_SIZE"):
        value = os.environ.get(name)
        if value is None or not value.isdigit():
            raise ValueError(f"environment variable {name} is {value!r}; start the script with "
                             "torchrun or python -m hotswitch.launch")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if not 0 <= rank < world:
        raise ValueError(f"RANK({rank}) must lie in [0, WORLD_SIZE({world}))")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=os.environ.get(INIT_METHOD_ENV, "env://"),
                                rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return rank, world, local_rank


def _rank_main(fn, rank, world, store_path, results, args, pg_timeout, backend):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=pg_timeout))
        # Every rank finishes joining before any runs fn: a rank whose fn ends at once would
        # otherwise exit while a peer still connects to it (gloo: "connection closed by peer").
        dist.barrier()
        results.put((rank, "ok", fn(rank, world, *args)))
    except BaseException as e:  # reported to the parent, which raises
        results.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        # Flush the result, then skip destroy_process_group: a failed peer may make it block.
        results.close()
        results.join_thread()
        os._exit(0)


def spawn(world: int, fn: Callable, *args, timeout: float = 120.0, pg_timeout: float = 60.0,
          allow_exit: Sequence[int] = (), backend: str = "gloo") -> List[object]:
    """Runs ``fn(rank, world, *args)`` on ``world`` spawned processes (one thread each) that
    join one default process group through a temp-file store (no ports); returns the results
    by rank. ``fn`` and ``args`` must pickle (``fn`` a module-level function).

    ``backend="nccl"`` gives rank ``r`` CUDA device ``r`` (modulo the device count).
    ``pg_timeout``: seconds of the process group's collectives. Ranks in ``allow_exit`` may die
    without reporting (their result is None). Raises ``RuntimeError`` naming the ranks when a
    rank raised (with its traceback) or died, and ``TimeoutError`` when ranks still run after
    ``timeout`` seconds (they are killed).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="hotswitch-spawn-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank_main, args=(fn, r, world, store, results, args, pg_timeout, backend),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        done, errors = {}, {}
        deadline = time.monotonic() + timeout
        expected = world - len(allow_exit)
        try:
            while len(done) + len(errors) < world and time.monotonic() < deadline:
                if len(done) + len(errors) >= expected and all(not procs[r].is_alive() for r in allow_exit):
                    break
                try:
                    rank, status, value = results.get(timeout=0.2)
                except queue_module.Empty:
                    if not any(p.is_alive() for p in procs) and results.empty():
                        break
                    continue
                (done if status == "ok" else errors)[rank] = value
        finally:
            for p in procs:
                p.join(timeout=max(0.1, deadline - time.monotonic()))
            hung = [r for r, p in enumerate(procs) if p.is_alive()]
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    if errors:
        raise RuntimeError("\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    if hung:
        raise TimeoutError(f"ranks {hung} still running after timeout={timeout} s")
    missing = [r for r in range(world) if r not in done and r not in allow_exit]
    if missing:
        raise RuntimeError(f"ranks {missing} died without a result")
    return [done.get(r) for r in range(world)]
