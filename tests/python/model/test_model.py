"""The parallel transformer against a single-process run of the same code, on real gloo
processes, plus unit tests of its pieces.

Tolerances: fp32 sums taken in another order (TP partial sums, DP reductions) differ by
~1e-9 in the gradients. AdamW's step lr * g / (|g| + eps) turns a gradient error d near
g = 0 into a weight error of up to lr * d / eps, so the runs use eps = 1e-6 (with 1e-8 a
tp4 run differed by 1.7e-5 on one element; the gradients themselves agree to 1e-8).
"""

import math

import numpy as np

import pytest
import torch

import hotswitch as hs
from hotswitch.testing.reference import train_static
from hotswitch.model.init import init_full
from hotswitch.testing.harness import run_world
from hotswitch.model.attention import PackAttention, varlen_attention
from hotswitch.model.init import uniform_at

from tests.python.model import workers as w

TOL = 1e-5
WORLD4_RUNS = (
    [(name, False, False) for name in ("dp4", "tp4", "pp4", "dp2tp2", "dp2pp2", "tp2pp2")]
    + [(name, True, False) for name in ("pp4", "dp2pp2", "tp2pp2", "dp2tp2")]
    + [("dp4", False, True), ("dp2tp2", False, True), ("dp2pp2", True, True)]
    + [("dp2tp2/dp-tp-cp-pp", False, False), ("tp2pp2/pp-tp-cp-dp", True, False)]  # other rank orders
)
WORLD8_RUNS = [("dp2tp2pp2", False, False), ("dp2tp2pp2", True, True)]


@pytest.fixture(scope="module")
def references():
    return run_world(1, w.reference, [False, True], timeout=120)[0]


@pytest.fixture(scope="module")
def world4(references):
    return run_world(4, w.parity, WORLD4_RUNS, references, timeout=600)


def _check_run(results, references, run):
    ref_losses = references[run[1]][0]
    for rank, result in enumerate(results):
        losses, weight_diff = result[run]
        assert len(losses) == len(ref_losses) == len(w.STEP_LENGTHS)
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= TOL * abs(b), (rank, losses, ref_losses)
        assert weight_diff <= TOL, (rank, weight_diff)


@pytest.mark.parametrize("run", WORLD4_RUNS, ids=lambda r: f"{r[0]}{'-tied' if r[1] else ''}{'-zero' if r[2] else ''}")
def test_world4_training_matches_single_process(world4, references, run):
    _check_run(world4, references, run)


def test_world8_training_matches_single_process(references):
    results = run_world(8, w.parity, WORLD8_RUNS, references, timeout=600)
    for run in WORLD8_RUNS:
        _check_run(results, references, run)


def test_reference_learns():
    """The reference is not degenerate: the loss of a repeated batch falls."""
    cfg = w.config()
    batch = w.batches()[0]
    results = run_world(1, _repeat_batch, cfg, batch, timeout=120)[0]
    assert results[-1] < results[0] - 0.05, results


def _repeat_batch(rank, world, cfg, batch):
    return train_static(cfg, hs.Layout(), [batch], steps=6, lr=1e-2)[0]


@pytest.mark.parametrize("src,dst,tied", [("dp2tp2", "tp2pp2", True), ("tp2pp2", "dp2tp2", True),
                                          ("pp4", "dp2tp2", False)])
def test_switch_then_load_equals_building_under_the_new_layout(src, dst, tied):
    for same_weights, same_loss, same_grads, grad_diff, grad_scale in run_world(
            4, w.switch_model, src, dst, tied, timeout=300):
        assert same_weights and same_loss and same_grads
        assert grad_scale > 1e-4
        assert grad_diff <= 1e-7, grad_diff


