"""The planner's dry-run CLI: python -m hotswitch.cli.plan."""

import json
import re

import pytest

import hotswitch as hs
from hotswitch.cli import plan as cli
from hotswitch.data import load_lengths
from hotswitch.planner import build_planner, switch_costs


LENGTHS = [1, 97, 300, 512, 1025, 4096, 7919, 20000]


@pytest.fixture
def lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(n) for n in LENGTHS * 16) + "\n")
    return str(path)

_NUM = r"(\d+(?:\.\d+)?)"
# phase, layout, recompute, seqs, min-max length, micro-batches, then pred s, est s, peak GiB,
# switch in, grad s, and the grad method.
_PHASE = re.compile(r"^(\d+)\s+(\S+)\s+(none|selective|full)\s+(\d+)\s+(\d+)-(\d+)\s+(\d+)"
                    + "".join(r"\s+" + _NUM for _ in range(5)) + r"\s+(local|reduce|partial)$")
_ORDER = re.compile(r"^order (.+) \(home (\S+)\); switch back " + _NUM + r" s; switching " + _NUM
                    + r" s of the step$")
_STEP = re.compile(r"^predicted step " + _NUM + r" s \(objective " + _NUM + r" s\); best static (\S+): "
                   + _NUM + r" s; speedup over the best static layout packed per sequence " + _NUM + r"x$")
_CHOSEN = re.compile(r"^chosen: (planned phases|one phase under \S+) \(" + _NUM + r" s\)")
_SIM = re.compile(r"^simulated 2 steps: tokens/s hot switching ([\d,]+), best static layout for the run \((\S+)/(\S+)\) "
                  r"([\d,]+), best single layout per step ([\d,]+), free switches ([\d,]+); speedup over the best static "
                  r"layout for the run " + _NUM + r"x, over the best single layout per step \(another each step where "
                  r"it pays, no switch: no static run reaches it\) " + _NUM + r"x \(upper bound " + _NUM + r"x\); "
                  r"switching " + _NUM + r"% of the time; median plan " + _NUM + r" ms; speedup over padded static "
                  + _NUM + r"x$")


def _match(pattern, lines):
    found = [m for m in map(pattern.match, lines) if m]
    assert len(found) == 1, (pattern.pattern, lines)
    return found[0]


