#include "planner/Planner.h"

#include <gtest/gtest.h>

#include <cmath>

#include <algorithm>
#include <limits>
#include <random>
#include <tuple>

#include "CostFixtures.h"
#include "TestUtil.h"
#include "common/Check.h"

namespace hotswitch {
namespace {

using testing::longTailed;

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
      ASSERT_EQ(phase.cuSeqlens.size(), phase.packing.microBatches.size());
      for (size_t r = 0; r < phase.packing.microBatches.size(); ++r) {
        const auto& replica = phase.packing.microBatches[r];
        ASSERT_EQ(phase.cuSeqlens[r].size(), replica.size());
        for (size_t k = 0; k < replica.size(); ++k) {
          std::vector<int64_t> cu{0};
          for (int i : replica[k]) {
            ++seen[i];
            cu.push_back(cu.back() + plan.pieces[i].length);
          }
          EXPECT_EQ(phase.cuSeqlens[r][k], cu);
        }
      }
      total += phase.switchInSeconds + phase.cost.runSeconds() + phase.gradSeconds;
    }
    for (int c : seen) EXPECT_EQ(c, 1);
    EXPECT_NEAR(plan.totalSeconds, total, 1e-9);
    ASSERT_GE(plan.bestStaticCandidate, 0);
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

// LLaMA-7B under dp8 alone on 8 A800s with a 20 ms fixed cost per layer, which graphs at
// `buckets` cut to 0.1 ms.
Fixture graphedDp8(std::vector<int64_t> buckets) {
  Fixture s;
  s.layouts = {Layout(8, 1, 1)};
  HardwareProfile hw = HardwareProfile::preset("a800");
  hw.layerOverheadSeconds = 20e-3;
  CostOptions options{true, 4, 12};
  options.graphBuckets = std::move(buckets);
  options.graphLayerOverheadSeconds = 1e-4;
  s.cost = CostModel(ModelConfig::preset("llama-7b"), hw, Topology(8, 8), options);
  return s;
}

TEST(PlannerTest, PlansCarryEachMicroBatchsGraphBucket) {
  // LLaMA-7B under dp8 with a large fixed cost per layer that graphs cut: the micro-batches
  // that a bucket holds cheaply run from graphs (what CostModel::graphTokens says of each).
  // Packed to the memory budget (4755 tokens, with dp8's graph weight copies held) many hold
  // more than the 4096 bucket and run as they are (29 of 56 run from graphs); packed to the
  // 4096 bucket they fill it closely and all do: the planner packs so.
  const Fixture s = graphedDp8({2048, 4096, 8192});
  std::vector<int64_t> lengths = longTailed(200, 11);
  for (int64_t& n : lengths) n = std::min<int64_t>(n, 4096);
  const Planner planner = s.planner(0.0);
  StepPlan plan = planner.plan(lengths);
  int graphed = 0;
  for (const PlannedPhase& phase : plan.phases) {
    ASSERT_EQ(phase.graphTokens.size(), phase.packing.microBatches.size());
    const LayoutTerms terms = s.cost.terms(phase.layout, phase.recompute);
    int phaseGraphed = 0;
    for (size_t r = 0; r < phase.graphTokens.size(); ++r) {
      ASSERT_EQ(phase.graphTokens[r].size(), phase.packing.microBatches[r].size());
      for (size_t k = 0; k < phase.graphTokens[r].size(); ++k) {
        std::vector<int64_t> mb;
        int64_t tokens = 0;
        for (int i : phase.packing.microBatches[r][k]) {
          mb.push_back(plan.pieces[i].length);
          tokens += plan.pieces[i].length;
        }
        const int64_t bucket = phase.graphTokens[r][k];
        EXPECT_EQ(bucket, s.cost.graphTokens(terms, mb));
        if (bucket > 0) {
          EXPECT_TRUE(terms.graphs);
          EXPECT_GE(bucket, tokens);
          ++phaseGraphed;
        }
      }
    }
    EXPECT_EQ(phase.cost.graphedMicroBatches, phaseGraphed);
    // No worse than the packing to the memory budget alone, which pads nothing here.
    const CandidateModel& m = planner.candidateModel(phase.candidate, phase.recompute);
    std::vector<int64_t> local;
    for (int i : phase.sequences) local.push_back(plan.pieces[i].length);
    PackOptions budget;
    budget.maxTokensPerMicroBatch = m.budget;
    const Packing plain = Packer::pack(local, phase.layout.dp(), budget, [&](int64_t x) { return m.terms.u(x); });
    const PhaseCost unaligned = s.cost.phase(phase.layout, m.terms, plain.lengths(local));
    EXPECT_LT(unaligned.graphedMicroBatches, phaseGraphed);
    EXPECT_LT(phase.cost.totalSeconds, unaligned.totalSeconds);

    graphed += phaseGraphed;
  }
  EXPECT_GT(graphed, 0);
}

TEST(PlannerTest, TheEstimateWeighsMicroBatchesPackedToAGraphBucket) {
  // LLaMA-7B under dp8 with a 20 ms fixed cost per layer that graphs cut to 0.1 ms. 64
  // sequences of 100 tokens: 800 per replica, one micro-batch run as it is (the budget holds
  // 4755), or one padded to a bucket that holds it and run from the graphs. E takes the least.
  const Fixture s = graphedDp8({1024, 2048, 4096, 8192});
  const Planner planner = s.planner(0.0);
  const CandidateModel& m = planner.candidateModel(0);
  ASSERT_GE(m.budget, 4096);
  ASSERT_LT(m.budget, 8192);
  EXPECT_EQ(m.graphBuckets, (std::vector<int64_t>{1024, 2048, 4096}));  // within the budget
  const LayoutTerms& t = m.terms;
  const std::vector<int64_t> lengths(64, 100);
  const double work = std::max(64 * t.u(100) / 8, t.u(100));
  const double plain = work + t.microBatchSeconds;
  auto graphed = [&](double bucket) {
    const double pad = bucket - 800;
    return work + t.alpha() * pad + t.beta * pad * pad + t.gamma + t.microBatchSeconds - t.graphSavedSeconds;
  };
  EXPECT_LT(graphed(1024), plain);
  EXPECT_LT(graphed(1024), graphed(2048));
  const ObjectiveValue v = planner.objective(lengths, std::vector<int>(64, 0));
  EXPECT_NEAR(v.phaseSeconds[0], graphed(1024) + m.gradSeconds, 1e-12);
  // Of 5200 tokens per replica, two micro-batches filled to 4096 pay one padding of 2992.
  const std::vector<int64_t> more(416, 100);
  const double moreWork = std::max(416 * t.u(100) / 8, t.u(100));
  const double pad = 2 * 4096.0 - 5200;
  const double twoGraphed = moreWork + t.alpha() * pad + t.beta * pad * pad + t.gamma +
                            2 * (t.microBatchSeconds - t.graphSavedSeconds);
  const double twoPlain = moreWork + t.microBatchSeconds * 5200.0 / static_cast<double>(m.budget);
  double best = std::min(twoGraphed, twoPlain);
  for (double b : {1024.0, 2048.0}) {
    const double count = std::ceil(5200 / b);
    const double p = count * b - 5200;
    best = std::min(best, moreWork + t.alpha() * p + t.beta * p * p + (p > 0 ? t.gamma : 0.0) +
                              count * (t.microBatchSeconds - t.graphSavedSeconds));
  }
  EXPECT_NEAR(planner.objective(more, std::vector<int>(416, 0)).phaseSeconds[0], best + m.gradSeconds, 1e-12);
  // Off, E prices the layout as without graphs: one micro-batch run as it is.
  PlannerOptions off;
  off.graphEstimate = false;
  const Planner without(s.cost, s.layouts, 0, SwitchCosts{{{0.0}}, {0.0}, {}}, off);
  EXPECT_TRUE(without.candidateModel(0).graphBuckets.empty());
  EXPECT_NEAR(without.objective(lengths, std::vector<int>(64, 0)).phaseSeconds[0], plain + m.gradSeconds, 1e-12);
}

// The hand-countable model and hardware of CostFixtures.h: 2 layers, hidden 8, 2 heads,
// FFN 16, vocab 10, on unit hardware (1e6 FLOP/s, 1e3 B/s, no latency or overhead).
using testing::tinyModel;
using testing::unitHardware;

// dp2 (home), tp2, pp2 of world 2.
Planner tinyPlanner(std::vector<std::vector<double>> sw, std::vector<double> reduced, std::vector<double> partial,
                    PlannerOptions options = {}) {
  CostModel cost(tinyModel(), unitHardware(), Topology(2, 2));
  return Planner(cost, {Layout(2, 1, 1), Layout(1, 2, 1), Layout(1, 1, 2)}, 0,
                 SwitchCosts{std::move(sw), std::move(reduced), std::move(partial)}, options);
}

std::vector<std::vector<double>> uniformSwitches(int n, double s) {
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, s));
  for (int i = 0; i < n; ++i) sw[i][i] = 0;
  return sw;
}

