#pragma once

// Packs one phase's sequences into micro-batches: balanced across data-parallel replicas and
// pipeline slots by predicted time (attention is quadratic, so not by tokens), each
// micro-batch within a token budget (what fits in memory).
//
// Replicas: longest-predicted-time first, each sequence to the replica with the least
// predicted time so far (LPT), so the slowest replica exceeds the mean by at most one
// sequence; then, while it lowers the slowest replica's time, one of its sequences moves to
// another replica or swaps with a cheaper one there (the exchange leaving the lower maximum of
// the two; partners: every replica when the slowest holds few sequences, else the four least
// loaded; at most 2 * replicas exchanges, none once the slowest is within 0.1% of the mean).
// That one sequence is what matters when replicas
// hold a few long sequences each: LPT leaves the slowest up to a sequence above the mean,
// which the exchanges mostly close. Micro-batches of a replica: max(ceil(tokens / budget), ceil(cost / target),
// minMicroBatches) slots, capped at the sequence count, filled the same way among the slots
// with room; a sequence that fits no open slot opens a new one. Deterministic: ties go to the
// lower index.

#include <cstdint>
#include <functional>
#include <vector>

namespace hotswitch {

struct PackOptions {
  int64_t maxTokensPerMicroBatch = 4096;
  int minMicroBatches = 1;  // e.g. the pipeline depth, to fill the 1F1B schedule
  // > 0: micro-batches of about this predicted cost each (a pipeline's bubble grows with its
  // largest micro-batch); 0: as few micro-batches as the token budget allows.
  double targetMicroBatchCost = 0;
};

struct Packing {
  // microBatches[replica][k]: indices into the input lengths, in packing order.
  std::vector<std::vector<std::vector<int>>> microBatches;
  std::vector<double> replicaCost;  // predicted time units per replica

  // Sequence lengths in the layout the cost model takes: [replica][k] -> lengths.
  std::vector<std::vector<std::vector<int64_t>>> lengths(const std::vector<int64_t>& all) const;
};

class Packer {
 public:
  using CostFn = std::function<double(int64_t)>;

  // Throws InvalidArgument for replicas < 1, a budget < 1, a negative target, a length < 1,
  // a sequence longer than the budget (naming its index and length), or a cost that is
  // negative or not finite.
  static Packing pack(const std::vector<int64_t>& lengths, int replicas, const PackOptions& options,
                      const CostFn& cost);

  // cu_seqlens of one micro-batch: [0, l0, l0 + l1, ...] (int64, length n + 1).
  static std::vector<int64_t> cuSeqlens(const std::vector<int64_t>& lengths,
                                        const std::vector<int>& microBatch);
};

}  // namespace hotswitch
