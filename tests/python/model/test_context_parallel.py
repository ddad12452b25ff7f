"""Context parallelism against a single-process run of the same code, on real gloo processes,
plus unit tests of how a pack is cut over the cp ranks.

Tolerances as in test_model.py: fp32 sums in another order, AdamW with eps = 1e-6.
"""

import random

import pytest
import torch

import hotswitch as hs
import hotswitch.model.attention as attention
from hotswitch.model.context import CP_MIN_CHUNK, ContextAttention, ContextSplit, split_sequences
from hotswitch.testing.harness import run_world

from tests.python.model import attention_workers as aw
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


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_split_covers_every_token_once_on_random_packs(cp):
    rng = random.Random(10 + cp)
    for _ in range(30):
        lengths = [rng.choice([1, 2, 3, 2 * cp * CP_MIN_CHUNK - 1, 2 * cp * CP_MIN_CHUNK, rng.randrange(1, 300)])
                   for _ in range(rng.randrange(1, 40))]
        pieces = split_sequences(lengths, cp)
        assert len(pieces) == cp
        seen = sorted((s, t) for p in pieces for s, b, e in p for t in range(b, e))
        assert seen == sorted((s, t) for s, n in enumerate(lengths) for t in range(n)), lengths
        for p in pieces:
            assert p == sorted(p)  # pack order
            for s, b, e in p:
                cut = cp > 1 and lengths[s] >= 2 * cp * CP_MIN_CHUNK
                assert 0 <= b < e <= lengths[s] and (cut or (b, e) == (0, lengths[s]))
        for s, n in enumerate(lengths):
            holders = [r for r, p in enumerate(pieces) for t, _, _ in p if t == s]
            if cp > 1 and n >= 2 * cp * CP_MIN_CHUNK:
                assert holders == sorted(2 * list(range(cp)))  # two chunks on every rank
            else:
                assert len(holders) == 1


def test_split_balances_causal_work_of_long_sequences():
    # Attention work of a query at position p is p + 1 keys: the mirrored pairs even it out.
    cp, n = 4, 1024
    pieces = split_sequences([n], cp)
    work = [sum(sum(range(b + 1, e + 1)) for _, b, e in p) for p in pieces]
    assert max(work) - min(work) <= 0.01 * max(work), work


@pytest.mark.parametrize("cp_rank", [-1, 2, True, 1.0])
def test_context_split_rejects_a_rank_outside_the_group(cp_rank):
    with pytest.raises(ValueError, match=r"cp_rank must be an int in \[0, 2\), got"):
        ContextSplit(torch.tensor([0, 40, 43]), 2, cp_rank)


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


@pytest.mark.parametrize("lengths,cp,min_chunk,needle", [([5], 0, 4, "cp must be a positive int, got 0"),
                                                         ([5], 2, 0, "min_chunk must be a positive int"),
                                                         ([5, 0], 2, 4, "sequence 1 has length 0, expected >= 1")])
def test_split_rejects_bad_arguments(lengths, cp, min_chunk, needle):
    with pytest.raises(ValueError) as e:
        split_sequences(lengths, cp, min_chunk)
    assert needle in str(e.value)


def test_config_accepts_context_parallel_layouts():
    cfg = hs.TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                               ffn_hidden_size=64, vocab_size=64, max_position_embeddings=64)
    cfg.validate(hs.Layout.parse("dp2cp2"))


CPU = torch.device("cpu")
CP_KERNELS = ["grouped", "masked", "sdpa"]


