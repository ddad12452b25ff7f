"""Two separate 4-rank runs of the same training steps give bit-identical weights and the same
plans: planning, packing, switching and the reductions are deterministic."""

import torch

from hotswitch.testing.harness import run_world

from tests.python.runtime import workers as w

CANDIDATES = ["dp4", "dp2tp2", "pp4", "tp2pp2"]
STEPS = [w.STEPS[1], w.STEPS[2]]  # two and three phases: parameters and gradients switch


def test_two_runs_are_bit_identical():
    first = run_world(4, w.train_and_record_plans, CANDIDATES, STEPS, timeout=300)
    second = run_world(4, w.train_and_record_plans, CANDIDATES, STEPS, timeout=300)
    plans = first[0][0]
    assert any(len(layouts) > 1 for layouts, *_ in plans), f"no step switched layouts: {plans}"
    for rank in range(4):
        # Every rank runs the same layouts; micro-batch counts are per data replica.
        assert [p[0] for p in first[rank][0]] == [p[0] for p in plans], f"rank {rank}: {first[rank][0]}"
        assert second[rank][0] == first[rank][0], f"rank {rank}: {second[rank][0]} != {first[rank][0]}"
    weights_a, weights_b = first[0][1], second[0][1]
    assert sorted(weights_a) == sorted(weights_b)
    differ = [name for name in weights_a
              if not torch.equal(torch.from_numpy(weights_a[name]), torch.from_numpy(weights_b[name]))]
    assert not differ, f"weights differ between the runs: {differ}"
