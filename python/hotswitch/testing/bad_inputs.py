"""Tables of bad inputs for every public entry point: each must raise ValueError (or a
documented subclass) whose message names the value, and change no state. Shared by
hotswitch's tests and ``benchmarks.faults``.

``LOCAL`` holds ``(name, call, needle)`` cases run in one process without torch.distributed;
``runtime_cases`` those against a live runtime (``runtime_table`` runs them at world 1);
``check`` runs one case."""

import contextlib
import io
import math
import os
import tempfile

import torch

from hotswitch import data
from hotswitch._C import CostModel, HardwareProfile, Layout, ModelConfig, ParamSpec, Planner, Topology
from hotswitch.cli import train
from hotswitch.model.batch import MicroBatch
from hotswitch.model.config import TransformerConfig
from hotswitch.redistribute import TensorSet
from hotswitch.runtime import Runtime
from hotswitch.specs import llama_tensor_set

__all__ = ["LOCAL", "check", "runtime_cases", "runtime_table"]

TINY = dict(num_layers=2, hidden_size=16, num_attention_heads=2, num_query_groups=2, ffn_hidden_size=32,
            vocab_size=64, max_position_embeddings=32)


def _config(**kw):
    return TransformerConfig(**{**TINY, **kw})


def _cost():
    return CostModel(ModelConfig.preset("llama-7b"), HardwareProfile.preset("a100"), Topology(8, 8))


def _planner():
    layouts = [Layout(dp=8), Layout(dp=2, tp=4)]
    return Planner(_cost(), layouts, 0, [[0.0, 1.0], [1.0, 0.0]], [0.0, 1.0])


_corpus = []


def _corpus_dir():
    """A directory holding one small text file, made on first use."""
    if not _corpus:
        path = tempfile.mkdtemp(prefix="hotswitch-bad-inputs-")
        with open(os.path.join(path, "a.txt"), "w") as f:
            f.write("hello\n\nworld\n")
        _corpus.append(path)
    return _corpus[0]


def _sampler():
    return data.LengthAwareSampler(data.Corpus(_corpus_dir()), max_length=8, global_batch_size=2)


