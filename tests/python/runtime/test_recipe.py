"""The training recipe: Megatron's learning-rate schedules and the global gradient norm and
clipping, which must not depend on the layout (ZeRO, partial gradients, pipelines)."""

import json
import math

import pytest
import torch

import hotswitch as hs
from hotswitch.schedule import LearningRateSchedule
from hotswitch.testing.harness import run_world

TINY = dict(num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
            vocab_size=128, max_position_embeddings=128)
STEPS = [[1, 2, 3, 7, 13, 17, 31, 97, 11, 5, 40, 23, 37], [40, 40, 23, 120, 29, 60, 2, 15, 18, 33]]


def _batch(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, TINY["vocab_size"], (n,), generator=g).tolist() for n in lengths]


def train_norms(rank, world, candidates, zero, grad_method, clip, tied=True):
    """Per step (grad_norm, loss) and rank 0's final weights."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=tied)
    hw = hs.HardwareProfile.preset("a100")
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hw, zero=zero, grad_method=grad_method, seed=3,
                    recalibrate=False, clip_grad=clip,
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    out = [(r.grad_norm, r.loss, r.layouts) for r in (rt.train_step(_batch(s, i)) for i, s in enumerate(STEPS))]
    weights = rt.full_weights()
    # numpy, not tensors: a tensor crosses the result queue as a file descriptor of a dying process.
    return out, {k: v.numpy().copy() for k, v in weights.items()} if rank == 0 else None


def _reference(clip, tied=True):
    return run_world(1, train_norms, ["dp1"], False, "auto", clip, tied, timeout=300)[0]


@pytest.mark.parametrize("candidates,zero,grad_method,tied", [
    (["dp2"], False, "auto", True),
    (["tp2"], True, "auto", False),
    (["pp2"], False, "auto", True),
    (["dp2", "tp2", "pp2"], True, "partial", True),
    (["dp2", "pp2"], False, "reduce", False),
])
def test_the_gradient_norm_and_clipping_do_not_depend_on_the_layout(candidates, zero, grad_method, tied):
    # A clip well below the first step's norm, so that clipping changes the update.
    ref_steps, ref_weights = _reference(clip=0.05, tied=tied)
    assert ref_steps[0][0] > 0.05 * 4, f"the clip must bind: norm {ref_steps[0][0]}"
    results = run_world(2, train_norms, candidates, zero, grad_method, 0.05, tied, timeout=300)
    steps, weights = results[0]
    for (norm, loss, _), (ref_norm, ref_loss, _) in zip(steps, ref_steps, strict=True):
        assert abs(norm - ref_norm) <= 1e-6 * ref_norm, (norm, ref_norm)
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    assert results[1][0] == steps  # every rank reports the same norm
    for name, w in ref_weights.items():
        assert abs(weights[name] - w).max() <= 1e-5, name


def test_clipping_changes_the_update_and_no_clip_leaves_it():
    clipped, w_clipped = _reference(clip=0.05)
    free, w_free = _reference(clip=None)
    assert clipped[0][0] == pytest.approx(free[0][0], rel=1e-12)  # the same first norm, before clipping
    assert max(abs(w_clipped[k] - w_free[k]).max() for k in w_free) > 1e-4
    huge, w_huge = _reference(clip=1e9)  # a clip that never binds changes nothing
    assert all((w_huge[k] == w_free[k]).all() for k in w_free)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_clip_grad_must_be_a_positive_number(bad):
    with pytest.raises(ValueError, match=f"clip_grad must be a positive finite number or None, got {bad!r}"):
        hs.RuntimeConfig(clip_grad=bad)


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf"), True, "0.01"])
def test_min_gain_must_be_a_fraction_of_at_least_zero(bad):
    with pytest.raises(ValueError, match=f"min_gain must be a fraction >= 0 \\(0.01: 1%\\), got {bad!r}"):
        hs.RuntimeConfig(min_gain=bad)
    assert hs.RuntimeConfig(min_gain=0).min_gain == 0 and hs.RuntimeConfig().min_gain == 0.01


def test_the_planner_refuses_a_negative_min_gain():
    model = hs.ModelConfig.preset("llama-7b")
    cost = hs.CostModel(model, hs.HardwareProfile.preset("a800"), hs.Topology(8, 8))
    with pytest.raises(ValueError, match="min_gain must be a fraction >= 0, got -0.5"):
        hs.Planner(cost, [hs.Layout.parse("dp8")], 0, [[0.0]], [0.0], min_gain=-0.5)


def test_megatron_learning_rate_schedules():
    warm = LearningRateSchedule(1.0, style="cosine", min_lr=0.1, warmup_iters=4, decay_iters=14)
    assert [warm.lr_at(n) for n in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert warm.lr_at(9) == pytest.approx(0.1 + 0.9 * 0.5 * (math.cos(math.pi * 0.5) + 1))
    assert warm.lr_at(14) == pytest.approx(0.1) and warm.lr_at(100) == 0.1
    linear = LearningRateSchedule(2.0, style="linear", min_lr=0.0, decay_iters=10)
    assert [linear.lr_at(n) for n in (0, 5, 10, 11)] == [2.0, 1.0, 0.0, 0.0]
    constant = LearningRateSchedule(3e-4, warmup_iters=2)
    assert [constant.lr_at(n) for n in (0, 1, 2, 1000)] == [0.0, 1.5e-4, 3e-4, 3e-4]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=9.0)
    assert warm.apply(opt, 2) == 0.5 and opt.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("kwargs,needle", [
    (dict(lr=-1.0), "lr must be a finite number >= 0, got -1.0"),
    (dict(lr=1.0, style="exponential"), "lr decay style 'exponential' is not one of constant, linear, cosine"),
    (dict(lr=1.0, style="linear"), "the linear decay needs decay_iters"),
    (dict(lr=1.0, style="cosine", warmup_iters=10, decay_iters=10), "decay_iters(10) must exceed warmup_iters(10)"),
    (dict(lr=1.0, min_lr=2.0), "min_lr(2.0) must not exceed lr(1.0)"),
    (dict(lr=1.0, warmup_iters=-3), "warmup_iters must be an int >= 0, got -3"),
])
def test_bad_schedules_name_the_value(kwargs, needle):
    lr = kwargs.pop("lr")
    with pytest.raises(ValueError) as e:
        LearningRateSchedule(lr, **kwargs)
    assert needle in str(e.value)


def evaluate_then_train(rank, world, candidates):
    """(evaluation loss, the training step's loss on the same batch, weights unchanged by evaluate)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=False)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hs.HardwareProfile.preset("a100"), seed=3,
                    recalibrate=False)
    batch = _batch(STEPS[0], 0)
    before = [t.clone() for t in rt.state_dict()["params"]]
    ev = rt.evaluate(batch)
    unchanged = rt.step == 0 and all(torch.equal(a, b) for a, b in zip(before, rt.state_dict()["params"]))
    return ev, rt.train_step(batch).loss, unchanged


