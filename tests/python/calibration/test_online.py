"""Online re-calibration on synthetic phase times: the fit recovers the coefficients that
produced them, and is deterministic."""

import numpy as np
import pytest
import torch

import hotswitch as hs
from hotswitch import _C
from hotswitch.calibration import online
from hotswitch.calibration.online import OnlineCalibration
from hotswitch.model.config import runs_graphs
from hotswitch.testing import scenarios as w

BATCHES = [
    ("dp4", [[[40, 23]], [[17]], [[90]], [[5, 5, 5]]]),
    ("dp2tp2", [[[150, 60]], [[120]]]),
    ("pp4", [[[250], [100], [30, 31]]]),
    ("tp2pp2", [[[200, 50], [256]]]),
    ("dp4", [[[250]], [[3]], [[128]], [[64, 64]]]),
    ("dp2tp2", [[[31, 37, 41]], [[200]]]),
]


def _truth():
    fields = w.hardware().to_dict()
    fields.update(efficiency=0.4, layer_overhead_seconds=3e-4, intra_node_bandwidth=1e8, inter_node_bandwidth=1e8)
    return _C.HardwareProfile.from_dict(fields)


def _calibration(truth, tp_overlap=1.0):
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    topology = hs.Topology(4, 4)
    cal = OnlineCalibration(cfg, topology, zero=False, tp_overlap=tp_overlap)
    cost = hs.CostModel(cfg, truth, topology, tp_overlap=tp_overlap)
    for name, batches in BATCHES:
        layout = hs.Layout.parse(name)
        cal.observe_phase(layout, batches, cost.phase(layout, batches).run_seconds)
    cal.observe_switch(0.01, 0.03)
    cal.observe_switch(0.02, 0.06)
    cal.observe_overhead(0.005)
    return cal


def test_fit_recovers_the_times_that_produced_the_observations():
    cal = _calibration(_truth())
    fit = cal.fit(w.hardware())
    assert fit.error_before > 0.2, fit
    assert fit.error_after < 0.02, fit
    assert abs(fit.switch_scale - 3.0) < 1e-9 and abs(fit.overhead_s - 0.005) < 1e-12
    again = _calibration(_truth()).fit(w.hardware())
    assert again.hardware == fit.hardware  # deterministic


def test_phases_are_priced_with_the_tp_overlap_the_layers_ran_with():
    # Compiled layers hide none of the tp backward's collectives (tp_overlap 0): a calibration
    # told so recovers the times as well as the default one does its own; one that prices the
    # same phases with the eager overlap starts further off. Bad shares are refused.
    truth = _truth()
    fit = _calibration(truth, tp_overlap=0.0).fit(w.hardware())
    assert fit.error_after < 0.02, fit
    cal = _calibration(truth, tp_overlap=0.0)
    fields = online._fields(truth)
    assert np.allclose(cal._predict(fields), [p[2] for p in cal.phases], rtol=1e-12)
    cal.tp_overlap = 1.0
    off = cal._predict(fields) / np.array([p[2] for p in cal.phases])
    names = [name for name, _ in BATCHES]
    assert all((r < 1 - 1e-6) == ("tp" in n) for r, n in zip(off, names)), (names, off)
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    for bad in (-0.5, 1.5, float("nan"), True, "1"):
        with pytest.raises(ValueError, match=r"tp_overlap must be a share in \[0, 1\], got"):
            OnlineCalibration(cfg, hs.Topology(4, 4), zero=False, tp_overlap=bad)
    with pytest.raises(ValueError, match=r"tp_overlap must be in \[0, 1\], got 2"):
        hs.CostModel(cfg, truth, hs.Topology(4, 4), tp_overlap=2.0)
    assert hs.CostModel(cfg, truth, hs.Topology(4, 4)).tp_overlap == 1.0
    assert hs.RuntimeConfig().tp_overlap == 1.0 and hs.RuntimeConfig(compile_layers=True).tp_overlap == 0.0
    # Full recomputation's chunks, as the runtime's checkpoint stops their reruns.
    assert OnlineCalibration(cfg, hs.Topology(4, 4), zero=False, recompute_chunk_layers=2).recompute_chunk_layers == 2
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="recompute_chunk_layers must be an int >= 0, got"):
            OnlineCalibration(cfg, hs.Topology(4, 4), zero=False, recompute_chunk_layers=bad)
    assert hs.RuntimeConfig(recompute_num_layers=3).recompute_chunk_layers == 3
    # Compiled layers: not known to stop early, priced as the whole rerun.
    assert hs.RuntimeConfig(recompute_num_layers=3, compile_layers=True).recompute_chunk_layers == 0
    assert hs.CostModel(cfg, truth, hs.Topology(4, 4)).recompute_chunk_layers == 0  # Megatron-LM's whole rerun


