"""Hot-switch training from a plain PyTorch script.

    torchrun --nproc-per-node 4 examples/train_hot_switch.py
    python -m hotswitch.launch --nproc-per-node 4 examples/train_hot_switch.py   # without torchrun

Each step's documents are bucketed by length and each bucket runs under the layout the
planner picks for it (data parallel for short documents, tensor or pipeline parallel for
the long ones that would not fit in the per-rank memory budget otherwise).
"""

import torch

import hotswitch as hs
from hotswitch.data import Corpus, LengthAwareSampler

rank, world, _ = hs.init_distributed()
torch.set_num_threads(1)

config = hs.TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                              ffn_hidden_size=192, vocab_size=384, max_position_embeddings=1024,
                              tied_embedding=True)
runtime = hs.Runtime(config, candidates="auto", memory_budget_bytes=12 << 20, max_context=1024,
                     optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3))
sampler = LengthAwareSampler(Corpus(unit="block", max_files=200), max_length=1024, global_batch_size=64)

for step in range(5):
    result = runtime.train_step(sampler.next_batch())
    if rank == 0:
        print(f"step {result.step}: loss {result.loss:.3f}, {result.tokens} tokens in {result.seconds:.2f} s, "
              f"phases {' -> '.join(result.layouts)}")

torch.distributed.destroy_process_group()
