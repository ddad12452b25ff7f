"""Trains a LLaMA-style model on Megatron-LM indexed datasets or a directory of text files,
statically or with hot switching.

    torchrun --nproc-per-node 4 -m hotswitch.train --num-layers 4 --hidden-size 128 \\
        --num-attention-heads 4 --seq-length 1024 --global-batch-size 32 --train-iters 20 \\
        --hot-switch --candidate-layouts auto --memory-budget-gb 0.05
    python -m hotswitch.launch --nproc-per-node 4 -m hotswitch.train ...   # same, no torchrun

Arguments follow Megatron-LM's names; those of Megatron-LM that change nothing here are
ignored with a warning, those it cannot honour are refused (hotswitch.cli.megatron_args).
Without ``--hot-switch`` the run is static: one layout, dp = world / (tp * pp * cp), from
``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size`` and ``--context-parallel-size``. With it, every step
is planned over the candidate layouts (``--candidate-layouts auto``: every layout the model divides, with cp up to
``--context-parallel-size``). Gloo on CPU, NCCL when CUDA is available.
"""

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from hotswitch._C import Layout
from hotswitch.data.blend import open_splits
from hotswitch.data.sampler import LengthAwareSampler
from hotswitch.data.text import default_corpus_dir
from hotswitch.data.tokenizers import TOKENIZER_TYPES, build_tokenizer
from hotswitch.distributed import init_distributed
from hotswitch.config import RuntimeConfig
from hotswitch.hardware import load_hardware
from hotswitch.logging import get_logger
import hotswitch.cli.megatron_args as megatron_args
from hotswitch.model.config import TransformerConfig
from hotswitch.precision import LossScaling
from hotswitch.runtime import Runtime
from hotswitch.schedule import DECAY_STYLES, LearningRateSchedule

__all__ = ["build_parser", "format_iteration", "iteration_record", "learning_rate_schedule", "loss_scaling", "main",
           "parse_args", "runtime_config", "validation_record"]

# Megatron-LM's --use-rope-scaling: LLaMA 3.1's scaling with its fixed factors (its factor is
# --rope-scaling-factor).
MEGATRON_ROPE_SCALING = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}


