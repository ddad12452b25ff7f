#include "planner/Packer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <utility>

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
      l.reserve(mb.size());
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
  HS_CHECK(options.targetMicroBatchCost >= 0, "target_micro_batch_cost must be >= 0, got ",
           options.targetMicroBatchCost);
  std::vector<double> costs(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    HS_CHECK(lengths[i] >= 1, "sequence ", i, " has length ", lengths[i], ", expected >= 1");
    HS_CHECK(lengths[i] <= options.maxTokensPerMicroBatch, "sequence ", i, " of length ", lengths[i],
             " exceeds the micro-batch budget of ", options.maxTokensPerMicroBatch, " tokens");
    costs[i] = cost(lengths[i]);
    // NaN would break the ordering of the load sets below.
    HS_CHECK(std::isfinite(costs[i]) && costs[i] >= 0, "sequence ", i, " of length ", lengths[i],
             " has predicted cost ", costs[i], ", expected finite and >= 0");
  }
  std::vector<int> all(lengths.size());
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int> sorted = byCost(all, costs);

  Packing out;
  out.microBatches.resize(replicas);
  out.replicaCost.assign(replicas, 0.0);
  std::vector<std::vector<int>> perReplica(replicas);
  {
    std::set<std::pair<double, int>> load;  // (cost so far, replica): the least loaded first
    for (int r = 0; r < replicas; ++r) load.insert({0.0, r});
    for (int i : sorted) {
      auto [c, r] = *load.begin();
      load.erase(load.begin());
      perReplica[r].push_back(i);  // already in decreasing cost order
      out.replicaCost[r] = c + costs[i];
      load.insert({out.replicaCost[r], r});
    }
  }

  for (int r = 0; r < replicas; ++r) {
    const auto& items = perReplica[r];
    if (items.empty()) continue;
    int64_t tokens = 0;
    for (int i : items) tokens += lengths[i];
    double slots = std::ceil(static_cast<double>(tokens) / options.maxTokensPerMicroBatch);
    if (options.targetMicroBatchCost > 0) slots = std::max(slots, std::ceil(out.replicaCost[r] / options.targetMicroBatchCost));
    slots = std::max(slots, static_cast<double>(options.minMicroBatches));
    slots = std::min(slots, static_cast<double>(items.size()));
    std::vector<std::vector<int>> mbs(static_cast<size_t>(slots));
    std::vector<double> mbCost(mbs.size(), 0.0);
    std::vector<int64_t> mbTokens(mbs.size(), 0);
    std::set<std::pair<double, int>> open;  // (cost so far, slot)
    for (size_t k = 0; k < mbs.size(); ++k) open.insert({0.0, static_cast<int>(k)});
    for (int i : items) {
      auto it = open.begin();
      while (it != open.end() && mbTokens[it->second] + lengths[i] > options.maxTokensPerMicroBatch) ++it;
      int best;
      if (it == open.end()) {
        best = static_cast<int>(mbs.size());
        mbs.emplace_back();
        mbCost.push_back(0);
        mbTokens.push_back(0);
      } else {
        best = it->second;
        open.erase(it);
      }
      mbs[best].push_back(i);
      mbCost[best] += costs[i];
      mbTokens[best] += lengths[i];
      if (mbTokens[best] < options.maxTokensPerMicroBatch) open.insert({mbCost[best], best});
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
