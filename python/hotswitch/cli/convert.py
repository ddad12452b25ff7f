"""Converts model weights between hotswitch's layout-independent checkpoints and the Hugging
Face LLaMA layout (``config.json`` and safetensors):

    python -m hotswitch.convert --load ckpt/step_00000100 --save hf_model/     # out
    python -m hotswitch.convert --load hf_model/ --save ckpt_from_hf/          # in

The direction follows ``--load``: a directory with ``config.json`` is a Hugging Face model, one
with ``metadata.json`` (or a ``latest`` file) a hotswitch checkpoint. Going out, the model's
sizes come from the checkpoint (``python -m hotswitch.train`` saves them); for checkpoints
without them, give ``--num-attention-heads`` and ``--max-position-embeddings``. Coming in,
the result is a weights-only checkpoint that ``python -m hotswitch.train --load`` starts from
(under any layout; the optimizer starts afresh). Values are copied bit for bit unless
``--dtype`` casts them (``--dtype bfloat16`` for a bf16 release). Going out, the weights are
cut into shards of ``--max-shard-size`` with ``model.safetensors.index.json``, as
``save_pretrained`` writes them; ``--vocab-size`` drops the padded vocabulary rows; and
``--tokenizer-model`` copies the tokenizer files beside them. See ``hotswitch.huggingface`` for
the names and the rotary layout.

``--ckpt-format hotswitch|torch_dist`` instead re-saves a training checkpoint (hotswitch's
format or ``torch.distributed.checkpoint``'s, either way) in that format, whole: weights,
optimizer state, step and data position (one process loads and saves it):

    python -m hotswitch.convert --load ckpt/step_00000100 --save dcp_ckpt/ --ckpt-format torch_dist
"""

import argparse
import dataclasses
import os
import sys
from typing import List, Optional

import torch

from hotswitch.checkpoint import read_tensors, write_tensors
from hotswitch.huggingface import config_from_tensors, load_hf, save_hf
from hotswitch.model.config import DTYPES, TransformerConfig

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hotswitch.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="a hotswitch checkpoint or a Hugging Face model directory")
    p.add_argument("--save", required=True, help="the Hugging Face directory or checkpoint root to write")
    p.add_argument("--dtype", default=None, choices=DTYPES, help="cast the weights (default: as stored)")
    p.add_argument("--ckpt-format", default=None, choices=("hotswitch", "torch_dist"),
                   help="re-save the training checkpoint of --load in this format under --save (weights, optimizer "
                        "state, step, data position), instead of converting to or from Hugging Face")
    p.add_argument("--max-shard-size", default="5GB", type=_size,
                   help="largest safetensors shard going out: bytes, or with a KB/MB/GB suffix (default %(default)s)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="going out, the tokenizer's vocabulary: embedding and head rows beyond it (padding) are "
                        "dropped (default: all rows)")
    p.add_argument("--tokenizer-model", default=None, metavar="DIR_OR_FILE",
                   help="going out, copy this tokenizer's files (tokenizer.json, tokenizer.model, ...) beside the "
                        "weights")
    m = p.add_argument_group("model, for checkpoints that do not record it")
    m.add_argument("--num-attention-heads", type=int, default=None)
    m.add_argument("--max-position-embeddings", type=int, default=None)
    m.add_argument("--rotary-base", type=float, default=10000.0, help="rope_theta")
    m.add_argument("--norm-epsilon", type=float, default=1e-5, help="rms_norm_eps")
    return p


def _size(text: str) -> int:
    """``"5GB"``, ``"500MB"``, ``"1000"``: bytes (decimal units, as transformers counts)."""
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "B": 1}
    t = text.strip().upper()
    for suffix, scale in units.items():
        if t.endswith(suffix):
            number, unit = t[:-len(suffix)], scale
            break
    else:
        number, unit = t, 1
    try:
        value = int(float(number) * unit)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or a number with KB, MB or GB)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a shard must hold at least 1 byte")
    return value