def _context_attention(kernel, cp, lengths, hq=6, hkv=2, d=16, device=CPU, dtype=torch.float32, seed=3):
    """Every cp rank's attention over one pack in one process, the gather played by one
    concatenation of every rank's K/V rows (so the gradients of each rank's rows sum every
    rank's use of them, as the reduce-scatter does). Padding rows hold random values: they
    must reach no output. Returns the pack's q, k, v, the splits, the kernels the ranks ran,
    their outputs, the gradients of each rank's q/k/v rows for a fixed random cotangent,
    and that cotangent laid out in pack order."""
    gen = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0] + lengths).cumsum(0)
    t = int(cu[-1])
    q, k, v = (torch.randn(t, h, d, generator=gen) for h in (hq, hkv, hkv))
    splits = [ContextSplit(cu, cp, r, multiple=2) for r in range(cp)]

    def local(x, sp):
        out = torch.randn((sp.rows,) + tuple(x.shape[1:]), generator=gen)
        mine = sp.index >= 0
        out[mine] = x[sp.index[mine]]
        return out.to(device, dtype).requires_grad_()

    parts = [tuple(local(x, sp) for x in (q, k, v)) for sp in splits]
    kv = torch.cat([torch.cat([lk, lv], dim=1).reshape(sp.rows, -1) for (_, lk, lv), sp in zip(parts, splits)])
    kernels, outs, total = [], [], 0.0
    cotangent = torch.zeros(t, hq, d)
    for sp, (lq, lk, lv) in zip(splits, parts):
        att = ContextAttention(sp, lambda x: kv, kernel, hq, device)
        out = att(lq, lk, lv)
        weight = torch.randn(out.shape, generator=gen)
        mine = sp.index >= 0
        cotangent[sp.index[mine]] = weight[mine]
        total = total + (out.float() * weight.to(device)).sum()
        kernels.append(att.kernel)
        outs.append(out)
    total.backward()
    # A rank holding no token of the pack uses none of its rows: no gradient reaches them.
    grads = [tuple(torch.zeros_like(x) if x.grad is None else x.grad for x in p) for p in parts]
    return (q, k, v), splits, kernels, outs, grads, cotangent


CP_PACKS = [[1, 97, 13, 16, 5, 64], [3, 3, 3], [200], [41, 2, 1, 77, 30]]


def _max_abs_diff(a, b) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0  # a rank may hold no token


def _check_context_kernel(kernel, cp, lengths, device=CPU, tol=1e-5, dtype=torch.float32):
    (q, k, v), splits, kernels, outs, grads, cotangent = _context_attention(kernel, cp, lengths, device=device,
                                                                            dtype=dtype)
    assert set(kernels) == {kernel}, kernels
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    expected = aw.reference_attention(q64, k64, v64, lengths)
    (expected * cotangent.double()).sum().backward()
    for sp, out, grad in zip(splits, outs, grads):
        mine = sp.index >= 0
        at = sp.index[mine]
        out = out.detach().double().cpu()
        assert _max_abs_diff(out[mine], expected.detach()[at]) < tol, (kernel, cp, lengths)
        assert not out[~mine].any()
        for got, want in zip(grad, (q64.grad, k64.grad, v64.grad)):
            got = got.double().cpu()
            assert _max_abs_diff(got[mine], want[at]) < 10 * tol, (kernel, cp, lengths)
            assert not got[~mine].any()  # padding rows reach nothing


@pytest.mark.parametrize("lengths", CP_PACKS, ids=lambda p: f"{len(p)}seqs-{sum(p)}")
@pytest.mark.parametrize("cp", [2, 3, 4])
@pytest.mark.parametrize("kernel", CP_KERNELS)
def test_context_attention_matches_the_per_sequence_reference(kernel, cp, lengths, monkeypatch):
    monkeypatch.setitem(attention.MASKED_MAX_SCORES, "cpu", 1 << 40)
    _check_context_kernel(kernel, cp, lengths)


@pytest.mark.parametrize("lengths", CP_PACKS, ids=lambda p: f"{len(p)}seqs-{sum(p)}")
@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("kernel", ["flash_attn", "varlen", "flex"])
def test_context_attention_flash_and_flex_paths_with_stand_in_kernels(kernel, cp, lengths, stand_ins):
    aw.needs_torch_varlen(kernel)
    _check_context_kernel(kernel, cp, lengths)


