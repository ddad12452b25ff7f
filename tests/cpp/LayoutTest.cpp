#include "layout/Layout.h"

#include <gtest/gtest.h>

#include <set>

#include "TestUtil.h"
#include "common/Check.h"
#include "layout/Topology.h"

namespace hotswitch {
namespace {

TEST(LayoutTest, MegatronOrderTpFastest) {
  Layout l(2, 2, 2);
  EXPECT_EQ(l.world(), 8);
  EXPECT_EQ(l.coord(1)[static_cast<int>(Axis::kTp)], 1);
  EXPECT_EQ(l.coord(2)[static_cast<int>(Axis::kDp)], 1);
  EXPECT_EQ(l.coord(4)[static_cast<int>(Axis::kPp)], 1);
  EXPECT_EQ(l.group(Axis::kTp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group(Axis::kDp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.group(Axis::kPp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.groups(Axis::kTp), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

TEST(LayoutTest, RankCoordRoundTripForEveryOrder) {
  Layout::Order order = Layout::megatronOrder();
  std::sort(order.begin(), order.end());
  do {
    Layout l(3, 2, 2, 1, order);
    std::set<int> seen;
    for (int r = 0; r < l.world(); ++r) {
      EXPECT_EQ(l.rank(l.coord(r)), r);
      seen.insert(r);
    }
    EXPECT_EQ(seen.size(), 12u);
    for (Axis axis : {Axis::kTp, Axis::kDp, Axis::kPp, Axis::kCp}) {
      std::set<int> covered;
      for (const auto& g : l.groups(axis)) {
        EXPECT_EQ(static_cast<int>(g.size()), l.degree(axis));
        covered.insert(g.begin(), g.end());
      }
      EXPECT_EQ(covered.size(), 12u);
    }
    EXPECT_EQ(Layout::parse(l.name()), l);
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(LayoutTest, ParseAndName) {
  EXPECT_EQ(Layout::parse("dp2tp4"), Layout(2, 4, 1));
  EXPECT_EQ(Layout::parse("tp2pp2").name(), "tp2pp2");
  EXPECT_EQ(Layout::parse("dp1").world(), 1);
  EXPECT_EQ(Layout::parse("dp2tp4/dp-tp-cp-pp").name(), "dp2tp4/dp-tp-cp-pp");
  EXPECT_EQ(Layout::parse("dp2tp4/dp-tp-cp-pp").coord(1)[static_cast<int>(Axis::kDp)], 1);
}

TEST(LayoutTest, BadInputNamesTheValue) {
  auto message = [](auto fn) { return testing::invalidArgumentMessage(fn); };
  EXPECT_EQ(message([] { Layout(2, 3, 1).validate(8); }),
            "dp(2) * tp(3) * pp(1) * cp(1) = 6 != world(8)");
  EXPECT_NE(message([] { Layout(0, 1, 1); }).find("dp degree must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(message([] { Layout::parse("dp2xx4"); }).find("'dp2xx4'"), std::string::npos);
  EXPECT_NE(message([] { Layout::parse("dp2dp2"); }).find("twice"), std::string::npos);
  EXPECT_NE(message([] { Layout::parseOrder("tp-tp-dp-pp"); }).find("twice"), std::string::npos);
  EXPECT_NE(message([] { Topology(6, 4); }).find("world(6) is not a multiple of ranks_per_node(4)"),
            std::string::npos);
  EXPECT_NE(message([] { Layout(2, 2, 1).coord(4); }).find("rank 4"), std::string::npos);
}

// Found by the plan fuzzer: degrees whose product overflowed int made world() undefined.
TEST(LayoutTest, RejectsDegreesWhoseWorldOverflows) {
  EXPECT_EQ(testing::invalidArgumentMessage([] { Layout(589824, 1048576, 1); }),
            "dp(589824) * tp(1048576) * pp(1) * cp(1) exceeds the largest world (2147483647)");
  EXPECT_THROW(Layout::parse("dp999999tp999999"), InvalidArgument);
  EXPECT_THROW(Layout(65536, 65536, 65536, 65536), InvalidArgument);
  EXPECT_EQ(Layout(46340, 46340, 1).world(), 46340 * 46340);
}

TEST(LayoutTest, EnumerateCoversEveryFactorization) {
  EXPECT_EQ(Layout::enumerate(1).size(), 1u);
  EXPECT_EQ(Layout::enumerate(8).size(), 10u);   // ordered factorizations of 2^3 into 3
  EXPECT_EQ(Layout::enumerate(32).size(), 21u);
  EXPECT_EQ(Layout::enumerate(12).size(), 18u);
  for (const Layout& l : Layout::enumerate(12)) EXPECT_EQ(l.world(), 12);
}

}  // namespace
}  // namespace hotswitch
