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

// Rebalancing (Packer.h): pairs of (slowest replica's sequence, partner's sequence) searched
// per round against every other replica while there are at most this many, else against the
// kRebalancePartners least loaded replicas.
constexpr size_t kRebalanceWork = 4096;
constexpr int kRebalancePartners = 4;
// The slowest replica this close to the mean (relatively) is left as it is.
constexpr double kRebalanceTolerance = 1e-3;

// Lowers the slowest replica's cost by moving one of its sequences to another replica, or
// swapping it for a cheaper one there, while an exchange lowers it; each round takes the
// exchange whose larger replica cost afterwards is least (ties: partner, then positions).
void rebalance(std::vector<std::vector<int>>& perReplica, std::vector<double>& load, const std::vector<double>& costs,
               size_t items) {
  const int replicas = static_cast<int>(load.size());
  if (replicas < 2) return;
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / replicas;
  std::vector<int> partners;
  for (int round = 0; round < 2 * replicas; ++round) {
    const int a = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    if (load[a] - mean <= kRebalanceTolerance * load[a]) return;
    partners.resize(replicas);
    std::iota(partners.begin(), partners.end(), 0);
    partners.erase(partners.begin() + a);
    const auto byLoad = [&](int x, int y) { return load[x] != load[y] ? load[x] < load[y] : x < y; };
    if (perReplica[a].size() * items > kRebalanceWork && static_cast<int>(partners.size()) > kRebalancePartners) {
      std::nth_element(partners.begin(), partners.begin() + kRebalancePartners, partners.end(), byLoad);
      partners.resize(kRebalancePartners);
    }
    std::sort(partners.begin(), partners.end());
    double best = load[a];
    int bestPartner = -1, bestMine = -1, bestTheirs = -1;  // theirs -1: a move
    for (int b : partners) {
      for (size_t i = 0; i < perReplica[a].size(); ++i) {
        const double x = costs[perReplica[a][i]];
        const double moved = std::max(load[a] - x, load[b] + x);
        if (moved < best) {
          best = moved;
          bestPartner = b, bestMine = static_cast<int>(i), bestTheirs = -1;
        }
        for (size_t j = 0; j < perReplica[b].size(); ++j) {
          const double y = costs[perReplica[b][j]];
          if (y >= x) continue;
          const double swapped = std::max(load[a] - x + y, load[b] + x - y);
          if (swapped < best) {
            best = swapped;
            bestPartner = b, bestMine = static_cast<int>(i), bestTheirs = static_cast<int>(j);
          }
        }
      }
    }
    if (bestPartner < 0) return;
    auto& mine = perReplica[a];
    auto& theirs = perReplica[bestPartner];
    const int x = mine[bestMine];
    if (bestTheirs < 0) {
      mine.erase(mine.begin() + bestMine);
      theirs.push_back(x);
      load[a] -= costs[x];
      load[bestPartner] += costs[x];
    } else {
      const int y = theirs[bestTheirs];
      mine[bestMine] = y;
      theirs[bestTheirs] = x;
      load[a] += costs[y] - costs[x];
      load[bestPartner] += costs[x] - costs[y];
    }
  }
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
      perReplica[r].push_back(i);
      out.replicaCost[r] = c + costs[i];
      load.insert({out.replicaCost[r], r});
    }
  }
  rebalance(perReplica, out.replicaCost, costs, lengths.size());
  for (int r = 0; r < replicas; ++r) {
    perReplica[r] = byCost(perReplica[r], costs);  // the slots fill in decreasing cost
    out.replicaCost[r] = 0;  // summed afresh: the exchanges added and subtracted
    for (int i : perReplica[r]) out.replicaCost[r] += costs[i];
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