TEST(PlannerTest, HoldsTheGraphCopiesOfEveryCandidateThatRunsGraphs) {
  // dp2 and tp2 run graphs and keep their weight copies while pp2 runs: every candidate's
  // memory holds both, so even pp2's budget is smaller than without graph buckets.
  CostOptions options;
  options.graphBuckets = {8, 64};
  const CostModel cost(tinyModel(), unitHardware(), Topology(2, 2), options);
  const std::vector<Layout> layouts{Layout(2, 1, 1), Layout(1, 2, 1), Layout(1, 1, 2)};
  const SwitchCosts switches{uniformSwitches(3, 0.5), {0, 0.25, 0.25}, {}};
  const Planner graphs(cost, layouts, 0, switches);
  const Planner plain(CostModel(tinyModel(), unitHardware(), Topology(2, 2)), layouts, 0, switches);
  const int64_t held = cost.graphCopyBytes(Layout(2, 1, 1)) + cost.graphCopyBytes(Layout(1, 2, 1));
  EXPECT_GT(held, 0);
  EXPECT_EQ(graphs.costModel().options().graphCopiesHeldBytes, held);
  EXPECT_EQ(plain.costModel().options().graphCopiesHeldBytes, 0);
  EXPECT_EQ(graphs.costModel().staticBytes(Layout(1, 1, 2)), plain.costModel().staticBytes(Layout(1, 1, 2)) + held);
  for (int i = 0; i < 3; ++i) EXPECT_LT(graphs.microBatchBudget(i), plain.microBatchBudget(i)) << i;
}

