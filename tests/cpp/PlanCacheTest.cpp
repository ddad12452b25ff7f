// World-1 plans between every pair of placement kinds, through the cache: the switch a
// one-GPU run makes between a layout's shards, its ZeRO buffer and its gradient summands
// (dp1 "sharded" -> dp1 "zero" is the plan that once crashed a CUDA build). On the tied test
// set in fp32 and bf16, simulated element by element, and on LLaMA-7B in bf16, whose plan is
// checked by its byte counts.

#include "redistribute/PlanCache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

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

// The cache's key: equal sets hash alike, and a change of any one field of any spec (or of
// the layer count, or of the specs' order) changes the hash.
TEST(TensorSetFingerprintTest, FollowsEveryField) {
  const TensorSet base = transformerSet(2, 8, /*tied=*/false, DType::kBFloat16);
  EXPECT_EQ(base.fingerprint(), transformerSet(2, 8, false, DType::kBFloat16).fingerprint());
  ASSERT_GE(base.specs.size(), 4u);
  std::vector<std::pair<std::string, TensorSet>> changed;
  auto change = [&](const std::string& what, const std::function<void(TensorSet&)>& edit) {
    TensorSet set = base;
    edit(set);
    changed.emplace_back(what, set);
  };
  int fused = -1;
  for (size_t i = 0; i < base.specs.size(); ++i) {
    if (base.specs[i].rule == ShardRule::kFusedColumn) fused = static_cast<int>(i);
  }
  ASSERT_GE(fused, 0);
  int layer = 1;  // a layer's spec
  while (base.specs[layer].stage != StageRole::kLayer) ++layer;
  change("num_layers", [](TensorSet& s) { s.numLayers += 1; });
  change("name", [](TensorSet& s) { s.specs[1].name += "x"; });
  change("shape", [](TensorSet& s) { s.specs[1].shape[0] += 1; });
  change("rank", [](TensorSet& s) { s.specs[1].shape.push_back(1); });
  change("dtype", [](TensorSet& s) { s.specs[1].dtype = DType::kFloat32; });
  change("rule", [](TensorSet& s) { s.specs[1].rule = s.specs[1].rule == ShardRule::kRow ? ShardRule::kColumn
                                                                                          : ShardRule::kRow; });
  change("groups", [&](TensorSet& s) { std::reverse(s.specs[fused].groups.begin(), s.specs[fused].groups.end());
                                       s.specs[fused].groups[0] += 1; s.specs[fused].groups[1] -= 1; });
  change("stage", [&](TensorSet& s) { s.specs[layer].stage = StageRole::kFirstAndLast; });
  change("layer", [&](TensorSet& s) { s.specs[layer].layer = 1 - s.specs[layer].layer; });
  change("order", [](TensorSet& s) { std::swap(s.specs[1], s.specs[2]); });
  change("a name's end moved into the next", [](TensorSet& s) {
    s.specs[1].name += s.specs[2].name.substr(0, 1);
    s.specs[2].name = s.specs[2].name.substr(1);
  });
  std::set<uint64_t> seen{base.fingerprint()};
  for (const auto& [what, set] : changed) {
    EXPECT_NE(set.fingerprint(), base.fingerprint()) << what;
    EXPECT_TRUE(seen.insert(set.fingerprint()).second) << what << " hashes like another change";
  }
}

}  // namespace
}  // namespace hotswitch
