// World-1 plans between every pair of placement kinds, through the cache: the switch a
// one-GPU run makes between a layout's shards, its ZeRO buffer and its gradient summands
// (dp1 "sharded" -> dp1 "zero" is the plan that once crashed a CUDA build). On the tied test
// set in fp32 and bf16, simulated element by element, and on LLaMA-7B in bf16, whose plan is
// checked by its byte counts.

#include "redistribute/PlanCache.h"

#include <gtest/gtest.h>

#include "TestModels.h"

namespace hotswitch {
namespace {

using testing::llama7b;
using testing::simulate;
using testing::transformerSet;

const PlacementKind kFromKinds[] = {PlacementKind::kSharded, PlacementKind::kZero, PlacementKind::kPartial};
const PlacementKind kToKinds[] = {PlacementKind::kSharded, PlacementKind::kZero};

int64_t totalBytes(const TensorSet& set) {
  int64_t bytes = 0;
  for (const ParamSpec& s : set.specs) bytes += s.bytes();
  return bytes;
}

std::string pairName(PlacementKind from, PlacementKind to) {
  return std::string(placementKindName(from)) + " -> " + placementKindName(to);
}

class WorldOnePlanTest : public ::testing::TestWithParam<DType> {};

TEST_P(WorldOnePlanTest, EveryPlacementPairOfTheTiedSetCopiesEveryElementLocally) {
  const TensorSet set = transformerSet(8, 16, /*tied=*/true, GetParam());
  const Layout dp1 = Layout::parse("dp1");
  const Topology topo(1, 1);
  PlanCache cache;
  for (PlacementKind from : kFromKinds) {
    for (PlacementKind to : kToKinds) {
      bool hit = true;
      auto cached = cache.get(set, dp1, from, dp1, to, topo, PlanOptions{}, &hit);
      ASSERT_TRUE(cached) << pairName(from, to);
      EXPECT_FALSE(hit) << pairName(from, to);
      const RedistributionPlan& plan = cached->plan;
      EXPECT_TRUE(plan.messages.empty()) << pairName(from, to);
      EXPECT_EQ(plan.stats.bytesMoved, 0) << pairName(from, to);
      EXPECT_EQ(plan.stats.localCopyBytes, totalBytes(set)) << pairName(from, to);
      const auto report = simulate(set, cached->from, cached->to, topo, plan);
      EXPECT_EQ(report.wrongValue, 0) << pairName(from, to);
      EXPECT_EQ(report.wrongWrites, 0) << pairName(from, to);
      EXPECT_EQ(report.strayWrites, 0) << pairName(from, to);
      cache.get(set, dp1, from, dp1, to, topo, PlanOptions{}, &hit);
      EXPECT_TRUE(hit) << pairName(from, to);
    }
  }
  EXPECT_EQ(cache.size(), std::size(kFromKinds) * std::size(kToKinds));
}

INSTANTIATE_TEST_SUITE_P(DTypes, WorldOnePlanTest, ::testing::Values(DType::kFloat32, DType::kBFloat16),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

TEST(WorldOnePlanTest, EveryPlacementPairOfLlama7bCopiesItsBytesOnce) {
  const TensorSet set = llama7b();
  const Layout dp1 = Layout::parse("dp1");
  PlanCache cache;
  for (PlacementKind from : kFromKinds) {
    for (PlacementKind to : kToKinds) {
      auto cached = cache.get(set, dp1, from, dp1, to, Topology(1, 1));
      EXPECT_TRUE(cached->plan.messages.empty()) << pairName(from, to);
      EXPECT_EQ(cached->plan.stats.localCopyBytes, totalBytes(set)) << pairName(from, to);
      ASSERT_EQ(cached->plan.dstBuffers.size(), 1u);
      int64_t dstBytes = 0;
      for (const BufferSpec& b : cached->plan.dstBuffers[0]) dstBytes += b.numel() * elementSize(b.dtype);
      EXPECT_EQ(dstBytes, totalBytes(set)) << pairName(from, to);
    }
  }
}

}  // namespace
}  // namespace hotswitch
