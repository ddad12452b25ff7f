"""Rank functions of the runtime tests (module-level so that spawned ranks can import them)."""

import copy

import torch

import hotswitch as hs
from hotswitch.testing.scenarios import BUDGET, LR, MAX_CONTEXT, STEPS, TINY, batch, hardware

# Bytes per rank under which dp4 holds micro-batches of ~80 tokens, dp2cp2 ~150 and only cp4
# (activations over 4 cp ranks) the max context: long sequences run under cp4, short ones
# elsewhere, within a step.
CP_BUDGET = 1_700_000


def _numpy(shards):
    return {k: v.detach().cpu().numpy().copy() for k, v in shards.items()}


def train(rank, world, candidates, zero=False, grad_method="auto", tied=True, steps=STEPS, recalibrate=False,
          home=None, budget=BUDGET, fixed_plan=None, home_window=0):
    """Trains the steps; returns per step (loss, layouts, grad methods, target tokens, and
    without re-calibration the planner's (layout, grad method) of each phase), the full
    weights (rank 0 only), the home layout and whether every copy of a weight is the same.
    ``budget``: bytes per rank the plans respect."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=tied)
    # World 1 holds the whole model on one rank: no budget there.
    budget = budget if world > 1 else 1 << 40
    rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=hardware(budget), max_context=MAX_CONTEXT,
                    zero=zero, grad_method=grad_method, seed=7, recalibrate=recalibrate, fixed_plan=fixed_plan,
                    home_window=home_window,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    out = []
    for i, lengths in enumerate(steps):
        b = batch(lengths, i)
        # With a fixed cost model the planner plans this batch as train_step will.
        planned = None if recalibrate else [(ph.layout.name, ph.grad_method)
                                            for ph in rt.planner.plan(lengths).phases]
        r = rt.train_step(b)
        out.append((r.loss, r.layouts, [p.grad_method for p in r.phases], r.targets, planned))
    if recalibrate:  # every rank plans with the same re-calibrated model
        out.append(sorted(rt.hardware.to_dict().items()))
    weights = rt.full_weights()
    # Every copy of a weight (data replicas, a tied embedding on two stages) holds the same bits.
    mine = rt._master_shards()
    expected = hs.shard_tensors(weights, rt.tensor_set, rt.home, rank, kind="zero" if zero else "sharded")
    copies_equal = (torch.equal(mine, expected) if zero else
                    all(torch.equal(mine[n], expected[n]) for n in mine))
    return out, _numpy(weights) if rank == 0 else None, rt.home.name, copies_equal


def train_rehoming(rank, world, candidates, zero, home):
    """``train`` from ``home`` with the home re-chosen over the last 2 batches after every step."""
    return train(rank, world, candidates, zero=zero, home=home, home_window=2)


def train_trusting(rank, world, candidates, trust_error, home, steps=STEPS):
    """A re-calibrating run from ``home`` under ``trust_error``; per step: (loss, layouts, the
    layouts trusted before it, the layouts left out of it), then the full weights (rank 0)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=hardware(BUDGET), max_context=MAX_CONTEXT,
                    seed=7, recalibrate=True, trust_error=trust_error,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    out = []
    for i, lengths in enumerate(steps):
        trusted = sorted(rt._trusted)
        left_out = sorted(n for n, until in rt._left_out_until.items() if until > rt.step + 1)
        r = rt.train_step(batch(lengths, i))
        out.append((r.loss, r.layouts, trusted, left_out, r.targets))
    weights = rt.full_weights()  # collective
    return out, _numpy(weights) if rank == 0 else None


