"""The hot-switch runtime on real gloo processes: a run with switching equals the world-1 run
of the same model and batches."""

import math

import numpy as np
import pytest

import hotswitch as hs
from hotswitch.runtime import EXPLORE_SHARE
from hotswitch.testing.harness import run_world

from tests.python.runtime import workers as w

CANDIDATES = ["dp4", "dp2tp2", "pp4", "tp2pp2"]
TOL = 1e-5


@pytest.fixture(scope="module")
def reference():
    return run_world(1, w.train, "auto", timeout=300)[0]


@pytest.fixture(scope="module")
def untied_reference():
    return run_world(1, w.train, "auto", False, "auto", False, timeout=300)[0]


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _check_equal(result, reference):
    steps, weights = result[:2]
    ref_steps, ref_weights = reference[:2]
    assert len(steps) == len(ref_steps)
    for (loss, layouts, _, targets, _), (ref_loss, _, _, ref_targets, _) in zip(steps, ref_steps):
        assert targets == ref_targets
        assert abs(loss - ref_loss) <= TOL * abs(ref_loss), (layouts, loss, ref_loss)
    assert _max_diff(weights, ref_weights) <= TOL


def test_switching_run_equals_single_process(reference):
    out = run_world(4, w.train, CANDIDATES, timeout=600)
    steps = out[0][0]
    assert all(o[0] == steps for o in out), "ranks report different steps"
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    phases = [len(layouts) for _, layouts, *_ in steps]
    used = {l for _, layouts, *_ in steps for l in layouts}
    # One phase for a single sequence, two and three or more when lengths spread.
    assert phases[0] == 1 and phases[1] >= 2 and max(phases) >= 3, phases
    assert any("tp" in l for l in used) and any("pp" in l for l in used), used
    _check_equal(out[0], reference)


@pytest.mark.parametrize("zero", [False, True])
def test_a_fixed_plan_runs_each_length_under_its_layout_and_equals_single_process(reference, zero):
    # Short sequences under dp4, up to 100 tokens under dp2tp2 (not a candidate: the fixed plan
    # adds it), the rest under tp2pp2.
    fixed = [[40, "dp4"], [100, "dp2tp2", "none"], {"upper_bound": 256, "layout": "tp2pp2"}]
    out = run_world(4, w.train_fixed, ["dp4", "tp2pp2"], fixed, zero, timeout=600)
    steps = out[0][0]
    assert all(o[0] == steps for o in out), "ranks report different steps"
    bounds = {"dp4": (0, 40), "dp2tp2": (40, 100), "tp2pp2": (100, 256)}
    for (_, layouts, *_), lengths in zip(steps, w.STEPS):
        wanted = {name for name, (lo, hi) in bounds.items() if any(lo < n <= hi for n in lengths)}
        assert set(layouts) == wanted, (lengths, layouts)
    _check_equal(out[0], reference)


def test_a_fixed_plan_is_refused_at_construction_naming_the_entry():
    with pytest.raises(ValueError, match="entry 1"):
        hs.RuntimeConfig(fixed_plan=[[40, "dp4"], [30, "tp4"]])
    with pytest.raises(ValueError, match="cannot read it"):
        hs.RuntimeConfig(fixed_plan="no-such-file.json")


@pytest.mark.parametrize("zero", [True, False])
def test_moving_the_home_twice_during_a_run_equals_single_process(reference, zero, tmp_path):
    # dp4 -> tp2pp2 before step 1, -> pp4 before step 2: the masters and Adam's moments move
    # between placements that hold different tensors per rank (pipeline stages).
    moves = {1: "tp2pp2", 2: "pp4"}
    out = run_world(4, w.train_moving_home, CANDIDATES, zero, moves, str(tmp_path), timeout=600)
    steps, _, homes, same, round_trip, resumed = out[0]
    assert all(o[0] == steps for o in out), "ranks report different steps"
    assert all(o[2] == ["dp4", "tp2pp2", "pp4"] for o in out), homes
    assert all(o[3] for o in out), "the full weights changed across a move"
    assert all(o[4] for o in out), "a round trip of the home did not give back the masters and moments bitwise"
    assert all(o[5] for o in out), "a checkpoint saved after the moves did not resume under another home"
    _check_equal(out[0], reference)


@pytest.mark.parametrize("zero", [True, False])
def test_the_runtime_moves_a_poor_home_by_itself_and_equals_single_process(reference, zero):
    # pp4 holds the masters at first; the steps' short sequences run faster elsewhere, and a
    # home there saves more than the move over two batches.
    out = run_world(4, w.train_rehoming, CANDIDATES, zero, "pp4", timeout=600)
    assert all(o[2] == out[0][2] for o in out), "ranks ended under different homes"
    assert out[0][2] != "pp4", out[0][2]
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    _check_equal(out[0], reference)


def test_moving_the_home_to_a_layout_that_is_no_candidate_changes_nothing():
    out = run_world(2, w.move_home_refusals, timeout=300)
    assert all(o == ["dp2", "dp2"] for o in out), out


