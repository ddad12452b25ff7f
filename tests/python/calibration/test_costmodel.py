"""The cost model against measured runs: reading a runs file, rebuilding its steps, fitting a
profile and checking one (``python -m hotswitch.costmodel``), on small files written here."""

import csv
import json
import os

import numpy as np
import pytest

import hotswitch as hs
from hotswitch.calibration import runs as measured
from hotswitch.cli import costmodel as cli

HIST = {"128": 300, "256": 280, "512": 250, "1024": 180, "2048": 80, "4096": 40}


def row(**overrides):
    """A run of a small llama model on 8 GPUs (packed, seq_length 4096)."""
    r = {"run": "small", "family": "llama", "gpu": "H100-80GB", "world": 8, "num_layers": 8, "hidden_size": 1024,
         "ffn_hidden_size": 2816, "num_attention_heads": 8, "num_query_groups": 8, "seq_length": 4096,
         "global_batch_size": 64, "micro_batch_size": 2, "dp": 2, "tp": 2, "pp": 2, "packing": "True",
         "sequence_parallel": "True", "recompute": "None", "distributed_optimizer": "True", "flash_attn": "True",
         "padded_vocab": 32256, "untie_embeddings": "True", "normalization": "RMSNorm", "position_embedding": "rope",
         "iter_ms_median": 1000.0, "iter_ms_all": "1000.0", "max_allocated_mb": 1.0,
         "real_seq_len_hist": json.dumps(HIST)}
    r.update(overrides)
    return r