def default_ffn_hidden_size(hidden_size: int) -> int:
    """Megatron-LM's FFN size under --swiglu: int(4 h * 2 / 3 / 64) * 64 (here at least 64)."""
    return max(64, int(4 * hidden_size * 2 / 3 / 64) * 64)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The description as written; every option that takes a value shows its default, unless
    its help already speaks of it or there is none (None: derived, as the help says)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or action.nargs == 0 or action.default in (None, argparse.SUPPRESS)
                or "default" in text.lower()):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class _Parser(argparse.ArgumentParser):
    """Usage errors in a few lines, once (rank 0 of a launch), without the usage block."""

    def error(self, message: str):
        if int(os.environ.get("RANK", "0") or 0) == 0:
            sys.stderr.write("".join(f"{self.prog}: error: {line}\n" for line in message.splitlines()))
            sys.stderr.write(f"{self.prog}: see --help for every argument and its default\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m hotswitch.train", description=__doc__, formatter_class=_Formatter)
    m = p.add_argument_group("model")
    m.add_argument("--num-layers", type=int, default=4)
    m.add_argument("--hidden-size", type=int, default=128)
    m.add_argument("--num-attention-heads", type=int, default=4)
    m.add_argument("--num-query-groups", type=int, default=None, help="KV heads (default: attention heads)")
    m.add_argument("--ffn-hidden-size", type=int, default=None,
                   help="default: 8/3 of --hidden-size rounded down to a multiple of 64 (at least 64), "
                        "as Megatron-LM's --swiglu sets it")
    m.add_argument("--seq-length", type=int, default=1024, help="the longest sequence (max context)")
    m.add_argument("--max-position-embeddings", type=int, default=None, help="default: --seq-length")
    m.add_argument("--vocab-size", type=int, default=None,
                   help="default: the tokenizer's, padded to --make-vocab-size-divisible-by")
    m.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    m.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    m.add_argument("--init-method-std", type=float, default=0.02, help="standard deviation of the initial weights")
    m.add_argument("--norm-epsilon", type=float, default=1e-5, help="RMSNorm epsilon")
    m.add_argument("--rotary-base", type=float, default=10000.0, help="rotary embedding base (theta)")
    m.add_argument("--use-rope-scaling", action="store_true",
                   help="LLaMA 3.1's rotary frequency scaling, as Megatron-LM applies it (low/high frequency "
                        "factors 1 and 4, original context 8192)")
    m.add_argument("--rope-scaling-factor", type=float, default=8.0, help="its factor, with --use-rope-scaling")
    t = p.add_argument_group("training")
    t.add_argument("--micro-batch-size", type=int, default=None,
                   help="sequences of --seq-length per micro-batch: caps a micro-batch's tokens")
    t.add_argument("--global-batch-size", type=int, default=32,
                   help="sequences of --seq-length tokens per step, as in Megatron-LM: a step holds exactly "
                        "global-batch-size x seq-length tokens of documents, the last one's rest opening the next step")
    t.add_argument("--global-batch-tokens", type=int, default=None,
                   help="tokens per step instead (default: global-batch-size x seq-length)")
    t.add_argument("--global-batch-documents", action="store_true",
                   help="count --global-batch-size in documents instead: each step holds that many whole documents")
    t.add_argument("--train-iters", type=int, default=10)
    t.add_argument("--lr", type=float, default=None,
                   help="peak learning rate; required to train, as Megatron-LM has no default")
    t.add_argument("--min-lr", type=float, default=0.0, help="learning rate at the end of the decay")
    t.add_argument("--lr-decay-style", default="linear", help="constant, linear or cosine")
    t.add_argument("--lr-decay-iters", type=int, default=None, help="default: --train-iters")
    t.add_argument("--lr-warmup-iters", type=int, default=0)
    t.add_argument("--lr-warmup-fraction", type=float, default=None, help="of --lr-decay-iters, instead of iters")
    t.add_argument("--clip-grad", type=float, default=1.0, help="global gradient-norm clip; 0 disables it")
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--adam-beta1", type=float, default=0.9)
    t.add_argument("--adam-beta2", type=float, default=0.999)
    t.add_argument("--adam-eps", type=float, default=1e-8)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--use-distributed-optimizer", action="store_true", help="ZeRO-1 over the home data group")
    t.add_argument("--recompute-granularity", default=None,
                   help="activation recomputation: full (each layer's forward reruns in the backward pass) or "
                        "selective (only the attention core); auto: the planner chooses per phase")
    t.add_argument("--recompute-method", default=None,
                   help="with full: uniform (every layer, in chunks of --recompute-num-layers)")
    t.add_argument("--recompute-num-layers", type=int, default=None,
                   help="with full and uniform: layers per recomputed chunk (default 1)")
    t.add_argument("--compile-layers", action="store_true",
                   help="regional torch.compile: each layer's forward compiled once per layout (first step slower)")
    t.add_argument("--graph-buckets", type=_token_counts, default=None, metavar="T1,T2,...",
                   help="token counts at which layouts with pp and cp 1 (and every bucket a multiple of tp) run "
                        "their layers from CUDA graphs; the planner "
                        "pads a micro-batch to one when that saves more launches than the padding costs (needs "
                        "--graph-layer-overhead or --probe, which measures it)")
    t.add_argument("--graph-layer-overhead", type=float, default=None, metavar="SECONDS",
                   help="fixed seconds per layer of a micro-batch run from the graphs, as benchmarks.microbatch "
                        "--graphs measures it on the device (default with --probe: measured at start-up)")
    t.add_argument("--graph-layouts", default=None, metavar="L1,L2,...|auto",
                   help="with --graph-buckets and --hot-switch: the candidate layouts that capture CUDA graphs, "
                        "e.g. dp4tp2,dp2tp4 (default: every one that can); each keeps its graphs' weight copies "
                        "while the others run, which takes memory from every layout's micro-batches; auto: the "
                        "home and the layouts the planner without graph buckets gives the first batch")
    par = p.add_argument_group("parallelism")
    par.add_argument("--tensor-model-parallel-size", type=int, default=1)
    par.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    par.add_argument("--context-parallel-size", type=int, default=1,
                     help="static runs: split every sequence over this many ranks; with --hot-switch and "
                          "--candidate-layouts auto: the largest cp among the candidates")
    par.add_argument("--hot-switch", action="store_true", help="plan a layout per bucket of every step")
    par.add_argument("--candidate-layouts", default="auto", help='"auto" or e.g. "dp4,dp2tp2,tp2pp2"')
    par.add_argument("--home-layout", default=None, help="layout of the master weights (default: chosen)")
    par.add_argument("--memory-budget-gb", type=float, default=None, help="per-rank memory the plans respect")
    par.add_argument("--hardware", default="a800", help="cost profile: a preset name or a calibrated JSON file")
    par.add_argument("--micro-batch-overhead", default="auto", choices=("auto", "measure", "profile"),
                     help="the fixed cost per layer and micro-batch the plans count: measured on rank 0's device "
                          "before training (measure), or --hardware's (profile); auto measures when hot-switching "
                          "with a preset and re-calibration on, since presets hold another system's overheads")
    par.add_argument("--min-gain", type=float, default=0.01,
                     help="switch layouts within a step only when the plan is predicted at least this fraction "
                          "faster than the step in one phase under the home or best static layout (0.01: 1%%)")
    par.add_argument("--trust-error", type=float, default=0.25, metavar="FRACTION",
                     help="try at most one layout per step whose measured phase time has not yet come within this "
                          "fraction of its prediction; a layout that missed is left out of the next 1, 2, 4... "
                          "steps (0.25: 25%%; with re-calibration)")
    par.add_argument("--no-trust", dest="trust_error", action="store_const", const=None,
                     help="rely on every layout's prediction from the first step")
    par.add_argument("--explore", type=float, default=None, metavar="FRACTION",
                     help="uncertainty of a layout the re-calibrating model has not measured yet: a plan relying on "
                          "it prices it at 1 + FRACTION times its prediction, and a step tries it on a quarter of its "
                          "tokens when at 1 - FRACTION times it would beat the plan (0.5: 50%%; one a step; default: off)")
    par.add_argument("--no-explore", dest="explore", action="store_const", const=None,
                     help="never try a layout because it has not been measured")
    par.add_argument("--probe", action="store_true", default=None,
                     help="time every candidate layout on short and long synthetic sequences before the first step, "
                          "refit the cost model and choose the home from those times (default: on with --hot-switch "
                          "and re-calibration, without --fixed-plan)")
    par.add_argument("--no-probe", dest="probe", action="store_false",
                     help="plan the first steps with --hardware's costs as given")
    par.add_argument("--home-window", type=int, default=None, metavar="N",
                     help="with --hot-switch, re-choose the home layout over the last N batches after every step and "
                          "move it (masters and optimizer state) when that saves more than the move costs; 0: the "
                          "home stays where it started (default: 4, or 0 with --home-layout)")
    par.add_argument("--fixed-plan", default=None, metavar="FILE.json",
                     help="run this hand-written plan instead of the planner's: a JSON list of [upper_bound, layout, "
                          "recompute], bounds increasing (hotswitch.planner.load_fixed_plan)")
    par.add_argument("--timeout", type=float, default=300.0, help="seconds before a stalled peer raises")
    par.add_argument("--no-recalibrate", dest="recalibrate", action="store_false",
                     help="keep the cost model as given (plans, and so runs and resumes, are bit-reproducible)")
    mp = p.add_argument_group("mixed precision (Megatron-LM's: fp32 master weights, optimizer state and gradients)")
    mp.add_argument("--bf16", action="store_true", help="bf16 compute")
    mp.add_argument("--fp16", action="store_true", help="fp16 compute with loss scaling")
    mp.add_argument("--loss-scale", type=float, default=None,
                    help="a constant loss scale (default with --fp16: dynamic)")
    mp.add_argument("--initial-loss-scale", type=float, default=2.0 ** 32, help="the dynamic scale's start")
    mp.add_argument("--min-loss-scale", type=float, default=1.0, help="the dynamic scale's floor")
    mp.add_argument("--loss-scale-window", type=int, default=1000,
                    help="overflow-free iterations before the dynamic scale doubles")
    mp.add_argument("--hysteresis", type=int, default=2, help="overflowing iterations before the dynamic scale halves")
    d = p.add_argument_group("data")
    d.add_argument("--data-path", nargs="+", default=None,
                   help="an indexed dataset prefix (PREFIX.bin/.idx) or a directory of text files, or a blend "
                        "'0.3 PREFIX_A 0.7 PREFIX_B' (default: Python's stdlib source)")
    d.add_argument("--split", default="969,30,1", help="train,validation,test shares of each source's documents")
    d.add_argument("--tokenizer-type", default="ByteTokenizer", choices=TOKENIZER_TYPES)
    d.add_argument("--tokenizer-model", default=None,
                   help="SentencePiece model file, or a Hugging Face tokenizer directory (HuggingFaceTokenizer)")
    d.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer's vocab.json")
    d.add_argument("--merge-file", default=None, help="GPT2BPETokenizer's merges.txt")
    d.add_argument("--document-unit", default="block", choices=None, help="file or block")
    d.add_argument("--long-sequences", default="truncate", help="truncate or split documents over --seq-length")
    d.add_argument("--max-files", type=int, default=None)
    c = p.add_argument_group("checkpoints")
    c.add_argument("--save", default=None, help="directory to save checkpoints in")
    c.add_argument("--save-interval", type=int, default=None, help="save every N steps (and at the end)")
    c.add_argument("--load", default=None, help="checkpoint (step_N or a --save directory) to start from; "
                   "the --save folder holding none yet starts from the initialised model, with a warning, "
                   "as in Megatron-LM")
    c.add_argument("--ckpt-format", default="hotswitch", choices=("hotswitch", "torch_dist", "torch_dcp"),
                   help="how --save writes: hotswitch's own layout-independent format, or torch.distributed."
                        "checkpoint (torch_dist and torch_dcp alike); --load reads either")
    c.add_argument("--finetune", action="store_true",
                   help="load the weights of --load only: the optimizer, RNG states, iteration and data position "
                        "start afresh (Megatron-LM's)")
    c.add_argument("--no-load-optim", action="store_true", help="do not load the optimizer state of --load")
    c.add_argument("--no-load-rng", action="store_true", help="do not load the RNG states of --load")
    c.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint of --load (default: --save) when there is one")
    o = p.add_argument_group("output")
    o.add_argument("--log-interval", type=int, default=1)
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument("--summary-json", default=None, help="write the end-of-run summary to this file (rank 0)")
    o.add_argument("--eval-interval", type=int, default=None,
                   help="evaluate on the validation split every N iterations (and after the last)")
    o.add_argument("--eval-iters", type=int, default=10, help="validation batches per evaluation")
    o.add_argument("--metrics-file", default=None,
                   help="append each logged iteration's figures as one JSON object a line (rank 0)")
    o.add_argument("--dry-run", action="store_true",
                   help="plan the first batches exactly as this command would train them (model, hardware, memory "
                        "budget, data, candidates) for --dry-run-gpus GPUs, print the plans and exit; no process group")
    o.add_argument("--dry-run-gpus", type=int, default=None,
                   help="GPUs of the dry run (default: the launch's WORLD_SIZE, or 8)")
    o.add_argument("--dry-run-gpus-per-node", type=int, default=8)
    o.add_argument("--dry-run-steps", type=int, default=1, help="batches the dry run plans")
    o.add_argument("--tensorboard-dir", default=None,
                   help="write TensorBoard scalars here (rank 0): Megatron's names, plus tokens-per-second, "
                        "switch-share and phases")
    o.add_argument("--wandb-project", default=None, help="log the same scalars to this W&B project (rank 0)")
    o.add_argument("--wandb-exp-name", default=None, help="the W&B run's name")
    for action in p._actions:  # argparse shows no help line, so no default, for an option without help
        if action.help is None and action.option_strings and action.nargs != 0 and action.default is not None:
            action.help = "default: %(default)s"
    return p


