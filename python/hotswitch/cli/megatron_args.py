"""Megatron-LM's training arguments (``megatron/training/arguments.py``) as ``hotswitch.train``
treats them: the one table of what is accepted (and what it maps to), what is ignored with a
warning (it changes nothing here) and what is refused (and why).

``screen(argv)`` applies the table before ``hotswitch.train`` parses its arguments: ignored
arguments (with their values) are dropped with a warning, a refused one stops the launch
with a message naming it and the reason. Arguments that are neither ``hotswitch.train``'s
own nor in the table are refused too (``unknown``).

``python -m hotswitch.cli.megatron_args`` prints the table as Markdown (the README's).
"""

import dataclasses
import sys
from typing import List, Optional, Sequence, Tuple

__all__ = ["ACCEPTED", "IGNORED", "MEGATRON_ARGUMENTS", "MegatronArgument", "REFUSED", "markdown_table", "screen",
           "unknown"]

ACCEPTED, IGNORED, REFUSED = "accepted", "ignored", "refused"


@dataclasses.dataclass(frozen=True)
class MegatronArgument:
    """One Megatron-LM argument. ``values``: how many values follow it on the command line
    (0 for a flag). ``expects``: for an ignored argument whose value describes the model, the
    one value that matches hotswitch's model; another value is refused."""

    name: str
    treatment: str
    note: str
    values: int = 0
    expects: Optional[str] = None


def _accepted(name: str, note: str) -> MegatronArgument:
    return MegatronArgument(name, ACCEPTED, note)


def _ignored(name: str, note: str, values: int = 0, expects: Optional[str] = None) -> MegatronArgument:
    return MegatronArgument(name, IGNORED, note, values, expects)


def _refused(name: str, note: str) -> MegatronArgument:
    return MegatronArgument(name, REFUSED, note)


_LLAMA = "hotswitch's model is LLaMA-style (RMSNorm, SwiGLU, rotary embeddings, no biases, no dropout)"

