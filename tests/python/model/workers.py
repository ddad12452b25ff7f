"""Rank functions of the model tests (module-level so that spawned ranks can import them)."""

import torch

import hotswitch as hs
from hotswitch.testing.reference import train_static

TINY = dict(num_layers=4, hidden_size=64, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=96,
            vocab_size=128, max_position_embeddings=128)

# Sequence lengths of each step's micro-batches: a length-1 sequence, primes, one sequence
# far longer than the rest, and steps with fewer micro-batches than pipeline stages (and
# than data replicas, so some replicas get none).
STEP_LENGTHS = [
    [[1, 7, 13], [31], [2, 3, 5], [61, 1], [11, 17]],
    [[97], [1, 1, 2], [19, 23]],
    [[5, 7, 11, 13], [3, 41]],
]
LR = 1e-3
EPS = 1e-6


def config(tied=False, **overrides):
    return hs.TransformerConfig(**{**TINY, **overrides}, tied_embedding=tied)


def batches(seed=1234, step_lengths=STEP_LENGTHS, vocab=TINY["vocab_size"]):
    gen = torch.Generator().manual_seed(seed)
    return [[hs.MicroBatch.from_sequences([torch.randint(0, vocab, (n,), generator=gen) for n in mb])
             for mb in step] for step in step_lengths]


def _numpy(shards):
    return {k: v.detach().cpu().numpy().copy() for k, v in shards.items()}


def reference(rank, world, tieds):
    """World 1: losses and full weights after training, per tied-embedding setting."""
    out = {}
    for tied in tieds:
        losses, model = train_static(config(tied), hs.Layout(), batches(), lr=LR, eps=EPS)
        out[tied] = (losses, _numpy(model.named_shards()))
    return out


def _compare(model, cfg, layout, rank, full):
    expected = hs.shard_tensors({k: torch.from_numpy(v) for k, v in full.items()}, cfg.tensor_set(), layout, rank)
    shards = model.named_shards()
    assert shards.keys() == expected.keys(), (sorted(shards), sorted(expected))
    return max(float((shards[k].detach() - expected[k]).abs().max()) for k in shards)


def parity(rank, world, runs, refs):
    """Trains each (layout, tied, zero) run; returns its losses and the largest weight
    difference of this rank's shards against the reference's."""
    out = {}
    for name, tied, zero in runs:
        layout = hs.Layout.parse(name)
        cfg = config(tied)
        losses, model = train_static(cfg, layout, batches(), lr=LR, eps=EPS, zero=zero)
        out[(name, tied, zero)] = (losses, _compare(model, cfg, layout, rank, refs[tied][1]))
    return out


