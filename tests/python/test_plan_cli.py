"""The planner's dry-run CLI: python -m hotswitch.plan."""

import pytest

from hotswitch import plan as cli


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(n) for n in [1, 97, 300, 512, 1025, 4096, 7919, 20000] * 16) + "\n")
    return str(path)


def test_plans_one_step_and_simulates(lengths_file, capsys):
    assert cli.main(["--gpus", "8", "--lengths", lengths_file, "--global-batch", "64",
                     "--candidates", "dp8,dp2tp4,tp8", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "predicted step" in out and "best static" in out
    assert "simulated 2 steps" in out


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "0"], "--gpus must be >= 1, got 0"),
    (["--model", "gpt-5"], "'gpt-5'"),
    (["--hardware", "tpu"], "'tpu'"),
    (["--candidates", "dp2tp2"], "!= world(8)"),
    (["--candidates", "dp1tp8", "--home", "dp8"], "--home dp8 is not among"),
    (["--steps", "-1"], "--steps must be >= 0"),
])
def test_bad_arguments_exit_with_the_value(lengths_file, capsys, args, needle):
    with pytest.raises(SystemExit) as info:
        cli.main(["--lengths", lengths_file] + args)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


def test_bad_lengths_files_name_the_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("12\nabc\n")
    with pytest.raises(ValueError, match="bad.txt:2"):
        cli.load_lengths(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        cli.load_lengths(str(tmp_path / "missing.txt"))