def _runtime_methods(zero):
    """What the runtime reports for each of the planner's gradient methods. The home layout's
    own reduction ("local") needs no switch, except under ZeRO, where its partial gradients
    are summed into the flat home shard by a switch ("partial")."""
    return {"partial": "partial", "reduce": "reduce", "local": "partial" if zero else "local"}


@pytest.mark.parametrize("zero,grad_method", [(True, "auto"), (True, "reduce"), (False, "reduce"), (False, "partial")])
def test_zero_and_reduced_gradients_equal_single_process(reference, zero, grad_method):
    out = run_world(4, w.train, CANDIDATES, zero, grad_method, timeout=600)
    steps = out[0][0]
    assert all(o[0] == steps for o in out), "ranks report different steps"
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    ran = [list(zip(layouts, methods)) for _, layouts, methods, _, _ in steps]
    layouts = {l for phases in ran for l, _ in phases}
    methods = {m for phases in ran for _, m in phases}
    # Every step runs the planner's layouts; the long sequences need the model split over 4
    # ranks, the short ones run data-parallel.
    assert [[l for l, _ in phases] for phases in ran] == [[l for l, _ in p] for *_, p in steps], steps
    assert max(len(phases) for phases in ran) >= 2
    assert "dp4" in layouts and layouts & {"pp4", "tp2pp2"}, layouts
    if zero:
        # The home accumulator is a flat ZeRO shard: even the home layout's phase switches.
        assert "local" not in methods, ran
    if grad_method == "auto":
        # The planner's choice, phase by phase. Into a ZeRO home shard the partial summands
        # move once (a reduce-scatter across layouts), while reducing first all-reduces and
        # then moves the reduced shards too: here the planner takes partial for every phase.
        assert [[m for _, m in phases] for phases in ran] == [
            [_runtime_methods(zero)[m] for _, m in p] for *_, p in steps], steps
        assert methods == {"partial"}, ran
        assert len(layouts) >= 3, ran
    else:
        assert methods <= {grad_method, "local"} and grad_method in methods, ran
    _check_equal(out[0], reference)


def test_bad_steps_raise_on_every_rank_and_change_nothing():
    out = run_world(2, w.refusals, ["dp2", "tp2", "pp2"], timeout=300)
    needles = ["non-empty list of token sequences", "sequence 1 must be a non-empty", "token id 500",
               "more than max_context(256)", "integer token ids", "no target tokens", "differs from the batch",
               "refused the batch|differs from the batch", "sequence 0 must be", "sequence 1 must be",
               "sequence 0 must be", "integer token ids", "refused the batch|sequence 0 must be"]
    for rank, (messages, unchanged, loss) in enumerate(out):
        assert len(messages) == len(needles)
        assert unchanged, f"rank {rank}: master weights changed by a refused step"
        assert np.isfinite(loss)
        for message, needle in zip(messages, needles):
            assert message is not None, f"rank {rank}: a bad step was accepted ({needle})"
            assert any(n in message for n in needle.split("|")), (needle, message)


def test_a_context_no_layout_holds_is_refused_at_construction():
    messages = run_world(4, w.too_long_for_memory, timeout=300)
    for m in messages:
        assert m is not None and "max_context(256)" in m and "the longest that fits is" in m


def test_a_model_whose_state_alone_exceeds_the_budget_is_refused_saying_so():
    for m in run_world(4, w.model_too_large, timeout=300):
        assert m is not None and "weights, gradients and optimizer state alone take" in m, m
        assert "under tp2pp2, the layout that shards them most" in m and "20000 bytes per rank" in m, m


def test_recalibrated_run_plans_alike_on_every_rank_and_equals_single_process(reference):
    out = run_world(4, w.train, CANDIDATES, False, "auto", True, w.STEPS, True, timeout=600)
    profiles = [o[0][-1] for o in out]
    assert all(p == profiles[0] for p in profiles), "ranks re-calibrated differently"
    assert dict(profiles[0]) != w.hardware().to_dict(), "the measured times changed nothing"
    steps = out[0][0][:-1]
    _check_equal((steps, out[0][1]), reference)


@pytest.mark.parametrize("zero,home", [(False, None), (True, "tp2pp2")])
def test_a_start_up_probe_fits_the_model_and_chooses_the_home_and_the_run_equals_single_process(
        reference, zero, home):
    out = run_world(4, w.train_probing, CANDIDATES, zero, home, timeout=600)
    steps, _, _, _, probed_home, preferred, measured, untouched, fitted = out[0]
    assert all(o[0] == steps and o[4:] == out[0][4:] for o in out), "ranks probed or planned differently"
    assert untouched, "the probe changed the weights or the optimizer state"
    # Every candidate holds a sequence of MAX_CONTEXT / 4 tokens or more under BUDGET: each was timed.
    assert measured == sorted(hs.Layout.parse(n).name for n in CANDIDATES), measured
    assert dict(fitted) != w.hardware().to_dict(), "the probe's times changed nothing"
    # A given home stays; otherwise the home is the one the fitted model prefers.
    assert probed_home == (home or preferred), (probed_home, home, preferred)
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    _check_equal(out[0][:2], reference)