# (name, call, needle in the message): the needle names the argument and its value. Calls are
# made in one process without torch.distributed; the runtime's cases are in runtime_cases
# below (they need a process group).
LOCAL = [
    # layouts, topology, specs
    ("Layout negative tp", lambda: Layout(dp=1, tp=-2), "tp degree must be >= 1, got -2"),
    ("Layout.parse empty", lambda: Layout.parse(""), "layout '' is empty"),
    ("Layout.parse garbage", lambda: Layout.parse("dp2tp"), "layout 'dp2tp'"),
    ("Layout.enumerate zero world", lambda: Layout.enumerate(0), "world must be >= 1, got 0"),
    ("Topology zero ranks per node", lambda: Topology(8, 0), "ranks_per_node must be >= 1, got 0"),
    ("ParamSpec empty name", lambda: ParamSpec("", [4]), "needs a non-empty name"),
    ("ParamSpec unknown rule", lambda: ParamSpec("w", [4], rule="diagonal"), "sharding rule 'diagonal'"),
    ("TensorSet bad layers", lambda: TensorSet([ParamSpec("w", [4])], 0), "num_layers must be >= 1, got 0"),
    ("llama_tensor_set groups", lambda: llama_tensor_set(num_attention_heads=32, num_query_groups=5),
     "multiple of num_query_groups(5)"),
    # cost model and planner
    ("ModelConfig preset", lambda: ModelConfig.preset("llama-1t"), "model preset 'llama-1t'"),
    ("ModelConfig zero layers", lambda: ModelConfig(0, 64, 4, 4, 128, 100), "num_layers must be >= 1, got 0"),
    ("HardwareProfile preset", lambda: HardwareProfile.preset("abacus"), "hardware preset 'abacus'"),
    ("HardwareProfile negative memory", lambda: HardwareProfile(1e12, 0.5, -1, 1e9, 1e9),
     "memory_bytes must be > 0, got -1"),
    ("HardwareProfile efficiency > 1", lambda: HardwareProfile(1e12, 1.5, 1 << 30, 1e9, 1e9),
     "efficiency must be in (0, 1], got 1.5"),
    ("CostModel layout of another world", lambda: _cost().phase(Layout(dp=4), [[[10]]] * 4), "= 4 != world(8)"),
    ("CostModel zero length", lambda: _cost().phase(Layout(dp=8), [[[0]]] * 8),
     "sequence length must be >= 1, got 0"),
    ("Planner empty batch", lambda: _planner().plan([]), "no sequences"),
    ("Planner negative length", lambda: _planner().plan([5, -3]), "sequence 1 has length -3"),
    ("Planner too long", lambda: _planner().plan([10 ** 9]), f"length {10 ** 9} fits no candidate layout"),
    ("Planner home out of range",
     lambda: Planner(_cost(), [Layout(dp=8)], 3, [[0.0]], [0.0]), "home layout index 3 outside [0, 1)"),
    ("Planner negative switch cost",
     lambda: Planner(_cost(), [Layout(dp=8)], 0, [[-1.0]], [0.0]),
     "switch_seconds entries must be finite and >= 0, got -1"),
    # model
    ("TransformerConfig zero layers", lambda: _config(num_layers=0), "num_layers must be a positive int, got 0"),
    ("TransformerConfig heads", lambda: _config(num_attention_heads=3),
     "hidden_size(16) is not divisible by num_attention_heads(3)"),
    ("TransformerConfig dtype", lambda: _config(dtype="int8"), "dtype 'int8'"),
    ("TransformerConfig nan eps", lambda: _config(norm_eps=math.nan), "norm_eps must be a positive number, got nan"),
    ("TransformerConfig tp", lambda: _config().validate(Layout(tp=4)),
     "num_attention_heads(2) is not divisible by tp(4)"),
    ("TransformerConfig pp", lambda: _config().validate(Layout(pp=4)), "num_layers(2) is not divisible by pp(4)"),
    ("MicroBatch empty", lambda: MicroBatch.from_sequences([]), "micro-batch has no sequence"),
    ("MicroBatch float tokens", lambda: MicroBatch(torch.zeros(3), torch.tensor([0, 3])),
     "tokens must be a 1-D int64 tensor, got torch.float32"),
    ("MicroBatch bad cu_seqlens", lambda: MicroBatch(torch.zeros(3, dtype=torch.long),
                                                        torch.tensor([0, 2])),
     "cu_seqlens must rise strictly from 0 to the token count 3, got [0, 2]"),
    # data
    ("Corpus missing dir", lambda: data.Corpus("/nonexistent/corpus"), "corpus directory '/nonexistent/corpus'"),
    ("Corpus bad unit", lambda: data.Corpus(_corpus_dir(), unit="page"), "document unit 'page'"),
    ("Corpus zero files", lambda: data.Corpus(_corpus_dir(), max_files=0),
     "max_files must be a positive int or None, got 0"),
    ("Corpus index", lambda: data.Corpus(_corpus_dir()).tokens(99), "document index 99 outside"),
    ("fit_length policy", lambda: data.fit_length([1], 4, "wrap"), "policy 'wrap'"),
    ("Sampler both sizes", lambda: data.LengthAwareSampler(data.Corpus(_corpus_dir()), 8, 2, 10),
     "exactly one of global_batch_size and global_batch_tokens, got 2 and 10"),
    ("Sampler bad state", lambda: _sampler().load_state_dict({"seed": 0, "epoch": -1, "position": 0}), "epoch -1"),
    ("ByteTokenizer id", lambda: data.ByteTokenizer().decode([-1]), "token id -1"),
    # launcher arguments
    ("train --num-layers 0", lambda: train.parse_args(["--num-layers", "0"]), "--num-layers must be >= 1, got 0"),
    ("train --lr nan", lambda: train.parse_args(["--lr", "nan"]), "--lr must be a positive number, got nan"),
    ("train --memory-budget-gb -1", lambda: train.parse_args(["--memory-budget-gb", "-1"]),
     "--memory-budget-gb must be a positive number, got -1"),
    ("train --document-unit", lambda: train.parse_args(["--document-unit", "page"]),
     "--document-unit must be file or block, got 'page'"),
    ("train tp*pp vs world", lambda: train.parse_args(["--tensor-model-parallel-size", "3"], world=4),
     "world(4) is not divisible by tensor(3)"),
    ("train --vocab-size small", lambda: train.parse_args(["--vocab-size", "100"]), "--vocab-size(100) must hold"),
]