def test_bad_input_raises_before_any_collective():
    for messages, intact in run_world(4, w.bad_input, timeout=120):
        world, heads, layers, groups, shape, token = messages
        assert "!= world(4)" in world, world
        assert "num_attention_heads(4) is not divisible by tp(4)" not in heads  # heads=4 divides
        assert "num_query_groups(2) is not divisible by tp(4)" in heads, heads
        assert "num_layers(3) is not divisible by pp(4)" in layers, layers
        assert "num_query_groups(2) is not divisible by tp(4)" in groups, groups
        assert "layers.1.qkv.weight" in shape and "(3, 3)" in shape, shape
        assert "vocab_size(128)" in token, token
        assert intact


@pytest.mark.parametrize("kwargs,layout,needle", [
    (dict(num_attention_heads=6, hidden_size=48, num_query_groups=6), "tp4", "num_attention_heads(6) is not divisible by tp(4)"),
    (dict(num_query_groups=2), "tp4", "num_query_groups(2) is not divisible by tp(4)"),
    (dict(num_layers=6), "pp4", "num_layers(6) is not divisible by pp(4)"),
    (dict(ffn_hidden_size=90), "tp4", "ffn_hidden_size(90) is not divisible by tp(4)"),
    (dict(vocab_size=130), "tp4", "vocab_size(130) is not divisible by tp(4)"),
])
def test_config_rejects_layouts_it_cannot_run_under(kwargs, layout, needle):
    cfg = w.config(**kwargs)
    with pytest.raises(ValueError) as e:
        cfg.validate(hs.Layout.parse(layout))
    assert needle in str(e.value)
    with pytest.raises(ValueError) as e:  # before it looks at the groups: no collective
        hs.ParallelTransformer(cfg, hs.Layout.parse(layout), groups=None)
    assert needle in str(e.value)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(num_query_groups=3), "num_attention_heads(8) is not a multiple of num_query_groups(3)"),
    (dict(num_query_groups=16), "num_query_groups(16)"),
    (dict(hidden_size=60), "hidden_size(60) is not divisible by num_attention_heads(8)"),
    (dict(hidden_size=24), "must be even"),
    (dict(num_layers=0), "num_layers must be a positive int"),
    (dict(dtype="float64"), "dtype 'float64'"),
])
def test_config_rejects_bad_models(kwargs, needle):
    with pytest.raises(ValueError) as e:
        w.config(**kwargs)
    assert needle in str(e.value)


def test_config_matches_the_engine_and_the_cost_model():
    cfg = w.config(tied=True)
    names = [s.name for s in cfg.tensor_set().specs]
    assert names[0] == "embedding.weight" and "head.weight" not in names
    assert cfg.tensor_set().fingerprint() == hs.llama_tensor_set(
        num_layers=4, hidden_size=64, ffn_hidden_size=96, num_attention_heads=8, num_query_groups=4,
        vocab_size=128, tied_embedding=True, dtype="float32").fingerprint()
    cost = w.config().cost_config()  # the cost model counts an untied head
    assert (cost.num_layers, cost.hidden_size, cost.num_query_groups, cost.vocab_size) == (4, 64, 4, 128)
    assert cost.total_params == sum(s.numel for s in w.config().tensor_set().specs)


def test_initialiser_gives_the_same_logical_weights_under_every_layout():
    for tied in (False, True):
        cfg = w.config(tied)
        full = init_full(cfg, seed=5)
        for layout in hs.Layout.enumerate(4):
            if layout.cp > 1:
                continue
            for rank in range(4):
                shards = hs.init_shards(cfg, layout, rank, seed=5)
                expected = hs.shard_tensors(full, cfg.tensor_set(), layout, rank)
                assert shards.keys() == expected.keys()
                for name in shards:
                    assert torch.equal(shards[name], expected[name]), (layout, rank, name)
    other = init_full(w.config(), seed=6)
    assert not torch.equal(other["layers.0.qkv.weight"], init_full(w.config(), seed=5)["layers.0.qkv.weight"])


