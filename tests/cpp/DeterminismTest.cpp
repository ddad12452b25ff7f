// Plans are pure functions of their inputs: every rank must build the same redistribution
// plan and the same step plan. Built twice, in different orders and from fresh caches, the
// plans must agree byte for byte (every field, doubles to the last bit).

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "PlanDump.h"
#include "TestModels.h"
#include "TestUtil.h"
#include "planner/Planner.h"
#include "redistribute/PlanCache.h"

namespace hotswitch {
namespace {

using testing::dumpPlan;
using testing::dumpStepPlan;
using testing::longTailed;
using testing::transformerSet;

struct PairKey {
  Layout from;
  Layout to;
  PlacementKind fromKind;
  PlacementKind toKind;
};

std::vector<PairKey> pairsOf(int world) {
  std::vector<PairKey> out;
  const std::vector<Layout> layouts = Layout::enumerate(world);
  for (const Layout& a : layouts) {
    for (const Layout& b : layouts) {
      out.push_back({a, b, PlacementKind::kSharded, PlacementKind::kSharded});
      out.push_back({a, b, PlacementKind::kPartial, PlacementKind::kZero});
    }
  }
  return out;
}

// Dumps of every pair's plan, built through a fresh cache in the given order of pairs.
std::vector<std::string> buildAll(const TensorSet& set, const Topology& topo, const std::vector<PairKey>& pairs,
                                  const std::vector<size_t>& order) {
  PlanCache cache;
  std::vector<std::string> out(pairs.size());
  for (size_t i : order) {
    const PairKey& p = pairs[i];
    out[i] = dumpPlan(cache.get(set, p.from, p.fromKind, p.to, p.toKind, topo)->plan);
  }
  return out;
}

TEST(DeterminismTest, RedistributionPlansAreTheSameInAnyOrderAndCache) {
  const Topology topo(6, 3);
  const TensorSet set = transformerSet(6, 12, /*tied=*/true);
  const std::vector<PairKey> pairs = pairsOf(6);
  std::vector<size_t> order(pairs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const std::vector<std::string> first = buildAll(set, topo, pairs, order);
  std::reverse(order.begin(), order.end());
  const std::vector<std::string> reversed = buildAll(set, topo, pairs, order);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  const std::vector<std::string> shuffled = buildAll(set, topo, pairs, order);
  for (size_t i = 0; i < pairs.size(); ++i) {
    SCOPED_TRACE(pairs[i].from.name() + " -> " + pairs[i].to.name());
    EXPECT_EQ(first[i], reversed[i]);
    EXPECT_EQ(first[i], shuffled[i]);
    if (i % 5) continue;  // and without any cache, for a fifth of the pairs
    const Placement from = Placement::make(set, pairs[i].from, pairs[i].fromKind);
    const Placement to = Placement::make(set, pairs[i].to, pairs[i].toKind);
    EXPECT_EQ(first[i], dumpPlan(RedistributionPlan::build(set, from, to, topo)));
  }
}

Planner makePlanner() {
  CostModel cost(ModelConfig::preset("llama-7b"), HardwareProfile::preset("a800"), Topology(8, 8),
                 CostOptions{true, 4, 12});
  std::vector<Layout> layouts{Layout(8, 1, 1), Layout(4, 2, 1), Layout(2, 4, 1), Layout(1, 8, 1), Layout(2, 2, 2)};
  const size_t n = layouts.size();
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) sw[i][j] = i == j ? 0 : 0.01 * static_cast<double>(1 + (i * 7 + j * 3) % 5);
  }
  std::vector<double> grad(n, 0.02), partial(n, 0.015);
  grad[0] = partial[0] = 0;
  PlannerOptions options;
  options.boundaryCandidates = 32;  // quantile cuts for the larger batches
  options.maxContext = 16384;
  options.longSequences = LongSequences::kSplit;
  return Planner(cost, layouts, 0, SwitchCosts{sw, grad, partial}, options);
}

TEST(DeterminismTest, StepPlansAreTheSameFromAnyPlannerInAnyOrder) {
  std::vector<std::vector<int64_t>> batches;
  for (unsigned seed = 1; seed <= 6; ++seed) batches.push_back(longTailed(seed * 40, seed));
  batches.push_back({1, 2, 3, 31991, 7});
  const Planner planner = makePlanner();
  std::vector<std::string> first;
  for (const auto& lengths : batches) first.push_back(dumpStepPlan(planner.plan(lengths)));
  // The same planner again, backwards; then a fresh one.
  for (size_t i = batches.size(); i-- > 0;) EXPECT_EQ(dumpStepPlan(planner.plan(batches[i])), first[i]) << "batch " << i;
  const Planner fresh = makePlanner();
  for (size_t i = 0; i < batches.size(); ++i) EXPECT_EQ(dumpStepPlan(fresh.plan(batches[i])), first[i]) << "batch " << i;
  // The dump is not trivially equal: different batches give different plans.
  EXPECT_NE(first[0], first[1]);
}

}  // namespace
}  // namespace hotswitch