TEST(PlannerTest, ObjectiveByHand) {
  Planner p = tinyPlanner(uniformSwitches(3, 0.5), {0, 0.25, 0.25}, {});
  // dp2: u(s) = 8160e-6 s + 896e-6 s^2 (CostModelTest: TermsByHand); reduction: all-reduce of
  // 1480 fp32 gradients over 2 ranks, 2 * 2960 / 1e3 s.
  auto u = [](double s) { return 8160e-6 * s + 896e-6 * s * s; };
  const double reduce = 2 * 2960 / 1e3;
  EXPECT_NEAR(p.candidateModel(0).reduceSeconds, reduce, 1e-12);
  // {5, 3} under dp2: max(W / 2, U) = max((u5 + u3) / 2, u5) = u5; one micro-batch, no overhead.
  ObjectiveValue home = p.objective({5, 3}, {0, 0});
  EXPECT_NEAR(home.totalSeconds, u(5) + reduce, 1e-12);
  EXPECT_EQ(home.switchSeconds, 0);
  EXPECT_EQ(home.order, std::vector<int>{0});
  // {5, 3} under dp2 and {7} under tp2 (half the FLOPs per rank plus 6 collectives per layer of
  // 7 tokens * 8 * 2 bytes / 2 at 1e3 B/s, and the head's: 1 of them and 3 all-reduces of 4
  // bytes a token): a round trip of switches and tp2's gradients, reduced over its data group
  // of one (free) and switched home.
  const double tp2 = u(7) / 2 + 2 * 6 * 0.5 * 7 * 16 / 1e3 + 7 * (1 * 0.5 * 16 + 3 * 2 * 0.5 * 4) / 1e3;
  ObjectiveValue both = p.objective({5, 3, 7}, {0, 0, 1});
  EXPECT_NEAR(both.totalSeconds, u(5) + reduce + tp2 + 0.25 + 2 * 0.5, 1e-12);
  EXPECT_NEAR(both.phaseSeconds[1], tp2 + 0.25, 1e-12);
  EXPECT_EQ(both.order, (std::vector<int>{0, 1}));
}