def test_plans_one_step_and_simulates(lengths_file, capsys):
    # The batch is the whole file (128 lengths): short ones on dp8, the long ones need tp.
    # No margin: the program's phases run whenever they are predicted faster at all (here by 1.6%).
    assert cli.main(["--gpus", "8", "--lengths", lengths_file, "--global-batch", "128", "--home", "dp8",
                     "--candidates", "dp8,tp8", "--steps", "2", "--recompute", "none", "--min-gain", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["phase", "layout", "recompute", "seqs", "lengths", "micro-b", "pred", "s", "est", "s", "peak",
                                "GiB", "switch", "in", "grad", "s", "grad", "method"]
    phases = [m.groups()[:2] + m.groups()[3:] for m in map(_PHASE.match, lines) if m]
    assert all(m.group(3) == "none" for m in map(_PHASE.match, lines) if m)
    assert phases and [int(p[0]) for p in phases] == list(range(len(phases)))
    order = _match(_ORDER, lines)
    step = _match(_STEP, lines)
    sim = _match(_SIM, lines)
    assert _match(_CHOSEN, lines).group(1) == "planned phases"
    candidates = {"dp8", "tp8"}
    # The phases hold the whole batch once, each under a candidate, in the order line's order,
    # as buckets of lengths that do not overlap.
    assert sum(int(p[2]) for p in phases) == 128
    assert order.group(1).split(" -> ") == [p[1] for p in phases]
    assert {p[1] for p in phases} <= candidates and order.group(2) == "dp8" and step.group(3) in candidates
    buckets = sorted((int(p[3]), int(p[4])) for p in phases)
    assert buckets[0][0] == 1 and buckets[-1][1] == 20000
    assert all(hi <= lo for (_, hi), (lo, _) in zip(buckets, buckets[1:])), buckets
    for _, layout, seqs, lo, hi, micro_batches, pred, est, peak, switch_in, grad, method in phases:
        assert int(lo) in LENGTHS and int(hi) in LENGTHS
        assert 1 <= int(micro_batches) <= int(seqs) and float(pred) > 0 and float(est) > 0
        assert 0 < float(peak) <= 80  # GiB of an a800
        assert (method == "local") == (layout == "dp8")  # the home layout reduces in place
    # 20000 tokens fit no data-parallel replica of LLaMA-7B on an a800.
    assert next(p for p in phases if int(p[4]) == 20000)[1] != "dp8"
    # The step is its phases, their switches in, their gradients and the switch back home
    # (each figure printed to 1 ms), and the speedup is the best static layout's time over it.
    total, objective, best_static = float(step.group(1)), float(step.group(2)), float(step.group(4))
    parts = sum(float(p[6]) + float(p[9]) + float(p[10]) for p in phases) + float(order.group(3))
    assert total == pytest.approx(parts, abs=5e-4 * (3 * len(phases) + 2))
    assert float(step.group(5)) == pytest.approx(best_static / total, abs=0.006)
    assert 0 <= float(order.group(4)) <= total and objective > 0
    # The simulation's speedups are ratios of its throughputs; free switches bound hot switching.
    # The best layout fixed for the run is a candidate, and no faster than the best single
    # layout of each step (which may change from step to step at no cost).
    hot, run, per_step, free = (int(sim.group(i).replace(",", "")) for i in (1, 4, 5, 6))
    assert sim.group(2) in candidates and sim.group(3) == "none"
    assert hot <= free and run <= per_step
    assert float(sim.group(7)) == pytest.approx(hot / run, abs=0.006)
    assert float(sim.group(8)) == pytest.approx(hot / per_step, abs=0.006)
    assert float(sim.group(9)) == pytest.approx(free / per_step, abs=0.006)


def test_long_sequences_truncate_split_or_reject(lengths_file, capsys):
    args = ["--gpus", "8", "--lengths", lengths_file, "--global-batch", "32", "--candidates", "dp8,dp2tp4,tp8",
            "--max-context", "4096"]
    assert cli.main(args + ["--long-sequences", "truncate"]) == 0
    assert "-4096" in capsys.readouterr().out
    assert cli.main(args + ["--long-sequences", "split"]) == 0
    assert "-4096" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        cli.main(args + ["--long-sequences", "reject"])
    assert info.value.code == 2
    assert "longer than the max context of 4096" in capsys.readouterr().err


def test_planner_splits_long_sequences_into_pieces():
    model = hs.ModelConfig.preset("llama-7b")
    hardware = hs.HardwareProfile.preset("a800")
    topology = hs.Topology(8, 8)
    layouts = [hs.Layout.parse(n) for n in ["dp8", "dp2tp4", "tp8"]]
    planner = build_planner(model, hardware, topology, layouts, 0, max_context=1000, long_sequences="split")
    plan = planner.plan([2500, 30, 1000])
    pieces = [(p.sequence, p.offset, p.length) for p in plan.pieces]
    assert pieces == [(0, 0, 1000), (0, 1000, 1000), (0, 2000, 500), (1, 0, 30), (2, 0, 1000)]
    assert plan.pieces == planner.pieces([2500, 30, 1000])
    placed = sorted(i for ph in plan.phases for r in ph.packing.micro_batches for mb in r for i in mb)
    assert placed == [0, 1, 2, 3, 4]
    for ph in plan.phases:
        assert len(ph.cu_seqlens) == len(ph.packing.micro_batches)
        for replica, cus in zip(ph.packing.micro_batches, ph.cu_seqlens):
            assert len(cus) == len(replica)
            for mb, cu in zip(replica, cus):
                assert cu == [sum(plan.pieces[i].length for i in mb[:k]) for k in range(len(mb) + 1)]
    assert planner.long_sequences == "split" and planner.max_context == 1000


def test_calibrated_profile_file_plans_like_a_preset(lengths_file, tmp_path, capsys):
    profile = hs.HardwareProfile.preset("a800")
    profile.memory_bytes = 60 << 30
    profile.name = "a800-60g"
    path = str(tmp_path / "hw.json")
    profile.save(path)
    assert json.loads(open(path).read())["memory_bytes"] == 60 << 30
    assert hs.HardwareProfile.load(path) == profile
    assert cli.main(["--gpus", "8", "--lengths", lengths_file, "--global-batch", "32", "--hardware", path,
                     "--candidates", "dp8,dp2tp4,tp8"]) == 0
    assert "predicted step" in capsys.readouterr().out


def test_plot_draws_a_png(lengths_file, tmp_path, capsys):
    path = tmp_path / "step.png"
    assert cli.main(["--gpus", "8", "--lengths", lengths_file, "--global-batch", "48",
                     "--candidates", "dp8,dp2tp4,tp8", "--plot", str(path)]) == 0
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_switch_costs_from_plans_and_estimates_agree():
    model = hs.ModelConfig.preset("llama-7b")
    hardware = hs.HardwareProfile.preset("a800")
    topology = hs.Topology(16, 8)
    layouts = [hs.Layout.parse(n) for n in ["dp16", "dp4tp4", "dp2tp4pp2"]]
    plans = switch_costs(model, hardware, topology, layouts, 1, method="plans")
    estimates = switch_costs(model, hardware, topology, layouts, 1, method="estimate")
    pairs = [(plans[0][i][j], estimates[0][i][j]) for i in range(3) for j in range(3)]
    pairs += [(plans[k][i], estimates[k][i]) for k in (1, 2) for i in range(3)]
    for planned, estimated in pairs:
        # The plan's slowest rank (sends or receives) and the estimate's slowest receiver:
        # equal when the receives bind, larger for the plan when a sender does.
        assert (planned == 0) == (estimated == 0)
        assert planned >= estimated * (1 - 1e-12), (planned, estimated)
        assert planned <= estimated * 2, (planned, estimated)
    assert plans[1][1] == plans[2][1] == 0  # the home layout's gradients stay in place


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "0"], "--gpus must be >= 1, got 0"),
    (["--model", "gpt-5"], "'gpt-5'"),
    (["--hardware", "tpu"], "'tpu'"),
    (["--hardware", "missing.json"], "cannot read hardware profile 'missing.json'"),
    (["--candidates", "dp2tp2"], "!= world(8)"),
    (["--candidates", "dp1tp8", "--home", "dp8"], "--home dp8 is not among"),
    (["--steps", "-1"], "--steps must be >= 0"),
    (["--plot", "out.svg"], "--plot must name a .png file"),
    (["--recompute", "block"], "--recompute must be auto or a list of distinct none, selective, full; got 'block'"),
    (["--recompute", "full,full"], "got 'full,full'"),
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
        load_lengths(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        load_lengths(str(tmp_path / "missing.txt"))


def test_bad_profile_files_name_the_field(tmp_path):
    path = tmp_path / "hw.json"
    fields = hs.HardwareProfile.preset("a100").to_dict()
    fields["efficiency"] = 1.5
    path.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match="efficiency must be in"):
        hs.HardwareProfile.load(str(path))
    del fields["efficiency"]
    path.write_text(json.dumps(fields))
    with pytest.raises(ValueError, match="lacks the field 'efficiency'"):
        hs.HardwareProfile.load(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        hs.HardwareProfile.load(str(path))
    profile = hs.HardwareProfile.preset("a100")
    with pytest.raises(ValueError, match="memory_bytes must be > 0"):
        profile.memory_bytes = 0
    assert profile.memory_bytes == 80 << 30


def test_recompute_lets_a_long_context_plan_and_only_its_phase_pays(tmp_path, capsys):
    # LLaMA-32B's 52 heads allow tp <= 4 on 32 GPUs; without recomputation no layout holds
    # 32K tokens on an a800; with it the long bucket recomputes and the short ones do not.
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(n) for n in [300, 500, 1000, 2048, 4000] * 100 + [32768] * 4) + "\n")
    args = ["--model", "llama-32b", "--gpus", "32", "--gpus-per-node", "8", "--hardware", "a800",
            "--max-context", "32768", "--lengths", str(path), "--global-batch", "504", "--switch-costs", "estimate"]
    with pytest.raises(SystemExit) as info:
        cli.main(args + ["--recompute", "none"])
    assert info.value.code == 2
    assert "fits no candidate layout; the longest that fits is" in capsys.readouterr().err
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    phases = [m.groups() for m in map(_PHASE.match, lines) if m]
    assert phases
    longest = next(p for p in phases if int(p[5]) == 32768)
    assert longest[2] != "none"
    assert any(p[2] == "none" for p in phases), phases  # short buckets skip recomputation
    for p in phases:
        assert 0 < float(p[9]) <= 80  # peak GiB within an a800