def parity_cuda(rank, world, name, refs):
    """Trains on CUDA over NCCL (TF32 off); losses and the weight difference to the CPU run."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    layout = hs.Layout.parse(name)
    cfg = config()
    losses, model = train_static(cfg, layout, batches(), lr=LR, eps=EPS)
    assert all(p.is_cuda for p in model.named_shards().values())
    shards = {k: v.detach().cpu() for k, v in model.named_shards().items()}
    expected = hs.shard_tensors({k: torch.from_numpy(v) for k, v in refs[False][1].items()},
                                cfg.tensor_set(), layout, rank)
    return losses, max(float((shards[k] - expected[k]).abs().max()) for k in shards)


def switch_model(rank, world, src, dst, tied):
    """Switching a model's shards, and its partial gradients, from ``src`` to ``dst``."""
    cfg = config(tied)
    ts = cfg.tensor_set()
    a, b = hs.Layout.parse(src), hs.Layout.parse(dst)
    ga, gb = hs.ParallelGroups(a), hs.ParallelGroups(b)
    model_a = hs.ParallelTransformer(cfg, a, ga, seed=3)
    direct = hs.ParallelTransformer(cfg, b, gb, seed=3)
    moved = hs.ParallelTransformer(cfg, b, gb, seed=9)
    moved.load_shards(hs.switch(model_a.named_shards(), ts, a, b).shards)
    moved_shards, direct_shards = moved.named_shards(), direct.named_shards()
    same_weights = moved_shards.keys() == direct_shards.keys() and all(
        torch.equal(moved_shards[n], direct_shards[n]) for n in direct_shards)
    step = batches()[0]
    scale = 1.0 / hs.count_targets(step)
    loss_direct = direct.forward_backward(hs.split_replicas(step, b.dp)[gb.dp_rank], scale)
    loss_moved = moved.forward_backward(hs.split_replicas(step, b.dp)[gb.dp_rank], scale)
    moved_grads, direct_grads = moved.grad_shards(), direct.grad_shards()
    same_grads = moved_grads.keys() == direct_grads.keys() and all(
        torch.equal(moved_grads[n], direct_grads[n]) for n in direct_grads)
    # Gradients of src, accumulated over two calls and left partial over the data replicas,
    # switched with their summands added, against the reduction done under dst.
    mine = hs.split_replicas(step, a.dp)[ga.dp_rank]
    model_a.forward_backward(mine[:1], scale)
    model_a.finish_gradients()
    model_a.forward_backward(mine[1:], scale)
    summed = hs.switch(model_a.grad_shards(), ts, a, b, src_kind="partial").shards
    reduced = direct.reduce_gradients()
    grad_diff = max(float((summed[k] - reduced[k]).abs().max()) for k in reduced)
    grad_scale = max(float(reduced[k].abs().max()) for k in reduced)
    return same_weights, loss_direct == loss_moved, same_grads, grad_diff, grad_scale


def bad_input(rank, world):
    """Errors that must come before any collective, on every rank; the world stays usable."""
    messages = []
    for make in (lambda: hs.ParallelGroups(hs.Layout.parse("dp2tp4")),
                 lambda: hs.ParallelTransformer(config(num_attention_heads=4, num_query_groups=2),
                                                hs.Layout.parse("tp4"), None),
                 lambda: hs.ParallelTransformer(config(num_layers=3), hs.Layout.parse("pp4"), None),
                 lambda: hs.ParallelTransformer(config(num_attention_heads=8, num_query_groups=2),
                                                hs.Layout.parse("tp4"), None)):
        try:
            make()
            messages.append(None)
        except ValueError as e:
            messages.append(str(e))
    layout = hs.Layout.parse("dp2tp2")
    model = hs.ParallelTransformer(config(), layout, hs.ParallelGroups(layout))
    shards = {k: v.detach().clone() for k, v in model.named_shards().items()}
    wrong = dict(shards)
    wrong["layers.1.qkv.weight"] = torch.zeros(3, 3)
    try:
        model.load_shards(wrong)
        messages.append(None)
    except ValueError as e:
        messages.append(str(e))
    intact = all(torch.equal(v, shards[k]) for k, v in model.named_shards().items())
    try:
        model.forward_backward([hs.MicroBatch(torch.tensor([1, 200]), torch.tensor([0, 2]))], 1.0)
        messages.append(None)
    except ValueError as e:
        messages.append(str(e))
    torch.distributed.barrier()
    return messages, intact


def dead_stage(rank, world, timeout, mode):
    """The last stage dies (or stalls) before the step: the first stage must raise, within
    the timeout."""
    import os
    import time

    layout = hs.Layout.parse("pp2")
    groups = hs.ParallelGroups(layout, timeout=timeout)
    model = hs.ParallelTransformer(config(), layout, groups)
    torch.distributed.barrier()
    if rank == 1:
        if mode == "stall":
            time.sleep(4 * timeout)
        os._exit(0)
    start = time.monotonic()
    try:
        model.forward_backward(batches()[0], 1.0)
        return "no error", time.monotonic() - start
    except RuntimeError as e:
        return f"RuntimeError: {e}", time.monotonic() - start