TEST(PlannerTest, GradientsTakeTheCheaperMethod) {
  // Partial summands cost 0.1 for tp2 (cheaper than 0 + 0.3) and 0.9 for pp2 (dearer than 0 + 0.2).
  Planner p = tinyPlanner(uniformSwitches(3, 0.5), {0, 0.3, 0.2}, {0, 0.1, 0.9});
  EXPECT_EQ(p.candidateModel(0).gradMethod, GradMethod::kLocal);
  EXPECT_NEAR(p.candidateModel(0).gradSeconds, p.candidateModel(0).reduceSeconds, 1e-12);
  EXPECT_EQ(p.candidateModel(1).gradMethod, GradMethod::kPartial);
  EXPECT_DOUBLE_EQ(p.candidateModel(1).gradSeconds, 0.1);
  EXPECT_EQ(p.candidateModel(2).gradMethod, GradMethod::kReduce);
  EXPECT_DOUBLE_EQ(p.candidateModel(2).gradSeconds, 0.2);  // tp1 pp2 dp1: no reduction
  // Without the partial option, reduce then switch.
  Planner q = tinyPlanner(uniformSwitches(3, 0.5), {0, 0.3, 0.2}, {});
  EXPECT_EQ(q.candidateModel(1).gradMethod, GradMethod::kReduce);
  EXPECT_DOUBLE_EQ(q.candidateModel(1).gradSeconds, 0.3);
}

TEST(PlannerTest, PhasesRunInTheCheapestSwitchOrder) {
  // home -> pp2 -> tp2 -> home costs 1 + 1 + 1; home -> tp2 -> pp2 -> home costs 10 + 10 + 10.
  std::vector<std::vector<double>> sw = {{0, 10, 1}, {1, 0, 10}, {10, 1, 0}};
  Planner p = tinyPlanner(sw, {0, 0, 0}, {});
  ObjectiveValue v = p.objective({5, 7, 9}, {0, 1, 2});
  EXPECT_DOUBLE_EQ(v.switchSeconds, 3);
  EXPECT_EQ(v.order, (std::vector<int>{0, 2, 1}));
  ObjectiveValue away = p.objective({5, 7}, {1, 2});  // home unused: still the cycle through it
  EXPECT_DOUBLE_EQ(away.switchSeconds, 3);
  EXPECT_EQ(away.order, (std::vector<int>{2, 1}));
}

TEST(PlannerTest, LongSequencesAreRejectedTruncatedOrSplit) {
  PlannerOptions o;
  o.maxContext = 100;
  for (LongSequences mode : {LongSequences::kReject, LongSequences::kTruncate, LongSequences::kSplit}) {
    o.longSequences = mode;
    Planner p = tinyPlanner(uniformSwitches(3, 0.5), {0, 0, 0}, {}, o);
    if (mode == LongSequences::kReject) {
      EXPECT_NE(testing::invalidArgumentMessage([&] { p.pieces({50, 250}); })
                    .find("sequence 1 has length 250, longer than the max context of 100"),
                std::string::npos);
      continue;
    }
    std::vector<SequencePiece> pieces = p.pieces({50, 250, 100});
    std::vector<std::tuple<int, int64_t, int64_t>> got;
    for (const auto& q : pieces) got.emplace_back(q.sequence, q.offset, q.length);
    if (mode == LongSequences::kTruncate) {
      EXPECT_EQ(got, (std::vector<std::tuple<int, int64_t, int64_t>>{{0, 0, 50}, {1, 0, 100}, {2, 0, 100}}));
    } else {
      EXPECT_EQ(got, (std::vector<std::tuple<int, int64_t, int64_t>>{
                         {0, 0, 50}, {1, 0, 100}, {1, 100, 100}, {1, 200, 50}, {2, 0, 100}}));
      StepPlan plan = p.plan({50, 250, 100});
      ASSERT_EQ(plan.pieces.size(), 5u);
      int placed = 0;
      for (const auto& phase : plan.phases) placed += static_cast<int>(phase.sequences.size());
      EXPECT_EQ(placed, 5);
    }
  }
  EXPECT_THROW(parseLongSequences("drop"), InvalidArgument);
}