def test_initialiser_statistics_and_hash():
    cfg = w.config(hidden_size=256, num_attention_heads=8, ffn_hidden_size=512)
    full = init_full(cfg, seed=0)
    std = cfg.init_std
    assert abs(float(full["layers.0.gate_up.weight"].std()) - std) < 0.02 * std
    assert abs(float(full["layers.0.down.weight"].std()) - std / math.sqrt(8)) < 0.02 * std
    assert abs(float(full["embedding.weight"].mean())) < 0.02 * std
    assert torch.equal(full["final_norm.weight"], torch.ones(256))
    # splitmix64 in plain Python integers, against the int64 tensor version.
    from hotswitch.model.init import _key

    def splitmix(key, i):
        m = (1 << 64) - 1
        z = (key + (i + 1) * 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return ((z ^ (z >> 31)) >> 11) / float(1 << 53)

    index = torch.tensor([0, 1, 2, 12345, 2**40 + 7])
    ours = uniform_at(3, "layers.2.qkv.weight", index).tolist()
    key = _key(3, "layers.2.qkv.weight") & ((1 << 64) - 1)
    assert ours == [splitmix(key, int(i)) for i in index]


def _dense_reference(q, k, v, lengths):
    out, start = [], 0
    repeat = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = q[start:start + n], k[start:start + n], v[start:start + n]
        ks, vs = ks.repeat_interleave(repeat, 1), vs.repeat_interleave(repeat, 1)
        scores = torch.einsum("qhd,khd->hqk", qs.double(), ks.double()) / math.sqrt(q.shape[-1])
        scores = scores + torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs.double()))
        start += n
    return torch.cat(out)


def test_varlen_attention_matches_per_sequence_reference():
    torch.manual_seed(0)
    lengths = [1, 7, 3, 7, 31, 2, 1]
    q = torch.randn(sum(lengths), 4, 8)
    k, v = torch.randn(sum(lengths), 2, 8), torch.randn(sum(lengths), 2, 8)
    cu = torch.tensor([0] + lengths).cumsum(0)
    for kernel in ("masked", "grouped"):
        got = varlen_attention(q, k, v, PackAttention(cu, kernel, 4, torch.device("cpu")))
        assert float((got.double() - _dense_reference(q, k, v, lengths)).abs().max()) < 1e-5, kernel


@pytest.mark.parametrize("tokens,cu,needle", [
    ([1, 2, 3], [0, 2], "rise strictly from 0 to the token count 3"),
    ([1, 2, 3], [0, 0, 3], "rise strictly"),
    ([1, 2, 3], [0], "no sequence"),
])
def test_micro_batch_rejects_bad_packs(tokens, cu, needle):
    with pytest.raises(ValueError) as e:
        hs.MicroBatch(torch.tensor(tokens), torch.tensor(cu)).check()
    assert needle in str(e.value)
    with pytest.raises(ValueError) as e:
        hs.MicroBatch(torch.tensor(tokens, dtype=torch.int32), torch.tensor([0, 3])).check()
    assert "int64" in str(e.value)