@pytest.mark.parametrize("fields,match", [({"probe": True, "recalibrate": False}, "probe=True needs recalibrate"),
                                          ({"probe": "yes"}, "probe")])
def test_a_bad_probe_setting_is_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        hs.RuntimeConfig(**fields)


def _check_steps_equal(steps, weights, reference):
    ref_steps, ref_weights = reference[:2]
    for (loss, layouts, *_, targets), (ref_loss, *_, ref_targets, _) in zip(steps, ref_steps):
        assert targets == ref_targets
        assert abs(loss - ref_loss) <= TOL * abs(ref_loss), (layouts, loss, ref_loss)
    assert _max_diff(weights, ref_weights) <= TOL


@pytest.fixture(scope="module")
def long_reference():
    return run_world(1, w.train, "auto", False, "auto", True, LONG_STEPS, timeout=300)[0]


LONG_STEPS = w.STEPS + w.STEPS[1:]


@pytest.mark.parametrize("trust_error", [1e-9, 0.25])
def test_a_step_tries_at_most_one_untrusted_layout_and_leaves_out_those_that_missed(long_reference, trust_error):
    # Home tp2pp2 holds every length, so any other layout can be left out. 1e-9: no phase is
    # ever predicted that closely, so no layout is ever trusted: every step may try one layout
    # beside the home, and each one that ran warm sits out the steps after.
    out = run_world(4, w.train_trusting, CANDIDATES, trust_error, "tp2pp2", LONG_STEPS, timeout=600)
    steps = out[0][0]
    assert all([s[:4] for s in o[0]] == [s[:4] for s in steps] for o in out), "ranks planned differently"
    tried = set()
    for i, (_, layouts, trusted, left_out, _) in enumerate(steps):
        untrusted = {l for l in layouts if l != "tp2pp2" and l not in trusted}
        assert len(untrusted) <= 1, (i, layouts, trusted)
        assert not set(layouts) & set(left_out), (i, layouts, left_out)
        if trust_error < 1e-6:
            assert trusted == [], trusted
        tried |= untrusted
    assert tried, "no layout beside the home was ever tried"
    # Whether a layout runs warm after the first refit depends on the measured times; the
    # leaving out itself is checked deterministically below and in the dp4-home test.
    _check_steps_equal(steps, out[0][1], long_reference)


class _Phase:
    def __init__(self, name, predicted):
        self.layout = type("L", (), {"name": name})()
        self.cost = type("C", (), {"run_seconds": predicted})()


def _trust_state(fits_applied, home="dp4", trust_error=0.25, step=5):
    state = type("S", (), {})()
    state.settings = hs.RuntimeConfig(trust_error=trust_error)
    state._fits_applied, state.home, state.step = fits_applied, hs.Layout.parse(home), step
    state._trusted, state._misses, state._left_out_until = set(), {}, {}
    state._protecting = True  # re-calibration on, a trust_error set
    state._layout_scale = {}  # the re-calibration's factors
    state.cost = type("M", (), {"layout_scale": {}})()  # the factors the step was planned with
    return state


def test_trust_follows_the_measured_error_of_warm_phases_after_a_refit():
    plan = type("P", (), {"phases": [_Phase("dp4", 1.0), _Phase("tp2pp2", 1.0), _Phase("pp4", 1.0),
                                     _Phase("dp2tp2", 1.0)]})()
    state = _trust_state(fits_applied=1)
    # The home is never judged; a cold phase is not judged; 1.2 s measured is within 25%; 2 s is not.
    hs.Runtime._update_trust(state, plan, [9.0, 1.2, 2.0, 5.0], [False, False, False, True])
    assert state._trusted == {"tp2pp2"}
    assert state._left_out_until == {"pp4": 7} and state._misses == {"pp4": 1}  # out of step 6
    state.step = 7
    hs.Runtime._update_trust(state, plan, [1.0, 3.0, 2.0, 1.0], [False, False, False, False])
    assert state._trusted == {"dp2tp2"}  # tp2pp2 missed: trust lost
    assert state._left_out_until == {"pp4": 10, "tp2pp2": 9}  # pp4's second miss: out of 2 steps
    # Faster than predicted: not trusted, and not left out either (the step lost nothing).
    # dp2tp2 was planned at explore's 1.5 times the model's own prediction (1.0 s / 1.5): it
    # is judged against the model's own.
    state.step = 11
    state._layout_scale = {"pp4": 2.0}
    state.cost.layout_scale = {"pp4": 2.0, "dp2tp2": 1.5}
    hs.Runtime._update_trust(state, plan, [1.0, 0.5, 1.0, 0.7], [False, False, False, False])
    assert "tp2pp2" not in state._trusted and state._left_out_until["tp2pp2"] == 9 and state._misses["tp2pp2"] == 1
    assert state._trusted == {"dp2tp2", "pp4"}
    before = _trust_state(fits_applied=0)  # the starting profile's scale says nothing of one layout
    hs.Runtime._update_trust(before, plan, [9.0, 9.0, 9.0, 9.0], [False] * 4)
    assert not before._trusted and not before._left_out_until


