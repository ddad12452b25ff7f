"""python -m hotswitch.train under the launcher: a hot-switching run, checkpoints and resume,
and argument errors."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--num-query-groups", "2",
         "--seq-length", "256", "--global-batch-size", "12", "--max-files", "40", "--no-progress"]


def _train(nproc, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "hotswitch.launch", "--nproc-per-node", str(nproc),
                           "-m", "hotswitch.train", *MODEL, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


COMMON = ["--hot-switch", "--memory-budget-gb", "0.003", "--no-recalibrate"]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """Three steps on 2 ranks without a break: the run the resumed ones must reproduce."""
    path = str(tmp_path_factory.mktemp("full") / "full.json")
    out = _train(2, *COMMON, "--candidate-layouts", "dp2,tp2,pp2", "--train-iters", "3", "--summary-json", path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "summary: 3 steps on 2 ranks" in out.stdout
    return json.load(open(path))


def test_hot_switching_run_saves_and_resumes_where_it_stopped(tmp_path, full_run):
    ckpt, part, rest = (str(tmp_path / n) for n in ("ckpt", "part.json", "rest.json"))
    common = COMMON + ["--candidate-layouts", "dp2,tp2,pp2"]
    out = _train(2, *common, "--train-iters", "2", "--save", ckpt, "--summary-json", part)
    assert out.returncode == 0, out.stderr[-3000:]
    assert os.path.isdir(os.path.join(ckpt, "step_00000002"))
    out = _train(2, *common, "--train-iters", "3", "--save", ckpt, "--resume", "--summary-json", rest)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stdout and "step_00000002" in out.stdout
    part, rest = (json.load(open(p)) for p in (part, rest))
    assert part["losses"] == full_run["losses"][:2]
    assert rest["steps"] == 1 and rest["losses"] == full_run["losses"][2:]  # bit for bit


def test_a_checkpoint_of_one_rank_resumes_on_two(tmp_path, full_run):
    ckpt, part, rest = (str(tmp_path / n) for n in ("ckpt", "part.json", "rest.json"))
    out = _train(1, *COMMON, "--candidate-layouts", "auto", "--train-iters", "2", "--save", ckpt,
                 "--summary-json", part)
    assert out.returncode == 0, out.stderr[-3000:]
    out = _train(2, *COMMON, "--candidate-layouts", "dp2,tp2,pp2", "--train-iters", "3", "--load", ckpt,
                 "--summary-json", rest)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stdout and "step_00000002" in out.stdout
    part, rest = (json.load(open(p)) for p in (part, rest))
    assert (part["world"], rest["world"]) == (1, 2)
    assert part["layouts"] == ["dp1"] and len(rest["layouts"]) >= 1
    # Another world sums in another order: equal to fp32 rounding, not bit for bit. The data
    # position travels with the checkpoint: step 3 trains the batch the 2-rank run trained.
    assert part["losses"] == pytest.approx(full_run["losses"][:2], rel=1e-5, abs=0)
    assert rest["steps"] == 1 and rest["step_tokens"] == full_run["step_tokens"][2:]
    assert rest["losses"] == pytest.approx(full_run["losses"][2:], rel=1e-5, abs=0)


@pytest.mark.parametrize("args,needle", [
    (["--train-iters", "0"], "--train-iters must be >= 1, got 0"),
    (["--resume"], "--resume needs --load or --save"),
    (["--save-interval", "2"], "--save-interval 2 needs --save"),
    (["--tensor-model-parallel-size", "3"], "world(2) is not divisible by tensor(3)"),
    (["--num-attention-heads", "3"], "num_attention_heads(3)"),
    (["--data-path", "/nonexistent/texts"], "/nonexistent/texts"),
    (["--hardware", "tpu"], "'tpu'"),
    (["--load", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
])
def test_argument_errors_name_the_value(args, needle):
    out = _train(2, *args, timeout=300)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert needle in out.stderr