def runtime_cases(rt):
    """(name, call, needle) against a live world-1 runtime ``rt``."""
    return [
        ("train_step not a list", lambda: rt.train_step("hello"), "list of token sequences, got str"),
        ("train_step empty", lambda: rt.train_step([]), "list of token sequences, got list of length 0"),
        ("train_step empty sequence", lambda: rt.train_step([[1, 2], []]), "sequence 1 must be a non-empty"),
        ("train_step token out of vocabulary", lambda: rt.train_step([[1, 64]]),
         "token id 64, outside [0, vocab_size(64))"),
        ("train_step negative token", lambda: rt.train_step([[1, -5]]), "token id -5, outside"),
        ("train_step float tokens", lambda: rt.train_step([[1.0, 2.0]]),
         "integer token ids, got shape (2,) and torch.float"),
        ("train_step 2-D sequence", lambda: rt.train_step([[[1, 2]]]),
         "1-D sequence of integer token ids, got shape (1, 2)"),
        ("train_step too long", lambda: rt.train_step([[1] * 33]), "has 33 tokens, more than max_context(32)"),
        ("train_step no targets", lambda: rt.train_step([[1], [2]]), "no target tokens"),
        ("load_checkpoint missing", lambda: rt.load_checkpoint("/nonexistent/ckpt"), "/nonexistent/ckpt"),
        ("load_checkpoint not a path", lambda: rt.load_checkpoint(42), "checkpoint path must be a path, got int"),
        ("save_checkpoint not a path", lambda: rt.save_checkpoint(None),
         "checkpoint directory must be a path, got NoneType"),
        ("Runtime config type", lambda: Runtime({"num_layers": 2}),
         "config must be a hotswitch.TransformerConfig, got dict"),
        ("Runtime candidates", lambda: Runtime(_config(), candidates=["dp3"]), "= 3 != world(1)"),
        ("Runtime candidates empty", lambda: Runtime(_config(), candidates=[]), "non-empty list of layouts, got []"),
        ("Runtime home", lambda: Runtime(_config(), home="tp2"), "home layout 'tp2'"),
        ("Runtime grad method", lambda: Runtime(_config(), grad_method="sum"), "grad_method 'sum'"),
        ("Runtime timeout", lambda: Runtime(_config(), timeout=-1),
         "timeout must be a positive number of seconds, got -1"),
        ("Runtime max context", lambda: Runtime(_config(), max_context=64), "max_context(64)"),
        ("Runtime memory budget", lambda: Runtime(_config(), memory_budget_bytes=0),
         "memory_budget_bytes must be an int >= 1, got 0"),
        ("Runtime memory too small", lambda: Runtime(_config(), memory_budget_bytes=1000),
         "within 1000 bytes per rank"),
        ("Runtime nonfinite policy", lambda: Runtime(_config(), nonfinite="ignore"), "nonfinite 'ignore'"),
        ("Runtime optimizer factory", lambda: Runtime(_config(), optimizer=lambda p: None),
         "optimizer factory returned NoneType"),
    ]


def check(call, needle):
    """Runs one case; returns None when it raised ValueError, or exited with argparse's
    status 2, with ``needle`` in its message; else why not."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            call()
    except ValueError as e:
        return None if needle in str(e) else f"message {str(e)!r} does not name {needle!r}"
    except SystemExit as e:  # a usage error: its lines on stderr, then exit status 2
        lines = [l for l in err.getvalue().strip().splitlines() if "error:" in l] or \
            err.getvalue().strip().splitlines()[-1:] or [""]
        if e.code != 2:
            return f"exit code {e.code} ({lines[0]!r})"
        return None if any(needle in l for l in lines) else f"usage error {lines!r} does not name {needle!r}"
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}: {e}"
    return "accepted"


def runtime_table(rank, world):
    """World 1: every runtime case raises and the runtime's state stays as it was."""
    rt = Runtime(_config(), max_context=32, seed=1)
    before = {k: v.detach().clone() for k, v in rt.master.items()}
    out = []
    for name, call, needle in runtime_cases(rt):
        out.append((name, check(call, needle)))
    unchanged = all(torch.equal(before[k], rt.master[k]) for k in before) and rt.step == 0
    loss = rt.train_step([[1, 2, 3, 4], [5, 6]]).loss
    return out, unchanged, loss