def train_probing(rank, world, candidates, zero, home):
    """A re-calibrating run whose runtime probes every candidate before the first step.
    Returns (per step (loss, layouts, grad methods, targets, None), the full weights (rank 0),
    the home after the run, whether every copy of a weight is the same, the home after the
    probe, the home the fitted model prefers for a max_context sequence, the layouts measured,
    whether the probe left the weights and the optimizer state alone, the fitted profile)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)

    def runtime(probe):
        return hs.Runtime(cfg, candidates=candidates, home=home, hardware=hardware(BUDGET), max_context=MAX_CONTEXT,
                          zero=zero, seed=7, recalibrate=True, probe=probe,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))

    before = runtime(False).full_weights()
    rt = runtime(True)
    after = rt.full_weights()
    untouched = before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before) \
        and not rt.optimizer.state
    probed_home, preferred = rt.home.name, rt._home(None, rt._free_planner()).name
    measured, fitted = sorted(rt._measured), sorted(rt.hardware.to_dict().items())
    out = []
    for i, lengths in enumerate(STEPS):
        r = rt.train_step(batch(lengths, i))
        out.append((r.loss, r.layouts, [p.grad_method for p in r.phases], r.targets, None))
    weights = rt.full_weights()
    mine = rt._master_shards()
    expected = hs.shard_tensors(weights, rt.tensor_set, rt.home, rank, kind="zero" if zero else "sharded")
    copies_equal = (torch.equal(mine, expected) if zero else
                    all(torch.equal(mine[n], expected[n]) for n in mine))
    return (out, _numpy(weights) if rank == 0 else None, rt.home.name, copies_equal, probed_home, preferred,
            measured, untouched, fitted)


def train_probing_graphs(rank, world, candidates, home, buckets):
    """A re-calibrating run with graph buckets and no graph overhead given: the start-up
    probe measures it. Returns (the calibration's starting graph overhead, (the graph
    overhead after the probe, the refitted layer overhead, the layouts of the savings
    observed), the cost model's graph overhead, per observed phase (layout, its graph tokens),
    the probe's time of each such phase, and per step (loss, layouts))."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=False)
    rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=hardware(1 << 40), max_context=MAX_CONTEXT,
                    seed=7, recalibrate=True, probe=True, graph_buckets=buckets,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    before = rt.calibration.graphs["graph_layer_overhead_seconds"]  # what the calibration started from
    observed = [(layout.name, tokens) for layout, _, _, _, tokens in rt.calibration.phases]
    seconds = [m for _, _, m, _, _ in rt.calibration.phases]
    savings = [layout.name for layout, _, _ in rt.calibration.graph_savings]
    after, model = rt._graph_overhead, rt.cost.graph_layer_overhead_seconds
    layer = rt.hardware.layer_overhead_seconds
    steps = []
    for i in (1, 2):
        r = rt.train_step(batch(STEPS[i], i))
        steps.append((r.loss, r.layouts))
    return before, (after, layer, savings), model, observed, seconds, steps