def test_context_parallel_size_adds_cp_layouts_that_take_the_longest_documents(tmp_path, capsys):
    # 128K documents among short ones on 8 GPUs: the layouts with cp up to 8 join the candidates
    # and the dry run shows the lengths each phase takes.
    path = tmp_path / "long.lengths"
    path.write_text("\n".join(str(n) for n in [131072, 90000] + [300, 1200, 4000] * 20) + "\n")
    argv = ["--gpus", "8", "--lengths", str(path), "--global-batch", "62", "--max-context", "131072",
            "--hardware", "h100", "--seed", "1"]
    assert cli.main(argv + ["--context-parallel-size", "8"]) == 0
    out = capsys.readouterr()
    assert "\n20 candidate layouts" in out.err, out.err  # 10 without cp, 6 with cp2, 3 with cp4, cp8
    phases = [m.groups() for m in map(_PHASE.match, out.out.splitlines()) if m]
    layouts = {p[1]: (int(p[4]), int(p[5])) for p in phases}
    cp = {name: span for name, span in layouts.items() if hs.Layout.parse(name).cp > 1}
    assert cp and max(hi for _, hi in cp.values()) == 131072, layouts
    assert any(hs.Layout.parse(name).cp == 1 and lo == 300 for name, (lo, _) in layouts.items()), layouts
    with pytest.raises(SystemExit):
        cli.main(argv + ["--context-parallel-size", "0"])
    assert "--context-parallel-size must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(argv + ["--context-parallel-size", "2", "--candidates", "dp8,tp8"])
    assert "name the cp layouts there" in capsys.readouterr().err