// J_DP by brute force: every bucketing of the sorted lengths into contiguous buckets and
// every layout per bucket, in length order from and back to home.
double bruteForceProgram(const Planner& p, std::vector<int64_t> lengths) {
  std::sort(lengths.begin(), lengths.end());
  const int n = static_cast<int>(lengths.size()), L = static_cast<int>(p.candidates().size());
  const auto& sw = p.switchCosts().params;
  double best = std::numeric_limits<double>::infinity();
  for (int cuts = 0; cuts < (1 << (n - 1)); ++cuts) {
    std::vector<std::vector<int64_t>> buckets(1);
    for (int i = 0; i < n; ++i) {
      buckets.back().push_back(lengths[i]);
      if (i + 1 < n && (cuts >> i & 1)) buckets.emplace_back();
    }
    const int k = static_cast<int>(buckets.size());
    std::vector<int> choice(k, 0);
    while (true) {
      double total = 0;
      int prev = p.home();
      bool ok = true;
      for (int b = 0; b < k && ok; ++b) {
        const int l = choice[b];
        if (buckets[b].back() > p.microBatchBudget(l)) {
          ok = false;
          break;
        }
        // E + g of the bucket alone: the objective of putting it all under l, less its cycle.
        ObjectiveValue v = p.objective(buckets[b], std::vector<int>(buckets[b].size(), l));
        total += v.totalSeconds - v.switchSeconds + sw[prev][l];
        prev = l;
      }
      if (ok) best = std::min(best, total + sw[prev][p.home()]);
      int b = 0;
      while (b < k && ++choice[b] == L) choice[b++] = 0;
      if (b == k) break;
    }
  }
  return best;
}

TEST(PlannerTest, ProgramIsExactOverContiguousBuckets) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> cost(0.0, 0.05);
  HardwareProfile hw = unitHardware();
  hw.layerOverheadSeconds = 0.004;  // pipelined micro-batches of about 10x that (tau)
  hw.memoryBytes = 60000;
  CostModel model(tinyModel(), hw, Topology(2, 2));
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<std::vector<double>> sw(3, std::vector<double>(3, 0.0));
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) sw[i][j] = i == j ? 0 : cost(gen);
    }
    Planner p(model, {Layout(2, 1, 1), Layout(1, 2, 1), Layout(1, 1, 2)}, trial % 3,
              SwitchCosts{sw, {cost(gen), cost(gen), cost(gen)}, {cost(gen), cost(gen), cost(gen)}});
    int64_t holds = 0;
    for (int l = 0; l < 3; ++l) holds = std::max(holds, p.microBatchBudget(l));
    ASSERT_GT(holds, 20);
    std::uniform_int_distribution<int64_t> len(1, holds);
    std::vector<int64_t> lengths;
    for (int i = 0; i < 7; ++i) lengths.push_back(len(gen));
    StepPlan plan = p.plan(lengths);
    EXPECT_NEAR(plan.programSeconds, bruteForceProgram(p, lengths), 1e-9) << "trial " << trial;
    if (!plan.singlePhaseFallback) EXPECT_LE(plan.objectiveSeconds, plan.programSeconds + 1e-9);
  }
}

TEST(PlannerTest, DroppingDominatedLayoutsKeepsTheOptimum) {
  Fixture s;
  // The same degrees in another rank order: identical costs, so one of the two is dropped.
  s.layouts.push_back(Layout(8, 1, 1, 1, Layout::parseOrder("dp-tp-cp-pp")));
  const size_t n = s.layouts.size();
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, 0.05));
  for (size_t i = 0; i < n; ++i) sw[i][i] = 0;
  sw[0][n - 1] = sw[n - 1][0] = 0;
  std::vector<double> grad(n, 0.02);
  grad[0] = 0;
  PlannerOptions on, off;
  off.pruneDominated = false;
  Planner pruned(s.cost, s.layouts, 0, SwitchCosts{sw, grad, {}}, on);
  Planner full(s.cost, s.layouts, 0, SwitchCosts{sw, grad, {}}, off);
  for (unsigned seed = 1; seed <= 6; ++seed) {
    std::vector<int64_t> lengths = longTailed(300, seed);
    StepPlan a = pruned.plan(lengths), b = full.plan(lengths);
    EXPECT_LT(a.candidatesUsed, static_cast<int>(n));
    EXPECT_EQ(b.candidatesUsed, static_cast<int>(n));
    EXPECT_NEAR(a.programSeconds, b.programSeconds, 1e-9 * b.programSeconds);
  }
}