GRAPH_BUCKETS = [64, 128, 256]
# dp4 phases whose micro-batches fill a bucket (every replica alike), each once as it is and
# once from the graphs, as the runtime's start-up probe runs them: the same work, with and
# without the launches.
GRAPHED = [[[[64]]] * 4, [[[30, 34]]] * 4, [[[120, 8]]] * 4, [[[100, 28], [64]]] * 4, [[[256]]] * 4,
           [[[16, 16, 16, 16]]] * 4, [[[200, 56]]] * 4]


def _graph_calibration(cost, given, pairs=True, layout="dp4"):
    """A calibration with graph buckets and the overhead ``given`` (None: unknown) that observed
    BATCHES eagerly and, with ``pairs``, each of GRAPHED under ``layout`` as it is and from the
    graphs (the runtime's start-up probe), priced by ``cost``."""
    cal = OnlineCalibration(cost.model, cost.topology, zero=False, tp_overlap=cost.tp_overlap, graphs=dict(
        graph_buckets=GRAPH_BUCKETS, graph_layer_overhead_seconds=given))
    for name, batches in BATCHES:
        phase_layout = hs.Layout.parse(name)
        cal.observe_phase(phase_layout, batches, cost.phase(phase_layout, batches).run_seconds,
                          graph_tokens=[[0] * len(r) for r in batches])
    paired = hs.Layout.parse(layout)
    for batches in GRAPHED if pairs else []:
        batches = batches[:paired.dp]
        times = []
        for graphed in (False, True):
            tokens = [[sum(mb) if graphed else 0 for mb in r] for r in batches]
            times.append(cost.phase(paired, batches, graph_tokens=tokens).run_seconds)
            cal.observe_phase(paired, batches, times[-1], graph_tokens=tokens)
        cal.observe_graph_saving(paired, [sum(mb) for mb in batches[0]], *times)
    return cal


def _graph_truth():
    """The truth of the graph tests: 2 ms per layer eagerly, 0.2 ms from the graphs; and its
    cost model with GRAPH_BUCKETS."""
    fields = _truth().to_dict()
    fields["layer_overhead_seconds"] = 2e-3
    truth = hs.HardwareProfile.from_dict(fields)
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    return truth, hs.CostModel(cfg, truth, hs.Topology(4, 4), graph_buckets=GRAPH_BUCKETS,
                               graph_layer_overhead_seconds=2e-4)