def train_bf16_switching(rank, world, candidates, fixed_plan, home, tied):
    """Two bf16-compute runs of STEPS under one fixed plan from ``home``: the parameters
    switched in the compute dtype, then at full width. Per run: per step (loss, layouts,
    parameter bytes switched, gradient bytes switched), and the full weights (rank 0)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=tied, compute_dtype="bfloat16")
    out = {}
    for narrow in (True, False):
        rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=hardware(BUDGET), max_context=MAX_CONTEXT,
                        seed=7, recalibrate=False, fixed_plan=fixed_plan, switch_compute_dtype=narrow,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
        steps = []
        for i, lengths in enumerate(STEPS):
            r = rt.train_step(batch(lengths, i))
            steps.append((r.loss, r.layouts, sum(p.switch_bytes for p in r.phases),
                          sum(p.grad_bytes for p in r.phases)))
        weights = rt.full_weights()
        out[narrow] = (steps, _numpy(weights) if rank == 0 else None)
    return out


def train_fixed(rank, world, candidates, fixed_plan, zero):
    """``train`` under a fixed plan."""
    return train(rank, world, candidates, zero=zero, fixed_plan=fixed_plan)


def train_moving_home(rank, world, candidates, zero, moves, root):
    """``train``'s run with the home moved before the steps named in ``moves`` ({step index:
    layout}); returns the steps, the full weights (rank 0), the homes, whether the full
    weights stayed bitwise the same across every move, and whether a round trip of the home
    (there and back) gave back the masters and optimizer state bit for bit; and whether a
    checkpoint saved under the last home (in ``root``) loads into a runtime homed at dp4 with
    the same weights and the same next step."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, home="dp4", hardware=hardware(BUDGET), max_context=MAX_CONTEXT, zero=zero,
                    seed=7, recalibrate=False,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    out, homes, same = [], [rt.home.name], True
    round_trip = None
    for i, lengths in enumerate(STEPS):
        if i in moves:
            before = rt.full_weights()
            if round_trip is None:  # there and back first: every state tensor must come back as it was
                home = rt.home.name
                saved = [t.clone() for t in rt.state_dict()["params"]]
                moments = {k: [rt.optimizer.state[p][k].clone() for p in rt.master.values()]
                           for k in ("exp_avg", "exp_avg_sq")}
                rt.move_home(moves[i])
                rt.move_home(home)
                round_trip = all(torch.equal(a, b) for a, b in zip(saved, rt.state_dict()["params"])) and all(
                    torch.equal(a, rt.optimizer.state[p][k]) for k, ts in moments.items()
                    for a, p in zip(ts, rt.master.values()))
            rt.move_home(moves[i])
            homes.append(rt.home.name)
            after = rt.full_weights()
            same = same and all(torch.equal(before[n], after[n]) for n in before)
        r = rt.train_step(batch(lengths, i))
        out.append((r.loss, r.layouts, [p.grad_method for p in r.phases], r.targets, None))
    weights = rt.full_weights()
    path = rt.save_checkpoint(root)
    fresh = hs.Runtime(cfg, candidates=candidates, home="dp4", hardware=hardware(BUDGET), max_context=MAX_CONTEXT,
                       zero=zero, seed=3, recalibrate=False,
                       optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    fresh.load_checkpoint(path)
    loaded = fresh.full_weights()
    nxt = batch(STEPS[1], 99)
    a, b = fresh.train_step(nxt).loss, rt.train_step(nxt).loss  # plans may differ: equal within rounding
    resumed = all(torch.equal(weights[n], loaded[n]) for n in weights) and abs(a - b) <= 1e-6 * abs(b)
    return out, _numpy(weights) if rank == 0 else None, homes, same, round_trip, resumed


def move_home_refusals(rank, world):
    """A move to a layout outside the candidates, and moves that differ between ranks, are
    refused on every rank; the home stays. Returns the home after each refusal."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=["dp2", "tp2"], home="dp2", hardware=hardware(1 << 40), max_context=MAX_CONTEXT,
                    seed=7, recalibrate=False)
    homes = []
    for target in ("pp2", "tp2" if rank == 0 else "dp2"):
        try:
            rt.move_home(target)
        except ValueError:
            homes.append(rt.home.name)
    rt.train_step(batch([5, 9], 0))  # still usable
    return homes


def refusals(rank, world, candidates):
    """Bad steps raise ValueError on every rank and leave the master weights untouched."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hardware(1 << 40), max_context=MAX_CONTEXT, seed=7)
    before = {k: v.clone() for k, v in rt._master_shards().items()}
    messages = []
    bad = [
        [],                                     # empty batch
        [[1, 2, 3], []],                        # an empty sequence
        [[1, 2, 500]],                          # token outside the vocabulary
        [[1] * (MAX_CONTEXT + 1)],              # longer than the max context
        [[1.5, 2.0]],                           # not token ids
        [[3]],                                  # no target tokens
        batch([5, 7], seed=rank),               # ranks disagree on the batch
        [[1, 2]] if rank == 1 else [[1, 2, 3]],  # one rank's batch differs in length
        [[1, 2**70]],                           # an id beyond int64
        [[1, 2], None],                         # not a sequence
        [{"a": 1}],                             # a mapping
        [[1 + 2j, 3]],                          # complex numbers
        [[1, 2, 3]] if rank == 0 else [None],   # one rank's batch is malformed
    ]
    for b in bad:
        try:
            rt.train_step(b)
        except ValueError as e:
            messages.append(str(e))
        else:
            messages.append(None)
    after = rt._master_shards()
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    # The runtime still trains after the refusals.
    loss = rt.train_step(batch([5, 9, 250], 0)).loss
    return messages, unchanged, loss


def too_long_for_memory(rank, world):
    """A max context no layout holds within the budget is refused at construction."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    try:
        hs.Runtime(cfg, candidates=["dp4", "dp2tp2"], hardware=hardware(), max_context=MAX_CONTEXT)
    except ValueError as e:
        return str(e)
    return None


def model_too_large(rank, world):
    """A budget below the model's own state is refused naming what does not fit."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    try:
        hs.Runtime(cfg, candidates=["dp4", "dp2tp2", "tp2pp2"], hardware=hardware(20_000), max_context=MAX_CONTEXT)
    except ValueError as e:
        return str(e)
    return None


def train_and_record_plans(rank, world, candidates, steps):
    """Trains ``steps`` (lists of lengths) with a fixed cost model; returns per step the plan
    as this rank saw it (layouts, per phase its sequences, tokens, micro-batches, gradient
    method and predicted seconds) and the loss, and the full weights (rank 0 only)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hardware(), max_context=MAX_CONTEXT, seed=7,
                    recalibrate=False,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    plans = []
    for i, lengths in enumerate(steps):
        r = rt.train_step(batch(lengths, i))
        phases = [(p.layout, p.sequences, p.tokens, p.micro_batches, p.grad_method, p.predicted_s) for p in r.phases]
        plans.append((r.layouts, phases, r.predicted_s, r.loss))
    weights = rt.full_weights()
    return plans, _numpy(weights) if rank == 0 else None


def _state_copy(state):
    return {"step": state["step"], "params": [p.clone() for p in state["params"]],
            "optimizer": copy.deepcopy(state["optimizer"])}


def _same_state(a, b):
    """Whether two runtime states hold the same bits (optimizer state included)."""
    if a["step"] != b["step"] or len(a["params"]) != len(b["params"]):
        return False
    if not all(torch.equal(x, y) for x, y in zip(a["params"], b["params"])):
        return False
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    return sa.keys() == sb.keys() and all(
        sa[k].keys() == sb[k].keys() and all(torch.equal(torch.as_tensor(sa[k][f]), torch.as_tensor(sb[k][f]))
                                             for f in sa[k]) for k in sa)


def nonfinite(rank, world, policy, candidates):
    """A finite step, then a step whose loss is not finite: one element of the master final
    norm weight is set to inf (through ``load_state_dict``), so every logit of the poisoned
    step is NaN or infinite. Returns what the poisoned step did, whether the master weights
    and the optimizer state stayed as they were, and — after the finite weights are loaded
    back — the loss of the step retried, against a run that never saw the poisoned step."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)

    def runtime():
        return hs.Runtime(cfg, candidates=candidates, hardware=hardware(), max_context=MAX_CONTEXT, seed=7,
                          recalibrate=False, nonfinite=policy,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))

    rt, clean = runtime(), runtime()
    for r in (rt, clean):
        r.train_step(batch(STEPS[1], 0))
    good = _state_copy(rt.state_dict())
    poisoned = _state_copy(good)
    names = list(rt.master)
    if "final_norm.weight" in names:  # the ranks of the home layout's last stage
        poisoned["params"][names.index("final_norm.weight")][0] = float("inf")
    rt.load_state_dict(poisoned)
    before = _state_copy(rt.state_dict())
    try:
        r = rt.train_step(batch(STEPS[2], 1))
        outcome = ("skipped" if r.skipped else "stepped", r.loss, r.step, r.layouts)
    except hs.NonFiniteLoss as e:
        outcome = ("raised", str(e), rt.step, None)
    after = rt.state_dict()
    unchanged = _same_state(before, {**after, "step": before["step"]})
    rt.load_state_dict(good)
    retried = rt.train_step(batch(STEPS[2], 1))
    expected = clean.train_step(batch(STEPS[2], 1))
    return outcome, unchanged, after["step"], retried.loss, expected.loss, expected.layouts