TEST(PlannerTest, MemoryBudgetShrinksMicroBatches) {
  Fixture s;
  HardwareProfile small = s.cost.hardware();
  small.memoryBytes = 40LL << 30;
  CostModel cost(s.cost.model(), small, s.cost.topology(), CostOptions{true, 4, 12});
  Planner tight(cost, s.layouts, 0, SwitchCosts{uniformSwitches(5, 0.05), std::vector<double>(5, 0.0), {}});
  Planner roomy = s.planner();
  for (int l = 0; l < 5; ++l) EXPECT_LT(tight.microBatchBudget(l), roomy.microBatchBudget(l));
  StepPlan plan = tight.plan(longTailed(200, 5));
  for (const PlannedPhase& phase : plan.phases) EXPECT_LE(phase.cost.peakBytes, 40LL << 30);
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

// The program's plan is kept only when it beats one phase under home or the best static
// layout by minGain: measured with no margin, then with the margin just above and just below
// the gain the step offers.
TEST(PlannerTest, KeepsTheProgramsPlanOnlyWhenItWinsByTheMargin) {
  Fixture s;
  const size_t n = s.layouts.size();
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, 0.05));
  for (size_t i = 0; i < n; ++i) sw[i][i] = 0;
  std::vector<double> grad(n, 0.025);
  grad[s.home] = 0;
  std::vector<int64_t> lengths = longTailed(256, 3);  // a step where the phases win by 2%
  lengths.push_back(31991);  // only high tp holds it: the home dp8 alone cannot run the step
  auto planWith = [&](double minGain) {
    PlannerOptions options;
    options.minGain = minGain;
    return Planner(s.cost, s.layouts, s.home, SwitchCosts{sw, grad, {}}, options).plan(lengths);
  };
  const StepPlan free = planWith(0);
  ASSERT_FALSE(free.singlePhaseFallback);
  ASSERT_GT(free.phases.size(), 1u);
  ASSERT_GT(free.onePhaseSeconds, 0);
  EXPECT_DOUBLE_EQ(free.programPlanSeconds, free.totalSeconds);
  const double gain = free.onePhaseSeconds / free.programPlanSeconds - 1;
  ASSERT_GT(gain, 0.0);

  const StepPlan kept = planWith(gain * 0.9);
  EXPECT_FALSE(kept.singlePhaseFallback);
  EXPECT_DOUBLE_EQ(kept.totalSeconds, free.totalSeconds);

  const StepPlan one = planWith(gain * 1.1);
  EXPECT_TRUE(one.singlePhaseFallback);
  ASSERT_EQ(one.phases.size(), 1u);
  EXPECT_DOUBLE_EQ(one.totalSeconds, free.onePhaseSeconds);
  EXPECT_DOUBLE_EQ(one.programPlanSeconds, free.programPlanSeconds);

  for (double bad : {-0.01, std::nan("")}) {
    PlannerOptions options;
    options.minGain = bad;
    EXPECT_THROW(Planner(s.cost, s.layouts, s.home, SwitchCosts{sw, grad, {}}, options), InvalidArgument);
  }
}

