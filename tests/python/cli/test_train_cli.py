"""python -m hotswitch.train under the launcher: a hot-switching run, checkpoints and resume,
and argument errors."""

import json
import math
import os
import subprocess
import sys

import pytest

import hotswitch as hs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODEL = ["--lr", "1e-3", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--num-query-groups", "2",
         "--seq-length", "256", "--global-batch-size", "12", "--max-files", "40", "--no-progress"]


def _train(nproc, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "hotswitch.launch", "--nproc-per-node", str(nproc),
                           "-m", "hotswitch.train", *MODEL, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# One learning-rate schedule for every run, whatever its --train-iters.
COMMON = ["--hot-switch", "--memory-budget-gb", "0.003", "--no-recalibrate", "--lr-decay-iters", "3"]


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
    (["--probe"], "--probe needs --hot-switch and re-calibration"),
    (["--probe", "--hot-switch", "--no-recalibrate"], "--probe needs --hot-switch and re-calibration"),
    (["--tensor-model-parallel-size", "3"], "world(2) is not divisible by tensor(3)"),
    (["--context-parallel-size", "4"], "world(2) is not divisible by tensor(1) * pipeline(1) * context(4)"),
    (["--context-parallel-size", "2", "--hot-switch", "--candidate-layouts", "dp2,tp2"],
     "--context-parallel-size(2) with --hot-switch bounds the cp of --candidate-layouts auto"),
    (["--context-parallel-size", "0"], "--context-parallel-size must be >= 1, got 0"),
    (["--num-attention-heads", "3"], "num_attention_heads(3)"),
    (["--data-path", "/nonexistent/texts"], "/nonexistent/texts"),
    (["--hardware", "tpu"], "'tpu'"),
    (["--load", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
    (["--lr-decay-style", "step"], "--lr-decay-style must be one of constant, linear, cosine, got 'step'"),
    (["--clip-grad", "-1"], "--clip-grad must be a number >= 0, got -1.0"),
    (["--rope-scaling-factor", "4"], "--rope-scaling-factor 4.0 needs --use-rope-scaling"),
    (["--use-rope-scaling", "--rope-scaling-factor", "0"], "--rope-scaling-factor must be a positive number, got 0.0"),
    (["--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"], "--lr-warmup-fraction and --lr-warmup-iters"),
    (["--lr-decay-style", "cosine", "--lr-warmup-iters", "20", "--train-iters", "10"],
     "--lr-decay-iters(10) must exceed the warm-up (20 iterations)"),
])
def test_argument_errors_name_the_value(args, needle):
    out = _train(2, *args, timeout=300)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert needle in out.stderr


def test_a_context_parallel_run_equals_data_parallel_and_its_checkpoint_resumes_on_one_rank(tmp_path):
    ckpt, cp, dp, rest = (str(tmp_path / n) for n in ("ckpt", "cp.json", "dp.json", "rest.json"))
    common = ["--no-recalibrate", "--lr-decay-iters", "3"]
    out = _train(2, *common, "--context-parallel-size", "2", "--train-iters", "2", "--save", ckpt,
                 "--summary-json", cp)
    assert out.returncode == 0, out.stderr[-3000:]
    out = _train(2, *common, "--train-iters", "3", "--summary-json", dp)
    assert out.returncode == 0, out.stderr[-3000:]
    out = _train(1, *common, "--train-iters", "3", "--load", ckpt, "--summary-json", rest)
    assert out.returncode == 0, out.stderr[-3000:]
    hot = str(tmp_path / "hot.json")
    # Under --hot-switch the same argument bounds the cp of the planner's candidates.
    out = _train(2, *common, "--hot-switch", "--context-parallel-size", "2", "--train-iters", "2",
                 "--summary-json", hot)
    assert out.returncode == 0, out.stderr[-3000:]
    cp, dp, rest, hot = (json.load(open(p)) for p in (cp, dp, rest, hot))
    assert cp["layouts"] == ["cp2"] and dp["layouts"] == ["dp2"]
    assert cp["losses"] == pytest.approx(dp["losses"][:2], rel=1e-5, abs=0)
    assert rest["steps"] == 1 and rest["losses"] == pytest.approx(dp["losses"][2:], rel=1e-5, abs=0)
    assert "cp2" in hot["candidates"] and "dp2" in hot["candidates"], hot["candidates"]
    assert hot["losses"] == pytest.approx(dp["losses"][:2], rel=1e-5, abs=0)


def test_megatron_log_lines_and_metrics_file(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    out = _train(2, "--hot-switch", "--candidate-layouts", "dp2,tp2", "--train-iters", "4", "--lr", "1e-3",
                 "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--min-lr", "1e-4", "--clip-grad", "0.5",
                 "--metrics-file", str(metrics), "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
                 "--split", "80,20,0")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [l for l in out.stdout.splitlines() if l.startswith(" iteration ")]
    assert len(lines) == 2 and lines[0].startswith(" iteration        2/       4 | consumed samples:           24 |")
    for needle in ("elapsed time per iteration (ms):", "learning rate: 5.000000E-04", "lm loss:", "grad norm:",
                   "number of skipped iterations:   0", "tokens/s:", "layouts:", "switch share:"):
        assert needle in lines[0], (needle, lines[0])
    valid = [l for l in out.stdout.splitlines() if l.startswith(" validation loss at iteration ")]
    assert len(valid) == 2 and " lm loss value: " in valid[0] and " lm loss PPL: " in valid[0], out.stdout[-2000:]
    records = [json.loads(l) for l in metrics.read_text().splitlines()]
    evals = [r for r in records if "valid_lm_loss" in r]
    assert [r["iteration"] for r in evals] == [2, 4]
    assert all(0 < r["valid_lm_loss"] < 20 and r["valid_ppl"] == pytest.approx(math.exp(r["valid_lm_loss"]))
               for r in evals)
    records = [r for r in records if "lm_loss" in r]
    assert [r["iteration"] for r in records] == [2, 4] and [r["consumed_samples"] for r in records] == [24, 48]
    # Warm-up 0.5e-3 at iteration 1 (0-based), then cosine from 1e-3 to 1e-4 over iterations 2..4.
    assert records[0]["learning_rate"] == pytest.approx(5e-4)
    assert records[1]["learning_rate"] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(r["grad_norm"] > 0 and set(r["layouts"]) <= {"dp2", "tp2"} for r in records)


def test_plans_with_the_layer_overhead_measured_on_rank_0(tmp_path):
    path = tmp_path / "summary.json"
    out = _train(2, "--hot-switch", "--candidate-layouts", "dp2,tp2", "--train-iters", "2", "--hardware", "h100",
                 "--micro-batch-overhead", "measure", "--summary-json", str(path))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [l for l in out.stdout.splitlines() if l.startswith("planning with a layer overhead of ")]
    assert len(lines) == 1 and "measured on cpu" in lines[0], out.stdout[-2000:]  # rank 0 measures, once
    measured_ms = float(lines[0].split("planning with a layer overhead of ")[1].split(" ms")[0])
    preset = hs.HardwareProfile.preset("h100").layer_overhead_seconds
    assert f"--hardware h100 holds {preset * 1e3:.3f} ms" in lines[0]
    planned = json.load(open(path))["planned_layer_overhead_seconds"]
    assert planned * 1e3 == pytest.approx(measured_ms, abs=5e-4) and planned != preset


@pytest.mark.parametrize("args,measures", [
    (["--hot-switch"], True),  # a preset holds another system's overheads
    (["--hot-switch", "--no-recalibrate"], False),  # reproducible plans: nothing measured
    (["--hot-switch", "--hardware", "profile.json"], False),  # a calibrated file is this system's
    ([], False),  # one static layout
    (["--micro-batch-overhead", "measure"], True),
    (["--hot-switch", "--micro-batch-overhead", "profile"], False),
])
def test_when_the_overhead_is_measured(args, measures):
    from hotswitch.cli import train as cli

    assert cli.measure_overhead(cli.build_parser().parse_args(args)) is measures


@pytest.mark.parametrize("args,probes", [
    (["--hot-switch"], True),  # re-calibrating plans start from this machine's times
    (["--hot-switch", "--no-probe"], False),
    (["--hot-switch", "--no-recalibrate"], False),  # reproducible plans: nothing measured
    (["--hot-switch", "--fixed-plan", "plan.json"], False),  # the plan is given
    ([], False),  # one static layout
])
def test_when_the_layouts_are_probed_before_the_first_step(args, probes):
    from hotswitch.cli import train as cli

    parsed = cli.parse_args(["--lr", "1e-3", *args])
    assert parsed.probe is probes
    if "--fixed-plan" not in args:  # (its file is read when the settings are built)
        assert cli.runtime_config(parsed, 2).probe is probes


def test_tensorboard_scalars_carry_megatron_names_and_the_logged_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    board, metrics = str(tmp_path / "tb"), str(tmp_path / "metrics.jsonl")
    out = _train(1, *COMMON, "--candidate-layouts", "auto", "--train-iters", "3", "--tensorboard-dir", board,
                 "--metrics-file", metrics, "--eval-interval", "3", "--eval-iters", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    events = EventAccumulator(board)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"lm loss", "learning-rate", "grad-norm", "loss-scale", "iteration-time", "batch-size",
            "tokens-per-second", "switch-share", "phases", "lm loss validation", "lm loss validation ppl"} <= tags
    records = [json.loads(line) for line in open(metrics)]
    train = [r for r in records if "lm_loss" in r]
    assert [e.step for e in events.Scalars("lm loss")] == [r["iteration"] for r in train] == [1, 2, 3]
    assert [e.value for e in events.Scalars("lm loss")] == pytest.approx([r["lm_loss"] for r in train], rel=1e-6)
    assert [e.value for e in events.Scalars("phases")] == [len(r["layouts"]) for r in train]
    valid = [r for r in records if "valid_lm_loss" in r]
    assert events.Scalars("lm loss validation")[0].value == pytest.approx(valid[0]["valid_lm_loss"], rel=1e-6)
    # Not a terminal: no progress bar redrawing lines into the log.
    assert "\r" not in out.stderr and "\r" not in out.stdout


def test_every_refused_and_unknown_argument_is_reported_together_once(tmp_path):
    out = _train(2, "--no-such-thing", "3", "--num-experts", "4", "--fp8-format", "hybrid", "--other=1",
                 "--train-iters", "1")
    assert out.returncode != 0
    err = out.stderr
    for needle in ("unknown argument --no-such-thing", "unknown argument --other", "--num-experts is refused",
                   "--fp8-format is refused"):
        assert err.count(needle) == 1, err  # rank 0 only, each once
    assert "usage:" not in err and len([l for l in err.splitlines() if "error:" in l]) == 4, err


def test_help_shows_the_defaults_and_missing_writers_are_refused(monkeypatch, capsys):
    import hotswitch.cli.train as cli
    text = cli.build_parser().format_help()
    assert "default: 0.999" in text and "required to train" in text and "default: 4" in text
    assert cli.default_ffn_hidden_size(2048) == 5440 and cli.default_ffn_hidden_size(4096) == 10880
    import importlib.util
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(SystemExit):
            cli.parse_args(["--wandb-project", "p"])
        assert "--wandb-project needs the wandb package" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["--wandb-exp-name", "x"])
    assert "--wandb-exp-name needs --wandb-project" in capsys.readouterr().err


def test_finetune_starts_from_the_weights_at_iteration_zero(tmp_path):
    ckpt, tuned = str(tmp_path / "ckpt"), str(tmp_path / "tuned.json")
    out = _train(1, *COMMON, "--candidate-layouts", "auto", "--train-iters", "2", "--save", ckpt)
    assert out.returncode == 0, out.stderr[-3000:]
    out = _train(1, *COMMON, "--candidate-layouts", "auto", "--train-iters", "2", "--load", ckpt, "--finetune",
                 "--summary-json", tuned)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "at step 0" in out.stdout and json.load(open(tuned))["steps"] == 2  # two new iterations, not zero
    out = _train(1, *COMMON, "--train-iters", "1", "--no-load-optim")
    assert out.returncode == 2 and "give --load" in out.stderr


def test_a_torch_dist_checkpoint_resumes_where_it_stopped(tmp_path, full_run):
    ckpt, rest = str(tmp_path / "ckpt"), str(tmp_path / "rest.json")
    common = COMMON + ["--candidate-layouts", "dp2,tp2,pp2"]
    out = _train(2, *common, "--train-iters", "2", "--save", ckpt, "--ckpt-format", "torch_dist")
    assert out.returncode == 0, out.stderr[-3000:]
    assert os.path.isfile(os.path.join(ckpt, "step_00000002", ".metadata"))
    out = _train(2, *common, "--train-iters", "3", "--load", os.path.join(ckpt, "step_00000002"),
                 "--summary-json", rest)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.load(open(rest))["losses"] == full_run["losses"][2:]  # bit for bit


def test_the_dry_run_plans_the_training_command_without_a_process_group(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hotswitch.train", *MODEL, *COMMON, "--candidate-layouts", "auto",
                          "--dry-run", "--dry-run-gpus", "4", "--dry-run-gpus-per-node", "2", "--dry-run-steps", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("dry run: 4 GPUs (2 per node), hardware a800, 0.00 GiB per GPU")
    assert sum(l.startswith("batch ") for l in lines) == 2 and sum(l.startswith("predicted step") for l in lines) == 2
    assert "summary:" not in out.stdout  # nothing trained
    # Graph buckets are planned where the attention a GPU selects runs them static: head dim 8
    # takes the mask kernel, whose pack holds at most 2^24 scores on CUDA.
    out = subprocess.run([sys.executable, "-m", "hotswitch.train", *MODEL, *COMMON, "--candidate-layouts", "dp4,dp2tp2",
                          "--graph-buckets", "64,256", "--graph-layer-overhead", "1e-4", "--dry-run",
                          "--dry-run-gpus", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "graph buckets [64, 256] with the sdpa attention a GPU selects: static while heads per rank * " \
           "tokens^2 <= 16777216" in out.stdout, out.stdout[:2000]
    out = subprocess.run([sys.executable, "-m", "hotswitch.train", *MODEL, *COMMON, "--candidate-layouts", "dp4,dp2tp2",
                          "--graph-buckets", "64,256", "--graph-layer-overhead", "1e-4", "--graph-layouts", "dp2tp2,tp4",
                          "--dry-run", "--dry-run-gpus", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "graph_layouts ['tp4'] are not among the candidate layouts ['dp4', 'dp2tp2']" in \
        out.stderr, out.stderr[-2000:]
    # --fixed-plan: the dry run plans the fixed plan, as the runtime runs it, beside the
    # planner's own prediction.
    fixed = tmp_path / "fixed.json"
    fixed.write_text('[[128, "dp4", "none"], [256, "dp2tp2", "none"]]')
    out = subprocess.run([sys.executable, "-m", "hotswitch.train", *MODEL, *COMMON, "--candidate-layouts", "dp4,dp2tp2",
                          "--fixed-plan", str(fixed), "--dry-run", "--dry-run-gpus", "4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"; the fixed plan {fixed}" in out.stdout and "the planner's own plan: " in out.stdout, out.stdout[:3000]
    rows = out.stdout.split("phase layout", 1)[1].split("\norder ", 1)[0].splitlines()[1:]
    for row in rows:  # each phase's lengths within its bound
        layout, lengths = row.split()[1], row.split()[4]
        assert int(lengths.split("-")[1]) <= {"dp4": 128, "dp2tp2": 256}[layout], rows
    assert {row.split()[1] for row in rows} == {"dp4", "dp2tp2"}, rows
    # --graph-layouts auto: the home and the layouts that the first batch is planned under
    # without graph buckets, as the runtime chooses them at its first step.
    out = subprocess.run([sys.executable, "-m", "hotswitch.train", *MODEL, *COMMON, "--candidate-layouts", "dp4,dp2tp2",
                          "--graph-buckets", "64,256", "--graph-layer-overhead", "1e-4", "--graph-layouts", "auto",
                          "--dry-run", "--dry-run-gpus", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    chosen = [l for l in out.stdout.splitlines() if l.startswith("graph layouts (auto, from batch 1 planned without "
                                                                  "graph buckets): ")]
    assert len(chosen) == 1, out.stdout[:3000]
    home = out.stdout.splitlines()[0].rsplit("home ", 1)[1]
    plain = subprocess.run([sys.executable, "-m", "hotswitch.train", *MODEL, *COMMON, "--candidate-layouts",
                            "dp4,dp2tp2", "--dry-run", "--dry-run-gpus", "4"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0 and plain.stdout.splitlines()[0].endswith(f"home {home}"), plain.stderr[-3000:]
    table = plain.stdout.split("phase layout", 1)[1].split("\norder ", 1)[0].splitlines()[1:]
    planned = {row.split()[1] for row in table}
    assert chosen[0].rsplit(": ", 1)[1].split(",") == [n for n in ("dp4", "dp2tp2") if n == home or n in planned]


def test_graph_buckets_reach_the_runtime_config_with_their_overhead():
    from hotswitch.cli import train as cli

    parsed = cli.parse_args(["--lr", "1e-3", "--graph-buckets", "2048,4096", "--graph-layer-overhead", "2e-4"], 1)
    settings = cli.runtime_config(parsed, 1)
    assert settings.graph_buckets == [2048, 4096] and settings.graph_layer_overhead_seconds == 2e-4
    assert settings.graph_layouts is None
    named = cli.runtime_config(cli.parse_args(["--lr", "1e-3", "--graph-buckets", "2048", "--graph-layer-overhead",
                                               "2e-4", "--graph-layouts", "dp2tp4, dp4tp2"], 1), 1)
    assert named.graph_layout_names() == ["dp2tp4", "dp4tp2"]
    auto = cli.runtime_config(cli.parse_args(["--lr", "1e-3", "--graph-buckets", "2048", "--graph-layer-overhead",
                                              "2e-4", "--graph-layouts", "auto"], 1), 1)
    assert auto.graph_layouts == "auto" and auto.auto_graph_layouts
    with pytest.raises(ValueError, match="graph_layouts names dp2tp4 twice"):
        cli.runtime_config(cli.parse_args(["--lr", "1e-3", "--graph-buckets", "2048", "--graph-layer-overhead", "2e-4",
                                           "--graph-layouts", "dp2tp4,dp2tp4"], 1), 1)
    assert cli.runtime_config(cli.parse_args(["--lr", "1e-3"], 1), 1).graph_buckets is None
    with pytest.raises(ValueError, match="graph_buckets needs graph_layer_overhead_seconds .* or probe=True"):
        cli.runtime_config(cli.parse_args(["--lr", "1e-3", "--graph-buckets", "2048"], 1), 1)
    # Hot switching probes at start-up by default: the probe measures the graph overhead.
    probed = cli.runtime_config(cli.parse_args(["--lr", "1e-3", "--hot-switch", "--graph-buckets", "2048"], 1), 1)
    assert probed.probe and probed.graph_buckets == [2048] and probed.graph_layer_overhead_seconds is None
    with pytest.raises(ValueError, match="graph_buckets needs graph_layer_overhead_seconds"):
        cli.runtime_config(cli.parse_args(["--lr", "1e-3", "--hot-switch", "--no-probe", "--graph-buckets", "2048"],
                                          1), 1)
    with pytest.raises(SystemExit):
        cli.parse_args(["--lr", "1e-3", "--graph-buckets", "2k"], 1)