def test_a_left_out_layout_still_runs_the_sequences_only_it_holds(reference):
    # Home dp4 holds only the short sequences; the long ones need pp4 or tp2pp2 even while
    # they are left out, and the steps still run.
    out = run_world(4, w.train_trusting, CANDIDATES, 1e-9, "dp4", timeout=600)
    steps = out[0][0]
    for i, (_, layouts, trusted, left_out, _) in enumerate(steps):
        assert len({l for l in layouts if l != "dp4"}) <= 1, (i, layouts)
    assert any(set(layouts) & set(left_out) for _, layouts, _, left_out, _ in steps), steps
    _check_steps_equal(steps, out[0][1], reference)


@pytest.mark.parametrize("bad", [0, -0.1, float("nan"), True, "0.2"])
def test_a_bad_trust_error_is_refused(bad):
    with pytest.raises(ValueError, match="trust_error"):
        hs.RuntimeConfig(trust_error=bad)


def _explore_state(measured, explore=0.5, step=1, home="tp2pp2"):
    """What Runtime._explore reads, over the tiny model's 4-rank candidates, with a planner
    pricing each unmeasured layout at (1 + explore) times its prediction, as the runtime's."""
    from hotswitch import planner as planning

    state = type("S", (), {})()
    state.settings = hs.RuntimeConfig(explore=explore)
    state._exploring, state.calibration, state.step = True, object(), step
    state._measured = set(measured)
    state.recompute_modes = ["none"]
    candidates = [hs.Layout.parse(n) for n in CANDIDATES]
    names = [c.name for c in candidates]
    model = hs.TransformerConfig(**w.TINY, tied_embedding=True).cost_config()
    topology = hs.Topology(4, 4)
    scale = {n: 1.0 + explore for n in names if n not in state._measured}
    switch, reduced, partial = planning.switch_costs(model, w.hardware(), topology, candidates, names.index(home),
                                                     zero=False)
    state.planner = hs.Planner(hs.CostModel(model, w.hardware(), topology, layout_scale=scale), candidates,
                               names.index(home), switch, reduced, partial)
    return state, names, names.index(home)


LENGTHS = [5, 9, 17, 30, 41, 64, 90, 128, 200, 256]


def test_a_layout_never_measured_is_tried_on_a_share_of_the_step_when_its_optimistic_price_wins():
    state, names, home = _explore_state(measured=["tp2pp2"], explore=0.9)
    plan = state.planner.plan(LENGTHS)
    tried = hs.Runtime._explore(state, LENGTHS, plan, names, home)
    assert tried is not plan
    used = {names[ph.candidate] for ph in tried.phases}
    new = used - {"tp2pp2"} - {names[ph.candidate] for ph in plan.phases}
    assert len(new) == 1, (used, [names[ph.candidate] for ph in plan.phases])  # one layout tried a step
    # It runs the shortest pieces, about EXPLORE_SHARE of the tokens (the piece that crosses it included).
    (c,) = new
    pieces = [p.length for p in tried.pieces]
    its = sorted(pieces[i] for ph in tried.phases if names[ph.candidate] == c for i in ph.sequences)
    assert its == sorted(pieces)[:len(its)]
    assert sum(its[:-1]) < EXPLORE_SHARE * sum(pieces)
    # Priced at the bottom of its uncertainty, it beats the plan as planned.
    cut = 1 - (1 - 0.9) / (1 + 0.9)
    assert tried.total_seconds - cut * sum(ph.cost.run_seconds for ph in tried.phases
                                           if names[ph.candidate] == c) < plan.total_seconds


def test_no_layout_is_tried_without_optimism_once_measured_or_on_the_first_step():
    state, names, home = _explore_state(measured=CANDIDATES, explore=0.9)
    plan = state.planner.plan(LENGTHS)
    assert hs.Runtime._explore(state, LENGTHS, plan, names, home) is plan
    state, names, home = _explore_state(measured=["tp2pp2"], explore=0.9, step=0)  # nothing learns from step 1
    plan = state.planner.plan(LENGTHS)
    assert hs.Runtime._explore(state, LENGTHS, plan, names, home) is plan


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), True, "0.5"])
def test_a_bad_explore_is_refused(bad):
    with pytest.raises(ValueError, match=r"explore must be a fraction in \[0, 1\)"):
        hs.RuntimeConfig(explore=bad)


def test_switching_into_a_pipeline_layout_in_the_middle_of_a_step(reference):
    # Home dp4, whose phase runs first: its short sequences run there, then the parameters
    # switch from the running dp4 model (not from the master weights) into a pipeline layout
    # for the long ones, and the pipeline's gradients switch back into the dp4 accumulator.
    out = run_world(4, w.train, ["dp4", "pp4", "tp2pp2"], False, "auto", True, w.STEPS, False, "dp4", timeout=600)
    steps = out[0][0]
    assert out[0][2] == "dp4"
    assert all(o[0] == steps for o in out), "ranks report different steps"
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    into_pipeline = [(i, k) for i, (_, layouts, *_) in enumerate(steps) for k in range(1, len(layouts))
                     if "pp" in layouts[k] and layouts[k - 1] == "dp4"]
    assert len(into_pipeline) >= 2, [layouts for _, layouts, *_ in steps]
    _check_equal(out[0], reference)