// Found by the planner fuzzer: with memory for billions of tokens, the squared lengths of
// the program's prefix sums overflowed int64 and the buckets were costed with negative work.
TEST(PlannerTest, HugeSequencesDoNotOverflowThePrefixSums) {
  HardwareProfile hw = unitHardware();
  hw.memoryBytes = int64_t{1} << 62;
  PlannerOptions options;
  options.exactFallback = false;
  Planner p(CostModel(tinyModel(), hw, Topology(2, 2)), {Layout(2, 1, 1), Layout(1, 2, 1)}, 0,
            SwitchCosts{uniformSwitches(2, 0.5), {0, 0}, {}}, options);
  const int64_t s = 3037000500;  // s * s > INT64_MAX
  ASSERT_GE(p.microBatchBudget(0), s);
  StepPlan plan = p.plan({s, s, 7});
  EXPECT_GT(plan.programSeconds, 0);
  EXPECT_LE(plan.objectiveSeconds, plan.programSeconds * (1 + 1e-12));
  std::vector<int64_t> lengths;
  std::vector<int> assignment;
  for (const PlannedPhase& phase : plan.phases) {
    for (int i : phase.sequences) {
      lengths.push_back(plan.pieces[i].length);
      assignment.push_back(phase.candidate);
    }
  }
  EXPECT_NEAR(p.objective(lengths, assignment).totalSeconds, plan.objectiveSeconds, 1e-9 * plan.objectiveSeconds);
}

// LLaMA-7B on 8 A800s without tp8: the plain layouts hold at most some 20K tokens; with full
// recomputation as a choice the longer pieces plan, and only their phase pays for it.
TEST(PlannerTest, RecomputesOnlyThePhasesThatNeedIt) {
  Fixture s;
  s.layouts = {Layout(8, 1, 1), Layout(4, 2, 1), Layout(2, 4, 1), Layout(2, 2, 2)};
  const size_t n = s.layouts.size();
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, 0.05));
  for (size_t i = 0; i < n; ++i) sw[i][i] = 0;
  std::vector<double> grad(n, 0.025);
  grad[0] = 0;
  const Planner plain(s.cost, s.layouts, 0, SwitchCosts{sw, grad, {}});
  PlannerOptions options;
  options.recompute = {Recompute::kNone, Recompute::kFull};
  const Planner both(s.cost, s.layouts, 0, SwitchCosts{sw, grad, {}}, options);
  int64_t plainMost = 0;
  for (size_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i);
    EXPECT_EQ(both.candidateModel(c).recompute, Recompute::kNone);
    EXPECT_EQ(both.candidateModel(c).budget, plain.microBatchBudget(c));
    EXPECT_GT(both.candidateModel(c, Recompute::kFull).budget, plain.microBatchBudget(c));
    EXPECT_EQ(both.microBatchBudget(c), both.candidateModel(c, Recompute::kFull).budget);
    plainMost = std::max(plainMost, plain.microBatchBudget(c));
  }
  EXPECT_THROW(both.candidateModel(0, Recompute::kSelective), InvalidArgument);

  // A short step: nothing recomputes, and the plan is the plain planner's.
  std::vector<int64_t> shortStep = longTailed(128, 5);
  for (int64_t& l : shortStep) l = std::min<int64_t>(l, plainMost);
  const StepPlan a = plain.plan(shortStep), b = both.plan(shortStep);
  ASSERT_EQ(a.phases.size(), b.phases.size());
  for (size_t k = 0; k < a.phases.size(); ++k) {
    EXPECT_EQ(b.phases[k].recompute, Recompute::kNone);
    EXPECT_EQ(b.phases[k].candidate, a.phases[k].candidate);
  }
  EXPECT_DOUBLE_EQ(b.totalSeconds, a.totalSeconds);

  // One piece longer than any plain layout holds: the plain planner refuses, the other plans
  // it under full recomputation and leaves the short pieces without. (With few short pieces
  // one phase for all can be faster: a second replica runs them beside the long one.)
  std::vector<int64_t> lengths = longTailed(1024, 5);
  const int64_t outlier = plainMost + plainMost / 2;
  lengths.push_back(outlier);
  EXPECT_THROW(plain.plan(lengths), InvalidArgument);
  const StepPlan plan = both.plan(lengths);
  int full = 0, none = 0;
  for (const PlannedPhase& phase : plan.phases) {
    EXPECT_TRUE(phase.cost.fits);
    int64_t longest = 0;
    for (int i : phase.sequences) longest = std::max(longest, plan.pieces[i].length);
    if (phase.recompute == Recompute::kFull) {
      ++full;
      EXPECT_EQ(longest, outlier);  // only the long bucket pays
    } else {
      ++none;
      EXPECT_EQ(phase.recompute, Recompute::kNone);
      EXPECT_LE(longest, plainMost);
    }
    // The phase's cost is the cost model's for its recompute mode.
    std::vector<int64_t> all;
    for (const auto& q : plan.pieces) all.push_back(q.length);
    const PhaseCost again = s.cost.phase(phase.layout, phase.recompute, phase.packing.lengths(all));
    EXPECT_DOUBLE_EQ(again.totalSeconds, phase.cost.totalSeconds);
    EXPECT_EQ(again.peakBytes, phase.cost.peakBytes);
  }
  EXPECT_EQ(full, 1);
  EXPECT_GE(none, 1);
  // The objective of the plan's assignment, recompute modes included, is the plan's.
  if (!plan.singlePhaseFallback) {
    std::vector<int> assignment(plan.pieces.size());
    std::vector<Recompute> modes(plan.pieces.size());
    std::vector<int64_t> pieceLengths;
    for (const auto& q : plan.pieces) pieceLengths.push_back(q.length);
    for (const PlannedPhase& phase : plan.phases) {
      for (int i : phase.sequences) {
        assignment[i] = phase.candidate;
        modes[i] = phase.recompute;
      }
    }
    EXPECT_NEAR(both.objective(pieceLengths, assignment, modes).totalSeconds, plan.objectiveSeconds,
                1e-9 * plan.objectiveSeconds);
    EXPECT_THROW(both.objective(pieceLengths, assignment), InvalidArgument);  // the outlier without
  }
  options.recompute = {Recompute::kFull, Recompute::kFull};
  EXPECT_THROW(Planner(s.cost, s.layouts, 0, SwitchCosts{sw, grad, {}}, options), InvalidArgument);
  options.recompute = {};
  EXPECT_THROW(Planner(s.cost, s.layouts, 0, SwitchCosts{sw, grad, {}}, options), InvalidArgument);
}