def forward_backward(rank, world):
    """One forward and backward of the tiny model on this backend's device (TF32 off); the
    loss and the gradients on the CPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = config(tied=True)
    layout = hs.Layout.parse("dp1")
    model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=5)
    step = batches()[0]
    loss, _ = model.forward_backward(step, 1.0 / hs.count_targets(step))
    model.finish_gradients()
    device = next(iter(model.named_shards().values())).device.type
    return device, float(loss), {k: v.detach().cpu().numpy().copy() for k, v in model.grad_shards().items()}


def host_waits_of_a_micro_batch(rank, world):
    """World 1 on CUDA, bf16 compute (the default attention kernel and fused steps): two
    packs' contexts built, then each pack's forward and backward through every layer, the
    head and the loss, each of the two under ``torch.cuda.set_sync_debug_mode("error")``, so that
    any operation that makes the host wait for the device raises. Returns ``(attention
    kernel, fused steps, None or the error building the contexts, None or the error
    running)``."""
    from hotswitch.model.attention import FLASH_KERNELS

    cfg = config(tied=False, compute_dtype="bfloat16", max_position_embeddings=256)
    layout = hs.Layout()
    model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=5)
    micro_batches = batches(seed=7, step_lengths=[[[40, 9, 64, 1], [128, 3]]])[0]
    model.forward_backward(micro_batches, 1.0)  # compiles what compiles, outside the check
    model.zero_grad()

    def checked(fn):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(), None
        except RuntimeError as e:
            return None, str(e)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()

    contexts, build_error = checked(lambda: model._contexts(micro_batches, model.attention_kernel))
    if contexts is None:
        contexts = model._contexts(micro_batches, model.attention_kernel)
    if model.attention_kernel not in FLASH_KERNELS:
        build_error = None  # a compiled block mask may wait; only the flash kernels' copies are checked
    model._make_compute_copies()
    _, run_error = checked(lambda: [model._stage_forward(ctx, None).backward() for ctx in contexts])
    model._end_compute_copies(failed=run_error is not None)
    return model.attention_kernel, model.kernels, build_error, run_error


def against_llama_reference(rank, world, tied, step_lengths, dtype_name):
    """World 1: one step of our model and of the plain-PyTorch reference on the same
    initial weights; per quantity the largest absolute difference and the reference's scale.
    Our logits are those our loss reads (captured at the cross entropy)."""
    from hotswitch.model import transformer
    from hotswitch.model.init import init_full
    from tests.python.model import llama_reference

    cfg = config(tied)
    layout = hs.Layout()
    model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=5)
    micro_batches = batches(seed=99, step_lengths=[step_lengths])[0]
    captured = []
    original = transformer.cross_entropy

    def capture(logits, target, vocab_start, group, kernels="torch"):
        captured.append(logits.detach().clone())
        return original(logits, target, vocab_start, group, kernels)

    transformer.cross_entropy = capture
    try:
        targets = hs.count_targets(micro_batches)
        loss_sum, _ = model.forward_backward(micro_batches, 1.0 / targets)
    finally:
        transformer.cross_entropy = original
    grads = model.grad_shards()
    assert len(captured) == len(micro_batches), (len(captured), len(micro_batches))
    sequences, ours = [], []
    for mb, logits in zip(micro_batches, captured):
        assert logits.shape == (mb.num_tokens, cfg.vocab_size), tuple(logits.shape)  # world 1: no padding
        cu = mb.cu_seqlens.tolist()
        for a, b in zip(cu, cu[1:]):
            sequences.append(mb.tokens[a:b])
            ours.append(logits[a:b])
    ref_logits, ref_loss, ref_grads = llama_reference.run(cfg, init_full(cfg, seed=5), sequences,
                                                          getattr(torch, dtype_name))
    assert grads.keys() == ref_grads.keys(), (sorted(grads), sorted(ref_grads))
    return {
        "sequences": [len(s) for s in sequences],
        "logits": (max(float((a.double() - b.double()).abs().max()) for a, b in zip(ours, ref_logits)),
                   max(float(b.abs().max()) for b in ref_logits)),
        "loss": (loss_sum / targets, float(ref_loss)),
        "grads": {n: (float((grads[n].double() - ref_grads[n].double()).abs().max()),
                      float(ref_grads[n].abs().max())) for n in grads},
    }


def fused_parity(rank, world, layout_name, compute_dtype):
    """One forward and backward of the tiny model (GQA, an FFN of 96) under ``layout_name``,
    once with each implementation of the fused steps; per implementation the loss and this
    rank's gradients."""
    cfg = config(compute_dtype=compute_dtype)
    layout = hs.Layout.parse(layout_name)
    groups = hs.ParallelGroups(layout)
    step = batches()[0]
    out = {}
    for kernels in ("torch", "triton"):
        model = hs.ParallelTransformer(cfg, layout, groups, seed=5, kernels=kernels)
        loss, _ = model.forward_backward(step, 1.0 / hs.count_targets(step))
        out[kernels] = (float(loss), _numpy(model.grad_shards()))
    return out