def test_micro_batch_targets():
    mb = hs.MicroBatch.from_sequences([[5], [1, 2, 3], [4, 4]])
    assert mb.cu_seqlens.tolist() == [0, 1, 4, 6]
    assert (mb.num_tokens, mb.num_sequences, mb.num_targets) == (6, 3, 3)
    assert [len(r) for r in hs.split_replicas([mb] * 5, 2)] == [3, 2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_nccl_training_matches_cpu_reference(references):
    gpus = torch.cuda.device_count()
    world = 2 if gpus >= 2 else 1
    layout = "tp2" if world == 2 else "dp1"
    results = run_world(world, w.parity_cuda, layout, references, backend="nccl", timeout=300)
    for losses, weight_diff in results:
        assert len(losses) == len(references[False][0]) == len(w.STEP_LENGTHS)
        for a, b in zip(losses, references[False][0]):
            assert abs(a - b) <= 1e-4 * abs(b)
        assert weight_diff <= 1e-4


@pytest.mark.parametrize("mode", ["die", "stall"])
def test_dead_pipeline_stage_raises_instead_of_hanging(mode):
    outcome, seconds = run_world(2, w.dead_stage, 3.0, mode, allow_exit=(1,), timeout=120)[0]
    assert outcome.startswith("RuntimeError"), outcome
    assert seconds < 12, (seconds, outcome)



# The backward's collectives and products, in order, by the leaves that need gradients.
_GATHERED_ORDER = {"xw": ["c10d._allgather_base_", "aten.mm", "c10d._reduce_scatter_base_", "aten.mm"],
                   "x": ["aten.mm", "c10d._reduce_scatter_base_"], "w": ["c10d._allgather_base_", "aten.mm"]}
_COMPOSED_ORDER = {"xw": ["aten.mm", "aten.mm", "c10d._reduce_scatter_base_"],
                   "x": ["aten.mm", "c10d._reduce_scatter_base_"], "w": ["aten.mm"]}


@pytest.mark.parametrize("dtype,autocast,needs", [("float32", False, "xw"), ("bfloat16", False, "xw"),
                                                  ("bfloat16", True, "xw"), ("bfloat16", True, "x"),
                                                  ("float32", False, "w")])
def test_gathered_linear_equals_the_gather_then_linear_keeping_only_the_slice_and_overlapping_its_backward(
        dtype, autocast, needs):
    for rank, out in enumerate(run_world(2, w.gathered_linear_parity, dtype, autocast, needs, timeout=120)):
        fused, composed = out["fused"], out["composed"]
        # The same products of the same operands: bit for bit, in fp32 and bf16, under autocast too.
        for key, missing in (("y", False), ("dx", "x" not in needs), ("dw", "w" not in needs)):
            assert (fused[key] is None) == (composed[key] is None) == missing, key
            if fused[key] is not None:
                np.testing.assert_array_equal(fused[key], composed[key], err_msg=f"rank {rank} {key}")
        assert fused["y_dtype"] == composed["y_dtype"] == f"torch.{dtype}"
        assert fused["grad_dtypes"] == composed["grad_dtypes"]
        # The backward gathers this rank's slice again before the input gradient's product and
        # posts that gradient's reduce-scatter before the weight gradient's product; the gather
        # then F.linear reduce-scatters after both products.
        assert fused["order"] == _GATHERED_ORDER[needs], fused["order"]
        assert composed["order"] == _COMPOSED_ORDER[needs], composed["order"]
        if needs == "xw":
            # Only this rank's 6 rows (and the 24-row weight shard) stay for the backward; the
            # gather then F.linear keeps the 12 gathered rows.
            assert fused["kept_rows"] == [6, 24], fused["kept_rows"]
            assert 12 in composed["kept_rows"], composed["kept_rows"]


@pytest.mark.parametrize("layout,compute_dtype,recompute,tied", [
    ("dp1", None, "none", False), ("tp2", None, "full", False), ("dp1", "bfloat16", "selective", False),
    ("tp2", "bfloat16", "none", False), ("dp1", None, "none", True), ("pp2", "bfloat16", "none", True)])
def test_weight_gradients_accumulated_in_the_products_equal_autograds(layout, compute_dtype, recompute, tied):
    # hotswitch.model.wgrad: the four matrices' and the loss head's weight gradients added into
    # .grad in their products' backward (addmm_ in fp32; on the CPU the bf16 product, then its
    # addition) against autograd's product and accumulation (through the copy's hook under
    # bf16), over two calls of several micro-batches; a tied head on the last of two stages
    # too, and not on the embedding's own stage. Same losses; gradients within 1e-6 relative
    # (fp32: one fused multiply-add instead of a product then an addition).
    world = hs.Layout.parse(layout).world
    for rank, out in enumerate(run_world(world, w.wgrad_parity, layout, compute_dtype, recompute, tied,
                                         timeout=300)):
        assert out["refused"] == "fuse_wgrad must be a bool, got 1", out["refused"]
        (losses, grads, fused), (ref_losses, ref_grads, unfused) = out[True], out[False]
        # Every matrix of this rank's layers and its loss head, at every micro-batch of both calls.
        micro_batches = sum(len(step) for step in w.batches()[:2])
        assert fused == (4 * out["layers"] + out["head"]) * micro_batches and unfused == 0, (fused, unfused)
        assert out["layers"] == w.TINY["num_layers"] // hs.Layout.parse(layout).pp
        # The head is fused on the last stage, unless its tied embedding is on the same stage.
        assert out["head"] == {"dp1": not tied, "tp2": not tied, "pp2": rank == 1}[layout], (rank, out["head"])
        assert losses == ref_losses, (rank, losses, ref_losses)
        assert grads.keys() == ref_grads.keys()
        for name in grads:
            np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-6, atol=1e-7,
                                       err_msg=f"rank {rank} {name}")


