// Context parallelism in the cost model and the planner: how cp divides a phase's work and
// memory, what its K/V exchange costs, how unevenly a micro-batch's parts load the cp ranks,
// and that the planner runs long sequences under cp and short ones without.

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "CostFixtures.h"
#include "TestUtil.h"
#include "common/Check.h"
#include "planner/CostModel.h"
#include "planner/Planner.h"

namespace hotswitch {
namespace {

// CostFixtures.h's model with 1 K/V group (GQA: kv = 4).
ModelConfig tiny() { return testing::tinyModel(1); }

// Its unit hardware with attention at half the products' rate, latencies and fixed costs.
HardwareProfile unitHardware() {
  HardwareProfile h = testing::unitHardware();
  h.attentionEfficiency = 0.5;
  h.intraNodeLatency = 1e-3;
  h.interNodeLatency = 1e-2;
  h.layerOverheadSeconds = 0.25;
  h.sequenceOverheadSeconds = 0.125;
  return h;
}

TEST(ContextParallelCostTest, SplitLoadsDealChunksAndWholeSequencesAsTheModelDoes) {
  // cp 2, minimum chunk 4: 35 tokens cut in chunks of 9, 9, 9, 8 (rank 0: chunks 0 and 3,
  // rank 1: chunks 1 and 2); 7 and 3 stay whole, longest first to the rank with fewer tokens:
  // 7 to rank 0 (17 tokens against 18), then 3 to rank 1 (18 against 24).
  const auto loads = contextSplitLoads({35, 7, 3}, 2, 4);
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[0].tokens, 9 + 8 + 7);
  EXPECT_EQ(loads[1].tokens, 9 + 9 + 3);
  EXPECT_EQ(loads[0].sequences, 2);
  EXPECT_EQ(loads[1].sequences, 2);
  // Causal pairs: queries [a, b) attend to position + 1 keys each.
  auto pairs = [](double a, double b) { return (b * (b + 1) - a * (a + 1)) / 2; };
  EXPECT_DOUBLE_EQ(loads[0].pairs, pairs(0, 9) + pairs(27, 35) + pairs(0, 7));
  EXPECT_DOUBLE_EQ(loads[1].pairs, pairs(9, 18) + pairs(18, 27) + pairs(0, 3));
  // Every token and pair is somewhere, once.
  const auto big = contextSplitLoads({1024, 100, 31, 31, 5}, 4, 4);
  int64_t tokens = 0;
  double all = 0;
  for (const auto& l : big) {
    tokens += l.tokens;
    all += l.pairs;
  }
  EXPECT_EQ(tokens, 1024 + 100 + 31 + 31 + 5);
  EXPECT_DOUBLE_EQ(all, pairs(0, 1024) + pairs(0, 100) + 2 * pairs(0, 31) + pairs(0, 5));
  // The mirrored chunks of one long sequence give every rank nearly the same causal work.
  const auto one = contextSplitLoads({1024}, 4, 4);
  for (const auto& l : one) EXPECT_NEAR(l.pairs / (pairs(0, 1024) / 4), 1.0, 1e-3);
  EXPECT_THROW(contextSplitLoads({5}, 0, 4), InvalidArgument);
  EXPECT_THROW(contextSplitLoads({5}, 2, 0), InvalidArgument);
  EXPECT_THROW(contextSplitLoads({5, 0}, 2, 4), InvalidArgument);
}

TEST(ContextParallelCostTest, SplitOwnersCutLongSequencesAndDealShortOnesLongestFirst) {
  // The example above: 35 is cut (-1), 7 goes to rank 0 (17 tokens against 18), 3 to rank 1.
  EXPECT_EQ(contextSplitOwners({35, 7, 3}, 2, 4), (std::vector<int>{-1, 0, 1}));
  // Ties: equal lengths go by index, equal loads to the lowest rank. cp 3, nothing cut
  // (24 tokens needed): 9 to rank 0; 5, 5 to ranks 1 and 2; then 5 to rank 1 (5 < 9, 5 vs 5).
  EXPECT_EQ(contextSplitOwners({5, 9, 5, 5}, 3, 4), (std::vector<int>{1, 0, 2, 1}));
  // Exactly 2 * cp * minChunk tokens is cut; one fewer stays whole.
  EXPECT_EQ(contextSplitOwners({16, 15}, 2, 4), (std::vector<int>{-1, 0}));
  // cp 1 holds everything whole on its one rank.
  EXPECT_EQ(contextSplitOwners({100, 1}, 1, 4), (std::vector<int>{0, 0}));
  EXPECT_THROW(contextSplitOwners({5}, 0, 4), InvalidArgument);
  EXPECT_THROW(contextSplitOwners({5}, 2, 0), InvalidArgument);
  EXPECT_THROW(contextSplitOwners({5, 0}, 2, 4), InvalidArgument);
}

TEST(ContextParallelCostTest, TermsDivideTheWorkAndAddTheKeyValueExchange) {
  CostModel cost(tiny(), unitHardware(), Topology(4, 4));
  const LayoutTerms one = CostModel(tiny(), unitHardware(), Topology(1, 1)).terms(Layout(1, 1, 1, 1));
  const Layout cp4(1, 1, 1, 4);
  const LayoutTerms cp = cost.terms(cp4);
  EXPECT_EQ(cp.cp, 4);
  EXPECT_DOUBLE_EQ(cp.alphaCompute, one.alphaCompute / 4);
  EXPECT_DOUBLE_EQ(cp.beta, one.beta / 4);
  EXPECT_DOUBLE_EQ(cp.lastStageAlpha, one.lastStageAlpha / 4);
  EXPECT_DOUBLE_EQ(cp.gamma, one.gamma);  // every cp rank holds a part of each cut sequence
  // Per layer a gather of K/V forward and a reduce-scatter of their gradients backward: 2 kv
  // elements of 2 bytes per token, 3/4 of them received, at 1e3 B/s; latency 3 steps each.
  EXPECT_DOUBLE_EQ(cp.alphaCp, 2 * 2 * 0.75 * (2 * 4 * 2) / 1e3);
  EXPECT_DOUBLE_EQ(cp.microBatchCpSeconds, 2 * 2 * 3 * 1e-3);
  EXPECT_DOUBLE_EQ(cp.microBatchSeconds, one.microBatchSeconds + cp.microBatchCpSeconds);
  EXPECT_DOUBLE_EQ(cp.alpha(), one.alpha() / 4 + cp.alphaCp);
  // Full recomputation gathers once more.
  EXPECT_DOUBLE_EQ(cost.terms(cp4, Recompute::kFull).alphaCp, 1.5 * cp.alphaCp);
  // The gradients reduce over the data group of dp * cp = 4 ranks, as dp4's do.
  EXPECT_DOUBLE_EQ(cp.dpSeconds, cost.terms(Layout(4, 1, 1)).dpSeconds);
  EXPECT_DOUBLE_EQ(cost.dataCollectiveSeconds(cp4, 1000, true), cost.collectiveSeconds(Layout(4, 1, 1), Axis::kDp, 1000, true));
  // What hides behind compute is not paid.
  CostOptions hidden;
  hidden.cpOverlap = 1;
  EXPECT_DOUBLE_EQ(CostModel(tiny(), unitHardware(), Topology(4, 4), hidden).terms(cp4).alphaCp, 0);
  CostOptions half;
  half.cpOverlap = 0.5;
  EXPECT_DOUBLE_EQ(CostModel(tiny(), unitHardware(), Topology(4, 4), half).terms(cp4).alphaCp, cp.alphaCp / 2);
  // A cp group across nodes pays the slow link.
  CostModel twoNodes(tiny(), unitHardware(), Topology(4, 2));
  EXPECT_GT(twoNodes.terms(cp4).alphaCp, cp.alphaCp);
  CostOptions bad;
  bad.cpOverlap = 1.5;
  EXPECT_THROW(CostModel(tiny(), unitHardware(), Topology(4, 4), bad), InvalidArgument);
  bad.cpOverlap = 0;
  bad.cpMinChunk = 0;
  EXPECT_THROW(CostModel(tiny(), unitHardware(), Topology(4, 4), bad), InvalidArgument);
}

TEST(ContextParallelCostTest, ActivationsDivideOverCpButTheGatheredKeysAndValuesStay) {
  CostModel cost(tiny(), unitHardware(), Topology(4, 4));
  const Layout cp4(1, 1, 1, 4);
  // 34 h bytes per token over 4 ranks, plus the gathered K/V: 2 * kv * 2 bytes per token.
  EXPECT_EQ(cost.activationBytesPerTokenLayer(cp4), (34 * 8 + 3) / 4 + 2 * 4 * 2);
  // Full recomputation keeps the layer inputs only, and no gathered K/V.
  EXPECT_EQ(cost.activationBytesPerTokenLayer(cp4, Recompute::kFull), 2 * 8 / 4);
  const int64_t n = 1000;
  PhaseCost flat = CostModel(tiny(), unitHardware(), Topology(1, 1)).phase(Layout(1, 1, 1, 1), {{{n}}});
  PhaseCost split = cost.phase(cp4, {{{n}}});
  EXPECT_LT(split.activationBytes, flat.activationBytes / 2);
  EXPECT_EQ(split.staticBytes, flat.staticBytes);  // every cp rank holds the whole model
}

TEST(ContextParallelCostTest, PhaseTakesTheSlowestCpRankAndTheExchange) {
  CostModel cost(tiny(), unitHardware(), Topology(2, 2));
  const Layout cp2(1, 1, 1, 2);
  const LayoutTerms t = cost.terms(cp2);
  const LayoutTerms one = CostModel(tiny(), unitHardware(), Topology(1, 1)).terms(Layout(1, 1, 1, 1));
  auto rankSeconds = [&](const ContextLoad& l) {
    return one.alpha() * l.tokens + one.beta * 2 * l.pairs + one.gamma * l.sequences;
  };
  // A long sequence is cut evenly: each rank does half the work, plus the exchange.
  const std::vector<int64_t> longOne{400};
  const auto loads = contextSplitLoads(longOne, 2, 4);
  const double slowest = std::max(rankSeconds(loads[0]), rankSeconds(loads[1]));
  PhaseCost c = cost.phase(cp2, {{longOne}});
  EXPECT_NEAR(c.runSeconds(), slowest + t.microBatchSeconds + t.alphaCp * 400, 1e-12);
  EXPECT_NEAR(c.cpSeconds, t.alphaCp * 400 + t.microBatchCpSeconds, 1e-12);
  EXPECT_NEAR(c.runSeconds(), c.computeSeconds + c.tpSeconds + c.cpSeconds + c.ppSeconds, 1e-12);
  // Three short sequences stay whole: one rank runs two of them, and pays for it.
  const std::vector<int64_t> shorts{7, 7, 7};
  const auto uneven = contextSplitLoads(shorts, 2, 4);
  PhaseCost s = cost.phase(cp2, {{shorts}});
  EXPECT_NEAR(s.runSeconds(), std::max(rankSeconds(uneven[0]), rankSeconds(uneven[1])) + t.microBatchSeconds +
                                  t.alphaCp * 21, 1e-12);
  // More than an even split of the same work would take.
  const double mean = (rankSeconds(uneven[0]) + rankSeconds(uneven[1])) / 2;
  EXPECT_GT(s.runSeconds(), mean + t.microBatchSeconds + t.alphaCp * 21 + 1e-9);
}

TEST(ContextParallelCostTest, EnumerateListsCpLayoutsUpToTheBound) {
  EXPECT_EQ(Layout::enumerate(8).size(), 10u);
  const auto withCp = Layout::enumerate(8, 4);
  int cp2 = 0, cp4 = 0;
  for (const Layout& l : withCp) {
    EXPECT_EQ(l.world(), 8);
    EXPECT_LE(l.cp(), 4);
    cp2 += l.cp() == 2;
    cp4 += l.cp() == 4;
  }
  EXPECT_EQ(cp2, 6);  // the layouts of 4 ranks
  EXPECT_EQ(cp4, 3);  // of 2 ranks
  EXPECT_EQ(withCp.size(), 10u + 6u + 3u);
  EXPECT_THROW(Layout::enumerate(8, 0), InvalidArgument);
}

TEST(ContextParallelCostTest, PlannerRunsLongSequencesUnderCpAndShortOnesWithout) {
  // LLaMA-7B on 8 GPUs of a node at a 64K context: short sequences run cheapest without cp;
  // the longest needs full recomputation on every layout but cp8 runs it fastest.
  const CostModel cost{ModelConfig::preset("llama-7b"), HardwareProfile::preset("h100"), Topology(8, 8),
                       CostOptions{true, 4, 12}};
  const std::vector<Layout> layouts{Layout(8, 1, 1), Layout(4, 2, 1), Layout(2, 4, 1), Layout(1, 1, 1, 8),
                                    Layout(2, 1, 1, 4)};
  const size_t n = layouts.size();
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, 0.05));
  for (size_t i = 0; i < n; ++i) sw[i][i] = 0;
  std::vector<double> grad(n, 0.025);
  grad[0] = 0;
  PlannerOptions options;
  options.recompute = {Recompute::kNone, Recompute::kFull};
  const Planner planner(cost, layouts, 0, SwitchCosts{sw, grad, {}}, options);
  EXPECT_GT(planner.microBatchBudget(3), planner.microBatchBudget(0) * 4);
  EXPECT_GE(planner.microBatchBudget(3), 65536);
  std::vector<int64_t> lengths = testing::longTailed(256, 3);
  for (int64_t& l : lengths) l = std::min<int64_t>(l, 4096);
  lengths.push_back(65536);
  lengths.push_back(50000);
  const StepPlan plan = planner.plan(lengths);
  bool longUnderCp = false, shortWithout = false;
  for (const PlannedPhase& phase : plan.phases) {
    int64_t longest = 0;
    for (int i : phase.sequences) longest = std::max(longest, plan.pieces[i].length);
    int64_t shortest = longest;
    for (int i : phase.sequences) shortest = std::min(shortest, plan.pieces[i].length);
    if (phase.layout.cp() > 1 && longest == 65536) longUnderCp = true;
    if (phase.layout.cp() == 1 && shortest <= 4096) shortWithout = true;
    EXPECT_TRUE(phase.cost.fits) << phase.layout.name();
  }
  EXPECT_TRUE(longUnderCp);
  EXPECT_TRUE(shortWithout);
  EXPECT_LE(plan.totalSeconds, plan.bestStaticSeconds * (1 + 1e-9));
}

}  // namespace
}  // namespace hotswitch
