"""Rank functions of the conversion tests."""

import dataclasses

import torch

import hotswitch as hs
from hotswitch.testing import scenarios as rw

CONFIG = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
              vocab_size=128, max_position_embeddings=64, rope_theta=500.0, norm_eps=1e-6)
BATCHES = [rw.batch([5, 17, 31, 2], 0), rw.batch([9, 40, 3], 1)]


def _runtime(world, home, tied):
    cfg = hs.TransformerConfig(**CONFIG, tied_embedding=tied)
    candidates = "auto" if world == 1 else [hs.Layout.parse(home)]
    return cfg, hs.Runtime(cfg, candidates=candidates, home=home, hardware=rw.hardware(1 << 40), max_context=64,
                           seed=7, recalibrate=False,
                           optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-6, weight_decay=0.1))


def save_initial(rank, world, root, tied):
    """Saves the freshly initialised model, as ``python -m hotswitch.train`` saves: with its config."""
    cfg, rt = _runtime(world, None, tied)
    return rt.save_checkpoint(root, extra={"model": dataclasses.asdict(cfg)})


def train_from(rank, world, path, tied, home=None):
    """Loads a checkpoint and trains the batches: (losses, full weights as numpy arrays)."""
    _, rt = _runtime(world, home, tied)
    rt.load_checkpoint(path)
    losses = [rt.train_step(b).loss for b in BATCHES]
    return losses, {k: v.numpy().copy() for k, v in rt.full_weights().items()}


def evaluate_and_train(rank, world, path, home=None):
    """Builds the model a checkpoint records (``extra.model``), loads it and returns (the
    loss of each sequence of BATCHES[0] on its own, forward only; the losses of training on
    BATCHES; the full weights as numpy arrays)."""
    from hotswitch.checkpoint import read_tensors

    _, meta = read_tensors(path)
    cfg = hs.TransformerConfig(**meta["extra"]["model"])
    candidates = "auto" if world == 1 else [hs.Layout.parse(home)]
    rt = hs.Runtime(cfg, candidates=candidates, home=home, hardware=rw.hardware(1 << 40), max_context=64,
                    seed=7, recalibrate=False,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, eps=1e-6, weight_decay=0.1))
    rt.load_checkpoint(path)
    singles = [rt.evaluate([seq]) for seq in BATCHES[0]]
    losses = [rt.train_step(b).loss for b in BATCHES]
    return singles, losses, {k: v.numpy().copy() for k, v in rt.full_weights().items()}
