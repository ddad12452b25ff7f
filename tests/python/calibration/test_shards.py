"""The compute terms fitted to the model's own layer shards on one device: shard shapes, a
fit that recovers a profile from times it predicted, and a measurement on the CPU."""

import dataclasses

import pytest

import hotswitch as hs
from hotswitch.calibration.shards import ShardTimes, fit_shards, measure_shards, predicted_layer_seconds, shard_config

LLAMA_7B = hs.TransformerConfig(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=32,
                                ffn_hidden_size=11008, vocab_size=32000, max_position_embeddings=32768,
                                compute_dtype="bfloat16")


def test_shard_shapes_divide_heads_and_ffn():
    s = shard_config(LLAMA_7B, 4)
    assert (s.hidden_size, s.num_attention_heads, s.num_query_groups, s.ffn_hidden_size) == (4096, 8, 8, 2752)
    gqa = dataclasses.replace(LLAMA_7B, num_query_groups=4)
    assert shard_config(gqa, 8).num_query_groups == 1  # fewer K/V heads than tp: each rank holds one
    assert shard_config(gqa, 2).num_query_groups == 2
    with pytest.raises(ValueError, match=r"tp\(3\) must divide num_attention_heads\(32\)"):
        shard_config(LLAMA_7B, 3)


def test_fit_recovers_the_profile_that_made_the_times():
    truth = hs.HardwareProfile.from_dict(dict(hs.HardwareProfile.preset("h100").to_dict(), efficiency=0.62,
                                              attention_efficiency=0.41, attention_half_length=900.0,
                                              memory_efficiency=0.7, layer_overhead_seconds=3e-4))
    grid = [(tp, t, 1.0) for tp in (1, 2, 4, 8) for t in (256, 1024, 4096, 16384, 32768)]
    times = ShardTimes(LLAMA_7B, grid, "cuda", "test", "sdpa", "bfloat16", 0.0)
    seconds = predicted_layer_seconds(times, truth)
    assert all(a < b for a, b in zip(seconds[:4], seconds[1:5]))  # longer sequences take longer
    times.samples = [(tp, t, float(s)) for (tp, t, _), s in zip(grid, seconds)]
    profile, report = fit_shards(times, hs.HardwareProfile.preset("h100-datasheet"), name="fitted")
    assert report["max_abs_rel_error"] < 0.01, report
    assert profile.efficiency == pytest.approx(0.62, rel=0.05)
    assert profile.layer_overhead_seconds == pytest.approx(3e-4, rel=0.1)
    assert profile.name == "fitted" and profile.peak_flops == hs.HardwareProfile.preset("h100-datasheet").peak_flops
    assert [s["tp"] for s in report["samples"]] == [tp for tp, _, _ in grid]


def test_bad_input_is_refused():
    times = ShardTimes(LLAMA_7B, [(1, 256, 0.0)], "cpu", "cpu", "grouped", "bfloat16", 0.0)
    with pytest.raises(ValueError, match="must be > 0"):
        fit_shards(times, hs.HardwareProfile.preset("h100"))
    with pytest.raises(ValueError, match="fields must be a non-empty subset"):
        fit_shards(times, hs.HardwareProfile.preset("h100"), fields=["peak_flops"])
    with pytest.raises(ValueError, match="tps must be a non-empty list"):
        measure_shards(LLAMA_7B, tps="1,2")


def test_measures_shards_on_the_cpu():
    cfg = hs.TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                               ffn_hidden_size=128, vocab_size=128, max_position_embeddings=256)
    times = measure_shards(cfg, tps=[1, 2], token_counts=[16, 64, 256], repeats=2, cuda=False)
    assert times.device == "cpu" and [(tp, t) for tp, t, _ in times.samples] == \
        [(1, 16), (1, 64), (1, 256), (2, 16), (2, 64), (2, 256)]
    # Three layers of 256 tokens take longer than one: the difference is a layer's work.
    by = {(tp, t): s for tp, t, s in times.samples}
    assert by[(1, 256)] > 0 and by[(2, 256)] > 0


def test_command_line_fits_shards_on_the_cpu(tmp_path, capsys):
    from hotswitch.cli import calibration as cli
    from hotswitch.hardware import load_profile

    out = tmp_path / "shards.json"
    base = hs.HardwareProfile.preset("h100-datasheet")
    base_path = tmp_path / "base.json"
    hs.save_profile(hs.HardwareProfile.from_dict(dict(base.to_dict(), peak_flops=5e10, name="cpu-base")),
                    str(base_path))
    # The fit needs every per-layer time > 0 (3 layers slower than 1): the best of 3 repeats of
    # at least 64 tokens, so that a busy host's stall in one timing does not make one negative.
    assert cli.main(["--device", "cpu", "--base", str(base_path), "--out", str(out), "--tp", "1,2",
                     "--lengths", "64,128,256", "--repeats", "3"]) == 0
    text = capsys.readouterr().out
    rows = [l.split() for l in text.splitlines() if l.split()[:1] in (["1"], ["2"])]
    assert [(r[0], r[1]) for r in rows] == [("1", "64"), ("1", "128"), ("1", "256"), ("2", "64"), ("2", "128"),
                                            ("2", "256")], text
    profile = load_profile(str(out))
    assert profile.peak_flops == 5e10 and "efficiency" in text and "--base cpu-base" in text


def test_command_line_needs_a_base_off_cuda(tmp_path, capsys):
    from hotswitch.cli import calibration as cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--device", "cpu", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and "--base is needed on this device" in capsys.readouterr().err