def parse_args(argv: Optional[List[str]] = None, world: Optional[int] = None) -> argparse.Namespace:
    """Parses and checks the arguments; exits with status 2 naming the bad value."""
    parser = build_parser()
    argv, warnings, refusal = megatron_args.screen(sys.argv[1:] if argv is None else list(argv))
    args, unknown = parser.parse_known_args(argv)
    # Every refused and unknown argument at once.
    problems = ([refusal] if refusal else []) + [megatron_args.unknown(u.partition("=")[0])
                                                  for u in unknown if u.startswith("-")]
    if unknown and not problems:
        problems = [f"unexpected values {unknown}"]
    if problems:
        parser.error("\n".join(problems))
    for line in warnings if int(os.environ.get("RANK", "0") or 0) == 0 else ():
        print(line, file=sys.stderr, flush=True)
    if args.global_batch_documents and args.global_batch_tokens:
        parser.error("--global-batch-documents and --global-batch-tokens exclude each other: give one")
    if args.bf16 and args.fp16:
        parser.error("--bf16 and --fp16 exclude each other: give one")
    for name in ("init_method_std", "norm_epsilon", "rotary_base", "adam_eps", "initial_loss_scale",
                 "min_loss_scale") + (("loss_scale",) if args.loss_scale is not None else ()):
        value = getattr(args, name)
        if not math.isfinite(value) or value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if args.loss_scale is not None and not (args.fp16 or args.bf16):
        parser.error(f"--loss-scale {args.loss_scale} needs --fp16 or --bf16 (fp32 training scales no loss)")
    if args.fp16 and args.loss_scale is None and args.min_loss_scale > args.initial_loss_scale:
        parser.error(f"--min-loss-scale({args.min_loss_scale}) must be <= --initial-loss-scale"
                     f"({args.initial_loss_scale})")
    positive = ["num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
                "train_iters", "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                "make_vocab_size_divisible_by", "log_interval", "loss_scale_window", "hysteresis"]
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("eval_interval", "eval_iters", "num_query_groups", "ffn_hidden_size", "max_position_embeddings",
                 "vocab_size",
                 "micro_batch_size", "global_batch_tokens", "max_files", "save_interval"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if (args.finetune or args.no_load_optim or args.no_load_rng) and not args.load:
        parser.error("--finetune, --no-load-optim and --no-load-rng apply to the checkpoint of --load; give --load")
    if args.finetune and args.resume:
        parser.error("--finetune starts from the weights of --load; --resume continues a run: give one of them")
    # Megatron's "consumed samples" count global-batch-size per step, unless the step is a token budget.
    args.samples_per_step = None if args.global_batch_tokens else args.global_batch_size
    if not args.global_batch_documents and args.global_batch_tokens is None:
        args.global_batch_tokens = args.global_batch_size * args.seq_length
    missing = ScalarWriters.check(args)
    if missing:
        parser.error(missing)
    if args.lr is not None and (not math.isfinite(args.lr) or args.lr <= 0):
        parser.error(f"--lr must be a positive number, got {args.lr}")
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.memory_budget_gb is not None and (not math.isfinite(args.memory_budget_gb) or args.memory_budget_gb <= 0):
        parser.error(f"--memory-budget-gb must be a positive number, got {args.memory_budget_gb}")
    if args.document_unit not in ("file", "block"):
        parser.error(f"--document-unit must be file or block, got {args.document_unit!r}")
    if args.long_sequences not in ("truncate", "split"):
        parser.error(f"--long-sequences must be truncate or split, got {args.long_sequences!r}")
    if args.lr_decay_style not in DECAY_STYLES:
        parser.error(f"--lr-decay-style must be one of {', '.join(DECAY_STYLES)}, got {args.lr_decay_style!r}")
    if not math.isfinite(args.clip_grad) or args.clip_grad < 0:
        parser.error(f"--clip-grad must be a number >= 0, got {args.clip_grad}")
    if args.lr_warmup_fraction is not None and args.lr_warmup_iters:
        parser.error("--lr-warmup-fraction and --lr-warmup-iters exclude each other")
    if args.lr_warmup_fraction is not None and not 0 <= args.lr_warmup_fraction < 1:
        parser.error(f"--lr-warmup-fraction must lie in [0, 1), got {args.lr_warmup_fraction}")
    if args.resume and not (args.load or args.save):
        parser.error("--resume needs --load or --save to name the checkpoint directory")
    if args.save_interval is not None and not args.save:
        parser.error(f"--save-interval {args.save_interval} needs --save")
    if args.probe is None:
        args.probe = bool(args.hot_switch and args.recalibrate and not args.fixed_plan)
    elif args.probe and not (args.hot_switch and args.recalibrate):
        parser.error("--probe needs --hot-switch and re-calibration (without --no-recalibrate): its times refit "
                     "the cost model the plans use")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.max_position_embeddings < args.seq_length:
        parser.error(f"--max-position-embeddings({args.max_position_embeddings}) must be >= "
                     f"--seq-length({args.seq_length})")
    if args.recompute_granularity is not None and args.recompute_granularity not in ("full", "selective", "auto"):
        parser.error(f"--recompute-granularity must be full, selective or auto, got {args.recompute_granularity!r}")
    if args.recompute_method is not None:
        if args.recompute_granularity not in ("full", "auto"):
            parser.error(f"--recompute-method {args.recompute_method} needs --recompute-granularity full")
        if args.recompute_method != "uniform":
            parser.error(f"--recompute-method must be uniform (every layer, in chunks), got {args.recompute_method!r}")
    if args.recompute_num_layers is not None:
        if args.recompute_num_layers < 1:
            parser.error(f"--recompute-num-layers must be >= 1, got {args.recompute_num_layers}")
        if args.recompute_method != "uniform":
            parser.error(f"--recompute-num-layers {args.recompute_num_layers} needs --recompute-method uniform")
    if args.num_query_groups is None:
        args.num_query_groups = args.num_attention_heads
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = default_ffn_hidden_size(args.hidden_size)
    try:
        args.tokenizer = build_tokenizer(args.tokenizer_type, args.tokenizer_model, args.vocab_file, args.merge_file)
    except ValueError as e:
        parser.error(str(e))
    tokens = args.tokenizer.vocab_size
    if args.vocab_size is None:
        k = args.make_vocab_size_divisible_by
        args.vocab_size = -(-tokens // k) * k
    elif args.vocab_size < tokens:
        parser.error(f"--vocab-size({args.vocab_size}) must hold the {args.tokenizer_type}'s {tokens} tokens")
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.train_iters
    if args.lr_warmup_fraction is not None:
        args.lr_warmup_iters = int(args.lr_warmup_fraction * args.lr_decay_iters)
    try:
        # A dry run trains nothing: it needs no learning rate.
        args.schedule = learning_rate_schedule(args) if args.lr is not None else None
    except ValueError as e:
        parser.error(str(e))
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    if args.hot_switch and cp != 1 and args.candidate_layouts != "auto":
        parser.error(f"--context-parallel-size({cp}) with --hot-switch bounds the cp of --candidate-layouts auto; "
                     f"with listed layouts ({args.candidate_layouts}) name the cp layouts there")
    if args.dry_run:
        for name in ("dry_run_gpus", "dry_run_gpus_per_node", "dry_run_steps"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        world = args.dry_run_gpus or (world if "WORLD_SIZE" in os.environ else 8)
        args.dry_run_gpus = world
    if world is not None and not args.hot_switch and world % (tp * pp * cp):
        parser.error(f"world({world}) is not divisible by tensor({tp}) * pipeline({pp}) * context({cp}) "
                     f"parallel size")
    if args.rope_scaling_factor != 8.0 and not args.use_rope_scaling:
        parser.error(f"--rope-scaling-factor {args.rope_scaling_factor} needs --use-rope-scaling")
    if not math.isfinite(args.rope_scaling_factor) or args.rope_scaling_factor <= 0:
        parser.error(f"--rope-scaling-factor must be a positive number, got {args.rope_scaling_factor}")
    args.rope_scaling = dict(MEGATRON_ROPE_SCALING, factor=args.rope_scaling_factor) if args.use_rope_scaling else None
    # Last: every other mistake in the command is named first.
    if args.lr is None and not args.dry_run:
        parser.error("--lr is required: the peak learning rate (Megatron-LM has no default either)")
    return args


def learning_rate_schedule(args: argparse.Namespace) -> LearningRateSchedule:
    """Megatron's ``--lr --min-lr --lr-decay-style --lr-decay-iters --lr-warmup-iters``."""
    style = args.lr_decay_style
    if style != "constant" and args.lr_decay_iters <= args.lr_warmup_iters:
        raise ValueError(f"--lr-decay-iters({args.lr_decay_iters}) must exceed the warm-up "
                         f"({args.lr_warmup_iters} iterations)")
    return LearningRateSchedule(args.lr, style=style, min_lr=args.min_lr, warmup_iters=args.lr_warmup_iters,
                                decay_iters=None if style == "constant" else args.lr_decay_iters)


def runtime_config(args: argparse.Namespace, world: int) -> RuntimeConfig:
    """Megatron-LM's arguments as the runtime's settings: the one place they meet.

    ``--tensor-model-parallel-size``/``--pipeline-model-parallel-size``/``--context-parallel-size``
    give the static layout (dp = world / (tp * pp * cp)) without ``--hot-switch``; with it, ``--candidate-layouts`` and
    ``--home-layout`` the planner's choices, ``--context-parallel-size`` the largest cp of
    ``auto`` candidates. ``--micro-batch-size`` times ``--seq-length``
    caps a micro-batch's tokens; ``--use-distributed-optimizer`` is ZeRO-1;
    ``--recompute-granularity`` (and ``--recompute-num-layers``) the activation recomputation."""
    if args.hot_switch:
        home = args.home_layout
        candidates = "auto" if args.candidate_layouts == "auto" else \
            [Layout.parse(n.strip()) for n in args.candidate_layouts.split(",") if n.strip()]
        max_cp = args.context_parallel_size
    else:
        tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
        home = Layout(dp=world // (tp * pp * cp), tp=tp, pp=pp, cp=cp)
        candidates, max_cp = [home], 1
    return RuntimeConfig(
        candidates=candidates, max_cp=max_cp, home=home, hardware=load_hardware(args.hardware),
        memory_budget_bytes=None if args.memory_budget_gb is None else int(args.memory_budget_gb * 2**30),
        max_context=args.seq_length,
        max_tokens_per_micro_batch=None if args.micro_batch_size is None else args.micro_batch_size * args.seq_length,
        zero=args.use_distributed_optimizer, seed=args.seed, timeout=args.timeout, recalibrate=args.recalibrate,
        clip_grad=args.clip_grad or None, loss_scaling=loss_scaling(args),
        recompute=args.recompute_granularity or "none", recompute_num_layers=args.recompute_num_layers or 1,
        min_gain=args.min_gain, fixed_plan=args.fixed_plan,
        home_window=(0 if args.home_layout else 4) if args.home_window is None else args.home_window,
        trust_error=args.trust_error, explore=args.explore, probe=args.probe, compile_layers=args.compile_layers,
        graph_buckets=args.graph_buckets, graph_layer_overhead_seconds=args.graph_layer_overhead,
        graph_layouts=None if args.graph_layouts is None else "auto" if args.graph_layouts.strip() == "auto" else
        [n.strip() for n in args.graph_layouts.split(",") if n.strip()])


def loss_scaling(args: argparse.Namespace) -> Optional[LossScaling]:
    """Megatron's grad scaler: ``--loss-scale`` a constant one (with ``--fp16`` or
    ``--bf16``); else with ``--fp16`` a dynamic one (``--initial-loss-scale --min-loss-scale
    --loss-scale-window --hysteresis``); none for bf16 or fp32."""
    if args.loss_scale is not None:
        return LossScaling(constant=args.loss_scale)
    if args.fp16:
        return LossScaling(initial=args.initial_loss_scale, min=args.min_loss_scale, window=args.loss_scale_window,
                           hysteresis=args.hysteresis)
    return None


def _token_counts(text: str) -> List[int]:
    """``--graph-buckets``: comma-separated token counts."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    return counts


def measure_overhead(args: argparse.Namespace) -> bool:
    """Whether this run plans with the layer overhead measured on its own device."""
    if args.micro_batch_overhead != "auto":
        return args.micro_batch_overhead == "measure"
    return args.hot_switch and args.recalibrate and not args.hardware.endswith(".json")


def _measured_overhead(config: TransformerConfig, profile, rank: int):
    """``profile`` with the layer overhead of this model measured on rank 0 (every rank gets it)."""
    from hotswitch.calibration.overhead import agreed_layer_overhead

    planned, costs = agreed_layer_overhead(config, profile)
    if rank == 0:
        print(f"planning with a layer overhead of {planned.layer_overhead_seconds * 1e3:.3f} ms per micro-batch, "
              f"measured on {costs.device} ({costs.device_name}, {costs.attention} attention) in "
              f"{costs.seconds:.1f} s; --hardware {profile.name} holds "
              f"{profile.layer_overhead_seconds * 1e3:.3f} ms", flush=True)
    return planned


def main(argv: Optional[List[str]] = None) -> int:
    world_env = os.environ.get("WORLD_SIZE", "1")
    args = parse_args(argv, int(world_env) if world_env.isdigit() else None)
    parser = build_parser()
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, int(local) if local.isdigit() else 1)))
    if args.dry_run:
        rank, world = 0, args.dry_run_gpus
    else:
        try:
            rank, world, _ = init_distributed(timeout_s=args.timeout)
        except ValueError as e:
            parser.error(str(e))
    try:
        config = TransformerConfig(
            num_layers=args.num_layers, hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
            ffn_hidden_size=args.ffn_hidden_size, vocab_size=args.vocab_size,
            max_position_embeddings=args.max_position_embeddings,
            tied_embedding=not args.untie_embeddings_and_output_weights, init_std=args.init_method_std,
            norm_eps=args.norm_epsilon, rope_theta=args.rotary_base, rope_scaling=args.rope_scaling,
            compute_dtype="bfloat16" if args.bf16 else "float16" if args.fp16 else None)
        settings = runtime_config(args, world)
        if measure_overhead(args) and not args.dry_run:
            settings = dataclasses.replace(settings, hardware=_measured_overhead(config, settings.hardware, rank))
        splits = open_splits(args.data_path or [default_corpus_dir()], args.split, args.tokenizer,
                             max_length=args.seq_length, max_files=args.max_files, unit=args.document_unit)
        sampler = LengthAwareSampler(
            splits.train, max_length=args.seq_length,
            global_batch_size=None if args.global_batch_tokens else args.global_batch_size,
            global_batch_tokens=args.global_batch_tokens, seed=args.seed, long_sequences=args.long_sequences)
        if args.dry_run:
            return dry_run(args, config, settings, sampler, world)
        runtime = Runtime(
            config, settings,
            optimizer=lambda params: torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay,
                                                       betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps))
    except ValueError as e:
        parser.error(str(e))

    log = get_logger("train")
    if rank == 0:
        print(f"data: {splits.describe()} ({args.long_sequences})", flush=True)
    start_step = 0
    source = args.load or (args.save if args.resume else None)
    if source:
        from hotswitch.checkpoint import latest_checkpoint
        is_step = any(os.path.exists(os.path.join(source, f)) for f in ("metadata.json", ".metadata"))
        path = source if is_step else latest_checkpoint(source)
        fresh = args.save is not None and os.path.abspath(source) == os.path.abspath(args.save)
        if path is None and not args.resume and not fresh:
            parser.error(f"--load {source!r} holds no checkpoint")
        if path is None and not args.resume and rank == 0:
            # Megatron-LM's scripts pass --load and --save the same folder from the first run on.
            print(f"warning: --load {source!r} (the --save folder) holds no checkpoint yet; starting from the "
                  f"initialised model, as Megatron-LM does", file=sys.stderr, flush=True)
        if path is not None:
            info = runtime.load_checkpoint(path, optimizer=not (args.finetune or args.no_load_optim),
                                           rng=not (args.finetune or args.no_load_rng), reset_step=args.finetune)
            if info["data_state"]:
                sampler.load_state_dict(info["data_state"])
            start_step = info["step"]
            if rank == 0:
                print(f"resumed from {path} at step {start_step}", flush=True)
    writers = ScalarWriters(args, rank)
    bar = None
    # The bar redraws a terminal line; in a log file it would write carriage-return junk.
    if rank == 0 and not args.no_progress and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=args.train_iters, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr)
    results = []
    metrics = open(args.metrics_file, "a") if rank == 0 and args.metrics_file else None
    consumed = start_step * args.samples_per_step if args.samples_per_step else 0
    skipped_in_interval = 0
    for it in range(start_step, args.train_iters):
        batch = sampler.next_batch()
        if it == start_step:
            _check_token_ids(batch, config.vocab_size, args, parser)
        # Megatron's schedule counts optimizer updates: a skipped iteration does not advance it.
        args.schedule.apply(runtime.optimizer, runtime.updates)
        result = runtime.train_step(batch)
        results.append(result)
        consumed += args.samples_per_step or len(batch)
        skipped_in_interval += int(result.skipped)
        tps = result.tokens / result.seconds
        layouts = "+".join(result.layouts)
        if bar is not None:
            bar.set_postfix_str(f"loss {result.loss:.3f} | {tps:,.0f} tok/s | {layouts}")
            bar.update(1)
        if rank == 0 and (it + 1) % args.log_interval == 0:
            record = iteration_record(result, args.train_iters, consumed, len(batch), skipped_in_interval)
            skipped_in_interval = 0
            msg = format_iteration(record)
            if bar is not None:
                bar.write(msg)
            else:
                print(msg, flush=True)
            if metrics is not None:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            writers.iteration(record)
        last = it + 1 == args.train_iters
        if args.eval_interval and ((it + 1) % args.eval_interval == 0 or last):
            record = validation_record(runtime, splits, args, result.step)
            if rank == 0 and record is not None:
                msg = (f" validation loss at iteration {record['iteration']} | lm loss value: "
                       f"{record['valid_lm_loss']:.6E} | lm loss PPL: {record['valid_ppl']:.6E} |")
                (bar.write if bar is not None else print)(msg)
                writers.validation(record)
                if metrics is not None:
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
        if args.save and (last or (args.save_interval and (it + 1) % args.save_interval == 0)):
            path = runtime.save_checkpoint(args.save, data_state=sampler.state_dict(),
                                           ckpt_format="hotswitch" if args.ckpt_format == "hotswitch" else "torch_dist",
                                           extra={"model": dataclasses.asdict(config)})
            if rank == 0:
                (bar.write if bar is not None else print)(f"saved {path}")
    if bar is not None:
        bar.close()
    if metrics is not None:
        metrics.close()
    writers.close()

    summary = _summary(results, runtime, world)
    if rank == 0:
        print(f"data: {sampler.cut_documents} of {sampler.documents_drawn} documents drawn were longer than "
              f"--seq-length {args.seq_length} ({args.long_sequences})", flush=True)
        print(_format_summary(summary), flush=True)
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump(summary, f, indent=1)
    log.debug("rank %d done", rank)
    dist.barrier()
    # End the process group as torchrun scripts do: left to interpreter exit, gloo's teardown
    # aborts a rank now and then ("terminate called without an active exception").
    dist.destroy_process_group()
    return 0


def validation_record(runtime, splits, args, iteration: int) -> Optional[dict]:
    """The validation loss over ``--eval-iters`` batches of the validation split (the same
    batches at every evaluation), and its perplexity; None without a validation split."""
    if splits.valid is None:
        return None
    sampler = LengthAwareSampler(
        splits.valid, max_length=args.seq_length,
        global_batch_size=None if args.global_batch_tokens else args.global_batch_size,
        global_batch_tokens=args.global_batch_tokens, seed=args.seed + 1, long_sequences=args.long_sequences)
    losses, targets = 0.0, 0
    for _ in range(args.eval_iters):
        batch = sampler.next_batch()
        n = sum(len(s) - 1 for s in batch)
        if n:
            losses += runtime.evaluate(batch) * n
            targets += n
    loss = losses / targets if targets else float("nan")
    return {"iteration": iteration, "valid_lm_loss": loss,
            "valid_ppl": math.exp(min(loss, 700.0)) if math.isfinite(loss) else loss}


class ScalarWriters:
    """Rank 0's scalars to TensorBoard (``--tensorboard-dir``, through
    ``torch.utils.tensorboard``) and Weights & Biases (``--wandb-project``), under Megatron-LM's
    names: ``lm loss``, ``learning-rate``, ``grad-norm``, ``loss-scale``, ``iteration-time``
    (seconds), ``batch-size``, and validation's ``lm loss validation`` / ``lm loss validation
    ppl``; hot switching adds ``tokens-per-second``, ``switch-share``, ``phases`` and
    ``predicted-iteration-time``, and the layouts of each step as text."""

    def __init__(self, args: argparse.Namespace, rank: int):
        self.tensorboard = self.wandb = None
        if rank != 0:
            return
        if args.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter
            self.tensorboard = SummaryWriter(log_dir=args.tensorboard_dir)
        if args.wandb_project:
            import wandb
            self.wandb = wandb.init(project=args.wandb_project, name=args.wandb_exp_name,
                                    config={k: v for k, v in vars(args).items() if k != "schedule"})

    @staticmethod
    def check(args: argparse.Namespace) -> Optional[str]:
        """Why the writers asked for cannot be made (a missing package), or None."""
        import importlib.util
        if args.tensorboard_dir and importlib.util.find_spec("tensorboard") is None:
            return "--tensorboard-dir needs the tensorboard package (pip install 'hotswitch[tensorboard]')"
        if args.wandb_project and importlib.util.find_spec("wandb") is None:
            return "--wandb-project needs the wandb package (pip install wandb)"
        if args.wandb_exp_name and not args.wandb_project:
            return "--wandb-exp-name needs --wandb-project"
        return None

    def _write(self, scalars: Dict[str, float], step: int) -> None:
        if self.tensorboard is not None:
            for name, value in scalars.items():
                self.tensorboard.add_scalar(name, value, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def iteration(self, record: dict) -> None:
        step = record["iteration"]
        self._write({"lm loss": record["lm_loss"], "learning-rate": record["learning_rate"],
                     "grad-norm": record["grad_norm"], "loss-scale": record["loss_scale"],
                     "iteration-time": record["elapsed_ms_per_iteration"] / 1e3,
                     "batch-size": record["global_batch_size"], "tokens-per-second": record["tokens_per_s"],
                     "switch-share": record["switch_share"], "phases": len(record["layouts"]),
                     "predicted-iteration-time": record["predicted_s"]}, step)
        if self.tensorboard is not None:
            self.tensorboard.add_text("layouts", " -> ".join(record["layouts"]), step)

    def validation(self, record: dict) -> None:
        self._write({"lm loss validation": record["valid_lm_loss"],
                     "lm loss validation ppl": record["valid_ppl"]}, record["iteration"])

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def _check_token_ids(batch, vocab_size: int, args: argparse.Namespace, parser) -> None:
    """A dataset tokenized with another tokenizer than ``--tokenizer-type`` holds ids beyond its
    vocabulary: one clear line (on every rank alike, the batch being the same) before any step."""
    largest = max((int(max(seq)) for seq in batch if len(seq)), default=-1)
    if largest >= vocab_size:
        parser.error(f"the data holds token id {largest}, outside the model's vocabulary [0, {vocab_size}): it was "
                     f"tokenized with another tokenizer than --tokenizer-type {args.tokenizer_type}"
                     + (f" --tokenizer-model {args.tokenizer_model}" if args.tokenizer_model else "")
                     + "; give the tokenizer the data was made with (or --vocab-size)")


def iteration_record(result, train_iters: int, consumed: int, batch_size: int, skipped: int) -> dict:
    """One logged iteration's figures, as the log line shows them and the metrics file holds them.
    ``skipped``: iterations without an optimizer update since the last logged one (Megatron's
    "number of skipped iterations"); ``loss_scale`` the scale after this iteration."""
    switch_share = result.switch_seconds / result.seconds if result.seconds else 0.0
    return {"iteration": result.step, "train_iters": train_iters, "consumed_samples": consumed,
            "elapsed_ms_per_iteration": round(1e3 * result.seconds, 3), "learning_rate": result.lr,
            "global_batch_size": batch_size, "lm_loss": result.loss, "loss_scale": result.loss_scale,
            "grad_norm": result.grad_norm, "skipped_iterations": skipped,
            "tokens_per_s": round(result.tokens / result.seconds, 1) if result.seconds else 0.0,
            "tokens": result.tokens, "layouts": result.layouts, "switch_share": round(switch_share, 4),
            "predicted_s": round(result.predicted_s, 4)}


def format_iteration(r: dict) -> str:
    """Megatron-LM's iteration line, then what hot switching adds (layouts, switch share)."""
    return (f" iteration {r['iteration']:8d}/{r['train_iters']:8d} | consumed samples: {r['consumed_samples']:12d} | "
            f"elapsed time per iteration (ms): {r['elapsed_ms_per_iteration']:.1f} | "
            f"learning rate: {r['learning_rate']:.6E} | global batch size: {r['global_batch_size']:5d} | "
            f"lm loss: {r['lm_loss']:.6E} | loss scale: {r['loss_scale']:.1f} | grad norm: {r['grad_norm']:.3f} | "
            f"number of skipped iterations: {r['skipped_iterations']:3d} | tokens/s: {r['tokens_per_s']:,.0f} | "
            f"layouts: {'+'.join(r['layouts'])} | switch share: {100 * r['switch_share']:.1f}% |")


def dry_run(args: argparse.Namespace, config: TransformerConfig, settings: RuntimeConfig, sampler, world: int) -> int:
    """Plans the first ``--dry-run-steps`` batches of this command for ``world`` GPUs, as the
    runtime would plan them before any re-calibration, and prints each plan's table."""
    from hotswitch import _C
    from hotswitch.cli.plan import _table
    from hotswitch.hardware import load_hardware as _load
    from hotswitch.model.attention import PackAttention, cuda_kernel
    from hotswitch.planner import (auto_graph_layouts, build_planner, check_candidates, fixed_plan_entries,
                                   keep_graph_layouts, load_fixed_plan, with_fixed_layouts)

    hardware = settings.hardware or _load("a800")
    if settings.memory_budget_bytes is not None:
        fields = hardware.to_dict()
        fields["memory_bytes"] = settings.memory_budget_bytes
        hardware = _C.HardwareProfile.from_dict(fields)
    topology = _C.Topology(world, min(args.dry_run_gpus_per_node, world))
    model = config.cost_config()
    candidates = check_candidates(config, world, settings.candidates, settings.max_cp)
    fixed = None
    if settings.fixed_plan is not None:
        fixed = load_fixed_plan(settings.fixed_plan, world, config, settings.max_context)
        candidates = with_fixed_layouts(candidates, fixed)
    settings.check_graph_layouts(candidates)
    modes = ["none", "selective", "full"] if settings.recompute == "auto" else [settings.recompute]
    options = dict(max_context=settings.max_context, recompute=modes, min_gain=settings.min_gain,
                   max_tokens_per_micro_batch=settings.max_tokens_per_micro_batch or 0)
    # The graph buckets a GPU runs static: those of the attention kernel a CUDA device selects.
    kernel = cuda_kernel(getattr(torch, config.compute_dtype or config.dtype), config.head_dim)
    max_scores = PackAttention.max_static_scores(kernel, torch.device("cuda"))
    auto = settings.auto_graph_layouts
    # Under graph_layouts="auto" the home is chosen as without graphs (none captures them yet).
    graphs = settings.graph_options(hardware, model=config, graph_max_scores=max_scores,
                                    graph_layouts=[] if auto else None)
    names = [c.name for c in candidates]
    if settings.home is not None:
        home = names.index(Layout.parse(settings.home).name if isinstance(settings.home, str) else settings.home.name)
    else:
        n = len(candidates)
        probe = _C.Planner(_C.CostModel(model, hardware, topology, zero=settings.zero, tp_overlap=settings.tp_overlap,
                                        recompute_chunk_layers=settings.recompute_chunk_layers,
                                        **graphs),
                           candidates, 0,
                           [[0.0] * n for _ in range(n)], [0.0] * n, **options)
        home = probe.plan([settings.max_context]).best_static_candidate

    def planner_with(graphs):
        return build_planner(model, hardware, topology, candidates, home, zero=settings.zero, graphs=graphs,
                             tp_overlap=settings.tp_overlap, recompute_chunk_layers=settings.recompute_chunk_layers,
                             **options)

    batches = [sampler.next_batch() for _ in range(args.dry_run_steps)]
    longest = config.max_position_embeddings if settings.max_context is None else settings.max_context
    entries = None if fixed is None else fixed_plan_entries(fixed, candidates)
    refused = []
    if auto and batches:
        # As the runtime chooses them: the home and what the planner without graphs gives batch 1;
        # then the home alone, then none, while their copies leave no layout the max context or
        # break the fixed plan's bounds (keep_graph_layouts).
        def check(names):
            planner = planner_with(settings.graph_options(hardware, model=config, graph_max_scores=max_scores,
                                                          graph_layouts=names))
            held = max(planner.micro_batch_budget(i) for i in range(len(candidates)))
            if held < longest:
                raise ValueError(f"no candidate layout holds a {longest}-token sequence (at most {held} tokens)")
            if entries is not None:
                planner.check_fixed_plan(entries)
            return planner

        planned = auto_graph_layouts(planner_with(None), [[len(s) for s in batches[0]]], entries)
        chosen, planner, refused = keep_graph_layouts(planned, names[home], check)
    else:
        planner = planner_with(graphs)
        if entries is not None:  # the runtime runs the fixed plan; refused as it refuses one no layout holds
            planner.check_fixed_plan(entries)
    print(f"dry run: {world} GPUs ({topology.ranks_per_node} per node), hardware {hardware.name}, "
          f"{hardware.memory_bytes / 2**30:.2f} GiB per GPU, {len(candidates)} candidate layouts, home {names[home]}",
          flush=True)
    if settings.graph_buckets is not None and settings.graph_layer_overhead_seconds is None:
        print("graph buckets without --graph-layer-overhead: the start-up probe measures it; until then, and in "
              "this dry run, the graphs are priced as saving nothing", flush=True)
    if settings.graph_buckets is not None:
        bound = "every bucket static" if max_scores is None else \
            f"static while heads per rank * tokens^2 <= {max_scores}" if max_scores else "no bucket static"
        print(f"graph buckets {sorted(settings.graph_buckets)} with the {kernel} attention a GPU selects: {bound}",
              flush=True)
        if auto and batches:
            for tried, e in refused:
                print(f"graph layouts {','.join(tried)} not taken: with their graphs' copies {e}", flush=True)
            print(f"graph layouts (auto, from batch 1 planned without graph buckets): {','.join(chosen) or 'none'}",
                  flush=True)
    for step, batch in enumerate(batches):
        lengths = [len(s) for s in batch]
        plan = planner.plan(lengths) if entries is None else planner.plan_fixed(lengths, entries)
        print(f"\nbatch {step + 1}: {len(lengths)} sequences, {sum(lengths)} tokens, longest {max(lengths)}"
              + ("" if entries is None else f"; the fixed plan {settings.fixed_plan}"))
        print(_table(plan, planner, settings.min_gain if entries is None else None), flush=True)
        if entries is not None:
            planned = planner.plan(lengths).total_seconds
            print(f"the planner's own plan: {planned:.3f} s predicted; the fixed plan {plan.total_seconds:.3f} s, "
                  f"{plan.total_seconds / planned:.2f}x its time", flush=True)
    return 0


def _summary(results, runtime, world: int) -> dict:
    steps = len(results)
    seconds = sum(r.seconds for r in results)
    tokens = sum(r.tokens for r in results)
    switch = sum(r.switch_seconds for r in results)
    warm = runtime.prediction_errors[1:] or runtime.prediction_errors
    return {
        "steps": steps,
        "world": world,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else 0.0,
        "switch_seconds": round(switch, 3),
        "switch_share": round(switch / seconds, 4) if seconds else 0.0,
        "final_loss": results[-1].loss if results else None,
        "skipped_iterations": sum(int(r.skipped) for r in results),
        "losses": [r.loss for r in results],
        "step_seconds": [round(r.seconds, 4) for r in results],
        "step_tokens": [r.tokens for r in results],
        "step_switch_seconds": [round(r.switch_seconds, 4) for r in results],
        "step_layouts": [r.layouts for r in results],
        "prediction_errors": [round(e, 4) for e in runtime.prediction_errors],
        "pred_error_median": round(statistics.median(warm), 4) if warm else None,
        "layouts": sorted({l for r in results for l in r.layouts}),
        "home": runtime.home.name,
        "candidates": [l.name for l in runtime.candidates],
        # What the first step planned with: --hardware's, or measured here (--micro-batch-overhead).
        "planned_layer_overhead_seconds": runtime.settings.hardware.layer_overhead_seconds,
        # Under --graph-buckets, the layouts whose models capture graphs (None: every one that can).
        "graph_layouts": runtime.graph_layouts if runtime.settings.graph_buckets is not None else None,
    }


def _format_summary(s: dict) -> str:
    if not s["steps"]:
        return f"summary: no steps to run (the checkpoint is already at --train-iters); home {s['home']}"
    return (f"summary: {s['steps']} steps on {s['world']} ranks, {s['tokens']} tokens in {s['seconds']:.1f} s "
            f"({s['tokens_per_s']:,.0f} tok/s); time in switches {s['switch_seconds']:.2f} s "
            f"({100 * s['switch_share']:.1f}%); prediction error median {s['pred_error_median']}; "
            f"final loss {s['final_loss']:.4f}; layouts used {', '.join(s['layouts'])} (home {s['home']})")


if __name__ == "__main__":
    sys.exit(main())
