"""Planner options seen from Python: the micro-batch token cap."""

import pytest

import hotswitch as hs


def _planner(**options):
    cost = hs.CostModel(hs.ModelConfig.preset("llama-7b"), hs.HardwareProfile.preset("a100"), hs.Topology(8, 8))
    layouts = [hs.Layout.parse(n) for n in ("dp8", "dp4tp2", "dp2tp4", "tp8")]
    n = len(layouts)
    return hs.Planner(cost, layouts, 0, [[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n, **options)


def test_micro_batches_hold_at_most_the_cap():
    lengths = [100, 300, 700, 1500, 2000, 2048, 40, 900] * 8
    free = _planner(max_context=2048)
    capped = _planner(max_context=2048, max_tokens_per_micro_batch=2048)
    assert max(free.micro_batch_budget(i) for i in range(4)) > 2048  # memory alone allows more
    plan = capped.plan(lengths)
    placed = []
    for ph in plan.phases:
        for replica in ph.packing.micro_batches:
            for mb in replica:
                assert sum(lengths[i] for i in mb) <= 2048
                placed += mb
    assert sorted(placed) == list(range(len(lengths)))


def test_a_negative_cap_is_refused():
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch must be >= 0.*-1"):
        _planner(max_tokens_per_micro_batch=-1)


def test_every_layout_holds_the_weight_copies_of_the_candidates_that_run_graphs():
    # Under graph buckets each layout that runs graphs keeps a copy of its layer weights whose
    # addresses the graphs captured, while the others run: the planner's cost model holds
    # them all in every layout's memory, so each micro-batch budget shrinks. LLaMA-7B at 2
    # bytes a parameter: dp8 keeps 12.9 GB, dp4tp2 half its matrices and its norms whole;
    # tp2pp4 runs no graphs.
    model, hw, topology = hs.ModelConfig.preset("llama-7b"), hs.HardwareProfile.preset("a100"), hs.Topology(8, 8)
    layouts = [hs.Layout.parse(n) for n in ("dp8", "dp4tp2", "tp2pp4")]
    graphs = dict(graph_buckets=[4096, 8192], graph_layer_overhead_seconds=1e-4)
    cost = hs.CostModel(model, hw, topology, zero=True, **graphs)
    copies = [cost.graph_copy_bytes(l) for l in layouts]
    norms = 2 * model.hidden_size
    assert copies[0] == model.num_layers * model.layer_params * 2
    assert copies[1] == model.num_layers * ((model.layer_params - norms) // 2 + norms) * 2
    assert copies[2] == 0
    n = len(layouts)
    zeros = ([[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n)
    planner = hs.Planner(cost, layouts, 0, *zeros)
    plain = hs.Planner(hs.CostModel(model, hw, topology, zero=True), layouts, 0, *zeros)
    assert cost.graph_copies_held_bytes == 0
    assert planner.cost.graph_copies_held_bytes == sum(copies)
    assert planner.cost.static_bytes(layouts[2]) == plain.cost.static_bytes(layouts[2]) + sum(copies)
    for i in range(n):
        assert 0 < planner.micro_batch_budget(i) < plain.micro_batch_budget(i), layouts[i].name


def test_the_programs_estimate_finds_the_phases_that_graphs_make_cheap():
    # LLaMA-7B on 8 H100s, graphs that cut the fixed cost per layer to a tenth. A step of
    # short sequences and a few of 1-1.2K: as one dp4tp2 phase its replicas hold 4,200 tokens,
    # which no graph bucket holds in one micro-batch, and it runs as it is. The estimate that
    # weighs the buckets finds the split: the longer sequences packed to 4096 under dp4tp2 and
    # the short ones to 1024 under dp2tp4, all from the graphs, and its estimate of each phase
    # is the exact packing's time.
    model, hw, topology = hs.ModelConfig.preset("llama-7b"), hs.HardwareProfile.preset("h100"), hs.Topology(8, 8)
    layouts = [hs.Layout.parse(n) for n in ("dp8", "dp4tp2", "dp2tp4", "tp2pp4")]
    n = len(layouts)
    zeros = ([[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n)
    cost = hs.CostModel(model, hw, topology, zero=True, graph_buckets=[1024, 2048, 4096],
                        graph_layer_overhead_seconds=0.1 * hw.layer_overhead_seconds, graph_copy_param_bytes=2)
    weighed = hs.Planner(cost, layouts, 0, *zeros, max_context=32768)
    blind = hs.Planner(cost, layouts, 0, *zeros, max_context=32768, graph_estimate=False)
    assert [weighed.candidate_model(i).graph_buckets for i in range(n)] == [[1024, 2048], [1024, 2048, 4096],
                                                                            [1024, 2048, 4096], []]
    assert all(blind.candidate_model(i).graph_buckets == [] for i in range(n))
    lengths = [125] * 64 + [1000, 1200] * 4
    with_graphs, without = weighed.plan(lengths), blind.plan(lengths)
    assert [(p.layout.name, p.graph_tokens) for p in without.phases] == [("dp4tp2", [[0]] * 4)]
    assert [(p.layout.name, p.graph_tokens) for p in with_graphs.phases] == [("dp4tp2", [[4096]] * 4),
                                                                            ("dp2tp4", [[1024]] * 2)]
    assert with_graphs.total_seconds < 0.95 * without.total_seconds
    for phase in with_graphs.phases:
        assert phase.estimate_seconds == pytest.approx(phase.cost.run_seconds, rel=1e-9)
    # The MILP prices E without graphs: it refuses a planner whose estimate weighs them.
    from hotswitch.analysis import milp
    with pytest.raises(ValueError, match="does not model CUDA graph buckets; candidates dp8, dp4tp2, dp2tp4 run them"):
        milp.solve(weighed, lengths)


def test_only_the_named_graph_layouts_hold_copies_and_run_graphs():
    # graph_layouts: dp4tp2 alone captures graphs. dp8 runs as without buckets and keeps no
    # copies; every layout's memory holds dp4tp2's copies only, so dp8's micro-batch budget
    # is larger than when every layout that can captures graphs.
    model, hw, topology = hs.ModelConfig.preset("llama-7b"), hs.HardwareProfile.preset("a100"), hs.Topology(8, 8)
    layouts = [hs.Layout.parse(n) for n in ("dp8", "dp4tp2", "tp2pp4")]
    n = len(layouts)
    zeros = ([[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n)
    graphs = dict(graph_buckets=[4096, 8192], graph_layer_overhead_seconds=1e-4)
    every = hs.Planner(hs.CostModel(model, hw, topology, zero=True, **graphs), layouts, 0, *zeros)
    named = hs.Planner(hs.CostModel(model, hw, topology, zero=True, graph_layouts=["dp4tp2"], **graphs), layouts, 0,
                       *zeros)
    plain = hs.Planner(hs.CostModel(model, hw, topology, zero=True), layouts, 0, *zeros)
    copies = [named.cost.graph_copy_bytes(l) for l in layouts]
    assert copies[0] == 0 and copies[1] == every.cost.graph_copy_bytes(layouts[1]) > 0 and copies[2] == 0
    assert named.cost.graph_copies_held_bytes == copies[1] < every.cost.graph_copies_held_bytes
    assert [named.cost.terms(l).graphs for l in layouts] == [False, True, False]
    assert [every.cost.terms(l).graphs for l in layouts] == [True, True, False]
    assert every.micro_batch_budget(0) < named.micro_batch_budget(0) < plain.micro_batch_budget(0)
    assert named.candidate_model(0).graph_buckets == [] and named.candidate_model(1).graph_buckets


def test_auto_graph_layouts_are_the_home_and_the_layouts_planned_without_graphs():
    # graph_layouts="auto": the home (dp8) and every layout of the plans of the probe batches by
    # a planner without graph buckets, in candidate order. Only dp2tp4 holds a 30,000-token
    # sequence, so a batch with one brings it in; tp2pp4, never planned, stays out.
    from hotswitch.planner import auto_graph_layouts

    model, hw, topology = hs.ModelConfig.preset("llama-7b"), hs.HardwareProfile.preset("h100"), hs.Topology(8, 8)
    layouts = [hs.Layout.parse(n) for n in ("dp8", "dp4tp2", "dp2tp4", "tp2pp4")]
    n = len(layouts)
    zeros = ([[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n)
    plain = hs.Planner(hs.CostModel(model, hw, topology, zero=True), layouts, 0, *zeros, max_context=32768)
    assert [plain.micro_batch_budget(i) >= 30000 for i in range(n)] == [False, False, True, False]
    long_batch, short_batch = [125] * 32 + [30000], [125] * 64
    chosen = auto_graph_layouts(plain, [long_batch])
    assert "dp2tp4" in chosen and chosen[0] == "dp8"
    planned = {ph.layout.name for ph in plain.plan(long_batch).phases}
    assert chosen == [l.name for l in layouts if l.name == "dp8" or l.name in planned]
    both = auto_graph_layouts(plain, [short_batch, long_batch])
    assert set(both) == set(chosen) | set(auto_graph_layouts(plain, [short_batch])) and "tp2pp4" not in both
    assert both == [l.name for l in layouts if l.name in both]  # candidate order
    # A fixed plan's layouts in place of the planner's.
    fixed = [(30000, 2, "none")]
    assert auto_graph_layouts(plain, [long_batch], fixed_entries=fixed) == ["dp8", "dp2tp4"]
    graphed = hs.Planner(hs.CostModel(model, hw, topology, zero=True, graph_buckets=[1024],
                                      graph_layer_overhead_seconds=1e-4), layouts, 0, *zeros)
    with pytest.raises(ValueError, match=r"needs a planner without graph buckets, got one with \[1024\]"):
        auto_graph_layouts(graphed, [long_batch])
    for bad in ([], "12", None):
        with pytest.raises(ValueError, match="batches must be a non-empty list of batches of sequence lengths"):
            auto_graph_layouts(plain, bad)


def test_auto_graph_layouts_fall_back_to_the_home_alone_then_none():
    # keep_graph_layouts, the rule of the runtime and the dry run: the chosen set, else the home
    # alone, else none; the first set the check accepts, with every refusal before it.
    from hotswitch.planner import keep_graph_layouts

    def refusing(*refused):
        tried = []

        def check(names):
            tried.append(names)
            if names in refused:
                raise ValueError(f"{names} break the bound")
            return len(names)
        return check, tried

    check, tried = refusing()
    assert keep_graph_layouts(["dp2", "tp2"], "tp2", check) == (["dp2", "tp2"], 2, []) and tried == [["dp2", "tp2"]]
    check, tried = refusing(["dp2", "tp2"])
    names, result, refused = keep_graph_layouts(["dp2", "tp2"], "tp2", check)
    assert (names, result, tried) == (["tp2"], 1, [["dp2", "tp2"], ["tp2"]])
    assert [(n, str(e)) for n, e in refused] == [(["dp2", "tp2"], "['dp2', 'tp2'] break the bound")]
    check, tried = refusing(["dp2", "tp2"], ["tp2"])
    assert keep_graph_layouts(["dp2", "tp2"], "tp2", check)[:2] == ([], 0) and tried[-1] == []
    # The home alone is tried once, not twice, when it is what was chosen.
    check, tried = refusing(["tp2"])
    assert keep_graph_layouts(["tp2"], "tp2", check)[:2] == ([], 0) and tried == [["tp2"], []]
    # When even none is refused, its error is raised.
    check, tried = refusing(["dp2", "tp2"], ["tp2"], [])
    with pytest.raises(ValueError, match=r"\[\] break the bound"):
        keep_graph_layouts(["dp2", "tp2"], "tp2", check)