def test_graph_savings_and_graphed_phases_fit_the_graph_overhead():
    # The truth: 2 ms per layer eagerly, 0.2 ms from the graphs. The calibration starts without
    # a graph overhead (the runtime's start before its probe); pairs of the same micro-batch as
    # it is and from the graphs measure the saving, and the graph overhead is the refitted layer
    # overhead less it.
    truth, cost = _graph_truth()
    start = w.hardware()
    fit = _graph_calibration(cost, None).fit(start)
    assert fit.error_after < 0.02, fit
    # What the planner weighs is the saving per layer: measured, up to dp4's factor. The graph
    # overhead is as good as the layer overhead's refit (at least 0).
    saving = fit.hardware.layer_overhead_seconds - fit.graph_layer_overhead_seconds
    assert fit.graph_saving_seconds == pytest.approx(1.8e-3, rel=0.05), fit
    assert saving == pytest.approx(1.8e-3, rel=0.05), fit
    assert fit.hardware.layer_overhead_seconds == pytest.approx(2e-3, rel=0.15), fit
    assert 0 <= fit.graph_layer_overhead_seconds <= 4e-4, fit
    # A given overhead is replaced by the measured saving: the same fit (only the error before
    # it, priced with the given overhead, differs).
    again = _graph_calibration(cost, 1e-3).fit(start)
    assert (again.hardware, again.graph_layer_overhead_seconds, again.layout_scale) == \
        (fit.hardware, fit.graph_layer_overhead_seconds, fit.layout_scale)

    # No saving observed: a given overhead stays, whatever the phases; an unknown one follows
    # the refitted layer overhead (the graphs save nothing).
    given = _graph_calibration(cost, 2e-4, pairs=False).fit(start)
    assert given.graph_layer_overhead_seconds == 2e-4 and given.graph_saving_seconds is None
    unknown = _graph_calibration(cost, None, pairs=False).fit(start)
    assert unknown.graph_layer_overhead_seconds == unknown.hardware.layer_overhead_seconds != \
        start.layer_overhead_seconds, unknown
    # Without buckets there is none, and no saving to observe.
    assert _calibration(truth).fit(start).graph_layer_overhead_seconds is None
    with pytest.raises(ValueError, match="observe_graph_saving needs graph buckets"):
        _calibration(truth).observe_graph_saving(hs.Layout.parse("dp4"), [64], 0.2, 0.1)


def test_a_tp_pairs_saving_gets_back_the_collectives_its_graphs_wait_for():
    # At tp2 the graphed run of a pair also waits for the tp collectives the eager layers hide
    # (graph_tp_alpha), which the cost model prices apart: the fitted saving per layer is the
    # fixed cost alone, as at dp4, not less that traffic (which would count it twice).
    _, cost = _graph_truth()
    cfg = cost.model
    tp2 = hs.Layout.parse("dp2tp2")
    cal = _graph_calibration(cost, None, layout="dp2tp2")
    # What the pairs measure per layer is well short of the saving: the 4 collectives' latencies
    # and traffic per layer that the graphs wait for are large here.
    terms = cost.terms(tp2)
    assert terms.graph_tp_alpha > 0 and terms.graph_tp_micro_batch_seconds > 0
    raw = np.median([s / (len(tokens) * cfg.num_layers) for _, tokens, s in cal.graph_savings])
    assert raw < 0.5 * 1.8e-3, raw
    # The fit gets the saving back up to its own error in the link's bandwidth (within 10%:
    # the phases identify the latency better than the bandwidth).
    fit = cal.fit(w.hardware())
    assert fit.error_after < 0.02, fit
    assert fit.graph_saving_seconds == pytest.approx(1.8e-3, rel=0.1), fit
    # A pair's buckets must be graph buckets, one per micro-batch; nothing is observed otherwise.
    for bad in ([], [100], [64.0], [True], 64):
        with pytest.raises(ValueError, match=r"graph_tokens must list the graph bucket of each micro-batch"):
            cal.observe_graph_saving(tp2, bad, 0.2, 0.1)
    assert len(cal.graph_savings) == len(GRAPHED)


