// Redistribution plans to and from context-parallel layouts. Parameters are replicated over cp
// as over dp, so a cp layout is one more way to lay out the same shards: every plan between a
// cp layout and any other layout must deliver exactly the lower-bound bytes with balanced
// senders, for every placement kind and rank order the layout grid of RedistributionPlanTest
// covers.

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "PlanChecks.h"
#include "TestModels.h"
#include "common/Check.h"
#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace {

using testing::simulate;
using testing::transformerSet;

// Orders of the grid: Megatron's, dp fastest, cp fastest, pp fastest.
const char* const kOrders[] = {"tp-cp-dp-pp", "dp-tp-cp-pp", "cp-tp-dp-pp", "pp-tp-cp-dp"};

// Every layout of `world` (all four axes) in the first `orders` orders above, distinct by name.
std::vector<Layout> allLayouts(int world, int orders) {
  std::vector<Layout> out;
  std::set<std::string> seen;
  for (int o = 0; o < orders; ++o) {
    const char* order = kOrders[o];
    for (int cp = 1; cp <= world; ++cp) {
      for (int tp = 1; tp <= world; ++tp) {
        for (int pp = 1; pp <= world; ++pp) {
          if (world % (cp * tp * pp) != 0) continue;
          Layout l(world / (cp * tp * pp), tp, pp, cp, Layout::parseOrder(order));
          if (seen.insert(l.name()).second) out.push_back(l);
        }
      }
    }
  }
  return out;
}

using CpCase = testing::PlanCase;

class ContextParallelPlanTest : public ::testing::TestWithParam<CpCase> {};

// Every ordered pair of layouts with cp > 1 on at least one side: every destination element
// arrives exactly once (per summand) with the right value, exactly the lower-bound bytes and
// inter-node bytes move, the largest send equals the same-node-first optimum recomputed
// element by element (within rounding; in time when bandwidths are given), and a rebuilt plan
// is the same.
TEST_P(ContextParallelPlanTest, EveryPairWithCpDeliversExactlyTheLowerBound) {
  const CpCase& c = GetParam();
  Topology topo(c.world, c.ranksPerNode);
  TensorSet set = transformerSet(c.world, 2 * c.world, c.tied);
  // Worlds above 4 take Megatron's order and dp fastest: every order of the four axes would
  // take minutes there, and worlds 2 and 4 already cover every order.
  std::vector<Layout> layouts = allLayouts(c.world, c.world <= 4 ? 4 : 2);
  int pairs = 0;
  for (const Layout& a : layouts) {
    for (const Layout& b : layouts) {
      if (a.cp() == 1 && b.cp() == 1) continue;
      testing::expectLowerBoundPlan(set, a, b, topo, c, true);
      ++pairs;
    }
  }
  EXPECT_GT(pairs, 0);
}

std::vector<CpCase> cpCases() {
  std::vector<CpCase> out;
  for (int w : {2, 4, 6, 8}) {
    out.push_back({w, w, PlacementKind::kSharded, PlacementKind::kSharded});
    if (w == 8) {  // the slowest world: the kinds in one case each
      out.push_back({w, w / 2, PlacementKind::kPartial, PlacementKind::kZero, false, true});
      out.push_back({w, w, PlacementKind::kZero, PlacementKind::kSharded, /*tied=*/true});
      continue;
    }
    out.push_back({w, w / 2, PlacementKind::kSharded, PlacementKind::kSharded});
    if (w % 4 == 0) out.push_back({w, w / 2, PlacementKind::kSharded, PlacementKind::kSharded, false, true});
    out.push_back({w, w, PlacementKind::kSharded, PlacementKind::kZero});
    out.push_back({w, w, PlacementKind::kZero, PlacementKind::kSharded});
    out.push_back({w, w, PlacementKind::kPartial, PlacementKind::kSharded});
    out.push_back({w, w / 2, PlacementKind::kPartial, PlacementKind::kZero});
    out.push_back({w, w / 2, PlacementKind::kPartial, PlacementKind::kZero, false, true});
    out.push_back({w, w, PlacementKind::kPartial, PlacementKind::kSharded, /*tied=*/true});
    out.push_back({w, w, PlacementKind::kSharded, PlacementKind::kSharded, /*tied=*/true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ContextParallelPlanTest, ::testing::ValuesIn(cpCases()), testing::planCaseName);

// cp is a replica axis for parameters: cp2 and dp2 hold the same shards on the same ranks
// under Megatron's order, so switching between them moves nothing, and a cp2 partial gradient
// (each cp rank holds the summand of its tokens) sums into a dp2 layout's shards exactly as a
// dp2 partial does.
TEST(ContextParallelPlanTest, CpIsAReplicaAxisForParameters) {
  TensorSet set = transformerSet(2, 8);
  Topology topo(4, 4);
  for (const char* pair : {"cp2tp2:dp2tp2", "dp2cp2:dp4", "cp4:tp4"}) {
    std::string text(pair);
    Layout a = Layout::parse(text.substr(0, text.find(':')));
    Layout b = Layout::parse(text.substr(text.find(':') + 1));
    SCOPED_TRACE(a.name() + " -> " + b.name());
    auto plan = RedistributionPlan::build(set, Placement::make(set, a), Placement::make(set, b), topo);
    auto mirror = RedistributionPlan::build(set, Placement::make(set, Layout(b.dp() * b.cp(), b.tp(), b.pp())),
                                            Placement::make(set, b), topo);
    if (a.tp() == b.tp() && a.pp() == b.pp()) EXPECT_EQ(plan.stats.bytesMoved, 0);
    // a cp layout moves what the dp layout of the same data-group size moves.
    auto asDp = RedistributionPlan::build(set, Placement::make(set, Layout(a.dp() * a.cp(), a.tp(), a.pp())),
                                          Placement::make(set, b), topo);
    EXPECT_EQ(plan.stats.bytesMoved, asDp.stats.bytesMoved);
    EXPECT_EQ(plan.stats.maxSendBytes, asDp.stats.maxSendBytes);
    EXPECT_EQ(mirror.stats.bytesMoved, 0);
    auto partial = RedistributionPlan::build(set, Placement::make(set, a, PlacementKind::kPartial),
                                             Placement::make(set, b), topo);
    auto partialDp = RedistributionPlan::build(
        set, Placement::make(set, Layout(a.dp() * a.cp(), a.tp(), a.pp()), PlacementKind::kPartial),
        Placement::make(set, b), topo);
    EXPECT_EQ(partial.stats.bytesMoved, partialDp.stats.bytesMoved);
    auto report = simulate(set, Placement::make(set, a, PlacementKind::kPartial), Placement::make(set, b), topo,
                           partial);
    EXPECT_EQ(report.wrongValue, 0);
    EXPECT_EQ(report.wrongWrites, 0);
  }
}

}  // namespace
}  // namespace hotswitch
