"""Context parallelism against a single-process run of the same code, on real gloo processes,
plus unit tests of how a pack is cut over the cp ranks.

Tolerances as in test_model.py: fp32 sums in another order, AdamW with eps = 1e-6.
"""

import random

import pytest
import torch

import hotswitch as hs
from hotswitch.model.context import CP_MIN_CHUNK, ContextSplit, split_sequences
from hotswitch.testing.harness import run_world

from tests.python.model import cp_workers as w

TOL = 1e-5
WORLD2_RUNS = [("cp2", False, False), ("cp2", True, False)]
WORLD4_RUNS = [
    ("cp4", False, False),
    ("dp2cp2", False, False),
    ("tp2cp2", False, False),
    ("cp2pp2", False, False),
    ("cp2pp2", True, False),
    ("dp2cp2", False, True),
    ("dp2cp2/tp-dp-cp-pp", False, True),  # dp varies faster than cp: data index != rank order
    ("tp2cp2/cp-tp-dp-pp", True, False),
]
WORLD8_RUNS = [("dp2tp2cp2", False, True), ("tp2cp2pp2", True, False)]


@pytest.fixture(scope="module")
def references():
    return run_world(1, w.reference, [False, True], timeout=300)[0]


def _check(results, references, run):
    ref_losses = references[run[1]][0]
    for rank, result in enumerate(results):
        losses, weight_diff, grad_diff, loss_diff, zero_diff = result[run]
        assert len(losses) == len(ref_losses) == len(w.CP_STEP_LENGTHS)
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= TOL * abs(b), (rank, losses, ref_losses)
        assert weight_diff <= TOL, (rank, weight_diff)
        assert grad_diff <= TOL, (rank, grad_diff)
        assert loss_diff <= TOL, (rank, loss_diff)
        assert zero_diff <= TOL, (rank, zero_diff)


@pytest.fixture(scope="module")
def world2(references):
    return run_world(2, w.parity, WORLD2_RUNS, references, timeout=600)


@pytest.fixture(scope="module")
def world4(references):
    return run_world(4, w.parity, WORLD4_RUNS, references, timeout=900)


@pytest.mark.parametrize("run", WORLD2_RUNS, ids=lambda r: f"{r[0]}{'-tied' if r[1] else ''}")
def test_world2_context_parallel_matches_single_process(world2, references, run):
    _check(world2, references, run)


@pytest.mark.parametrize("run", WORLD4_RUNS,
                         ids=lambda r: f"{r[0]}{'-tied' if r[1] else ''}{'-zero' if r[2] else ''}")
def test_world4_context_parallel_matches_single_process(world4, references, run):
    _check(world4, references, run)


def test_world8_context_parallel_matches_single_process(references):
    results = run_world(8, w.parity, WORLD8_RUNS, references, timeout=900)
    for run in WORLD8_RUNS:
        _check(results, references, run)


def test_split_cuts_long_sequences_in_mirrored_chunks_and_deals_short_ones():
    cp = 2
    long_n = 4 * cp * CP_MIN_CHUNK + 3  # 35: chunks of 9, 9, 9, 8
    lengths = [long_n, 5, 3, 1]
    pieces = split_sequences(lengths, cp)
    assert [p for p in pieces[0] if p[0] == 0] == [(0, 0, 9), (0, 27, 35)]   # chunks 0 and 3
    assert [p for p in pieces[1] if p[0] == 0] == [(0, 9, 18), (0, 18, 27)]  # chunks 1 and 2
    # Every token of every sequence exactly once.
    seen = sorted((s, t) for p in pieces for s, b, e in p for t in range(b, e))
    assert seen == sorted((s, t) for s, n in enumerate(lengths) for t in range(n))
    # Short sequences whole, longest first to the rank holding fewer tokens (17 vs 18).
    whole = {s: r for r, p in enumerate(pieces) for s, b, e in p if s > 0}
    assert whole == {1: 0, 2: 1, 3: 1}
    assert [sum(e - b for _, b, e in p) for p in pieces] == [22, 22]