def fused_steps_on(device, kernels, dtype, t, seed=0):
    """Every fused step (``hotswitch.model.fused``) forward and backward on fixed inputs with
    awkward sizes (hidden 48, head dim 8, FFN 40): outputs and input gradients as fp32 on the
    CPU, and the Triton launches made."""
    from hotswitch.model import fused

    before = fused.LAUNCHES.copy()
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, dt=torch.float32):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dt).requires_grad_()

    h, hq, hkv, d, f = 48, 4, 2, 8, 40
    x, delta, weight = rand(t, h), rand(t, h, dt=dtype), rand(h)
    qkv, cos, sin = rand(t, (hq + 2 * hkv) * d, dt=dtype), rand(t, d // 2).detach(), rand(t, d // 2).detach()
    gate_up = rand(t, 2 * f, dt=dtype)
    # The loss head's logits: a vocabulary of 37 whole, and a strided slice [10, 31) of it with
    # targets inside (targets in other TP ranks' slices: the tp2 model's parity).
    logits, target = rand(t, 37, dt=dtype), torch.randint(0, 37, (t,), generator=gen).to(device)
    ce = fused.cross_entropy(logits, target, 0, None, kernels)
    ce_slice = fused.cross_entropy(logits[:, 10:31], 10 + target % 21, 10, None, kernels)
    xn, y = fused.add_norm(x, delta, weight, 1e-5, dtype, kernels)
    y2 = fused.norm(xn, weight, 1e-5, dtype, kernels)
    q, k, v = fused.rotary_qkv(qkv, cos, sin, hq, hkv, kernels)
    a = fused.swiglu(gate_up, kernels)
    ramp = torch.linspace(-1, 1, h, device=device)
    loss = (xn * ramp).sum() + (y.float() ** 2).sum() + (y2.float() * 3).sum() + (q.float() ** 2).sum() + \
        (k.float() * ramp[:d]).sum() + (v.float() ** 3).sum() + (a.float() ** 2).sum() + \
        (ce * torch.linspace(0.5, 1.5, t, device=device)).sum() + (ce_slice ** 2).sum()
    loss.backward()
    outs = {"x_new": xn, "norm": y, "norm2": y2, "q": q, "k": k, "v": v, "swiglu": a, "cross_entropy": ce,
            "cross_entropy_slice": ce_slice}
    grads = {"d_x": x.grad, "d_delta": delta.grad, "d_weight": weight.grad, "d_qkv": qkv.grad,
             "d_gate_up": gate_up.grad, "d_logits": logits.grad}
    return ({name: t.detach().float().cpu().numpy() for name, t in {**outs, **grads}.items()},
            dict(fused.LAUNCHES - before))


def fused_steps(rank, world, dtype_name, t):
    """World 1, Triton interpreted: ``fused_steps_on`` the CPU with each implementation."""
    dtype = getattr(torch, dtype_name.replace("torch.", ""))
    return tuple(fused_steps_on("cpu", kernels, dtype, t)[0] for kernels in ("torch", "triton"))


def fused_launches(rank, world):
    """World 1, Triton interpreted: the launches of ``fused_steps_on`` with each implementation."""
    return {kernels: fused_steps_on("cpu", kernels, torch.float32, 5)[1] for kernels in ("torch", "triton")}


def compute_copies_parity(rank, world, layout_name, tied):
    """bf16 forward and backward calls (several micro-batches each, gradients accumulating
    across calls) and validation passes, with the matrix weights' kept compute copies and with
    autocast casting them at every micro-batch. Between calls the weights change as a step
    changes them: an in-place update (an SGD step on the accumulated gradients) and new data
    (``load_shards``). Per way the losses, this rank's gradients and, with copies, which calls
    reused the previous call's copies."""
    cfg = config(tied=tied, compute_dtype="bfloat16")
    layout = hs.Layout.parse(layout_name)
    groups = hs.ParallelGroups(layout)
    out = {}
    for copies in (True, False):
        model = hs.ParallelTransformer(cfg, layout, groups, seed=5)
        model._copy_weights = copies
        losses, reused = [], []

        def call(fn):
            # A copy is reused when it is the same tensor, not cast into again (in place).
            before = {k: (v[2], v[2]._version) for k, v in model._copies.items()}
            losses.append(fn()[0])
            reused.append(bool(before) and all(model._copies[k][2] is w and w._version == version
                                               for k, (w, version) in before.items()))

        step1, step2, held_out = batches()[:3]
        call(lambda: model.forward_backward(step1, 1.0 / hs.count_targets(step1)))
        call(lambda: model.forward_backward(step2, 1.0 / hs.count_targets(step2)))  # unchanged weights
        call(lambda: model.forward_loss(held_out))
        grads = _numpy(model.grad_shards())
        with torch.no_grad():  # the optimizer's step, in place
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.5)
        call(lambda: model.forward_loss(held_out))
        model.load_shards({n: (p.detach() * 1.25).contiguous() for n, p in model.named_shards().items()})
        call(lambda: model.forward_loss(held_out))
        out[copies] = (losses, grads, reused)
    return out