def test_bad_graph_tokens_are_refused_and_observe_nothing():
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    cal = OnlineCalibration(cfg, hs.Topology(4, 4), zero=False,
                            graphs=dict(graph_buckets=GRAPH_BUCKETS, graph_layer_overhead_seconds=None))
    dp4, tp2, pp2 = hs.Layout.parse("dp4"), hs.Layout.parse("dp2tp2"), hs.Layout.parse("dp2pp2")
    batches = [[[120, 7]], [[100]], [[256]], [[30, 30]]]
    for layout, tokens, recompute, match in [
            (dp4, [[128]] * 3, "none", r"one entry per micro-batch of each replica \[1, 1, 1, 1\]"),
            (dp4, [[128, 0], [0], [0], [0]], "none", "one entry per micro-batch"),
            (dp4, [[64], [0], [0], [0]], "none", r"graph_tokens\[0\]\[0\] must be 0 or one of the graph buckets "
                                                 r"\[64, 128, 256\] holding the micro-batch's 127 tokens"),
            (dp4, [[0], [0], [0], [100]], "none", r"graph_tokens\[3\]\[0\] .* got 100"),
            (dp4, [[0], [0], [0], [64.0]], "none", r"got 64.0"),
            (dp4, [[128], [0], [0], [0]], "full", "recompute 'full'"),
            (pp2, [[128], [0]], "none", "dp2pp2")]:
        with pytest.raises(ValueError, match=match):
            cal.observe_phase(layout, batches if layout is dp4 else batches[:2], 0.1, recompute, graph_tokens=tokens)
    assert not cal.phases
    with pytest.raises(ValueError, match=r"layout dp2pp2 runs no CUDA graphs at the graph buckets \[64, 128, 256\]"):
        cal.observe_graph_saving(pp2, [64], 0.2, 0.1)
    assert not cal.graph_savings
    cal.observe_phase(dp4, batches, 0.1, graph_tokens=[[128], [128], [256], [64]])
    cal.observe_phase(tp2, batches[:2], 0.1, graph_tokens=[[128], [128]])  # every bucket a multiple of 2
    assert len(cal.phases) == 2


@pytest.mark.parametrize("buckets", [[64, 128, 256], [33, 64], [30, 64]])
def test_the_model_and_the_cost_model_agree_on_which_layouts_run_graphs(buckets):
    # runs_graphs (the model, the runtime, the calibration) against LayoutTerms.graphs (the
    # planner): pp and cp 1, every bucket a multiple of tp, no full recomputation.
    cfg = hs.TransformerConfig(**dict(w.TINY, num_query_groups=4))  # tp4 divides it
    cost = hs.CostModel(cfg.cost_config(), _truth(), hs.Topology(8, 8), graph_buckets=buckets,
                        graph_layer_overhead_seconds=4e-5)
    seen = set()
    for name in ("dp8", "dp4tp2", "dp2tp4", "dp4pp2", "dp4cp2", "tp2pp2cp2"):
        layout = hs.Layout.parse(name)
        for mode in ("none", "selective", "full"):
            runs = runs_graphs(layout, buckets, mode)
            assert cost.terms(layout, mode).graphs == runs, (name, mode, buckets)
            seen.add(runs)
    assert seen == {True, False}
    assert not runs_graphs(hs.Layout.parse("dp8"), None) and not runs_graphs(hs.Layout.parse("dp8"), [])


