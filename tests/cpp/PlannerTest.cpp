#include "planner/Planner.h"

#include <gtest/gtest.h>

#include <random>

#include "common/Check.h"

namespace hotswitch {
namespace {

// LLaMA-7B on 8 A800s of one node, ZeRO, the layouts a user would try.
struct Fixture {
  CostModel cost{ModelConfig::preset("llama-7b"), HardwareProfile::preset("a800"), Topology(8, 8),
                 CostOptions{true, 4, 12}};
  std::vector<Layout> layouts{Layout(8, 1, 1), Layout(4, 2, 1), Layout(2, 4, 1), Layout(1, 8, 1),
                              Layout(2, 2, 2)};
  int home = 0;

  Planner planner(double switchCost = 0.05) const {
    size_t n = layouts.size();
    std::vector<std::vector<double>> sw(n, std::vector<double>(n, switchCost));
    for (size_t i = 0; i < n; ++i) sw[i][i] = 0;
    std::vector<double> grad(n, switchCost / 2);
    grad[home] = 0;
    return Planner(cost, layouts, home, SwitchCosts{sw, grad, {}});
  }
};

std::vector<int64_t> longTailed(int n, unsigned seed) {
  std::mt19937 gen(seed);
  std::lognormal_distribution<double> dist(6.5, 1.3);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(std::clamp<int64_t>(static_cast<int64_t>(dist(gen)), 1, 32768));
  return out;
}

TEST(PlannerTest, BudgetsGrowWithTensorParallelism) {
  Fixture s;
  Planner p = s.planner();
  EXPECT_GT(p.microBatchBudget(3), p.microBatchBudget(2));
  EXPECT_GT(p.microBatchBudget(2), p.microBatchBudget(0));
  EXPECT_GT(p.microBatchBudget(0), 0);
}

TEST(PlannerTest, PlansCoverEverySequenceWithinMemory) {
  Fixture s;
  Planner planner = s.planner();
  for (unsigned seed = 1; seed <= 5; ++seed) {
    std::vector<int64_t> lengths = longTailed(128, seed);
    lengths.push_back(1);
    lengths.push_back(31991);  // a prime outlier that only high tp holds
    StepPlan plan = planner.plan(lengths);
    std::vector<int> seen(lengths.size(), 0);
    double total = plan.switchBackSeconds;
    for (const PlannedPhase& phase : plan.phases) {
      EXPECT_TRUE(phase.cost.fits) << phase.layout.name();
      EXPECT_LE(phase.cost.peakBytes, s.cost.hardware().memoryBytes);
      for (const auto& replica : phase.packing.microBatches) {
        for (const auto& mb : replica) {
          for (int i : mb) ++seen[i];
        }
      }
      total += phase.switchInSeconds + phase.cost.runSeconds() + phase.gradSeconds;
    }
    for (int c : seen) EXPECT_EQ(c, 1);
    EXPECT_NEAR(plan.totalSeconds, total, 1e-9);
    ASSERT_GE(plan.bestStaticLayout, 0);
    // The home layout cannot hold the outlier, so static runs elsewhere; the plan may switch
    // but its objective never loses to static's by more than a round trip of switches and
    // the gradients' switch.
    if (!plan.singlePhaseFallback) EXPECT_LE(plan.objectiveSeconds, plan.programSeconds + 1e-9);
    EXPECT_LE(plan.programSeconds, plan.bestStaticObjectiveSeconds + 0.1 + 0.025 + 1e-9);
    StepPlan again = planner.plan(lengths);
    ASSERT_EQ(again.phases.size(), plan.phases.size());
    for (size_t i = 0; i < plan.phases.size(); ++i) {
      EXPECT_EQ(again.phases[i].layout, plan.phases[i].layout);
      EXPECT_EQ(again.phases[i].packing.microBatches, plan.phases[i].packing.microBatches);
    }
  }
}

TEST(PlannerTest, FreeSwitchesNeverLoseToStatic) {
  Fixture s;
  Planner planner = s.planner(0.0);
  StepPlan plan = planner.plan(longTailed(200, 11));
  EXPECT_LE(plan.programSeconds, plan.bestStaticObjectiveSeconds + 1e-9);
  EXPECT_LE(plan.totalSeconds, plan.bestStaticSeconds + 1e-9);  // the exact fallback
}

TEST(PlannerTest, RejectsWhatNoLayoutHolds) {
  Fixture s;
  Planner planner = s.planner();
  int64_t longest = 0;
  for (size_t i = 0; i < s.layouts.size(); ++i) longest = std::max(longest, planner.microBatchBudget(i));
  try {
    planner.plan({100, longest + 1});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(str("length ", longest + 1)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(str(longest, " tokens")), std::string::npos) << e.what();
  }
  EXPECT_THROW(planner.plan({}), InvalidArgument);
  EXPECT_THROW(planner.plan({5, 0}), InvalidArgument);
  EXPECT_THROW(Planner(s.cost, s.layouts, 9, {}), InvalidArgument);
  EXPECT_THROW(Planner(s.cost, {Layout(2, 2, 1)}, 0, SwitchCosts{{{0}}, {0}, {}}), InvalidArgument);  // world 4 != 8
}

}  // namespace
}  // namespace hotswitch