def loss_scaling(rank, world, candidates, inject, steps, root):
    """``steps`` steps under dynamic loss scaling (initial 2**16, window 2, hysteresis 2) and fp32
    compute. At the steps in ``inject`` (1-based) rank ``world - 1`` alone sets one of its
    gradients to inf through the ``"gradients"`` hook. Returns per step (skipped, loss scale,
    whether the master weights changed, grad norm), the runtime's skipped/updates counts, the
    full weights (rank 0) and the scaler state a checkpoint saved after the last step restores
    into a fresh runtime, with its skipped count."""
    from hotswitch.checkpoint import latest_checkpoint
    from hotswitch.precision import LossScaling

    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)

    def runtime(scaling):
        return hs.Runtime(cfg, candidates=candidates, hardware=hardware(), max_context=MAX_CONTEXT, seed=7,
                          recalibrate=False, loss_scaling=scaling,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))

    rt = runtime(LossScaling(initial=2.0 ** 16, window=2, hysteresis=2))
    step = [0]

    def corrupt(accumulator):
        if step[0] in inject and rank == world - 1:
            g = accumulator if isinstance(accumulator, torch.Tensor) else next(iter(accumulator.values()))
            g.view(-1)[0] = float("inf")

    rt.hooks.add("gradients", corrupt)
    out = []
    for i in range(steps):
        step[0] = i + 1
        before = [p.clone() for p in rt.state_dict()["params"]]
        r = rt.train_step(batch(STEPS[1 + i % 3], i))
        changed = not all(torch.equal(a, b) for a, b in zip(before, rt.state_dict()["params"]))
        out.append((r.skipped, r.loss_scale, changed, r.grad_norm))
    rt.save_checkpoint(root)
    fresh = runtime(LossScaling(initial=2.0 ** 16, window=2, hysteresis=2))
    fresh.load_checkpoint(latest_checkpoint(root))
    weights = rt.full_weights()
    return (out, (rt.skipped, rt.updates), _numpy(weights) if rank == 0 else None,
            (fresh.scaler.state_dict(), fresh.skipped, fresh.updates))