def test_untied_embeddings_equal_single_process(untied_reference):
    out = run_world(4, w.train, CANDIDATES, False, "auto", False, timeout=600)
    steps = out[0][0]
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    assert "head.weight" in out[0][1] and "head.weight" in untied_reference[1]
    assert max(len(layouts) for _, layouts, *_ in steps) >= 3
    _check_equal(out[0], untied_reference)


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_nonfinite_loss_raises_or_skips_and_changes_nothing(policy):
    out = run_world(4, w.nonfinite, policy, CANDIDATES, timeout=600)
    for rank, (outcome, unchanged, step, retried, expected, layouts) in enumerate(out):
        assert len(layouts) >= 3, layouts  # the poisoned weights pass through two switches and back
        if policy == "raise":
            assert outcome[0] == "raised" and "the loss is nan" in outcome[1], (rank, outcome)
            assert step == 1, (rank, step)  # the step did not count
        else:
            kind, loss, result_step, ran = outcome
            assert kind == "skipped" and math.isnan(loss) and result_step == step == 2, (rank, outcome)
            assert ran == layouts, (ran, layouts)
        assert unchanged, f"rank {rank}: the master weights or the optimizer state changed"
        # With the finite weights back, the retried step is the step of a run that never
        # saw the poisoned one: the refused step left no trace in the optimizer.
        assert retried == expected, (rank, retried, expected)


@pytest.mark.parametrize("layout", ["cp4", "dp2cp2", "tp2cp2", "cp2pp2"])
def test_a_static_context_parallel_run_equals_single_process(reference, layout):
    out = run_world(4, w.train_static_cp, layout, timeout=600)
    assert all(o[0] == out[0][0] for o in out), "ranks report different steps"
    assert all(layouts == [hs.Layout.parse(layout).name] for _, layouts, *_ in out[0][0])
    _check_equal(out[0], reference)


def test_the_runtime_plans_cp_layouts_with_their_own_memory():
    for budgets, home in run_world(4, w.cp_cost_model_in_runtime, timeout=300):
        assert {name: cp for name, (_, cp) in budgets.items()} == {"dp4": 1, "dp2cp2": 2, "cp4": 4}
        # Activations divide over the cp ranks: only cp4 holds the max context.
        assert budgets["dp4"][0] < budgets["dp2cp2"][0] < w.MAX_CONTEXT <= budgets["cp4"][0], budgets
        assert home == "cp4"


@pytest.mark.parametrize("zero,grad_method", [(False, "auto"), (True, "reduce")])
def test_switching_to_and_from_cp_layouts_within_a_step_equals_single_process(reference, zero, grad_method):
    out = run_world(4, w.train, ["dp4", "dp2cp2", "cp4"], zero, grad_method, True, w.STEPS, False, "dp4",
                    w.CP_BUDGET, timeout=600)
    steps = out[0][0]
    assert out[0][2] == "dp4"
    assert all(o[0] == steps for o in out), "ranks report different steps"
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    ran = [layouts for _, layouts, *_ in steps]
    # The long sequences need cp4; the short ones of the same step run under another layout.
    assert all("cp4" in layouts for layouts in ran), ran
    assert sum(len(layouts) >= 2 for layouts in ran) >= 2, ran
    if grad_method == "reduce":
        # Reduced over dp x cp, then switched into the home accumulator.
        assert {m for _, _, methods, *_ in steps for m in methods} <= {"reduce", "local"}, steps
    _check_equal(out[0], reference)