@pytest.mark.parametrize("world,candidates", [(1, ["dp1"]), (2, ["dp2"]), (2, ["tp2"]), (2, ["pp2"]),
                                              (2, ["dp2", "tp2", "pp2"])])
def test_evaluation_is_the_training_loss_without_training(world, candidates):
    results = run_world(world, evaluate_then_train, candidates, timeout=300)
    for ev, loss, unchanged in results:
        assert unchanged
        assert abs(ev - loss) <= 1e-6 * loss, (ev, loss)
    assert len({r[0] for r in results}) == 1


def test_metrics_plot_from_a_metrics_file(tmp_path):
    from hotswitch.cli import plots

    path = tmp_path / "m.jsonl"
    records = [{"iteration": i, "lm_loss": 5.0 - i / 10, "tokens_per_s": 1000 + i, "layouts": ["dp2", "tp2"][: 1 + i % 2]}
               for i in range(1, 6)]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = tmp_path / "m.png"
    assert plots.main(["metrics", str(path), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    path.write_text('{"iteration": 1}\n')
    with pytest.raises(SystemExit) as e:
        plots.main(["metrics", str(path), "--out", str(out)])
    assert e.value.code == 2
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="m.jsonl:1: expected a JSON object, got list"):
        plots.read_metrics(str(path))