def wgrad_parity(rank, world, layout_name, compute_dtype, recompute, tied=False):
    """Two forward and backward calls (gradients accumulating over their micro-batches and
    across the calls) with the matrices' weight gradients accumulated in their products'
    backward (``hotswitch.model.wgrad``) and with autograd's products and accumulation. Per
    way: the losses, this rank's gradients (fp32) and how many weight gradients accumulated
    in the products' backward; the message refusing a non-bool ``fuse_wgrad``; this rank's
    layers and whether its loss head's gradient is fused (a last stage not holding a tied
    embedding)."""
    from hotswitch.model import wgrad

    cfg = config(tied=tied, compute_dtype=compute_dtype)
    layout = hs.Layout.parse(layout_name)
    groups = hs.ParallelGroups(layout)
    accumulate, calls = wgrad.accumulate_weight_grad, []

    def counted(main, grad, inputs):
        calls.append(tuple(main.shape))
        accumulate(main, grad, inputs)

    out = {}
    wgrad.accumulate_weight_grad = counted
    try:
        for fused in (True, False):
            calls.clear()
            model = hs.ParallelTransformer(cfg, layout, groups, seed=5, recompute=recompute)
            try:
                model.fuse_wgrad = 1
            except ValueError as e:
                out["refused"] = str(e)
            assert model.fuse_wgrad  # the refused value changed nothing
            model.fuse_wgrad = fused
            losses = []
            for step in batches()[:2]:
                losses.append(model.forward_backward(step, 1.0 / hs.count_targets(step))[0])
            model.finish_gradients()
            out[fused] = (losses, _numpy(model.grad_shards()), len(calls))
            out["layers"] = len(model.layers)
            out["head"] = groups.is_last_stage and not (tied and groups.is_first_stage)
    finally:
        wgrad.accumulate_weight_grad = accumulate
    return out