def test_the_attentions_bound_on_a_static_pack_caps_the_buckets_that_run_graphs():
    # The mask kernels hold at most graph_max_scores scores (heads per rank * tokens^2) in one
    # call and run larger packs per length, which no graph captures: the model runs such a
    # bucket as it is (runs_graphed), and the cost model neither chooses it nor takes it as run.
    from hotswitch.model.attention import PackAttention
    cfg = hs.TransformerConfig(**dict(w.TINY, num_query_groups=4)).cost_config()
    cpu = torch.device("cpu")
    bound = PackAttention.max_static_scores("sdpa", cpu)
    assert bound == 1 << 15 and PackAttention.max_static_scores("flex", cpu) is None
    assert PackAttention.max_static_scores("grouped", cpu) == 0
    buckets = [64, 128, 256]
    fields = _truth().to_dict()
    fields["layer_overhead_seconds"] = 0.1  # graphs that save this pay any padding
    slow = hs.HardwareProfile.from_dict(fields)
    for scores, kernel in ((bound, "sdpa"), (None, "flex"), (0, "grouped")):
        cost = hs.CostModel(cfg, slow, hs.Topology(4, 4), graph_buckets=buckets,
                            graph_layer_overhead_seconds=0.0, graph_max_scores=scores)
        assert cost.graph_max_scores == scores
        cal = OnlineCalibration(cfg, hs.Topology(4, 4), zero=False, graphs=dict(
            graph_buckets=buckets, graph_layer_overhead_seconds=None, graph_max_scores=scores))
        for name in ("dp4", "dp2tp2", "tp4"):
            layout = hs.Layout.parse(name)
            static = [b for b in buckets if PackAttention.runs_static(kernel, 4 // layout.tp, b, cpu)]
            assert cost.terms(layout).graph_max_tokens == max(static, default=0), (kernel, name)
            # The calibration takes as graphed exactly the buckets the model runs static.
            assert [b for b in buckets if cal._static(layout, b)] == static, (kernel, name)
            # With the graphs free, every micro-batch that a static bucket holds runs from it.
            for n in (60, 100, 200):
                chosen = cost.graph_tokens(layout, [n])
                assert chosen == min([b for b in static if b >= n], default=0), (kernel, name, n, chosen)
    # At tp1, 4 heads: 64 tokens are static (16,384 scores), 128 are not (65,536).
    cost = hs.CostModel(cfg, _truth(), hs.Topology(4, 4), graph_buckets=buckets, graph_layer_overhead_seconds=0.0,
                        graph_max_scores=bound)
    dp4 = hs.Layout.parse("dp4")
    with pytest.raises(ValueError, match=r"graph_tokens\[0\]\[0\] is 128 but dp4's attention is static up to 64 "
                                         r"tokens \(graph_max_scores 32768\)"):
        cost.phase(dp4, [[[100]]] * 4, graph_tokens=[[128]] * 4)
    cal = OnlineCalibration(cfg, hs.Topology(4, 4), zero=False, graphs=dict(
        graph_buckets=buckets, graph_layer_overhead_seconds=None, graph_max_scores=bound))
    with pytest.raises(ValueError, match=r"attention static at that size .*graph_max_scores 32768\), got 128"):
        cal.observe_phase(dp4, [[[100]]] * 4, 0.1, graph_tokens=[[128]] * 4)
    with pytest.raises(ValueError, match=r"each one of \[64, 128, 256\] with dp4's attention static"):
        cal.observe_graph_saving(dp4, [128], 0.2, 0.1)
    assert not cal.phases and not cal.graph_savings
    cal.observe_phase(hs.Layout.parse("dp2tp2"), [[[100]]] * 2, 0.1, graph_tokens=[[128]] * 2)  # 2 heads per rank
    with pytest.raises(ValueError, match=r"graph_max_scores must be >= 0 or None \(no bound\), got -1"):
        hs.CostModel(cfg, _truth(), hs.Topology(4, 4), graph_buckets=buckets, graph_max_scores=-1)


def test_a_phase_is_priced_with_the_graph_tokens_it_ran_with_and_bad_ones_are_refused():
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    cost = hs.CostModel(cfg, _truth(), hs.Topology(4, 4), graph_buckets=GRAPH_BUCKETS,
                        graph_layer_overhead_seconds=4e-5)
    plain = hs.CostModel(cfg, _truth(), hs.Topology(4, 4))
    dp4, tp2, pp2 = hs.Layout.parse("dp4"), hs.Layout.parse("dp2tp2"), hs.Layout.parse("dp2pp2")
    batches = [[[120, 7]], [[100]], [[256]], [[30, 30]]]
    assert cost.phase(dp4, batches, graph_tokens=[[0]] * 4).run_seconds == plain.phase(dp4, batches).run_seconds
    padded = cost.phase(dp4, batches, graph_tokens=[[128], [128], [256], [64]])
    assert padded.graphed_micro_batches == 4
    assert padded.run_seconds != plain.phase(dp4, batches).run_seconds
    for tokens, match in [([[128]] * 3, "graph_tokens has 3 replicas, expected the batches' 4"),
                          ([[128, 0], [0], [0], [0]], r"graph_tokens\[0\] has 2 entries"),
                          ([[64], [0], [0], [0]], r"graph_tokens\[0\]\[0\] is 64, expected 0 or a graph bucket that "
                                                  r"holds the micro-batch's 127 tokens"),
                          ([[0], [0], [0], [100]], r"graph_tokens\[3\]\[0\] is 100")]:
        with pytest.raises(ValueError, match=match):
            cost.phase(dp4, batches, graph_tokens=tokens)
    with pytest.raises(ValueError, match="dp2pp2 runs no CUDA graphs"):
        cost.phase(pp2, [[[120]], [[64]]], graph_tokens=[[128], [0]])
    # At tp2 the graphs run, every bucket being a multiple of 2.
    assert cost.phase(tp2, [[[120]], [[64]]], graph_tokens=[[128], [0]]).graphed_micro_batches == 1


def test_without_observations_nothing_is_fitted():
    cfg = hs.TransformerConfig(**w.TINY).cost_config()
    assert OnlineCalibration(cfg, hs.Topology(4, 4), zero=False).fit(w.hardware()) is None


def test_a_layout_slower_than_the_shared_coefficients_explain_gets_its_own_factor():
    # pp4's phases ran twice as long as the truth's coefficients say: no shared coefficient
    # explains one layout alone, so the refit leaves the others near 1 and gives pp4 a factor.
    truth = _truth()
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    topology = hs.Topology(4, 4)
    cost = hs.CostModel(cfg, truth, topology, layout_scale={"pp4": 2.0})
    assert cost.layout_scale == {"pp4": 2.0}
    cal = OnlineCalibration(cfg, topology, zero=False)
    for name, batches in BATCHES * 3:
        layout = hs.Layout.parse(name)
        cal.observe_phase(layout, batches, cost.phase(layout, batches).run_seconds)
    fit = cal.fit(truth)
    assert set(fit.layout_scale) == {"dp4", "dp2tp2", "pp4", "tp2pp2"}
    # Three pp4 phases at 2x, shrunk by half an observation: 2 ** (3 / 3.5) = 1.81 if the
    # shared coefficients stayed; the refit moves them a little towards pp4.
    assert 1.5 < fit.layout_scale["pp4"] < 2.0, fit.layout_scale
    others = [fit.layout_scale[n] for n in ("dp4", "dp2tp2", "tp2pp2")]
    assert all(0.8 < k < 1.2 for k in others), fit.layout_scale
    measured = np.array([p[2] for p in cal.phases])
    fields = online._fields(fit.hardware)
    with_factors = np.abs(cal._predict(fields, fit.layout_scale) - measured) / measured
    without = np.abs(cal._predict(fields) - measured) / measured
    assert with_factors.max() < 0.1 and without.max() > 0.3, (with_factors.max(), without.max())
    assert fit.error_after == pytest.approx(float(np.median(with_factors)))


def test_a_cost_models_layout_factor_scales_that_layouts_times_alone():
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    topology = hs.Topology(4, 4)
    plain = hs.CostModel(cfg, _truth(), topology)
    scaled = hs.CostModel(cfg, _truth(), topology, layout_scale={"pp4": 1.5, "dp4": 0.5})
    for name, batches in BATCHES:
        layout = hs.Layout.parse(name)
        factor = {"pp4": 1.5, "dp4": 0.5}.get(name, 1.0)
        a, b = plain.phase(layout, batches), scaled.phase(layout, batches)
        assert b.run_seconds == pytest.approx(factor * a.run_seconds, rel=1e-12)
        assert b.peak_bytes == a.peak_bytes  # memory is not time
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="layout_scale of pp4 must be a finite factor > 0"):
            hs.CostModel(cfg, _truth(), topology, layout_scale={"pp4": bad})
