"""The launcher: python -m hotswitch.launch starts ranks that meet through a file store."""

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SCRIPT = """
import os, sys
import torch, torch.distributed as dist
from hotswitch.distributed import init_distributed
rank, world, local = init_distributed(timeout_s=60)
t = torch.tensor([rank + 1])
dist.all_reduce(t)
# One write per line: ranks share the terminal, and an unbuffered print writes the newline apart.
sys.stdout.write(f"rank {rank}/{world} local {local} of {os.environ['LOCAL_WORLD_SIZE']} sum {t.item()}\\n")
sys.stdout.flush()
if len(sys.argv) > 1 and rank == int(sys.argv[1]):
    # Exit at once: left to interpreter shutdown with its peer still connected, gloo's
    # teardown may abort the process ("terminate called without an active exception", -6).
    os._exit(7)
if len(sys.argv) > 1:
    import time; time.sleep(600)  # a rank that would wait forever for the failed one
dist.barrier()
dist.destroy_process_group()
"""


def _launch(tmp_path, nproc, *args, timeout=120):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, "-m", "hotswitch.launch", "--nproc-per-node", str(nproc), str(script),
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_launch_starts_ranks_with_torchrun_environment(tmp_path):
    out = _launch(tmp_path, 3)
    assert out.returncode == 0, out.stderr
    lines = sorted(l for l in out.stdout.splitlines() if l.startswith("rank"))
    assert lines == [f"rank {r}/3 local {r} of 3 sum 6" for r in range(3)]


def test_a_failing_rank_stops_the_others_and_its_code_is_returned(tmp_path):
    start = time.monotonic()
    out = _launch(tmp_path, 2, "1")
    assert out.returncode == 7
    assert "rank 1 exited with code 7" in out.stderr
    assert time.monotonic() - start < 100  # the sleeping rank was stopped, not waited for


@pytest.mark.parametrize("args,needle", [
    (["--nproc-per-node", "0", "x.py"], "--nproc-per-node must be in [1, 1024], got 0"),
    (["--nproc-per-node", "2", "/nonexistent/job.py"], "does not exist"),
])
def test_launch_rejects_bad_arguments(args, needle):
    out = subprocess.run([sys.executable, "-m", "hotswitch.launch", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and needle in out.stderr


def test_init_distributed_without_launcher_names_the_variable(monkeypatch):
    from hotswitch.distributed import init_distributed
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="RANK is None"):
        init_distributed()
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK\(5\) must lie in \[0, WORLD_SIZE\(2\)\)"):
        init_distributed()