def _config(args, meta: dict, tensors, where: str) -> TransformerConfig:
    model = (meta.get("extra") or {}).get("model") if isinstance(meta.get("extra"), dict) else None
    if isinstance(model, dict):
        try:
            return TransformerConfig(**model)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}/metadata.json: extra.model is not a model config ({e})") from None
    if args.num_attention_heads is None or args.max_position_embeddings is None:
        raise ValueError(f"{where} does not record its model config: give --num-attention-heads and "
                         "--max-position-embeddings")
    return config_from_tensors(tensors, args.num_attention_heads, args.max_position_embeddings,
                               args.rotary_base, args.norm_epsilon, where)


def _reformat(rank, world, src: str, dst: str, ckpt_format: str, model: dict) -> str:
    """Loads a training checkpoint into a one-process runtime and saves it in ``ckpt_format``."""
    from hotswitch.runtime import Runtime

    config = TransformerConfig(**model)
    runtime = Runtime(config, candidates="auto", max_context=config.max_position_embeddings,
                         memory_budget_bytes=1 << 50, recalibrate=False)
    info = runtime.load_checkpoint(src)
    return runtime.save_checkpoint(dst, data_state=info["data_state"], extra=info["extra"], ckpt_format=ckpt_format)


def _checkpoint_model(src: str) -> dict:
    """``extra.model`` of a training checkpoint of either format (a step directory or a root)."""
    from hotswitch.checkpoint import latest_checkpoint
    from hotswitch.dist_checkpoint import MARKER
    from hotswitch._checks import read_json_object

    path = src if not os.path.isfile(os.path.join(src, "latest")) else (latest_checkpoint(src) or src)
    for name in ("metadata.json", MARKER):
        if os.path.isfile(os.path.join(path, name)):
            meta = read_json_object(os.path.join(path, name), "checkpoint metadata")
            model = (meta.get("extra") or {}).get("model") if isinstance(meta.get("extra"), dict) else None
            if not isinstance(model, dict):
                raise ValueError(f"{path}/{name} records no model config (extra.model): checkpoints of "
                                 "python -m hotswitch.train do")
            return model
    raise ValueError(f"--load {src!r} is not a training checkpoint (no metadata.json or {MARKER})")


def convert(args) -> str:
    """Runs one conversion; returns a line saying what was written."""
    src = args.load
    if args.ckpt_format is not None:
        from hotswitch.distributed import spawn

        model = _checkpoint_model(src)
        try:
            path = spawn(1, _reformat, src, args.save, args.ckpt_format, model, timeout=3600)[0]
        except RuntimeError as e:
            raise ValueError(str(e).splitlines()[-1] if str(e) else "conversion failed") from None
        return f"checkpoint {src} -> {path} ({args.ckpt_format})"
    if os.path.isfile(os.path.join(src, "config.json")):
        tensors, config = load_hf(src, args.dtype)
        path = write_tensors(args.save, tensors, step=0,
                             extra={"model": dataclasses.asdict(config), "converted_from": os.path.abspath(src)})
        return f"{len(tensors)} tensors of {src} (Hugging Face LLaMA, {config.dtype}) -> checkpoint {path}"
    if os.path.isfile(os.path.join(src, "metadata.json")) or os.path.isfile(os.path.join(src, "latest")):
        tensors, meta = read_tensors(src)
        config = _config(args, meta, tensors, src)
        if args.dtype is not None:
            tensors = {k: v.to(getattr(torch, args.dtype)) for k, v in tensors.items()}
            config = dataclasses.replace(config, dtype=args.dtype)
        written = save_hf(args.save, tensors, config, max_shard_bytes=args.max_shard_size,
                          vocab_size=args.vocab_size, tokenizer=args.tokenizer_model)
        return f"{len(tensors)} tensors of checkpoint {src} (step {meta['step']}) -> {', '.join(written)}"
    raise ValueError(f"--load {src!r} holds neither config.json (a Hugging Face model) nor metadata.json or "
                     "latest (a hotswitch checkpoint)")


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        print(convert(args), flush=True)
    except ValueError as e:
        parser.error(str(e))
    except OSError as e:
        parser.error(f"{e.filename or args.save}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