MEGATRON_ARGUMENTS: Tuple[MegatronArgument, ...] = (
    # model
    _accepted("--num-layers", "same"),
    _accepted("--hidden-size", "same"),
    _accepted("--num-attention-heads", "same"),
    _accepted("--num-query-groups", "key/value heads (grouped-query attention is always on)"),
    _accepted("--ffn-hidden-size", "same (default as under --swiglu: 8/3 of --hidden-size rounded down to a multiple "
                                   "of 64)"),
    _accepted("--seq-length", "the longest sequence: documents are trained whole, up to this length"),
    _accepted("--max-position-embeddings", "same"),
    _accepted("--vocab-size", "same"),
    _accepted("--make-vocab-size-divisible-by", "same"),
    _accepted("--untie-embeddings-and-output-weights", "same"),
    _accepted("--init-method-std", "same"),
    _accepted("--norm-epsilon", "same"),
    _accepted("--rotary-base", "same"),
    _accepted("--use-rope-scaling", "same (LLaMA 3.1's scaling: frequency factors 1 and 4, original context 8192)"),
    _accepted("--rope-scaling-factor", "same (default 8)"),
    # training
    _accepted("--micro-batch-size", "caps a packed micro-batch at micro-batch-size x seq-length tokens"),
    _accepted("--global-batch-size", "sequences of --seq-length tokens: a step holds exactly that many tokens, "
                                      "as Megatron's; a document cut at the step's end goes on in the next; "
                                      "--global-batch-documents counts documents instead"),
    _accepted("--train-iters", "same"),
    _accepted("--lr", "same: no default, required to train (not for --dry-run)"),
    _accepted("--min-lr", "same"),
    _accepted("--lr-decay-style", "constant, linear or cosine"),
    _accepted("--lr-decay-iters", "same"),
    _accepted("--lr-warmup-iters", "same"),
    _accepted("--lr-warmup-fraction", "same"),
    _accepted("--clip-grad", "same: the global norm counts every element once whatever the layouts"),
    _accepted("--weight-decay", "same"),
    _accepted("--adam-beta1", "same"),
    _accepted("--adam-beta2", "same"),
    _accepted("--adam-eps", "same"),
    _accepted("--seed", "same"),
    _accepted("--use-distributed-optimizer", "ZeRO-1 over the home layout's data-parallel group"),
    _accepted("--context-parallel-size", "2 * cp load-balanced chunks per sequence, K/V all-gathered; with "
              "--hot-switch the largest cp the planner may switch to"),
    _accepted("--recompute-granularity", "full or selective as Megatron-LM; auto: the planner chooses per phase"),
    _accepted("--recompute-method", "uniform only (block is refused with a message)"),
    _accepted("--recompute-num-layers", "layers per recomputed chunk under uniform"),
    # mixed precision
    _accepted("--bf16", "bf16 compute over fp32 master weights, optimizer state and gradients"),
    _accepted("--fp16", "fp16 compute over fp32 master weights, with dynamic loss scaling"),
    _accepted("--loss-scale", "a constant loss scale (with --fp16 or --bf16)"),
    _accepted("--initial-loss-scale", "same (default 2**32)"),
    _accepted("--min-loss-scale", "same (default 1.0)"),
    _accepted("--loss-scale-window", "same (default 1000)"),
    _accepted("--hysteresis", "same (default 2)"),
    # parallelism
    _accepted("--tensor-model-parallel-size", "the static layout; with --hot-switch the planner chooses"),
    _accepted("--pipeline-model-parallel-size", "the static layout; with --hot-switch the planner chooses"),
    # data, checkpoints, logging
    _accepted("--data-path", "indexed datasets, blends or a directory of text files"),
    _accepted("--split", "same"),
    _accepted("--tokenizer-type", "ByteTokenizer (default), SentencePieceTokenizer, Llama2Tokenizer, "
                                  "HuggingFaceTokenizer (a tokenizer.json directory), GPT2BPETokenizer"),
    _accepted("--tokenizer-model", "same"),
    _accepted("--vocab-file", "same (GPT2BPETokenizer)"),
    _accepted("--merge-file", "same (GPT2BPETokenizer)"),
    _accepted("--save", "layout-independent checkpoints"),
    _accepted("--save-interval", "same"),
    _accepted("--load", "a checkpoint of any layout and world"),
    _accepted("--ckpt-format", "torch_dist (or torch_dcp): torch.distributed.checkpoint; default hotswitch's own "
                               "layout-independent format; --load reads either"),
    _accepted("--finetune", "same: the weights only; optimizer, RNG, iteration and data position start afresh"),
    _accepted("--no-load-optim", "same: the optimizer (and loss scaler) start afresh"),
    _accepted("--no-load-rng", "same"),
    _accepted("--log-interval", "same"),
    _accepted("--eval-interval", "same"),
    _accepted("--eval-iters", "same"),
    # ignored: hotswitch does it one way, whatever the argument says
    _ignored("--use-flash-attn", "the attention kernel is chosen per device and dtype (flash-attn where installed)"),
    _ignored("--no-masked-softmax-fusion", "kernel fusions are hotswitch's own"),
    _ignored("--no-bias-gelu-fusion", "kernel fusions are hotswitch's own"),
    _ignored("--no-bias-swiglu-fusion", "kernel fusions are hotswitch's own"),
    _ignored("--no-bias-dropout-fusion", "kernel fusions are hotswitch's own"),
    _ignored("--no-rope-fusion", "kernel fusions are hotswitch's own"),
    _ignored("--no-gradient-accumulation-fusion", "kernel fusions are hotswitch's own"),
    _ignored("--no-persist-layer-norm", "kernel fusions are hotswitch's own"),
    _ignored("--sequence-parallel", "always on under tensor parallelism"),
    _ignored("--overlap-grad-reduce", "gradient movement is planned by the switch engine"),
    _ignored("--overlap-param-gather", "parameter movement is planned by the switch engine"),
    _ignored("--attention-softmax-in-fp32", "the softmax always runs in fp32"),
    _ignored("--accumulate-allreduce-grads-in-fp32", "gradients always accumulate and reduce in fp32"),
    _ignored("--apply-query-key-layer-scaling", "the softmax runs in fp32: no scaling needed"),
    _ignored("--use-mcore-models", "one model implementation"),
    _ignored("--transformer-impl", "one model implementation", values=1),
    _ignored("--swiglu", _LLAMA),
    _ignored("--disable-bias-linear", _LLAMA),
    _ignored("--group-query-attention", _LLAMA),
    _ignored("--use-rotary-position-embeddings", _LLAMA),
    _ignored("--no-position-embedding", _LLAMA),
    _ignored("--normalization", _LLAMA, values=1, expects="RMSNorm"),
    _ignored("--position-embedding-type", _LLAMA, values=1, expects="rope"),
    _ignored("--attention-dropout", _LLAMA, values=1, expects="0"),
    _ignored("--hidden-dropout", _LLAMA, values=1, expects="0"),
    _ignored("--optimizer", "AdamW, the only optimizer of hotswitch.train", values=1, expects="adam"),
    _ignored("--reset-position-ids", "always: packed documents restart their positions"),
    _ignored("--reset-attention-mask", "always: packed documents never attend across each other"),
    _ignored("--eod-mask-loss", "sequences are whole documents: no loss crosses a document boundary"),
    _ignored("--distributed-backend", "gloo on CPU, NCCL on CUDA, by device", values=1),
    _ignored("--distributed-timeout-minutes", "use --timeout (seconds)", values=1),
    _ignored("--num-workers", "batches are drawn in the training process", values=1),
    _ignored("--data-cache-path", "no index caches are written", values=1),
    _accepted("--tensorboard-dir", "Megatron's scalar names (lm loss, learning-rate, grad-norm, loss-scale, "
                                   "iteration-time, batch-size), plus tokens-per-second, switch-share and phases"),
    _accepted("--wandb-project", "the same scalars to Weights & Biases (needs the wandb package)"),
    _accepted("--wandb-exp-name", "same"),
    _ignored("--log-throughput", "the iteration line always shows tokens/s"),
    _ignored("--timing-log-level", "the summary and the metrics file time every step", values=1),
    # refused: hotswitch cannot do what the argument asks
    _refused("--train-samples", "give the length of the run as --train-iters"),
    _refused("--rampup-batch-size", "batch-size ramp-up is not supported"),
    _refused("--virtual-pipeline-model-parallel-size", "the interleaved pipeline schedule is not supported (1F1B)"),
    _refused("--num-layers-per-virtual-pipeline-stage", "the interleaved pipeline schedule is not supported (1F1B)"),
    _refused("--num-experts", "mixture-of-experts models are not supported"),
    _refused("--expert-model-parallel-size", "mixture-of-experts models are not supported"),
    _refused("--fp8-format", "fp8 compute is not supported (--bf16 or --fp16)"),
    _refused("--no-save-optim", "checkpoints always hold the optimizer state"),
    _refused("--use-checkpoint-args", "the model's arguments are given on the command line"),
    _refused("--exit-interval", "not supported: --train-iters ends the run"),
)