def unscaled(rank, world, candidates):
    """The steps of ``loss_scaling`` without loss scaling: per step the grad norm, and the
    full weights (rank 0)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hardware(), max_context=MAX_CONTEXT, seed=7,
                    recalibrate=False, optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    norms = [rt.train_step(batch(STEPS[1 + i % 3], i)).grad_norm for i in range(3)]
    weights = rt.full_weights()
    return norms, _numpy(weights) if rank == 0 else None


def train_static_cp(rank, world, layout):
    """``train`` under one static cp layout, without a memory budget."""
    torch.set_num_threads(1)
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=[layout], hardware=hardware(1 << 40), max_context=MAX_CONTEXT, seed=7,
                    recalibrate=False, optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    out = []
    for i, lengths in enumerate(STEPS):
        r = rt.train_step(batch(lengths, i))
        out.append((r.loss, r.layouts, [p.grad_method for p in r.phases], r.targets, None))
    weights = rt.full_weights()
    return out, _numpy(weights) if rank == 0 else None, rt.home.name, True


def cp_cost_model_in_runtime(rank, world):
    """The runtime's planner prices cp layouts itself: (per candidate name, its micro-batch
    budget and terms' cp) under a budget where cp4 alone holds the max context."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=["dp4", "dp2cp2", "cp4"], hardware=hardware(CP_BUDGET), max_context=MAX_CONTEXT,
                    recalibrate=False)
    return {l.name: (rt.planner.micro_batch_budget(i), rt.planner.candidate_model(i).terms.cp)
            for i, l in enumerate(rt.candidates)}, rt.home.name


