#include "planner/Packer.h"

#include <algorithm>
#include <numeric>

#include "common/Check.h"

namespace hotswitch {

namespace {

// Indices sorted by decreasing cost, ties by index.
std::vector<int> byCost(const std::vector<int>& items, const std::vector<double>& costs) {
  std::vector<int> out = items;
  std::stable_sort(out.begin(), out.end(), [&](int a, int b) { return costs[a] > costs[b]; });
  return out;
}

}  // namespace

std::vector<std::vector<std::vector<int64_t>>> Packing::lengths(const std::vector<int64_t>& all) const {
  std::vector<std::vector<std::vector<int64_t>>> out(microBatches.size());
  for (size_t r = 0; r < microBatches.size(); ++r) {
    for (const auto& mb : microBatches[r]) {
      std::vector<int64_t> l;
      for (int i : mb) l.push_back(all.at(i));
      out[r].push_back(std::move(l));
    }
  }
  return out;
}

Packing Packer::pack(const std::vector<int64_t>& lengths, int replicas, const PackOptions& options,
                     const CostFn& cost) {
  HS_CHECK(replicas >= 1, "replicas must be >= 1, got ", replicas);
  HS_CHECK(options.maxTokensPerMicroBatch >= 1, "max_tokens_per_micro_batch must be >= 1, got ",
           options.maxTokensPerMicroBatch);
  HS_CHECK(options.minMicroBatches >= 1, "min_micro_batches must be >= 1, got ", options.minMicroBatches);
  std::vector<double> costs(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    HS_CHECK(lengths[i] >= 1, "sequence ", i, " has length ", lengths[i], ", expected >= 1");
    HS_CHECK(lengths[i] <= options.maxTokensPerMicroBatch, "sequence ", i, " of length ", lengths[i],
             " exceeds the micro-batch budget of ", options.maxTokensPerMicroBatch, " tokens");
    costs[i] = cost(lengths[i]);
  }
  std::vector<int> all(lengths.size());
  std::iota(all.begin(), all.end(), 0);

  Packing out;
  out.microBatches.resize(replicas);
  out.replicaCost.assign(replicas, 0.0);
  std::vector<std::vector<int>> perReplica(replicas);
  for (int i : byCost(all, costs)) {
    int r = static_cast<int>(std::min_element(out.replicaCost.begin(), out.replicaCost.end()) -
                             out.replicaCost.begin());
    perReplica[r].push_back(i);
    out.replicaCost[r] += costs[i];
  }

  for (int r = 0; r < replicas; ++r) {
    const auto& items = perReplica[r];
    if (items.empty()) continue;
    int64_t tokens = 0;
    for (int i : items) tokens += lengths[i];
    int64_t slots = (tokens + options.maxTokensPerMicroBatch - 1) / options.maxTokensPerMicroBatch;
    slots = std::max<int64_t>(slots, options.minMicroBatches);
    slots = std::min<int64_t>(slots, static_cast<int64_t>(items.size()));
    std::vector<std::vector<int>> mbs(slots);
    std::vector<double> mbCost(slots, 0.0);
    std::vector<int64_t> mbTokens(slots, 0);
    for (int i : byCost(items, costs)) {
      int best = -1;
      for (size_t k = 0; k < mbs.size(); ++k) {
        if (mbTokens[k] + lengths[i] > options.maxTokensPerMicroBatch) continue;
        if (best < 0 || mbCost[k] < mbCost[best]) best = static_cast<int>(k);
      }
      if (best < 0) {
        mbs.emplace_back();
        mbCost.push_back(0);
        mbTokens.push_back(0);
        best = static_cast<int>(mbs.size()) - 1;
      }
      mbs[best].push_back(i);
      mbCost[best] += costs[i];
      mbTokens[best] += lengths[i];
    }
    for (auto& mb : mbs) {
      if (!mb.empty()) out.microBatches[r].push_back(std::move(mb));
    }
  }
  return out;
}

std::vector<int64_t> Packer::cuSeqlens(const std::vector<int64_t>& lengths, const std::vector<int>& microBatch) {
  std::vector<int64_t> cu{0};
  for (int i : microBatch) {
    HS_CHECK(i >= 0 && i < static_cast<int>(lengths.size()), "sequence index ", i, " outside [0, ",
             lengths.size(), ")");
    cu.push_back(cu.back() + lengths[i]);
  }
  return cu;
}

}  // namespace hotswitch