def gathered_linear_parity(rank, world, dtype_name, autocast, needs):
    """A column-parallel product of the sequence-parallel slices, through ``gathered_linear``
    and through the gather followed by ``F.linear``, with gradients for the leaves named in
    ``needs`` (``"x"``, ``"w"``): outputs, gradients (None where not needed), the row counts
    of what the forward keeps for the backward, and the order of the backward's collectives
    and products (per path)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from hotswitch.model.comm import gather_from_sequence, gathered_linear

    class Order(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            if name in ("aten.mm", "c10d._allgather_base_", "c10d._reduce_scatter_base_"):
                self.ops.append(name)
            return func(*args, **(kwargs or {}))

    rows, k, n = 6, 16, 24
    gen = torch.Generator().manual_seed(5)
    x_all = torch.randn(world * rows, k, generator=gen)
    w_all = torch.randn(world * n, k, generator=gen)
    g_all = torch.randn(world * rows, world * n, generator=gen)
    dtype = getattr(torch, dtype_name)
    group = dist.group.WORLD
    paths = {"fused": lambda a, b: gathered_linear(a, b, group, world, rank),
             "composed": lambda a, b: F.linear(gather_from_sequence(a, group, world, rank), b)}
    out = {}
    for name, fn in paths.items():
        leaf_dtype = torch.float32 if autocast else dtype
        x = x_all[rank * rows:(rank + 1) * rows].to(leaf_dtype).requires_grad_("x" in needs)
        w = w_all[rank * n:(rank + 1) * n].to(leaf_dtype).requires_grad_("w" in needs)
        kept = []
        with torch.autocast("cpu", dtype=dtype, enabled=autocast), \
                torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(tuple(t.shape)) or t, lambda t: t):
            y = fn(x, w)
        order = Order()
        with order:
            y.backward(g_all[:, rank * n:(rank + 1) * n].to(y.dtype))
        grads = {"dx": x.grad, "dw": w.grad}
        out[name] = {"y": y.detach().float().numpy(), "y_dtype": str(y.dtype),
                     **{k: None if g is None else g.float().numpy() for k, g in grads.items()},
                     "grad_dtypes": [None if g is None else str(g.dtype) for g in grads.values()],
                     "order": order.ops, "kept_rows": sorted({shape[0] for shape in kept if len(shape) == 2})}
    return out


def kept_activation_bytes(rank, world, layer_counts, tokens):
    """Bytes the forward of one pack of ``tokens`` tokens keeps for the backward, per layer,
    under ``tp{world}`` in bf16 compute: distinct storages saved by autograd that are neither
    parameters nor their compute copies, the model cut to the two ``layer_counts``, their
    difference per layer."""
    kept = {}
    for layers in layer_counts:
        cfg = config(num_layers=layers, compute_dtype="bfloat16")
        layout = hs.Layout.parse(f"tp{world}")
        model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=5)
        mb = hs.MicroBatch.from_sequences([list(range(1, tokens + 1))])
        model.forward_backward([mb], 1.0)  # makes the compute copies, kept for the next call
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        weights |= {w.untyped_storage().data_ptr() for _, _, w in model._copies.values()}
        storages = {}

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in weights:
                storages[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.forward_backward([mb], 1.0)
        kept[layers] = sum(storages.values())
    low, high = layer_counts
    return (kept[high] - kept[low]) / (high - low)


def compiled_layers_parity(rank, world, layout_name, recompute, compute_dtype):
    """The model with ``compile_layers=True`` against the same model eager, on the same
    micro-batches over two calls (their packs differ in size and sequence count): per
    call the loss, then the gradients, and the compiled graphs counted after each call."""
    import torch._dynamo

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    cfg = config(tied=False, compute_dtype=compute_dtype)
    layout = hs.Layout.parse(layout_name)
    calls = batches(seed=21, step_lengths=[[[5, 11, 1], [31]], [[2, 3, 5, 7, 9], [17, 19]]])
    out = {}
    for compiled in (False, True):
        model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=5, recompute=recompute,
                                       kernels="torch", compile_layers=compiled)
        losses, graphs = [], []
        for micro_batches in calls:
            losses.append(model.forward_backward(micro_batches, 1.0 / hs.count_targets(micro_batches))[0])
            graphs.append(counters["stats"]["unique_graphs"])
        out[compiled] = losses, _numpy(model.grad_shards()), graphs
    breaks = sorted({str(reason).split("\n")[0] for reason in counters["graph_break"]})
    return out, breaks


def compile_bad_input(rank, world):
    """The messages of compile_layers' bad values (world 1)."""
    layout = hs.Layout()
    messages = []
    for kwargs in (dict(compile_layers="yes"), dict(compile_layers=True, kernels="triton")):
        try:
            hs.ParallelTransformer(config(), layout, hs.ParallelGroups(layout), **kwargs)
            messages.append(None)
        except ValueError as e:
            messages.append(str(e))
    return messages


