#include "planner/SwitchEstimate.h"

#include <gtest/gtest.h>

#include <numeric>

#include "TestModels.h"
#include "TestUtil.h"
#include "common/Check.h"
#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace {

// Receive volumes do not depend on which sender a plan picks, so the estimate must equal the
// built plan's per rank; the balanced plan takes every element from its own node when it can,
// so the inter-node bytes must equal the plan's too.
TEST(SwitchEstimateTest, ReceiveVolumesEqualThoseOfBuiltPlans) {
  TensorSet set = testing::transformerSet(4, 8, /*tied=*/true);
  const Topology topology(8, 4);
  const std::vector<std::string> layouts = {"dp8", "dp2tp4", "tp2pp4", "dp2tp2pp2", "dp4pp2"};
  const std::vector<std::pair<PlacementKind, PlacementKind>> kinds = {
      {PlacementKind::kSharded, PlacementKind::kSharded},
      {PlacementKind::kPartial, PlacementKind::kZero},
      {PlacementKind::kZero, PlacementKind::kZero},
      {PlacementKind::kPartial, PlacementKind::kSharded}};
  int checked = 0;
  for (const auto& a : layouts) {
    for (const auto& b : layouts) {
      for (auto [fromKind, toKind] : kinds) {
        Placement from = Placement::make(set, Layout::parse(a), fromKind);
        Placement to = Placement::make(set, Layout::parse(b), toKind);
        RedistributionPlan plan = RedistributionPlan::build(set, from, to, topology);
        SwitchEstimate est = SwitchEstimate::of(set, from, to, topology);
        int64_t inter = 0;
        for (int r = 0; r < 8; ++r) {
          EXPECT_EQ(est.recvIntraNodeBytes[r] + est.recvInterNodeBytes[r], plan.recvBytes[r])
              << a << " -> " << b << " rank " << r;
          inter += est.recvInterNodeBytes[r];
        }
        EXPECT_EQ(est.totalBytes, plan.stats.bytesMoved) << a << " -> " << b;
        EXPECT_EQ(inter, plan.stats.interNodeBytes) << a << " -> " << b;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 100);
}

TEST(SwitchEstimateTest, SecondsOfTheSlowestRankByHand) {
  SwitchEstimate est;
  est.recvIntraNodeBytes = {100, 0, 300};
  est.recvInterNodeBytes = {0, 20, 10};
  // Rank 2: 300 / 100 + 10 / 10 = 4 s; rank 1: 2 s; rank 0: 1 s.
  EXPECT_DOUBLE_EQ(est.seconds(100, 10), 4.0);
  EXPECT_THROW(est.seconds(0, 10), InvalidArgument);
}

TEST(SwitchEstimateTest, RejectsMismatchedWorldsAndPartialDestinations) {
  TensorSet set = testing::transformerSet(2, 8);
  Placement four = Placement::make(set, Layout::parse("dp4"));
  Placement eight = Placement::make(set, Layout::parse("dp8"));
  EXPECT_THROW(SwitchEstimate::of(set, four, eight, Topology(8, 8)), InvalidArgument);
  EXPECT_THROW(SwitchEstimate::of(set, eight, eight, Topology(4, 4)), InvalidArgument);
  Placement partial = Placement::make(set, Layout::parse("dp8"), PlacementKind::kPartial);
  EXPECT_NE(testing::invalidArgumentMessage([&] { SwitchEstimate::of(set, eight, partial, Topology(8, 8)); })
                .find("cannot be partial"),
            std::string::npos);
}

}  // namespace
}  // namespace hotswitch
