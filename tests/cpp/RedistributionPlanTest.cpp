#include "redistribute/RedistributionPlan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "PlanChecks.h"
#include "TestModels.h"
#include "common/Check.h"

namespace hotswitch {
namespace {

using testing::simulate;
using testing::transformerSet;

using GridCase = testing::PlanCase;

class PlanGridTest : public ::testing::TestWithParam<GridCase> {};

// Every ordered pair of layouts of the world: every destination element arrives exactly once
// (per summand) with the right value, the plan moves exactly the lower-bound bytes and
// inter-node bytes, its stated same-node-first optimum equals the one recomputed element by
// element (worlds up to 12), its largest send is within rounding of that optimum, and
// rebuilding it gives the same plan.
TEST_P(PlanGridTest, EveryPairDeliversExactlyTheLowerBound) {
  const GridCase& c = GetParam();
  Topology topo(c.world, c.ranksPerNode);
  TensorSet set = transformerSet(c.world, 2 * c.world, c.tied);
  std::vector<Layout> layouts = Layout::enumerate(c.world);
  int pairs = 0;
  for (const Layout& a : layouts) {
    for (const Layout& b : layouts) {
      testing::expectLowerBoundPlan(set, a, b, topo, c, c.world <= 12);
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, static_cast<int>(layouts.size() * layouts.size()));
}

std::vector<GridCase> gridCases() {
  std::vector<GridCase> out;
  for (int w = 1; w <= 16; ++w) {
    out.push_back({w, w, PlacementKind::kSharded, PlacementKind::kSharded});
    if (w % 2 == 0) out.push_back({w, w / 2, PlacementKind::kSharded, PlacementKind::kSharded});
    if (w % 4 == 0) out.push_back({w, w / 2, PlacementKind::kSharded, PlacementKind::kSharded, false, true});
    if (w <= 8) {
      out.push_back({w, w, PlacementKind::kSharded, PlacementKind::kZero});
      out.push_back({w, w, PlacementKind::kZero, PlacementKind::kSharded});
      out.push_back({w, w, PlacementKind::kPartial, PlacementKind::kSharded});
      if (w % 2 == 0) out.push_back({w, w / 2, PlacementKind::kPartial, PlacementKind::kZero});
      if (w % 2 == 0) out.push_back({w, w / 2, PlacementKind::kPartial, PlacementKind::kZero, false, true});
      out.push_back({w, w, PlacementKind::kPartial, PlacementKind::kSharded, /*tied=*/true});
      out.push_back({w, w, PlacementKind::kSharded, PlacementKind::kSharded, /*tied=*/true});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, PlanGridTest, ::testing::ValuesIn(gridCases()), testing::planCaseName);

TEST(RedistributionPlanTest, ReplicasShareTheSends) {
  // tp4 -> dp4 on 4 ranks: every rank needs the three quarters it lacks; each quarter has
  // exactly one owner, so every rank sends 3/4 of the set.
  TensorSet set = transformerSet(1, 8);
  Topology topo(4, 4);
  auto plan = RedistributionPlan::build(set, Placement::make(set, Layout(1, 4, 1)),
                                        Placement::make(set, Layout(4, 1, 1)), topo);
  int64_t sharded = 0;  // bytes of the tensors tp splits; the rest is replicated
  for (const ParamSpec& spec : set.specs) {
    if (spec.rule != ShardRule::kReplicated) sharded += spec.bytes();
  }
  ASSERT_EQ(sharded % 4, 0);
  EXPECT_EQ(plan.stats.maxSendBytes, sharded / 4 * 3);
  EXPECT_EQ(plan.stats.sameNodeFirstMaxSendBytes, sharded / 4 * 3);
  EXPECT_EQ(plan.stats.numMessages, 12);
  // dp4 -> tp4: everything is local.
  auto back = RedistributionPlan::build(set, Placement::make(set, Layout(4, 1, 1)),
                                        Placement::make(set, Layout(1, 4, 1)), topo);
  EXPECT_EQ(back.stats.bytesMoved, 0);
  EXPECT_EQ(back.stats.numMessages, 0);
}

TEST(RedistributionPlanTest, RankOrderCanHalveWhatMoves) {
  // tp8 -> dp2 tp4 on 8 ranks: with Megatron's order a dp replica is ranks {0..3}, which
  // held different eighths before; with dp fastest, ranks 2i and 2i+1 form a tp4 shard pair.
  TensorSet set = transformerSet(1, 16);
  Topology topo(8, 8);
  Placement from = Placement::make(set, Layout(1, 8, 1));
  auto megatron = RedistributionPlan::build(set, from, Placement::make(set, Layout(2, 4, 1)), topo);
  auto dpFirst = RedistributionPlan::build(
      set, from, Placement::make(set, Layout::parse("dp2tp4/dp-tp-cp-pp")), topo);
  EXPECT_LT(dpFirst.stats.bytesMoved * 3, megatron.stats.bytesMoved * 2)
      << dpFirst.stats.bytesMoved << " vs " << megatron.stats.bytesMoved;
}

TEST(RedistributionPlanTest, InterNodeBytesOnlyWhereNoNearReplica) {
  // dp2 (one replica per node) -> tp4 over 2 nodes: every element has a replica on the
  // destination's node, so nothing crosses nodes.
  TensorSet set = transformerSet(2, 8);
  Topology topo(4, 2);
  auto plan = RedistributionPlan::build(set, Placement::make(set, Layout(2, 2, 1)),
                                        Placement::make(set, Layout(1, 4, 1)), topo);
  EXPECT_GT(plan.stats.bytesMoved, 0);
  EXPECT_EQ(plan.stats.interNodeBytes, 0);
  EXPECT_EQ(plan.stats.lowerBoundInterNodeBytes, 0);
  for (const Message& m : plan.messages) EXPECT_TRUE(topo.sameNode(m.src, m.dst)) << m.src << " -> " << m.dst;
  // tp4 -> dp2 tp2 over 2 nodes: the quarters that ranks 2, 3 lack live only on node 0.
  auto across = RedistributionPlan::build(set, Placement::make(set, Layout(1, 4, 1)),
                                          Placement::make(set, Layout(2, 2, 1)), topo);
  EXPECT_GT(across.stats.interNodeBytes, 0);
  EXPECT_EQ(across.stats.interNodeBytes, across.stats.lowerBoundInterNodeBytes);
  auto greedy = RedistributionPlan::build(set, Placement::make(set, Layout(1, 4, 1)),
                                          Placement::make(set, Layout(4, 1, 1)), topo,
                                          PlanOptions{SenderPolicy::kGreedy});
  EXPECT_EQ(greedy.stats.bytesMoved, greedy.stats.lowerBoundBytes);
}

// Taking elements from the receiver's node first is not free: on two nodes of 4, dp4 tp2 ->
// tp8 and dp2 tp4 -> tp8 leave some owners idle that could halve the largest send. The
// optima here are counted by hand from the layouts, and agree with the element-by-element
// recomputation for any owner.
TEST(RedistributionPlanTest, SameNodeFirstCanDoubleTheLargestSend) {
  TensorSet set = transformerSet(2, 16);
  Topology topo(8, 4);
  int64_t sharded = 0;
  for (const ParamSpec& spec : set.specs) {
    if (spec.rule != ShardRule::kReplicated) sharded += spec.bytes();
  }
  ASSERT_EQ(sharded % 16, 0);
  const Placement to = Placement::make(set, Layout(1, 8, 1));
  {
    // Ranks 1, 3 need eighths of half 0, held on node 0 by ranks 0, 2 and on node 1 by 4, 6;
    // ranks 4, 6 need eighths of half 1 (5, 7 near, 1, 3 far). Near owners send 1/8 each;
    // all eight owners could send 1/16 each.
    const Placement from = Placement::make(set, Layout(4, 2, 1));
    auto plan = RedistributionPlan::build(set, from, to, topo);
    auto report = simulate(set, from, to, topo, plan);
    EXPECT_EQ(plan.stats.bytesMoved, sharded / 2);
    EXPECT_EQ(plan.stats.interNodeBytes, 0);
    EXPECT_EQ(plan.stats.sameNodeFirstMaxSendBytes, sharded / 8);
    EXPECT_EQ(plan.stats.maxSendBytes, sharded / 8);
    EXPECT_EQ(testing::smallestLargestSend(report.anyOwnerSenders, 8), sharded / 16);
  }
  {
    // Ranks 2, 3 need quarter 1 (rank 1 near, 5 far), ranks 4, 5 quarter 2 (6 near, 2 far):
    // ranks 1 and 6 each send 2/8 near; with far owners the quarters split 1/8 + 1/8.
    const Placement from = Placement::make(set, Layout(2, 4, 1));
    auto plan = RedistributionPlan::build(set, from, to, topo);
    auto report = simulate(set, from, to, topo, plan);
    EXPECT_EQ(plan.stats.interNodeBytes, 0);
    EXPECT_EQ(plan.stats.sameNodeFirstMaxSendBytes, sharded / 4);
    EXPECT_EQ(plan.stats.maxSendBytes, sharded / 4);
    EXPECT_EQ(testing::smallestLargestSend(report.anyOwnerSenders, 8), sharded / 8);
  }
}

// Given link bandwidths the senders are balanced in time. dp2 tp4 pp2 -> dp8 tp2 on two nodes
// of 8: ranks that must send across nodes also hold what their node needs; balancing bytes
// gives them near sends too, balancing time leaves those to their idle neighbours.
TEST(RedistributionPlanTest, BalancesSendTimeGivenBandwidths) {
  TensorSet set = transformerSet(4, 64);
  Topology topo(16, 8);
  const Placement from = Placement::make(set, Layout(2, 4, 2));
  const Placement to = Placement::make(set, Layout(8, 2, 1));
  const double intra = 200e9, inter = 25e9;
  PlanOptions timed;
  timed.intraNodeBandwidth = intra;
  timed.interNodeBandwidth = inter;
  auto byBytes = RedistributionPlan::build(set, from, to, topo);
  auto byTime = RedistributionPlan::build(set, from, to, topo, timed);
  auto report = simulate(set, from, to, topo, byTime);
  EXPECT_EQ(report.wrongValue + report.wrongWrites + report.strayWrites, 0);
  EXPECT_EQ(byBytes.stats.maxSendSeconds, 0);
  EXPECT_EQ(byTime.stats.bytesMoved, byBytes.stats.bytesMoved);
  EXPECT_EQ(byTime.stats.interNodeBytes, byBytes.stats.interNodeBytes);
  EXPECT_GT(byTime.stats.interNodeBytes, 0);
  std::vector<double> seconds(16, 0);
  for (const Message& m : byBytes.messages) seconds[m.src] += m.bytes / (topo.sameNode(m.src, m.dst) ? intra : inter);
  const double bytesBalanced = *std::max_element(seconds.begin(), seconds.end());
  EXPECT_LT(byTime.stats.maxSendSeconds * 1.2, bytesBalanced);
  EXPECT_GE(byTime.stats.maxSendSeconds, byTime.stats.sameNodeFirstMaxSendSeconds * (1 - 1.0 / 256));
  EXPECT_LE(byTime.stats.maxSendSeconds, byTime.stats.sameNodeFirstMaxSendSeconds * 1.01);
  for (auto [a, b] : {std::pair{1e9, 0.0}, {-1.0, -1.0}, {1e6, 2e9}}) {
    PlanOptions bad;
    bad.intraNodeBandwidth = a;
    bad.interNodeBandwidth = b;
    EXPECT_THROW(RedistributionPlan::build(set, from, to, topo, bad), InvalidArgument) << a << " / " << b;
  }
}

// Time units are int64: a switch whose bytes times the slow link's units per byte would not
// fit is refused with a clear error (here 2^52 bytes to send, 4.5 PB, over links 1000x apart,
// against the 18 TB such links can weigh), never overflowed; equal links weigh 2^54 bytes.
TEST(RedistributionPlanTest, RefusesToWeighMoreTimeUnitsThanFit) {
  TensorSet set;
  set.numLayers = 1;
  for (int i = 0; i < 16; ++i) {
    ParamSpec spec;
    spec.name = "huge" + std::to_string(i);
    spec.shape = {int64_t{1} << 23, int64_t{1} << 23};
    spec.dtype = DType::kFloat32;
    spec.rule = ShardRule::kColumn;
    spec.stage = StageRole::kFirst;
    set.specs.push_back(spec);
  }
  Topology topo(2, 1);
  const Placement from = Placement::make(set, Layout(1, 2, 1));
  const Placement to = Placement::make(set, Layout(2, 1, 1));
  PlanOptions timed;
  timed.intraNodeBandwidth = 1000e9;
  timed.interNodeBandwidth = 1e9;
  try {
    RedistributionPlan::build(set, from, to, topo, timed);
    FAIL() << "a switch of 2^52 bytes was weighed in time units";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("balance bytes instead"), std::string::npos) << e.what();
  }
  timed.interNodeBandwidth = 1000e9;  // equal links: 256 units a byte, and 2^52 bytes fit
  EXPECT_NO_THROW(RedistributionPlan::build(set, from, to, topo, timed));
}

TEST(RedistributionPlanTest, EmptyTensorSet) {
  TensorSet set;
  set.numLayers = 1;
  Topology topo(4, 4);
  auto plan = RedistributionPlan::build(set, Placement::make(set, Layout(4, 1, 1)),
                                        Placement::make(set, Layout(1, 4, 1)), topo);
  EXPECT_EQ(plan.stats.bytesMoved, 0);
  EXPECT_TRUE(plan.messages.empty());
}

TEST(RedistributionPlanTest, RejectsMismatchedWorldsAndPartialDestinations) {
  TensorSet set = transformerSet(1, 8);
  Topology topo(4, 4);
  EXPECT_THROW(RedistributionPlan::build(set, Placement::make(set, Layout(2, 1, 1)),
                                         Placement::make(set, Layout(4, 1, 1)), topo),
               InvalidArgument);
  EXPECT_THROW(RedistributionPlan::build(set, Placement::make(set, Layout(4, 1, 1)),
                                         Placement::make(set, Layout(4, 1, 1), PlacementKind::kPartial),
                                         topo),
               InvalidArgument);
}

}  // namespace
}  // namespace hotswitch