def test_min_gain_keeps_the_step_in_one_phase_unless_switching_wins_by_it(lengths_file, capsys):
    args = ["--gpus", "8", "--lengths", lengths_file, "--global-batch", "128", "--home", "dp8",
            "--candidates", "dp8,tp8", "--recompute", "none"]
    assert cli.main(args + ["--min-gain", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    planned = _match(_CHOSEN, lines)
    assert planned.group(1) == "planned phases", lines
    # A margin no plan can beat: the step runs as one phase, and the line gives both sides.
    assert cli.main(args + ["--min-gain", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    one = _match(_CHOSEN, lines)
    assert one.group(1).startswith("one phase under ") and "not the 10000.0% that switching must gain" in one.string
    assert len([m for m in map(_PHASE.match, lines) if m]) == 1
    with pytest.raises(SystemExit) as info:
        cli.main(args + ["--min-gain", "-0.5"])
    assert info.value.code == 2
    assert "--min-gain must be a fraction >= 0 (0.01: 1%), got -0.5" in capsys.readouterr().err


def test_the_dry_run_takes_a_dataset_a_model_file_a_budget_and_part_of_a_node(tmp_path, capsys):
    from hotswitch import huggingface as hf
    from hotswitch.data.indexed import IndexedDatasetBuilder
    from hotswitch.model.config import TransformerConfig

    prefix = str(tmp_path / "docs_text_document")
    builder = IndexedDatasetBuilder(prefix)
    for n in LENGTHS * 8:
        builder.add_document([7] * n)
    builder.finalize()
    assert sorted(set(load_lengths(prefix))) == sorted(set(LENGTHS))
    assert load_lengths(prefix + ".bin") == load_lengths(prefix)
    config = TransformerConfig(num_layers=8, hidden_size=1024, num_attention_heads=16, num_query_groups=4,
                               ffn_hidden_size=2816, vocab_size=32000, max_position_embeddings=32768)
    (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(config)))
    (tmp_path / "model.json").write_text(json.dumps({"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
                                                     "num_query_groups": 4, "ffn_hidden_size": 2816,
                                                     "vocab_size": 32000, "max_position_embeddings": 32768}))
    outputs = []
    for model in ("config.json", "model.json"):
        assert cli.main(["--model-config", str(tmp_path / model), "--gpus", "4", "--hardware", "h100",
                         "--lengths", prefix, "--global-batch", "32", "--max-context", "20000",
                         "--memory-budget-gb", "40", "--home", "static", "--rank-order", "megatron"]) == 0
        out = capsys.readouterr().out
        _match(_STEP, out.splitlines())
        outputs.append([line for line in out.splitlines() if not line.startswith("planned in ")])  # timed
    assert outputs[0] == outputs[1]  # the same model either way
    with pytest.raises(SystemExit):
        cli.main(["--model-config", str(tmp_path / "lengths.txt"), "--lengths", prefix])
    assert "model config" in capsys.readouterr().err