def test_accumulate_weight_grad_adds_the_product_in_the_gradients_dtype():
    from hotswitch.model import wgrad

    torch.manual_seed(0)
    g, x = torch.randn(2, 3, 4), torch.randn(2, 3, 5)  # [..., out], [..., in]
    expected = torch.einsum("bto,bti->oi", g, x)
    main = torch.zeros(4, 5, requires_grad=True)
    wgrad.accumulate_weight_grad(main, g, x)  # the first: becomes .grad
    torch.testing.assert_close(main.grad, expected)
    first = main.grad
    wgrad.accumulate_weight_grad(main, g, x)  # then in place
    assert main.grad is first
    torch.testing.assert_close(main.grad, 2 * expected)
    # A bf16 product into an fp32 gradient (the CPU has no widening product).
    assert not wgrad.widening_products(torch.device("cpu"))
    wide = torch.zeros(4, 5, requires_grad=True)
    wgrad.accumulate_weight_grad(wide, g.bfloat16(), x.bfloat16())
    assert wide.grad.dtype == torch.float32
    torch.testing.assert_close(wide.grad, g.bfloat16().reshape(-1, 4).t().mm(x.bfloat16().reshape(-1, 5)).float())
    # Outside a recorded graph, for a parameter without a gradient, or compiled: F.linear.
    frozen = torch.zeros(4, 5)
    assert not wgrad.fusing(frozen)
    with torch.no_grad():
        assert not wgrad.fusing(main)
    assert wgrad.fusing(main)


def test_what_a_layer_keeps_for_the_backward_is_split_over_tp():
    # Everything a layer keeps (the residual stream's slice, the norms' outputs, q/k/v and the
    # attention's output, the MLP's intermediates) is a tp-th of the pack's, as the cost
    # model's activation memory assumes: no gathered [T, h] rows stay at tp > 1.
    per_layer = {world: run_world(world, w.kept_activation_bytes, (1, 3), 32, timeout=120)[0] for world in (1, 2)}
    assert per_layer[1] > 0
    assert per_layer[2] * 2 == per_layer[1], per_layer


@pytest.mark.parametrize("layout,tied", [("dp1", True), ("tp2", False), ("pp2", True)])
def test_kept_weight_copies_equal_autocast_casting_every_micro_batch(layout, tied):
    world = hs.Layout.parse(layout).world
    for rank, out in enumerate(run_world(world, w.compute_copies_parity, layout, tied, timeout=300)):
        (losses, grads, reused), (ref_losses, ref_grads, _) = out[True], out[False]
        assert losses == ref_losses, (rank, losses, ref_losses)
        # Cast at the first call, kept while the weights stay, cast again after an in-place
        # update and after new shards.
        assert reused == [False, True, True, False, False], (rank, reused)
        assert grads.keys() == ref_grads.keys()
        for name in grads:
            np.testing.assert_array_equal(grads[name], ref_grads[name], err_msg=f"rank {rank} {name}")


