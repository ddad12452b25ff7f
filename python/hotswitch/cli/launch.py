"""Starts the ranks of a job on this machine, like ``torchrun --standalone``, meeting through a
temporary file store instead of a TCP port:

    python -m hotswitch.launch --nproc-per-node 4 -m hotswitch.train [ARGS...]
    python -m hotswitch.launch --nproc-per-node 4 script.py [ARGS...]

Each rank gets torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``) plus ``HOTSWITCH_INIT_METHOD`` (``file://...``), which
``hotswitch.init_distributed`` prefers over ``env://``. When one rank fails, the others are
stopped and the launcher exits with that rank's code. Use torchrun itself where it works
(multi-node jobs): scripts written with ``init_distributed`` run under both.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from hotswitch.distributed import INIT_METHOD_ENV

__all__ = ["main"]


def _stop(procs: List[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                        help="ranks to start on this machine")
    parser.add_argument("-m", dest="module", action="store_true", help="run the target as a module")
    parser.add_argument("target", help="script path, or module name with -m")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the target")
    args = parser.parse_args(argv)
    if not 1 <= args.nproc_per_node <= 1024:
        parser.error(f"--nproc-per-node must be in [1, 1024], got {args.nproc_per_node}")
    if not args.module and not os.path.isfile(args.target):
        parser.error(f"script {args.target!r} does not exist (use -m for a module)")

    command = [sys.executable] + (["-m", args.target] if args.module else [args.target]) + args.args
    world = args.nproc_per_node
    with tempfile.TemporaryDirectory(prefix="hotswitch-launch-") as tmp:
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0",
                       **{INIT_METHOD_ENV: f"file://{os.path.join(tmp, 'store')}"})
            procs.append(subprocess.Popen(command, env=env))
        code = 0
        try:
            while True:
                codes = [p.poll() for p in procs]
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    rank, code = failed[0]
                    print(f"hotswitch.launch: rank {rank} exited with code {code}; stopping the others",
                          file=sys.stderr)
                    _stop(procs)
                    break
                if all(c == 0 for c in codes):
                    break
                time.sleep(0.1)
        except KeyboardInterrupt:
            _stop(procs)
            code = 130
    return code


if __name__ == "__main__":
    sys.exit(main())
