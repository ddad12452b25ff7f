#pragma once

// The checks every redistribution plan of a layout grid must pass, shared by the grid tests
// of RedistributionPlanTest and ContextParallelPlanTest.

#include <gtest/gtest.h>

#include <string>

#include "TestModels.h"
#include "common/Check.h"
#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace testing {

// One grid case: the world, its ranks per node, the placement kinds switched between.
struct PlanCase {
  int world;
  int ranksPerNode;
  PlacementKind fromKind;
  PlacementKind toKind;
  bool tied = false;
  bool timed = false;  // balance send time over links of 200 and 25 GB/s
};

inline std::string planCaseName(const ::testing::TestParamInfo<PlanCase>& info) {
  const PlanCase& c = info.param;
  return str("w", c.world, "_n", c.world / c.ranksPerNode, "_", placementKindName(c.fromKind), "_",
             placementKindName(c.toKind), c.tied ? "_tied" : "", c.timed ? "_timed" : "");
}

// The plan options of a case: bandwidths when it balances send time.
inline PlanOptions planOptions(const PlanCase& c) {
  PlanOptions options;
  if (c.timed) {
    options.intraNodeBandwidth = 200e9;
    options.interNodeBandwidth = 25e9;
  }
  return options;
}

// Plans a -> b under the case's kinds and checks that every destination element arrives
// exactly once (per summand) with the right value, that exactly the lower-bound bytes and
// inter-node bytes move, that the stated same-node-first optimum equals the one recomputed
// element by element (when `recomputeOptimum`), that the largest send is within rounding of
// that optimum (in time when bandwidths are given), and that rebuilding gives the same plan.
inline void expectLowerBoundPlan(const TensorSet& set, const Layout& a, const Layout& b, const Topology& topo,
                                 const PlanCase& c, bool recomputeOptimum) {
  const PlanOptions options = planOptions(c);
  Placement from = Placement::make(set, a, c.fromKind);
  Placement to = Placement::make(set, b, c.toKind);
  RedistributionPlan plan = RedistributionPlan::build(set, from, to, topo, options);
  auto report = simulate(set, from, to, topo, plan);
  SCOPED_TRACE(from.key() + " -> " + to.key());
  EXPECT_EQ(report.wrongValue, 0);
  EXPECT_EQ(report.wrongWrites, 0);
  EXPECT_EQ(report.strayWrites, 0);
  EXPECT_EQ(plan.stats.bytesMoved, report.lowerBoundBytes);
  EXPECT_EQ(plan.stats.lowerBoundBytes, report.lowerBoundBytes);
  EXPECT_EQ(plan.stats.interNodeBytes, report.lowerBoundInterNodeBytes);
  if (recomputeOptimum) {
    EXPECT_EQ(plan.stats.sameNodeFirstMaxSendBytes, smallestLargestSend(report.sameNodeFirstSenders, c.world));
  }
  EXPECT_GE(plan.stats.maxSendBytes, plan.stats.sameNodeFirstMaxSendBytes);
  if (c.timed) {
    EXPECT_GE(plan.stats.maxSendSeconds, plan.stats.sameNodeFirstMaxSendSeconds * (1 - 1.0 / 256));
  } else {
    EXPECT_LE(plan.stats.maxSendBytes, plan.stats.sameNodeFirstMaxSendBytes + 4 * c.world * 4);
  }
  if (a == b && c.fromKind == c.toKind) EXPECT_EQ(plan.stats.bytesMoved, 0);
  RedistributionPlan again = RedistributionPlan::build(set, from, to, topo, options);
  ASSERT_EQ(again.messages.size(), plan.messages.size());
  for (size_t i = 0; i < plan.messages.size(); ++i) {
    ASSERT_EQ(again.messages[i].segments.size(), plan.messages[i].segments.size());
    EXPECT_EQ(again.messages[i].src, plan.messages[i].src);
    EXPECT_EQ(again.messages[i].dst, plan.messages[i].dst);
    for (size_t j = 0; j < plan.messages[i].segments.size(); ++j) {
      EXPECT_EQ(again.messages[i].segments[j].box, plan.messages[i].segments[j].box);
      EXPECT_EQ(again.messages[i].segments[j].srcOffset, plan.messages[i].segments[j].srcOffset);
    }
  }
}

}  // namespace testing
}  // namespace hotswitch