@pytest.mark.parametrize("fuse_wgrad", [True, False])
def test_a_layer_run_by_itself_with_compute_copies_equals_autocast_casting_its_weights(fuse_wgrad):
    # TransformerLayer.use_compute_copies (benchmarks.gpu's layers): bf16 copies of the four
    # matrices, their gradients added into the fp32 .grad; bit for bit autocast's casts, over
    # two micro-batches that accumulate.
    from hotswitch.model import transformer
    from hotswitch.model.init import init_shards
    from hotswitch.model.transformer import LocalRegion, PackContext, TransformerLayer

    torch.manual_seed(0)
    cfg = hs.TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                               ffn_hidden_size=96, vocab_size=128, max_position_embeddings=64,
                               compute_dtype="bfloat16")
    shards = init_shards(cfg, hs.Layout(), 0, 3, torch.device("cpu"))

    mbs = [hs.MicroBatch.from_sequences([torch.randint(0, 128, (n,)) for n in lengths]) for lengths in ((5, 11), (16,))]
    inputs = [torch.randn(mb.num_tokens, cfg.hidden_size) for mb in mbs]
    runs = {}
    added = []
    add_grad_into = transformer._add_grad_into

    def counted(param, copy):
        if copy.grad is not None:
            added.append(copy.shape)
        add_grad_into(param, copy)

    for copies in (False, True):
        layer = TransformerLayer(cfg, 1, {k: v.clone() for k, v in shards.items()}, "layers.0.")
        layer.fuse_wgrad = fuse_wgrad
        if copies:
            transformer._add_grad_into = counted
            try:
                layer.use_compute_copies()
            finally:
                transformer._add_grad_into = add_grad_into
            assert {k: v.dtype for k, v in layer.compute_weights.items()} == \
                {k: torch.bfloat16 for k in ("qkv", "proj", "gate_up", "down")}
        outs = []
        for mb, x in zip(mbs, inputs):
            ctx = PackContext(mb, cfg, 1, torch.device("cpu"), "grouped")
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x.clone().requires_grad_(), ctx, LocalRegion())
            (y.float() ** 2).sum().backward()
            outs.append(y.detach())
        runs[copies] = outs, {n: p.grad.clone() for n, p in layer.named_parameters()}
    (outs, grads), (ref_outs, ref_grads) = runs[True], runs[False]
    # Fused, the products added every weight gradient into the parameters themselves
    # (hotswitch.model.wgrad): no copy kept one for the hook to add. Else every copy's gradient
    # reached its parameter through the hook, at both micro-batches.
    assert len(added) == (0 if fuse_wgrad else 2 * 4), added
    for a, b in zip(outs, ref_outs):
        assert torch.equal(a, b)
    assert grads.keys() == ref_grads.keys() and all(g.dtype == torch.float32 for g in grads.values())
    for name in grads:
        assert torch.equal(grads[name], ref_grads[name]), name


def test_to_device_keeps_a_host_tensor_and_casts_when_asked():
    # Off CUDA it is t.to(device): the tensor itself when nothing changes (no copy a pack pays).
    from hotswitch.model.batch import to_device

    t = torch.arange(5)
    assert to_device(t, "cpu") is t
    cast = to_device(t, torch.device("cpu"), torch.int32)
    assert cast.dtype == torch.int32 and cast.tolist() == [0, 1, 2, 3, 4]
    assert to_device(cast, "cpu", torch.int32) is cast


def _assert_trains_alike(out, compute_dtype, rank):
    """``out[True]`` and ``out[False]``, each (losses, gradients, ...): the same losses and
    gradients, fp32 within 1e-5, bf16 compute within 2e-2 of the largest gradient."""
    (losses, grads, _), (ref_losses, ref_grads, _) = out[True], out[False]
    tol = 1e-5 if compute_dtype is None else 2e-2
    np.testing.assert_allclose(losses, ref_losses, rtol=tol, err_msg=f"rank {rank}")
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        scale = max(float(np.abs(ref_grads[name]).max()), 1e-6)
        assert float(np.abs(grads[name] - ref_grads[name]).max()) <= tol * scale, (rank, name)


