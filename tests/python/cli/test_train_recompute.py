"""python -m hotswitch.train's recomputation flags (Megatron-LM's names) and their checks."""

import pytest

from hotswitch.cli.train import parse_args as _parse_args, runtime_config


def parse_args(argv, *rest, **kw):
    """hotswitch.train's parse_args with the learning rate every training command must give."""
    return _parse_args(["--lr", "1e-3", *argv], *rest, **kw)


def test_recompute_flags_map_onto_the_runtime_config():
    assert runtime_config(parse_args([]), 1).recompute == "none"
    args = parse_args(["--recompute-granularity", "full", "--recompute-method", "uniform",
                       "--recompute-num-layers", "2"])
    settings = runtime_config(args, 1)
    assert (settings.recompute, settings.recompute_num_layers) == ("full", 2)
    for granularity in ("selective", "full", "auto"):
        settings = runtime_config(parse_args(["--recompute-granularity", granularity]), 1)
        assert (settings.recompute, settings.recompute_num_layers) == (granularity, 1)


@pytest.mark.parametrize("args,needle", [
    (["--recompute-granularity", "partial"], "--recompute-granularity must be full, selective or auto, got 'partial'"),
    (["--recompute-method", "uniform"], "--recompute-method uniform needs --recompute-granularity full"),
    (["--recompute-granularity", "selective", "--recompute-method", "uniform"],
     "--recompute-method uniform needs --recompute-granularity full"),
    (["--recompute-granularity", "full", "--recompute-method", "block"],
     "--recompute-method must be uniform (every layer, in chunks), got 'block'"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "0"],
     "--recompute-num-layers must be >= 1, got 0"),
    (["--recompute-granularity", "full", "--recompute-num-layers", "2"],
     "--recompute-num-layers 2 needs --recompute-method uniform"),
])
def test_bad_recompute_flags_exit_with_the_value(args, needle, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(args)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err