def test_context_parallel_runs_one_kernel_call_per_layer_for_64_distinct_lengths():
    """cp2 on a pack of 64 distinct lengths: the grouped path calls once per distinct
    (length, pieces) shape of each rank's sequences; the mask kernel (its bound raised to take
    the pack) once per layer, with the same losses."""
    grouped = run_world(2, aw.count_kernel_calls, "grouped", None, aw.DISTINCT_64, None, "cp2", timeout=300)
    masked = run_world(2, aw.count_kernel_calls, "masked", 1 << 26, aw.DISTINCT_64, None, "cp2", timeout=300)
    cu = torch.tensor([0] + aw.DISTINCT_64).cumsum(0)
    for rank, ((_, ran_g, calls_g, layers, loss_g), (_, ran_m, calls_m, _, loss_m)) in enumerate(zip(grouped, masked)):
        shapes = len(ContextSplit(cu, 2, rank).shape_groups()[0])
        assert shapes > 50  # 64 sequences; the 49 of 16 tokens or more are cut, each its own shape
        assert ran_g == "grouped" and calls_g == {"_context_blocks": shapes * layers}, calls_g
        assert ran_m == "masked" and calls_m == {"_masked_kernel": layers}, calls_m
        assert abs(loss_m - loss_g) <= 1e-5 * abs(loss_g)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lengths", CP_PACKS, ids=lambda p: f"{len(p)}seqs-{sum(p)}")
def test_cuda_context_kernels_match_the_per_sequence_reference(lengths, monkeypatch):
    """Every CUDA kernel under cp2 and cp4: fp32 ones within 1e-5 (TF32 off), head dim 16;
    flash_attn and varlen (fp16/bf16 only) in bf16 within bf16 rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    monkeypatch.setitem(attention.MASKED_MAX_SCORES, "cuda", 1 << 40)
    cuda = torch.device("cuda")
    for cp in (2, 4):
        for kernel in attention.available_kernels(cuda, torch.float32, 16):
            _check_context_kernel(kernel, cp, lengths, device=cuda)
        for kernel in attention.FLASH_KERNELS:
            if kernel in attention.available_kernels(cuda, torch.bfloat16, 16):
                _check_context_kernel(kernel, cp, lengths, device=cuda, tol=2e-2, dtype=torch.bfloat16)


def test_varlen_bounds_give_each_piece_its_sequence_prefix():
    # cp2, a 35-token sequence in chunks of 9, 9, 9, 8 and two whole ones: rank 0 holds
    # chunks 0 and 3 of sequence 0 and sequence 1 (5 tokens) whole.
    cu = torch.tensor([0, 35, 40, 43])
    sp = ContextSplit(cu, 2, 0)
    assert [x.tolist() for x in sp.pieces] == [[0, 0, 1], [0, 27, 0], [9, 35, 5]]  # (sequence, start, end)
    cu_q, cu_k, key_rows, max_q, max_k = sp.varlen_bounds()
    assert cu_q.tolist() == [0, 9, 17, 22] and cu_k.tolist() == [0, 9, 44, 49]
    assert (max_q, max_k) == (9, 35)
    assert torch.equal(key_rows, sp.gathered[torch.cat([torch.arange(9), torch.arange(35), 35 + torch.arange(5)])])


def test_mask_kernels_under_cp_run_grouped_beyond_their_bound(monkeypatch):
    cu = torch.tensor([0, 40, 43])
    sp = ContextSplit(cu, 2, 0)  # 23 rows a rank (rank 0 holds 20 + 3 tokens), 46 gathered
    assert sp.rows == 23
    monkeypatch.setitem(attention.MASKED_MAX_SCORES, "cpu", 3 * 23 * 46)
    assert ContextAttention(sp, None, "masked", 3, CPU).kernel == "masked"
    assert ContextAttention(sp, None, "sdpa", 4, CPU).kernel == "grouped"
    with pytest.raises(ValueError, match="'dense' is not one of"):
        ContextAttention(sp, None, "dense", 3, CPU)


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