@pytest.mark.parametrize("layout,recompute,compute_dtype", [
    ("dp1", "none", None), ("dp1", "selective", "bfloat16"), ("tp2", "full", None), ("tp2", "selective", "bfloat16")])
def test_compiled_layers_equal_the_eager_model(layout, recompute, compute_dtype):
    # compile_layers=True: each layer's forward_pair through torch.compile(dynamic=True).
    # fp32: the eager model's losses and gradients within 1e-5; bf16 compute: within bf16's
    # rounding. One set of graphs serves both calls' pack sizes (no recompilation), and the
    # layer compiles whole, at tp2 too: its collectives are traced as functional collectives
    # (comm.py), so nothing breaks the graph.
    world = hs.Layout.parse(layout).world
    for rank, (out, breaks) in enumerate(run_world(world, w.compiled_layers_parity, layout, recompute, compute_dtype,
                                                   timeout=600)):
        _assert_trains_alike(out, compute_dtype, rank)
        graphs = out[True][2]
        assert graphs[0] > 0 and graphs[1] == graphs[0], (rank, graphs)
        assert breaks == [], breaks


def test_compile_layers_refuses_a_non_bool_and_the_triton_steps():
    not_bool, triton = run_world(1, w.compile_bad_input, timeout=120)[0]
    assert not_bool == "compile_layers must be a bool, got 'yes'", not_bool
    assert "kernels must be None or 'torch', got 'triton'" in triton, triton
    with pytest.raises(ValueError, match="compile_layers must be a bool, got 1"):
        hs.RuntimeConfig(compile_layers=1)


@pytest.mark.parametrize("recompute,compute_dtype,layout", [
    ("none", None, "dp1"), ("selective", "bfloat16", "dp1"), ("full", None, "dp1"), ("none", None, "tp2"),
    ("selective", "bfloat16", "tp2")])
def test_graph_buckets_pad_packs_and_train_as_the_unpadded_model(recompute, compute_dtype, layout):
    # Buckets of 32, 64 and 128 tokens: packs of up to 32 and up to 64 tokens run padded to
    # them (their padding an extra sequence without targets) through the graphed layers; a
    # pack of 70 as it is, since at 128 tokens its attention would run grouped here (8 heads
    # * 128^2 scores are over the CPU's mask bound); under full recomputation every pack runs
    # as it is. Losses and gradients
    # as without buckets: fp32 within 1e-5, bf16 within 2e-2 of the largest gradient (the
    # norms' matrix inputs round differently). One compiled graph per variant of the layer
    # serves both calls' packs, and nothing breaks it: at tp2 too, where each rank runs its
    # sequence-parallel half of the padded pack and the layer's collectives are traced in the
    # graph (at tp2 the 70-token pack runs as it is, with or without buckets).
    world = hs.Layout.parse(layout).world
    for rank, (out, breaks, _) in enumerate(run_world(world, w.graphed_layers_parity, recompute, compute_dtype,
                                                      layout, timeout=600)):
        _assert_trains_alike(out, compute_dtype, rank)
        (first, packs1), (second, packs2) = out[True][2]
        if recompute == "full":
            assert packs1 == [(17, False), (61, False), (70, False)] and packs2 == [(26, False), (36, False), (61, False)]
            assert first == second == 0
        else:
            assert packs1 == [(32, True), (64, True), (70, False)], (rank, packs1)
            assert packs2 == [(32, True), (64, True), (64, True)], (rank, packs2)
            assert first > 0 and second == first, (rank, graphs)
        assert breaks == [], (rank, breaks)