def test_split_balances_causal_work_of_long_sequences():
    # Attention work of a query at position p is p + 1 keys: the mirrored pairs even it out.
    cp, n = 4, 1024
    pieces = split_sequences([n], cp)
    work = [sum(sum(range(b + 1, e + 1)) for _, b, e in p) for p in pieces]
    assert max(work) - min(work) <= 0.01 * max(work), work


def test_context_split_positions_and_padding():
    cu = torch.tensor([0, 40, 43], dtype=torch.int64)
    parts = [ContextSplit(cu, 2, r, multiple=4) for r in range(2)]
    assert parts[0].rows == parts[1].rows and parts[0].rows % 4 == 0
    owned = torch.cat([p.index[p.index >= 0] for p in parts]).sort().values
    assert torch.equal(owned, torch.arange(43))
    for p in parts:
        local = p.index >= 0
        expected = torch.where(p.index[local] < 40, p.index[local], p.index[local] - 40)
        assert torch.equal(p.positions[local], expected)


@pytest.mark.parametrize("cp,min_chunk,needle", [(0, 4, "cp must be a positive int"),
                                                 (2, 0, "min_chunk must be a positive int")])
def test_split_rejects_bad_arguments(cp, min_chunk, needle):
    with pytest.raises(ValueError) as e:
        split_sequences([5], cp, min_chunk)
    assert needle in str(e.value)


def test_config_accepts_context_parallel_layouts():
    cfg = hs.TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                               ffn_hidden_size=64, vocab_size=64, max_position_embeddings=64)
    cfg.validate(hs.Layout.parse("dp2cp2"))


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_context_attention_equals_pack_attention_row_by_row(cp):
    # Every cp rank's part, with the gather played by concatenating the parts in one process.
    from hotswitch.model.attention import PackAttention
    from hotswitch.model.context import ContextAttention
    gen = torch.Generator().manual_seed(3)
    lengths = [1, 97, 13, 2 * cp * CP_MIN_CHUNK, 5, 64]
    cu = torch.tensor([0] + lengths).cumsum(0)
    t, hq, hkv, d = int(cu[-1]), 6, 2, 8
    q, k, v = (torch.randn(t, h, d, generator=gen) for h in (hq, hkv, hkv))
    expected = PackAttention(cu, "grouped", hq, torch.device("cpu"))(q, k, v)
    splits = [ContextSplit(cu, cp, r, multiple=2) for r in range(cp)]

    def local(x, sp):
        out = x.new_zeros((sp.rows,) + tuple(x.shape[1:]))
        mine = sp.index >= 0
        out[mine] = x[sp.index[mine]]
        return out

    kv = torch.cat([torch.cat([local(k, sp), local(v, sp)], dim=1).reshape(sp.rows, -1) for sp in splits])
    for sp in splits:
        out = ContextAttention(sp, lambda x: kv)(local(q, sp), local(k, sp), local(v, sp))
        mine = sp.index >= 0
        assert torch.allclose(out[mine], expected[sp.index[mine]], atol=1e-6), cp
        assert not out[~mine].any()


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_the_cost_model_deals_a_pack_as_the_model_splits_it(cp):
    # The planner prices each cp rank's part (hotswitch._C.context_split_loads); it must be the
    # part the model computes, for packs of long and short sequences alike.
    rng = random.Random(cp)
    for _ in range(20):
        lengths = [rng.choice([1, 2, 5, 2 * cp * CP_MIN_CHUNK - 1, 2 * cp * CP_MIN_CHUNK, rng.randrange(1, 600)])
                   for _ in range(rng.randrange(1, 12))]
        pieces = split_sequences(lengths, cp)
        expected = [(sum(b - a for _, a, b in p), sum((b * (b + 1) - a * (a + 1)) / 2 for _, a, b in p),
                     len({s for s, _, _ in p})) for p in pieces]
        assert [tuple(x) for x in hs._C.context_split_loads(lengths, cp, CP_MIN_CHUNK)] == expected, lengths