def test_compiled_layers_train_as_the_eager_runtime_across_switches():
    # RuntimeConfig.compile_layers: every layout's model compiles its layers; the hot-switched
    # run (dp2 for short sequences, the home tp2 for the rest) trains as the eager one, fp32
    # within 1e-5. Its planner prices the tp backward's collectives unhidden, as the compiled
    # layers run them.
    fixed = [[60, "dp2"], [256, "tp2"]]
    out = run_world(2, w.train_compiled, ["dp2", "tp2"], fixed, "tp2", timeout=900)
    assert out[0]["tp_overlap"] == {False: 1.0, True: 0.0}
    (steps, weights), (ref_steps, ref_weights) = out[0][True], out[0][False]
    assert [s[1] for s in steps] == [s[1] for s in ref_steps]
    assert any(len(s[1]) > 1 for s in steps), steps  # some step switched
    np.testing.assert_allclose([s[0] for s in steps], [s[0] for s in ref_steps], rtol=1e-5)
    for name in ref_weights:
        np.testing.assert_allclose(weights[name], ref_weights[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("fixed,buckets,graphed,graph_layouts", [
    ([[60, "dp2"], [256, "tp2"]], [64, 128, 256], {"dp2"}, None),
    ([[60, "tp2"], [256, "dp2"]], [64, 256], {"tp2"}, None),
    ([[60, "tp2"], [256, "dp2"]], [64, 256], set(), ["dp2"])])
def test_graph_buckets_train_as_the_unpadded_runtime_across_switches(fixed, buckets, graphed, graph_layouts):
    # RuntimeConfig.graph_buckets: the micro-batches that the plan pads to a bucket run from the
    # graphed layers, under dp2 and under the home tp2 alike (every bucket a multiple of 2),
    # where their attention is static here: packs of up to 64 tokens (at 8 heads, 4 per tp2
    # rank). In the first case tp2's phase holds the sequences over 60 tokens, whose packs
    # (over 64) run as they are; in the second it holds the short ones, packed to the one
    # static bucket: the planner knows the attention's bound (graph_max_scores), so it does
    # not pack them to 256, which would take them in fewer, larger packs whose attention is
    # not static and that run as they are. In the third only dp2's model captures graphs
    # (graph_layouts): tp2's short sequences run as they are. Trains as without buckets, fp32
    # within 1e-5.
    out = run_world(2, w.train_graphed, ["dp2", "tp2"], fixed, "tp2", buckets, graph_layouts, timeout=600)
    (steps, weights), (ref_steps, ref_weights) = out[0][True], out[0][False]
    assert [s[1] for s in steps] == [s[1] for s in ref_steps]
    assert any(len(s[1]) > 1 for s in steps), steps  # some step switched
    assert all(len(s[1]) == len(s[2]) for rank in out for run in rank.values() for s in run[0])  # a call a phase
    ran = {layout for rank in out for s in rank[True][0] for layout, tokens in zip(s[1], s[2]) if any(tokens)}
    assert ran == graphed, steps
    assert all(not any(g) for rank in out for s in rank[False][0] for g in s[2])
    np.testing.assert_allclose([s[0] for s in steps], [s[0] for s in ref_steps], rtol=1e-5)
    for name in ref_weights:
        np.testing.assert_allclose(weights[name], ref_weights[name], rtol=1e-5, atol=1e-6, err_msg=name)


SHORT_12 = [20] * 12  # 240 tokens: packed to graph buckets of 128 rather than one eager micro-batch


@pytest.mark.parametrize("steps,chosen,graphed", [
    ([SHORT_12, w.STEPS[1]], ["dp2", "tp2"], "dp2"),
    ([w.STEPS[1], SHORT_12], ["tp2"], "tp2")])
def test_auto_graph_layouts_are_the_home_and_the_layouts_planned_without_graphs(steps, chosen, graphed):
    # graph_layouts="auto" from the home tp2: the home alone captures graphs until the first
    # step, which adds every layout that the run without graph buckets plans for that batch.
    # Twelve 20-token sequences run under dp2 there: dp2 joins and runs them from the graphs
    # at once. A first batch planned under tp2 alone leaves dp2 out for the run: its second
    # step, which the run without buckets gives dp2, runs under tp2 from the graphs instead.
    # The cost model holds the copies of the chosen layouts only. Trains as without buckets,
    # fp32 within 1e-5.
    out = run_world(2, w.train_auto_graphed, ["dp2", "tp2"], "tp2", [64, 128, 256], steps, timeout=600)
    names, cost_layouts, ran, weights = out[0][True]
    _, _, ref, ref_weights = out[0][False]
    assert all(o[True][:2] == out[0][True][:2] for o in out), "ranks chose different graph layouts"
    assert names == [["tp2"], chosen, chosen] and cost_layouts == chosen
    assert sorted({"tp2"} | set(ref[0][1])) == chosen  # the home and the first step planned without graphs
    assert ran[0][1] == ref[0][1] if graphed == "dp2" else ran[1][1] != ref[1][1], (ran, ref)
    from_graphs = {layout for _, layouts, calls in ran for layout, g in zip(layouts, calls) if g}
    assert from_graphs == {graphed}, ran
    assert not any(g for _, _, calls in ref for g in calls)
    np.testing.assert_allclose([s[0] for s in ran], [s[0] for s in ref], rtol=1e-5)
    for name in ref_weights:
        np.testing.assert_allclose(weights[name], ref_weights[name], rtol=1e-5, atol=1e-6, err_msg=name)


def _graph_budgets(budget, names):
    """dp2's and tp2's micro-batch budgets (tokens) for the untied TINY model at ``budget`` bytes
    per rank, with graph buckets captured by the layouts ``names`` (their copies held)."""
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=False).cost_config()
    cost = hs.CostModel(cfg, w.hardware(budget), hs.Topology(2, 2), graph_buckets=[64, 128, 256],
                        graph_layer_overhead_seconds=0.0, graph_layouts=names)
    planner = hs.Planner(cost, [hs.Layout.parse("dp2"), hs.Layout.parse("tp2")], 1, [[0.0] * 2] * 2, [0.0] * 2,
                         [0.0] * 2)
    return [planner.micro_batch_budget(i) for i in range(2)]


def test_auto_graph_layouts_keep_the_home_alone_when_more_copies_would_leave_no_layout_the_max_context():
    # At 1.85 MB per rank, tp2 holds a max-context sequence with its own graphs' copies, but no
    # layout does with dp2's copies too: the first batch, planned under dp2 without graph
    # buckets, leaves the home tp2 alone capturing graphs, and the run trains on.
    budget = 1_850_000
    assert max(_graph_budgets(budget, ["tp2"])) >= w.MAX_CONTEXT > max(_graph_budgets(budget, ["dp2", "tp2"]))
    # Twelve 10-token sequences: each dp2 replica holds its six in one micro-batch.
    out = run_world(2, w.train_auto_graphed, ["dp2", "tp2"], "tp2", [64, 128, 256], [[10] * 12, w.STEPS[1]], budget,
                    timeout=600)
    names, cost_layouts, ran, _ = out[0][True]
    _, _, ref, _ = out[0][False]
    assert "dp2" in ref[0][1]  # planned without graph buckets
    assert names == [["tp2"]] * 3 and cost_layouts == ["tp2"], names
    np.testing.assert_allclose([s[0] for s in ran], [s[0] for s in ref], rtol=1e-5)


def test_auto_graph_layouts_keep_the_home_alone_when_more_copies_would_break_the_fixed_plan():
    # At 2 MB per rank under the fixed plan "dp2 up to 100 tokens, tp2 up to 256": tp2 holds
    # 256 tokens with both layouts' copies, but dp2 holds 100 only without its own; the plan
    # names both, so the first step would choose both, which the fixed plan's bounds refuse:
    # the home tp2 alone captures graphs, and the run trains as without buckets.
    budget = 2_000_000
    both, home = _graph_budgets(budget, ["dp2", "tp2"]), _graph_budgets(budget, ["tp2"])
    assert both[1] >= w.MAX_CONTEXT and both[0] < 100 <= home[0], (both, home)
    fixed = [[100, "dp2"], [256, "tp2"]]
    out = run_world(2, w.train_auto_graphed, ["dp2", "tp2"], "tp2", [64, 128, 256], [w.STEPS[1], w.STEPS[2]],
                    budget, fixed, timeout=600)
    names, cost_layouts, ran, _ = out[0][True]
    _, _, ref, _ = out[0][False]
    assert names == [["tp2"]] * 3 and cost_layouts == ["tp2"], names
    assert [s[1] for s in ran] == [s[1] for s in ref] and any("dp2" in s[1] for s in ran), ran
    np.testing.assert_allclose([s[0] for s in ran], [s[0] for s in ref], rtol=1e-5)


def test_a_start_up_probe_measures_the_graph_overhead():
    # Graph buckets without a graph overhead: the probe runs a bucket's pack eagerly and from
    # the graphs under dp2 and tp2 (never under pp2, whose two stages run no graphs), and its
    # fit replaces the starting overhead (the layer overhead: no saving) with a measured one
    # that every rank plans with.
    out = run_world(2, w.train_probing_graphs, ["dp2", "tp2", "pp2"], "tp2", [32, 64], timeout=600)
    before, (after, layer, savings), model, observed, seconds, steps = out[0]
    assert all(o[1:4] == out[0][1:4] and [s[1] for s in o[5]] == [s[1] for s in steps] for o in out), \
        "ranks probed or planned differently"
    assert before is None  # unknown: the graphs saved nothing until the probe's pairs
    assert savings == ["dp2", "dp2", "tp2", "tp2"], savings
    # The refitted layer overhead less the measured saving, which the planner prices with.
    assert model == after and after >= 0 and after != layer, (after, layer)
    graphed = [(name, tokens) for name, tokens in observed if any(b for r in tokens for b in r)]
    # dp2 and tp2 ran one sequence of each of their buckets from the graphs (and the same as it
    # is); pp2 observed its packs and none from the graphs.
    assert sorted(tokens[0][0] for name, tokens in graphed) == [32, 32, 64, 64], observed
    assert {name for name, _ in graphed} == {"dp2", "tp2"}, observed
    for bucket in (32, 64):
        assert ("dp2", [[0], [0]]) in observed and ("dp2", [[bucket], [bucket]]) in observed, observed
        assert ("tp2", [[0]]) in observed and ("tp2", [[bucket]]) in observed, observed
    assert any(name == "pp2" for name, _ in observed), observed
    assert all(s > 0 for s in seconds)
    assert all(np.isfinite(s[0]) for s in steps), steps


def test_graph_buckets_need_their_overhead_and_good_values():
    with pytest.raises(ValueError, match="graph_buckets needs graph_layer_overhead_seconds .* or probe=True"):
        hs.RuntimeConfig(graph_buckets=[64])
    # With the probe the overhead is measured; until then the graphs save nothing.
    probed = hs.RuntimeConfig(graph_buckets=[64, 32], probe=True, recalibrate=True)
    hw = w.hardware()
    assert probed.graph_options(hw) == {"graph_buckets": [32, 64],
                                        "graph_layer_overhead_seconds": hw.layer_overhead_seconds}
    assert hs.RuntimeConfig(graph_buckets=[64], graph_layer_overhead_seconds=1e-4).graph_options(hw)[
        "graph_layer_overhead_seconds"] == 1e-4
    assert hs.RuntimeConfig().graph_options(hw) == {}
    # fp32 parameters computing in bfloat16: the graphs' matrix copies are bfloat16, half of
    # what the model's param bytes would count.
    mixed = hs.TransformerConfig(**w.TINY, compute_dtype="bfloat16")
    options = probed.graph_options(hw, model=mixed)
    assert options["graph_copy_param_bytes"] == 2 and "graph_copy_param_bytes" not in probed.graph_options(
        hw, model=hs.TransformerConfig(**w.TINY))
    cost = mixed.cost_config()
    narrow = hs.CostModel(cost, hw, hs.Topology(1, 1), **options)
    wide = hs.CostModel(cost, hw, hs.Topology(1, 1), **probed.graph_options(hw))
    assert 0 < narrow.graph_copy_bytes(hs.Layout.parse("dp1")) < wide.graph_copy_bytes(hs.Layout.parse("dp1"))
    with pytest.raises(ValueError, match="graph_buckets must be a non-empty list of distinct token counts >= 1"):
        hs.RuntimeConfig(graph_buckets=[64, 64], graph_layer_overhead_seconds=0.0)
    with pytest.raises(ValueError, match=r"graph_layer_overhead_seconds \(0.1\) needs graph_buckets"):
        hs.RuntimeConfig(graph_layer_overhead_seconds=0.1)
    with pytest.raises(ValueError, match="graph_layer_overhead_seconds must be finite seconds >= 0 .*got -1"):
        hs.RuntimeConfig(graph_buckets=[64], graph_layer_overhead_seconds=-1)
    # graph_layouts: the layouts whose models capture graphs, by name, to the cost model.
    named = hs.RuntimeConfig(graph_buckets=[64], graph_layer_overhead_seconds=0.0,
                             graph_layouts=[hs.Layout.parse("dp2"), "tp2"])
    assert named.graph_layout_names() == ["dp2", "tp2"] and named.graph_options(hw)["graph_layouts"] == ["dp2", "tp2"]
    assert hs.CostModel(cost, hw, hs.Topology(2, 2), **named.graph_options(hw)).graph_layouts == ["dp2", "tp2"]
    for bad, match in [(dict(graph_layouts=["dp2"]), r"graph_layouts \(\['dp2'\]\) needs graph_buckets"),
                       (dict(graph_layouts="auto"), r"graph_layouts \('auto'\) needs graph_buckets"),
                       (dict(graph_buckets=[64], graph_layouts="dp2"), "must be 'auto' or a non-empty list of layouts"),
                       (dict(graph_buckets=[64], graph_layouts=[]), "must be 'auto' or a non-empty list of layouts"),
                       (dict(graph_buckets=[64], graph_layouts=["dp2", "xy2"]), r"graph_layouts\[1\] is 'xy2', not a "
                                                                                  r"layout name"),
                       (dict(graph_buckets=[64], graph_layouts=["dp2", 2]), r"graph_layouts\[1\] must be a Layout"),
                       (dict(graph_buckets=[64], graph_layouts=["dp2", "dp2"]), "names dp2 twice")]:
        with pytest.raises(ValueError, match=match):
            hs.RuntimeConfig(**dict(dict(graph_layer_overhead_seconds=0.0) if "graph_buckets" in bad else {}, **bad))
    with pytest.raises(ValueError, match="graph_layouts lists 'dp2' twice"):
        hs.CostModel(cost, hw, hs.Topology(2, 2), graph_buckets=[64], graph_layouts=["dp2", "dp2"])
    # "auto": the runtime chooses them (Runtime.graph_layouts); the config names none itself, and
    # its cost-model options take the chosen names.
    auto = hs.RuntimeConfig(graph_buckets=[64], graph_layer_overhead_seconds=0.0, graph_layouts="auto")
    assert auto.auto_graph_layouts and not named.auto_graph_layouts
    auto.check_graph_layouts([hs.Layout.parse("dp2")])  # whatever the candidates: chosen among them
    assert auto.graph_options(hw, graph_layouts=["tp2"])["graph_layouts"] == ["tp2"]
    assert named.graph_options(hw, graph_layouts=["tp2"])["graph_layouts"] == ["dp2", "tp2"]  # named: kept
    with pytest.raises(ValueError, match="graph_layouts='auto' names no layouts until a runtime chooses them"):
        auto.graph_layout_names()
    with pytest.raises(ValueError, match="graph_layouts='auto' needs the layouts chosen"):
        auto.graph_options(hw)
    with pytest.raises(ValueError, match="expected 'dp2tp2', got 'tp2dp2'"):
        hs.CostModel(cost, hw, hs.Topology(4, 4), graph_buckets=[64], graph_layouts=["tp2dp2"])