def test_models_that_compile_raise_the_recompile_limit_for_every_layouts_variants():
    # Every layout's graphed layers share one compiled function, and each layout and
    # recomputation adds its variants (the first layer and the others): 8 graphs here. Built
    # under a limit of 2, the first model raises it to RECOMPILE_LIMIT, so none runs uncompiled.
    from hotswitch.model.transformer import RECOMPILE_LIMIT

    for limit, graphs in run_world(2, w.graphed_variants, timeout=600):
        assert limit == RECOMPILE_LIMIT, limit
        assert graphs == [2, 4, 6, 8], graphs


def test_graph_buckets_and_graph_tokens_refuse_bad_values_and_change_nothing():
    *messages, unchanged = run_world(1, w.graph_bucket_errors, timeout=300)[0]
    bad_list = "graph_buckets must be a non-empty list of distinct token counts in [1, max_position_embeddings(128)]"
    assert all(m.startswith(bad_list) for m in messages[:6]), messages[:6]
    assert messages[6] == "graph_tokens must be a list of one int per micro-batch (2), got [32]", messages[6]
    assert messages[7].startswith("graph_tokens[1] must be 0 or one of the graph buckets [32, 64] holding the "
                                  "micro-batch's 40 tokens, got 32"), messages[7]
    assert messages[8].startswith("graph_tokens[0] must be 0 or one of the graph buckets"), messages[8]
    assert messages[9].endswith("got True"), messages[9]
    assert messages[10].endswith("got 128"), messages[10]
    assert messages[11].startswith("graph_tokens[0] must be 0 or one of") and messages[11].endswith("got 32.0")
    assert unchanged
    (tp2, pp2), _ = run_world(2, w.graph_bucket_errors, timeout=300)
    assert tp2 == ("graph_buckets must be multiples of tp (2) under layout tp2, so that a padded pack cuts into "
                   "equal sequence-parallel slices; got 33 in [32, 33]"), tp2
    assert pp2 == ("graph_buckets: layers run from CUDA graphs only on one stage without context parallelism (pp "
                   "and cp 1), got layout pp2"), pp2


def test_the_cost_model_prices_the_collectives_each_layer_posts():
    # Per layer at tp2 (sequence parallelism): 10 collectives, forward and backward. Full
    # recomputation reruns the forward under PyTorch's non-reentrant checkpoint, which stops
    # after the last tensor the chunk's backward saved: the chunk's last reduce-scatter is not
    # posted again, so 13 per layer in chunks of one layer and 13.5 in chunks of two (14 for
    # Megatron-LM's whole rerun). The cost model, its overlap off (every collective priced),
    # with the runtime's recompute_chunk_layers, prices as many.
    cases = [("none", 1), ("selective", 1), ("full", 1), ("full", 2)]
    posted = run_world(2, w.collectives_per_layer, cases, timeout=300)[0]
    assert posted == {("none", 1): 10, ("selective", 1): 10, ("full", 1): 13, ("full", 2): 13.5}, posted
    fields = hs.HardwareProfile.preset("h100").to_dict()
    fields["intra_node_latency"] = 1.0  # a collective's latency term: (tp - 1) * 1 s
    hw = hs.HardwareProfile.from_dict(fields)
    tp2 = hs.Layout.parse("tp2")
    for (recompute, chunk), n in posted.items():
        settings = hs.RuntimeConfig(recompute_num_layers=chunk)
        terms = [hs.CostModel(hs.TransformerConfig(**dict(w.TINY, num_layers=layers)).cost_config(), hw,
                              hs.Topology(2, 2), tp_overlap=0.0,
                              recompute_chunk_layers=settings.recompute_chunk_layers).terms(tp2, recompute)
                 for layers in (2, 4)]
        assert (terms[1].micro_batch_tp_seconds - terms[0].micro_batch_tp_seconds) / 2 == pytest.approx(n), \
            (recompute, chunk)
    with pytest.raises(ValueError, match="recompute_chunk_layers must be >= 0 .*got -1"):
        hs.CostModel(hs.TransformerConfig(**w.TINY).cost_config(), hw, hs.Topology(2, 2), recompute_chunk_layers=-1)