_BY_NAME = {a.name: a for a in MEGATRON_ARGUMENTS}


def _same_value(value: str, expects: str) -> bool:
    try:
        return float(value) == float(expects)
    except ValueError:
        return value.lower() == expects.lower()


def unknown(name: str) -> str:
    """The message refusing an argument neither hotswitch.train nor the table knows."""
    return (f"unknown argument {name}: neither a hotswitch.train argument nor a Megatron-LM argument it accepts "
            f"or ignores (see --help and README's 'Coming from Megatron-LM')")


def screen(argv: Sequence[str]) -> Tuple[List[str], List[str], Optional[str]]:
    """Applies the table to a command line: ``(argv without the ignored and refused arguments
    and their values, one warning per ignored argument, the refusals, one a line, or None)``."""
    kept, warnings, refusals = [], [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        arg = _BY_NAME.get(name) if token.startswith("--") else None
        if arg is None or arg.treatment == ACCEPTED:
            kept.append(token)
            i += 1
            continue
        if arg.treatment == REFUSED:
            refusals.append(f"Megatron-LM's {name} is refused: {arg.note}")
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):  # its values
                i += 1
            continue
        if eq:
            values = [inline]
        else:
            values = list(argv[i + 1:i + 1 + arg.values])
            if len(values) < arg.values or any(v.startswith("--") for v in values):
                refusals.append(f"Megatron-LM's {name} takes {arg.values} value(s)")
                i += 1 + len([v for v in values if not v.startswith("--")][:1])
                continue
        if eq and arg.values == 0:
            refusals.append(f"Megatron-LM's {name} is a flag and takes no value, got {token!r}")
            i += 1
            continue
        if arg.expects is not None and not _same_value(values[0], arg.expects):
            refusals.append(f"Megatron-LM's {name} {values[0]} is refused: {arg.note}; only {name} "
                            f"{arg.expects} matches it")
            i += 1 if eq else 1 + arg.values
            continue
        shown = " ".join([name] + values)
        warnings.append(f"warning: ignoring Megatron-LM's {shown}: {arg.note}")
        i += 1 if eq else 1 + arg.values
    return kept, warnings, "\n".join(refusals) or None


def markdown_table() -> str:
    """The table as Markdown rows, one argument a row, in the table's order."""
    lines = ["| Megatron-LM argument | here | note |", "| --- | --- | --- |"]
    for a in MEGATRON_ARGUMENTS:
        shown = a.name + (f" {a.expects}" if a.expects else "")
        lines.append(f"| `{shown}` | {a.treatment} | {a.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