def graphed_layers_parity(rank, world, recompute, compute_dtype, layout_name="dp1"):
    """The model with graph buckets (32, 64 and 128 tokens) against the same model without, on
    the same micro-batches over two calls (packs of up to 32, up to 64 and over 64 tokens)
    with an in-place step of the weights between them: per call the loss, then the second
    call's gradients, per call the compiled graphs counted after it and the tokens of each
    pack as the layers ran it (and whether from the graphs), the graph breaks and inductor's
    CUDA graph counters."""
    import torch._dynamo

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    cfg = config(tied=False, compute_dtype=compute_dtype)
    layout = hs.Layout.parse(layout_name)
    calls = batches(seed=21, step_lengths=[[[5, 11, 1], [31, 30], [70]], [[2, 3, 5, 7, 9], [17, 19], [40, 21]]])
    out = {}
    for buckets in (None, [64, 32, 128]):
        model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=5, recompute=recompute,
                                       kernels="torch", graph_buckets=buckets)
        losses, graphs = [], []
        contexts = model._contexts
        packs = []

        def recorded(*args, **kwargs):
            built = contexts(*args, **kwargs)
            packs.extend((ctx.num_tokens, ctx.graphed) for ctx in built)
            return built

        model._contexts = recorded
        for k, micro_batches in enumerate(calls):
            if k:  # an optimizer's step between the calls: the kept copies are cast again, in place
                model.finish_gradients()  # at tp2 the norms' gradients summed over the slices first
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-0.5)
                model.zero_grad()
            packs.clear()
            losses.append(model.forward_backward(micro_batches, 1.0 / hs.count_targets(micro_batches))[0])
            graphs.append((counters["stats"]["unique_graphs"], list(packs)))
        out[buckets is not None] = losses, _numpy(model.grad_shards()), graphs
    breaks = sorted({str(reason).split("\n")[0] for reason in counters["graph_break"]})
    # Where a CUDA device captures graphs: the ones inductor did not capture, and why.
    skips = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    return out, breaks, skips