def write(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return str(path)


def synthetic_rows():
    """Runs of two model shapes and families over layouts, packed and padded."""
    out = []
    gpt = dict(family="gpt", num_layers=8, hidden_size=1536, ffn_hidden_size=6144, num_attention_heads=12,
               num_query_groups=1, untie_embeddings="False", normalization="LayerNorm",
               position_embedding="learned_absolute", padded_vocab=50688)
    for i, (dp, tp, pp) in enumerate([(8, 1, 1), (4, 2, 1), (2, 4, 1), (2, 2, 2), (1, 4, 2), (1, 2, 4)]):
        for packing in ("True", "False"):
            for model in ({}, gpt):
                world = 16 if i % 3 == 2 else 8
                out.append(row(run=f"r{len(out)}", dp=dp * world // 8, tp=tp, pp=pp, world=world, packing=packing,
                               micro_batch_size=2 if packing == "True" else 1, **model))
    return out


PROFILE = dict(hs.HardwareProfile.preset("h100-datasheet").to_dict(), name="truth", efficiency=0.45,
               attention_efficiency=0.3, attention_half_length=300.0, memory_efficiency=0.6,
               intra_node_bandwidth=2.5e11, inter_node_bandwidth=2e10, layer_overhead_seconds=8e-4,
               step_overhead_seconds=0.05)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A runs file whose times the profile PROFILE predicts."""
    rows = synthetic_rows()
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    write(path, rows)
    runs = measured.read_runs(str(path))
    seconds = measured.predict(runs, hs.HardwareProfile.from_dict(PROFILE), steps=2)
    for r, s in zip(rows, seconds):
        r["iter_ms_median"] = round(1e3 * s, 6)
    return write(path, rows)


def result_line(out: str) -> dict:
    last = out.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    return json.loads(last[len("RESULT "):])


def test_fit_recovers_the_profile_that_made_the_times(synthetic, tmp_path, capsys):
    out = tmp_path / "fitted.json"
    assert cli.main(["fit", "--runs", synthetic, "--out", str(out), "--steps", "2", "--name", "mine"]) == 0
    result = result_line(capsys.readouterr().out)
    assert result["runs"] == 24 and result["skipped"] == 0
    assert result["median_abs_rel_error"] < 0.02 and result["max_abs_rel_error"] < 0.08
    assert result["pairwise_order_agreement"] >= 0.95
    profile = hs.load_profile(str(out))
    assert profile.name == "mine"
    # Fields the fit does not move come from the base.
    assert profile.peak_flops == PROFILE["peak_flops"] and profile.memory_bandwidth == PROFILE["memory_bandwidth"]
    # The dominant terms come back close to the truth.
    assert profile.efficiency == pytest.approx(PROFILE["efficiency"], rel=0.15)
    assert profile.layer_overhead_seconds == pytest.approx(PROFILE["layer_overhead_seconds"], rel=0.3)
    # Deterministic: the same inputs give the same profile.
    again = tmp_path / "again.json"
    assert cli.main(["fit", "--runs", synthetic, "--out", str(again), "--steps", "2", "--name", "mine"]) == 0
    assert open(out).read() == open(again).read()


def test_check_prints_every_run_and_draws_the_scatter(synthetic, tmp_path, capsys):
    profile = tmp_path / "truth.json"
    hs.save_profile(hs.HardwareProfile.from_dict(PROFILE), str(profile))
    plot = tmp_path / "scatter.png"
    assert cli.main(["check", "--runs", synthetic, "--profile", str(profile), "--steps", "2", "--plot",
                     str(plot)]) == 0
    out = capsys.readouterr().out
    result = result_line(out)
    assert set(result) >= {"runs", "median_abs_rel_error", "max_abs_rel_error", "pairwise_order_agreement"}
    assert result["runs"] == 24
    assert result["median_abs_rel_error"] < 1e-6  # the profile that made the times
    assert sum(1 for line in out.splitlines() if line.startswith("row ")) == 24
    assert plot.stat().st_size > 1000 and open(plot, "rb").read(4) == b"\x89PNG"
    # Another profile predicts them worse, and says so.
    assert cli.main(["check", "--runs", synthetic, "--profile", "h100-datasheet", "--steps", "2"]) == 0
    assert result_line(capsys.readouterr().out)["median_abs_rel_error"] > 0.05


def test_packed_runs_without_a_histogram_are_skipped(tmp_path, capsys):
    path = write(tmp_path / "runs.csv", [row(run="a"), row(run="b", real_seq_len_hist="{}"),
                                        row(run="c", real_seq_len_hist="{}", packing="False")])
    runs = measured.read_runs(path)
    assert [r.predictable for r in runs] == [True, False, True]
    assert cli.main(["check", "--runs", path, "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "row 2 (b): skipped" in out
    assert result_line(out)["runs"] == 2 and result_line(out)["skipped"] == 1
    with pytest.raises(ValueError, match="without a length histogram"):
        measured.predict(runs, hs.HardwareProfile.preset("h100"))


@pytest.mark.parametrize("column,value,message", [
    ("tp", "two", "column 'tp': expected a positive integer, got 'two'"),
    ("tp", "0", "column 'tp': expected a positive integer"),
    ("family", "bert", "column 'family': expected gpt or llama, got 'bert'"),
    ("packing", "maybe", "column 'packing': expected True or False"),
    ("iter_ms_median", "-3", "column 'iter_ms_median': expected a positive number"),
    ("real_seq_len_hist", "{not json", "column 'real_seq_len_hist': expected a JSON object"),
    ("real_seq_len_hist", '{"128": -1}', "a count >= 0 for bucket '128'"),
    ("real_seq_len_hist", '{"abc": 1}', "bucket keys that are positive ints"),
    ("world", "16", "column 'world': expected dp * tp * pp = 2 * 2 * 2 = 8"),
    ("micro_batch_size", "3", "column 'micro_batch_size': expected a divisor of global_batch_size / dp = 32"),
    ("num_query_groups", "1", "column 'tp': expected a layout the model divides"),
    ("num_attention_heads", "6", "column 'num_attention_heads': expected a layout the model divides"),
    ("recompute", "sometimes", "column 'recompute': expected None, selective or full"),
    ("normalization", "BatchNorm", "column 'normalization'"),
])
def test_a_malformed_row_names_its_row_and_column(tmp_path, capsys, column, value, message):
    path = write(tmp_path / "runs.csv", [row(run="fine"), row(run="broken", **{column: value})])
    with pytest.raises(ValueError) as e:
        measured.read_runs(path)
    assert "row 2 (run 'broken')" in str(e.value) and message in str(e.value)
    assert cli.main(["check", "--runs", path]) == 2
    assert "row 2 (run 'broken')" in capsys.readouterr().err


def test_a_file_without_the_columns_or_rows_is_refused(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("run,family\nx,gpt\n")
    with pytest.raises(ValueError, match="missing columns world, num_layers"):
        measured.read_runs(str(path))
    path.write_text(",".join(measured.COLUMNS) + "\n")
    with pytest.raises(ValueError, match="no runs"):
        measured.read_runs(str(path))
    with pytest.raises(ValueError, match="cannot read runs file"):
        measured.read_runs(str(tmp_path / "absent.csv"))


def test_lengths_follow_the_histogram_and_the_cut_at_seq_length(tmp_path):
    longer = json.dumps(dict(HIST, **{"8192": 20, "16384": 30}))
    path = write(tmp_path / "runs.csv", [row(), row(run="long", seq_length=16384, real_seq_len_hist=longer)])
    short, long_ = measured.read_runs(path)
    rng = np.random.default_rng(0)
    x = measured.sample_lengths(short, 200000, rng)
    assert x.min() >= 1 and x.max() <= 4096
    edges = [0, 128, 256, 512, 1024, 2048, 4096]
    counts = np.histogram(x, bins=np.array(edges) + 0.5)[0]
    expected = np.array(list(HIST.values())) / sum(HIST.values())
    assert np.allclose(counts / len(x), expected, atol=0.005)
    # The top bucket holds documents cut to seq_length: a point mass there.
    y = measured.sample_lengths(long_, 200000, np.random.default_rng(0))
    at_cut = np.mean(y == 16384)
    assert 0 < at_cut < 30 / 1180
    assert np.mean(y > 8192) == pytest.approx(30 / 1180, abs=0.002)
    # Seeded: the same lengths again.
    assert np.array_equal(measured.sample_lengths(short, 1000, np.random.default_rng(5)),
                          measured.sample_lengths(short, 1000, np.random.default_rng(5)))


def test_padded_runs_cost_every_sequence_its_padded_length(tmp_path):
    path = write(tmp_path / "runs.csv", [row(run="packed"), row(run="padded", packing="False"),
                                        row(run="padded, no histogram", packing="False", real_seq_len_hist="")])
    packed, padded, bare = measured.read_runs(path)
    hw = hs.HardwareProfile.preset("h100")
    t_packed, t_padded, t_bare = measured.predict([packed, padded, bare], hw, steps=2)
    cost = hs.CostModel(padded.model_config(), hw, padded.topology(), zero=True)
    step = cost.step_seconds(padded.layout())  # the same for both
    assert t_padded - step > 1.5 * (t_packed - step)
    assert t_bare == t_padded
    # By hand: every micro-batch of the padded run is micro_batch_size sequences of 4096.
    batches = [[[4096, 4096]] * 16] * 2
    assert t_padded == pytest.approx(cost.phase(padded.layout(), batches).total_seconds +
                                     cost.step_seconds(padded.layout()), rel=1e-12)


def test_pairwise_order_agreement_counts_pairs_apart_by_five_percent(tmp_path):
    rows = [row(run="a", iter_ms_median=1000), row(run="b", iter_ms_median=1030, tp=4, dp=1),
            row(run="c", iter_ms_median=1200, tp=1, dp=4), row(run="d", iter_ms_median=2000, seq_length=8192)]
    runs = measured.read_runs(write(tmp_path / "runs.csv", rows))
    # a-b are 3% apart (not a pair); d is another group; pairs a-c and b-c.
    assert measured.pairwise_order_agreement(runs, [1.0, 5.0, 3.0, 9.0]) == (0.5, 2)
    assert measured.pairwise_order_agreement(runs, [1.0, 1.0, 3.0, 0.1]) == (1.0, 2)
    assert measured.pairwise_order_agreement(runs, [3.0, 3.0, 3.0, 0.1]) == (0.0, 2)  # ties are not ordered


def test_fit_refuses_a_base_without_memory_bandwidth(synthetic):
    runs = measured.read_runs(synthetic)
    base = hs.HardwareProfile.from_dict(dict(PROFILE, memory_bandwidth=0.0))
    with pytest.raises(ValueError, match="memory_bandwidth 0"):
        measured.fit(runs, base)
    with pytest.raises(ValueError, match="subset of"):
        measured.fit(runs, hs.HardwareProfile.preset("h100-datasheet"), fields=["peak_flops"])


def test_the_shipped_runs_check_against_the_h100_preset():
    """The fitted preset predicts the measured runs it was fitted to (when the data is here)."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "megatron_runs", "runs.csv")
    if not os.path.exists(path):
        pytest.skip("data/megatron_runs is not beside the repository")
    result = measured.check(measured.read_runs(path), hs.HardwareProfile.preset("h100"), steps=2)
    assert len(result.runs) >= 100
    assert result.median_abs_rel_error < 0.15 and result.pairwise_order_agreement > 0.85
