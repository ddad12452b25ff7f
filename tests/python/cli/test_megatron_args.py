"""Megatron-LM's arguments in hotswitch.train: accepted, ignored with a warning, or refused
naming the argument and why; unknown arguments refused; the README lists the code's table."""

import json
import os

import pytest

from hotswitch.cli import megatron_args as ma
from hotswitch.cli.train import build_parser, loss_scaling, parse_args as _parse_args
from tests.python.cli.test_train_cli import ROOT, _train


def parse_args(argv, *rest, **kw):
    """hotswitch.train's parse_args with the learning rate every training command must give."""
    return _parse_args(["--lr", "1e-3", *argv], *rest, **kw)

# hotswitch.train's options that are not Megatron-LM's.
OWN = {"--help", "--global-batch-tokens", "--hot-switch", "--candidate-layouts", "--home-layout",
       "--memory-budget-gb", "--hardware", "--micro-batch-overhead", "--min-gain", "--fixed-plan", "--home-window", "--trust-error", "--no-trust", "--explore",
       "--no-explore", "--probe", "--no-probe", "--timeout", "--dry-run", "--dry-run-gpus",
       "--dry-run-gpus-per-node", "--dry-run-steps", "--global-batch-documents", "--no-recalibrate",
       "--document-unit", "--long-sequences", "--max-files", "--resume", "--no-progress", "--summary-json",
       "--metrics-file", "--compile-layers", "--graph-buckets", "--graph-layer-overhead", "--graph-layouts"}


def _options():
    return {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}


def _by(treatment):
    return {a.name for a in ma.MEGATRON_ARGUMENTS if a.treatment == treatment}


def test_the_table_matches_the_parser():
    names = [a.name for a in ma.MEGATRON_ARGUMENTS]
    assert len(names) == len(set(names)), "an argument is listed twice"
    options = _options()
    # Every accepted argument is the parser's; no ignored or refused one is.
    assert _by(ma.ACCEPTED) == options - OWN
    assert not (_by(ma.IGNORED) | _by(ma.REFUSED)) & options
    assert all(a.note for a in ma.MEGATRON_ARGUMENTS)


def test_readme_lists_exactly_the_table():
    text = open(os.path.join(ROOT, "README.md")).read()
    begin, end = "<!-- megatron-args:begin -->\n", "<!-- megatron-args:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1
    assert text[text.index(begin) + len(begin):text.index(end)] == ma.markdown_table()


def test_ignored_arguments_are_dropped_with_their_values_and_a_warning():
    argv = ["--use-flash-attn", "--num-layers", "2", "--transformer-impl", "local", "--normalization=RMSNorm",
            "--attention-dropout", "0.0", "--optimizer", "adam", "--lr", "2e-3"]
    kept, warnings, refusal = ma.screen(argv)
    assert refusal is None and kept == ["--num-layers", "2", "--lr", "2e-3"]
    assert len(warnings) == 5 and warnings[0].startswith("warning: ignoring Megatron-LM's --use-flash-attn: ")
    assert "--transformer-impl local" in warnings[1] and "--normalization RMSNorm" in warnings[2]


@pytest.mark.parametrize("argv,needle", [
    (["--num-experts", "8"], "Megatron-LM's --num-experts is refused: mixture-of-experts models are not supported"),
    (["--virtual-pipeline-model-parallel-size", "2"], "--virtual-pipeline-model-parallel-size is refused: the "
                                                      "interleaved pipeline schedule"),
    (["--normalization", "LayerNorm"], "--normalization LayerNorm is refused: hotswitch's model is LLaMA-style"),
    (["--hidden-dropout", "0.1"], "--hidden-dropout 0.1 is refused"),
    (["--optimizer", "sgd"], "--optimizer sgd is refused"),
    (["--transformer-impl"], "--transformer-impl takes 1 value(s)"),
    (["--use-flash-attn=1"], "--use-flash-attn is a flag"),
])
def test_refusals_name_the_argument_and_why(argv, needle):
    _, _, refusal = ma.screen(argv)
    assert refusal is not None and needle in refusal, refusal


@pytest.mark.parametrize("argv,needle", [
    (["--no-such-thing"], "unknown argument --no-such-thing: neither a hotswitch.train argument nor a Megatron-LM"),
    (["--num-experts", "4"], "--num-experts is refused"),
    (["--bf16", "--fp16"], "--bf16 and --fp16 exclude each other"),
    (["--loss-scale", "128"], "--loss-scale 128.0 needs --fp16 or --bf16"),
    (["--fp16", "--initial-loss-scale", "2", "--min-loss-scale", "4"], "--min-loss-scale(4.0) must be <= "),
    (["--fp16", "--hysteresis", "0"], "--hysteresis must be >= 1, got 0"),
])
def test_parse_args_refuses_with_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_precision_arguments_map_to_megatron_scalers():
    assert loss_scaling(parse_args([])) is None and loss_scaling(parse_args(["--bf16"])) is None
    dynamic = loss_scaling(parse_args(["--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "10",
                                       "--hysteresis", "3", "--min-loss-scale", "2"]))
    assert (dynamic.initial, dynamic.min, dynamic.window, dynamic.hysteresis, dynamic.constant) == (65536, 2, 10, 3,
                                                                                                   None)
    assert loss_scaling(parse_args(["--fp16"])).initial == 2.0 ** 32
    assert loss_scaling(parse_args(["--bf16", "--loss-scale", "512"])).constant == 512


def test_a_megatron_command_line_trains_with_bf16_and_a_constant_loss_scale(tmp_path):
    metrics = tmp_path / "m.jsonl"
    out = _train(2, "--bf16", "--loss-scale", "4096", "--use-flash-attn", "--normalization", "RMSNorm",
                 "--swiglu", "--disable-bias-linear", "--tensor-model-parallel-size", "2", "--train-iters", "2",
                 "--metrics-file", str(metrics), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("warning: ignoring Megatron-LM's --use-flash-attn") == 1  # rank 0 only
    lines = [l for l in out.stdout.splitlines() if l.startswith(" iteration ")]
    assert len(lines) == 2 and all("loss scale: 4096.0 |" in l for l in lines), lines
    assert all("number of skipped iterations:   0" in l for l in lines)
    records = [json.loads(l) for l in metrics.read_text().splitlines()]
    assert [r["loss_scale"] for r in records] == [4096.0, 4096.0]


def test_fp16_runs_or_is_refused_where_autocast_lacks_it():
    import torch

    from hotswitch.model.transformer import autocast_runs

    out = _train(1, "--fp16", "--train-iters", "1", timeout=600)
    if autocast_runs("cpu", torch.float16):
        assert out.returncode == 0 and "loss scale: 4294967296.0" in out.stdout, out.stderr[-3000:]
    else:
        assert out.returncode == 2 and "no float16 autocast on cpu" in out.stderr, out.stderr[-3000:]