def graphed_variants(rank, world):
    """Dynamo's recompile limit set to 2, then graphed models of dp2 and tp2 under no and
    selective recomputation, each run once: the limit after the first model is built, and the
    compiled graphs counted after each run."""
    import torch._dynamo

    torch._dynamo.reset()
    dynamo = torch._dynamo.config
    name = "recompile_limit" if hasattr(dynamo, "recompile_limit") else "cache_size_limit"
    setattr(dynamo, name, 2)
    counters = torch._dynamo.utils.counters
    calls = batches(seed=21, step_lengths=[[[5, 11, 1], [31, 3]]])
    limit, graphs = None, []
    for layout_name in ("dp2", "tp2"):
        layout = hs.Layout.parse(layout_name)
        for recompute in ("none", "selective"):
            model = hs.ParallelTransformer(config(), layout, hs.ParallelGroups(layout), seed=5, recompute=recompute,
                                           kernels="torch", graph_buckets=[32, 64])
            limit = getattr(dynamo, name) if limit is None else limit
            model.forward_backward(calls[0], 1.0)
            graphs.append(counters["stats"]["unique_graphs"])
    return limit, graphs


def graph_bucket_errors(rank, world):
    """The messages of bad graph buckets and graph tokens (world 1), and whether a refused
    call changed the gradients."""
    if world == 2:
        messages = []
        for name, buckets in (("tp2", [32, 33]), ("pp2", [32])):
            layout = hs.Layout.parse(name)
            try:
                hs.ParallelTransformer(config(), layout, hs.ParallelGroups(layout), graph_buckets=buckets)
                messages.append(None)
            except ValueError as e:
                messages.append(str(e))
        # Both ranks built pp2's groups just now: neither exits while the other still connects
        # to it (gloo: "connection closed by peer").
        torch.distributed.barrier()
        return messages
    layout = hs.Layout.parse("dp1")
    groups = hs.ParallelGroups(layout)
    messages = []
    for kwargs in (dict(graph_buckets=[]), dict(graph_buckets=[32, 32]), dict(graph_buckets=[0]),
                   dict(graph_buckets=[1000]), dict(graph_buckets="32"), dict(graph_buckets=[32.0])):
        try:
            hs.ParallelTransformer(config(), layout, groups, **kwargs)
            messages.append(None)
        except ValueError as e:
            messages.append(str(e))
    model = hs.ParallelTransformer(config(), layout, groups, graph_buckets=[32, 64])
    mbs = batches(seed=3, step_lengths=[[[20], [40]]])[0]
    model.forward_backward(mbs, 1.0)
    before = _numpy(model.grad_shards())
    for tokens in ([32], [32, 32], [16, 64], [64, True], [64, 128], [32.0, 64]):
        try:
            model.forward_backward(mbs, 1.0, graph_tokens=tokens)
            messages.append(None)
        except ValueError as e:
            messages.append(str(e))
    after = _numpy(model.grad_shards())
    return messages + [all((before[k] == after[k]).all() for k in before)]


def collectives_per_layer(rank, world, cases):
    """The tp collectives one layer posts per micro-batch, forward and backward, under
    ``tp{world}``: per ``(recompute, recompute_num_layers)`` of ``cases``, the all-gathers and
    reduce-scatters of a 16-token micro-batch through TINY cut to 2 and to 4 layers, their
    difference per layer."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hotswitch.model.batch import MicroBatch
    from hotswitch.model.groups import ParallelGroups

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += str(func.overloadpacket) in ("c10d._allgather_base_", "c10d._reduce_scatter_base_")
            return func(*args, **(kwargs or {}))

    layout = hs.Layout.parse(f"tp{world}")
    groups = ParallelGroups(layout)
    mbs = [MicroBatch.from_sequences([torch.randint(0, TINY["vocab_size"], (16,),
                                                    generator=torch.Generator().manual_seed(3))])]
    out = {}
    for recompute, chunk in cases:
        counts = []
        for layers in (2, 4):
            model = hs.ParallelTransformer(hs.TransformerConfig(**dict(TINY, num_layers=layers)), layout, groups,
                                           seed=0, recompute_num_layers=chunk)
            model.recompute = recompute
            model.forward_backward(mbs, 1.0)
            model.zero_grad()
            with Count() as count:
                model.forward_backward(mbs, 1.0)
            counts.append(count.n)
        out[(recompute, chunk)] = (counts[1] - counts[0]) / 2
    return out