def train_compiled(rank, world, candidates, fixed_plan, home):
    """Two fp32 runs of two of STEPS (the second and third: several phases each) under one
    fixed plan from ``home``, eager then with ``compile_layers``. Per run: per step (loss,
    layouts), and the full weights (rank 0); under "tp_overlap", each run's planner's."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=False)
    out = {}
    for compiled in (False, True):
        rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=hardware(1 << 40), max_context=MAX_CONTEXT,
                        seed=7, recalibrate=False, fixed_plan=fixed_plan, compile_layers=compiled,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
        steps = [(r.loss, r.layouts) for r in (rt.train_step(batch(STEPS[i], i)) for i in (1, 2))]
        weights = rt.full_weights()
        out[compiled] = (steps, _numpy(weights) if rank == 0 else None)
        out.setdefault("tp_overlap", {})[compiled] = rt.planner.cost.tp_overlap
    return out


def train_graphed(rank, world, candidates, fixed_plan, home, buckets, graph_layouts=None):
    """Two fp32 runs of two of STEPS under one fixed plan from ``home``, without and with
    graph buckets (captured by ``graph_layouts``' models, None: every one that can; on a profile whose fixed cost per layer, 50 ms, graphs cut to nothing: the
    plans pad what a bucket holds). Per run: per step (loss, layouts, per phase the tokens of
    this rank's replica's packs as the layers ran them: the bucket a pack was padded to where
    it ran from the graphs, else 0), and the full weights (rank 0)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=False)
    fields = hardware(1 << 40).to_dict()
    fields["layer_overhead_seconds"] = 0.05
    profile = hs.HardwareProfile.from_dict(fields)
    calls = []  # per forward_backward of the step: its packs as the layers ran them
    contexts = hs.ParallelTransformer._contexts

    def recorded(model, *args, **kwargs):
        built = contexts(model, *args, **kwargs)
        calls.append([ctx.num_tokens if ctx.graphed else 0 for ctx in built])
        return built

    hs.ParallelTransformer._contexts = recorded
    out = {}
    for graphs in (False, True):
        extra = dict(graph_buckets=buckets, graph_layer_overhead_seconds=0.0, graph_layouts=graph_layouts) \
            if graphs else {}
        rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=profile, max_context=MAX_CONTEXT,
                        seed=7, recalibrate=False, fixed_plan=fixed_plan, **extra,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
        steps = []
        for i in (1, 2):
            calls.clear()
            r = rt.train_step(batch(STEPS[i], i))
            steps.append((r.loss, r.layouts, list(calls)))  # one call per phase
        weights = rt.full_weights()  # collective
        out[graphs] = (steps, _numpy(weights) if rank == 0 else None)
    return out


def train_auto_graphed(rank, world, candidates, home, buckets, steps, budget=1 << 40, fixed_plan=None):
    """``graph_layouts="auto"``: fp32 runs of the batches of lengths ``steps`` from ``home`` on the profile
    of ``train_graphed`` (``budget`` bytes per rank), with graph buckets whose layouts the runtime
    chooses, and without graph buckets. Per run: the graph layouts before the first step and
    after each (None without buckets), the cost model's, per step (loss, layouts, per phase
    whether it ran from the graphs), and the full weights (rank 0). ``fixed_plan``: both runs'."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=False)
    fields = hardware(budget).to_dict()
    fields["layer_overhead_seconds"] = 0.05
    profile = hs.HardwareProfile.from_dict(fields)
    calls = []
    contexts = hs.ParallelTransformer._contexts

    def recorded(model, *args, **kwargs):
        built = contexts(model, *args, **kwargs)
        calls.append(any(ctx.graphed for ctx in built))
        return built

    hs.ParallelTransformer._contexts = recorded
    out = {}
    for graphs in (False, True):
        extra = dict(graph_buckets=buckets, graph_layer_overhead_seconds=0.0, graph_layouts="auto") if graphs else {}
        rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=profile, max_context=MAX_CONTEXT,
                        seed=7, recalibrate=False, fixed_plan=fixed_plan, **extra,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
        chosen = [rt.graph_layouts if graphs else None]
        ran = []
        for i, lengths in enumerate(steps):
            calls.clear()
            r = rt.train_step(batch(lengths, i))
            ran.append((r.loss, r.layouts, list(calls)))
            chosen.append(rt.graph_layouts if graphs else None)
        weights = rt.full_weights()  # collective
        out[graphs] = (chosen, rt.planner.cost.graph_layouts, ran, _numpy(weights) if rank == 0 else None)
    return out
