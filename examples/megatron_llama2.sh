#!/usr/bin/env bash
# A Megatron-LM LLaMA-2 pretraining script, written as Megatron-LM's examples write them
# (argument groups, checkpoint, TensorBoard and data paths as arguments), at a size a CPU runs.
# The launcher line is the only thing that differs between the two programs:
#
#   LAUNCH="torchrun --nproc-per-node 2 pretrain_gpt.py" \
#     examples/megatron_llama2.sh CKPT_DIR TB_DIR TOKENIZER_MODEL DATA_PREFIX   # Megatron-LM
#   examples/megatron_llama2.sh CKPT_DIR TB_DIR TOKENIZER_MODEL DATA_PREFIX    # hotswitch (default LAUNCH)
#
# Arguments after the four paths are passed on (e.g. --hot-switch for a layout per bucket of
# lengths; without it hotswitch trains under the one layout the script names, as Megatron-LM).
# tests/python/data/test_megatron_script.py runs it.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: $0 CKPT_DIR TB_DIR TOKENIZER_MODEL DATA_PREFIX [more arguments]" >&2
  exit 2
fi
CHECKPOINT_PATH=$1 TENSORBOARD_LOGS_PATH=$2 TOKENIZER_MODEL=$3 DATA_PATH=$4
shift 4
LAUNCH=${LAUNCH:-"torchrun --standalone --nproc-per-node 2 -m hotswitch.train"}

GPT_MODEL_ARGS=(
  --num-layers 2 --hidden-size 64 --ffn-hidden-size 172 --num-attention-heads 4
  --group-query-attention --num-query-groups 2
  --seq-length 128 --max-position-embeddings 128
  --position-embedding-type rope --rotary-base 10000 --normalization RMSNorm --norm-epsilon 1e-5
  --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
  --attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.02
)
TRAINING_ARGS=(
  --micro-batch-size 1 --global-batch-size 4 --train-iters 3
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0
  --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 1
  --bf16 --use-distributed-optimizer --use-flash-attn --no-masked-softmax-fusion
  --attention-softmax-in-fp32 --seed 1234
)
MODEL_PARALLEL_ARGS=(
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --sequence-parallel
)
DATA_ARGS=(
  --data-path "$DATA_PATH" --split 949,50,1
  --tokenizer-type Llama2Tokenizer --tokenizer-model "$TOKENIZER_MODEL"
)
EVAL_AND_LOGGING_ARGS=(
  --log-interval 1 --save-interval 1000 --eval-interval 1000 --eval-iters 1
  --save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH" --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)

# shellcheck disable=SC2086  # LAUNCH is a command line
exec $LAUNCH "${GPT_MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" "${MODEL_PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}" \
  "${EVAL_AND_LOGGING_ARGS[@]}" "$@"