// LLaMA-7B on two nodes of 8 A800s: tp16 spans the nodes and its collectives cross the
// inter-node links, so it runs only the piece no layout inside a node holds.
TEST(PlannerTest, TensorParallelismAcrossNodesOnlyForWhatNothingElseHolds) {
  const CostModel cost{ModelConfig::preset("llama-7b"), HardwareProfile::preset("a800"), Topology(16, 8),
                       CostOptions{true, 4, 12}};
  const std::vector<Layout> layouts{Layout(16, 1, 1), Layout(4, 4, 1), Layout(2, 8, 1), Layout(1, 16, 1)};
  const size_t n = layouts.size();
  std::vector<std::vector<double>> sw(n, std::vector<double>(n, 0.05));
  for (size_t i = 0; i < n; ++i) sw[i][i] = 0;
  std::vector<double> grad(n, 0.025);
  grad[0] = 0;
  const Planner planner(cost, layouts, 0, SwitchCosts{sw, grad, {}});
  EXPECT_TRUE(cost.spansNodes(layouts[3], Axis::kTp));
  EXPECT_FALSE(cost.spansNodes(layouts[2], Axis::kTp));
  // Its collectives cost more per token than tp8's inside a node.
  EXPECT_GT(cost.terms(layouts[3]).alphaTp, cost.terms(layouts[2]).alphaTp);
  const int64_t inside = planner.microBatchBudget(2);
  ASSERT_GT(planner.microBatchBudget(3), inside);
  std::vector<int64_t> lengths = longTailed(128, 9);
  for (int64_t& l : lengths) l = std::min(l, inside);
  lengths.push_back((inside + planner.microBatchBudget(3)) / 2);
  const StepPlan plan = planner.plan(lengths);
  int across = 0;
  for (const PlannedPhase& phase : plan.phases) {
    if (phase.candidate != 3) continue;
    ++across;
    ASSERT_EQ(phase.sequences.size(), 1u);
    EXPECT_EQ(plan.pieces[phase.sequences[0]].length, lengths.back());
  }
  EXPECT_EQ(across, 1);
}

}  // namespace
}  // namespace hotswitch
