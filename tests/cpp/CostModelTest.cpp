#include "planner/CostModel.h"

#include <gtest/gtest.h>

#include <limits>
#include <utility>

#include "CostFixtures.h"
#include "TestUtil.h"
#include "common/Check.h"

namespace hotswitch {
namespace {

// The hand-countable model of CostFixtures.h: 2 layers, hidden 8, 2 heads (no GQA), FFN 16,
// vocab 10, bf16.
ModelConfig tiny() { return testing::tinyModel(); }
using testing::unitHardware;

TEST(CostModelTest, ParameterCountsByHand) {
  ModelConfig m = tiny();
  // qkv 8 * (8 + 2 * 8) = 192, proj 64, gate/up 2 * 16 * 8 = 256, down 128, norms 16.
  EXPECT_EQ(m.layerParams(), 192 + 64 + 256 + 128 + 16);
  EXPECT_EQ(m.totalParams(), 2 * 656 + 2 * 80 + 8);
  ModelConfig llama = ModelConfig::preset("llama-7b");
  EXPECT_NEAR(static_cast<double>(llama.totalParams()), 6.74e9, 0.01e9);
  ModelConfig big = ModelConfig::preset("llama-70b");
  EXPECT_NEAR(static_cast<double>(big.totalParams()), 68.98e9, 0.1e9);
}

TEST(CostModelTest, FlopsByHand) {
  CostModel cost(tiny(), unitHardware(), Topology(1, 1));
  // Per layer: linear 2 * 640 * s, attention 2 * s^2 * 8; head 2 * 10 * 8 * s.
  const int64_t s = 5;
  const double products = 2 * 2.0 * 640 * s, attention = 2 * 2.0 * s * s * 8, head = 2.0 * 10 * 8 * s;
  EXPECT_DOUBLE_EQ(cost.forwardFlops(s), products + attention + head);
  // Backward: two products per forward one; flash attention's backward 2.5 forwards.
  EXPECT_DOUBLE_EQ(cost.trainingFlops(s), 3 * products + 3.5 * attention + 3 * head);
  ModelConfig recompute = tiny();
  recompute.recompute = Recompute::kFull;
  // Recomputation reruns the layers' forward, not the head's.
  EXPECT_DOUBLE_EQ(CostModel(recompute, unitHardware(), Topology(1, 1)).trainingFlops(s),
                   4 * products + 4.5 * attention + 3 * head);
  // Attention is quadratic: one sequence of 2s costs more than two of s.
  EXPECT_GT(cost.forwardFlops(2 * s), 2 * cost.forwardFlops(s));
}

TEST(CostModelTest, SingleDevicePhaseIsComputeOverFlops) {
  CostModel cost(tiny(), unitHardware(), Topology(1, 1));
  PhaseCost p = cost.phase(Layout(1, 1, 1), {{{5, 3}, {7}}});
  // Without memory traffic or overheads the time is the training FLOPs at peak, attention's
  // padded to flash attention's head dims: tiny()'s head dim 4 runs as 32.
  auto flops = [&](int64_t s) { return cost.trainingFlops(s) + 2 * 3.5 * 2.0 * s * s * 8 * (32.0 / 4 - 1); };
  EXPECT_NEAR(p.totalSeconds, (flops(5) + flops(3) + flops(7)) / 1e6, 1e-12);
  EXPECT_EQ(p.tpSeconds, 0);
  EXPECT_EQ(p.ppSeconds, 0);
  EXPECT_EQ(p.dpSeconds, 0);
  // Static memory: 1480 params * (2 + 4) bytes + 12 bytes optimizer state each.
  EXPECT_EQ(p.staticBytes, 1480 * 18);
  // Activations: with pp = 1 one micro-batch is in flight, the largest (8 tokens): 2 layers *
  // 34 * 8 bytes per token, plus fp32 logits and their gradient: 8 tokens * 10 * 4 * 2.
  EXPECT_EQ(p.activationBytes, 8 * 2 * 34 * 8 + 8 * 10 * 8);
  EXPECT_TRUE(p.fits);
}

TEST(CostModelTest, TermsByHand) {
  // tiny(): 2 layers, hidden 8, linear params 640 per layer, head dim 4 (runs as 32), vocab 10, bf16.
  HardwareProfile hw = unitHardware();
  hw.attentionEfficiency = 0.5;  // attention at half the linear layers' rate
  hw.intraNodeLatency = 1e-3;
  hw.layerOverheadSeconds = 0.25;
  hw.sequenceOverheadSeconds = 0.125;
  CostModel cost(tiny(), hw, Topology(2, 2));
  LayoutTerms one = cost.terms(Layout(2, 1, 1));
  // Per token: 3 * (2 layers * 2 * 640) + 3 * (2 * 10 * 8) FLOPs at 1e6 FLOP/s.
  EXPECT_DOUBLE_EQ(one.alphaCompute, (3 * 2 * 2 * 640 + 3 * 2 * 10 * 8) / 1e6);
  EXPECT_DOUBLE_EQ(one.lastStageAlpha, 3 * 2 * 10 * 8 / 1e6);
  // Per token^2: 2 layers * 7 * 8 * (32 / 4) FLOPs at 0.5e6 FLOP/s.
  EXPECT_DOUBLE_EQ(one.beta, 2 * 7 * 8 * 8 / 0.5e6);
  EXPECT_DOUBLE_EQ(one.gamma, 2 * 0.125);
  EXPECT_DOUBLE_EQ(one.alphaTp, 0);
  EXPECT_DOUBLE_EQ(one.microBatchSeconds, 2 * 0.25);
  // dp2 all-reduce of the rank's 1480 fp32 gradients (layers, embedding, final norm, head):
  // 2 steps of half the bytes at 1e3 B/s + latency.
  EXPECT_DOUBLE_EQ(one.dpSeconds, 2 * (1480 * 4 / 2 / 1e3 + 1e-3));

  LayoutTerms tp = cost.terms(Layout(1, 2, 1));
  EXPECT_DOUBLE_EQ(tp.alphaCompute, one.alphaCompute / 2);
  EXPECT_DOUBLE_EQ(tp.beta, one.beta / 2);
  // 6 collectives per layer (sequence parallelism: 10, the backward's 4 beside the products
  // hidden), each (tp - 1) / tp of the token's 8 * 2 bytes at 1e3 B/s; the head's input
  // gathered (its backward's gather and reduce-scatter hidden beside its products), and
  // three all-reduces of 4 bytes.
  const double head = 1 * 0.5 * 8 * 2 / 1e3 + 3 * 2 * 0.5 * 4 / 1e3;
  EXPECT_DOUBLE_EQ(tp.alphaTp, 2 * 6 * 0.5 * 8 * 2 / 1e3 + head);
  EXPECT_DOUBLE_EQ(tp.microBatchTpSeconds, 2 * 6 * 1 * 1e-3 + (1 + 3 * 2) * 1e-3);
  EXPECT_DOUBLE_EQ(tp.microBatchSeconds, 2 * 0.25 + tp.microBatchTpSeconds);
  EXPECT_DOUBLE_EQ(tp.lastStageAlpha, one.lastStageAlpha / 2 + head);

  LayoutTerms pp = cost.terms(Layout(1, 1, 2));
  EXPECT_DOUBLE_EQ(pp.beta, one.beta / 2);  // one layer per stage
  EXPECT_DOUBLE_EQ(pp.p2pPerToken, 8 * 2 / 1e3);
  EXPECT_DOUBLE_EQ(pp.p2pLatency, 1e-3);
  EXPECT_DOUBLE_EQ(pp.microBatchSeconds, 0.25);
}

TEST(CostModelTest, OneForwardOneBackwardOfEqualMicroBatches) {
  // Equal micro-batches: sum of the stage times plus (pp - 1) stage times.
  for (int pp : {1, 2, 4}) {
    for (int m : {1, 3, 8}) {
      std::vector<std::vector<double>> f(pp, std::vector<double>(m, 1.0)), b(pp, std::vector<double>(m, 2.0));
      const double expected = m * 3.0 + (pp - 1) * 3.0;
      EXPECT_DOUBLE_EQ(oneForwardOneBackward(f, b, std::vector<double>(m, 0.0)), expected) << pp << " " << m;
      // Synchronous transfers: a lone micro-batch pays each stage boundary twice; in steady
      // state the first stage waits for every gradient's round trip.
      const double p = 0.25;
      const double withTransfers = oneForwardOneBackward(f, b, std::vector<double>(m, p));
      if (m == 1) EXPECT_DOUBLE_EQ(withTransfers, expected + (pp - 1) * 2 * p);
      EXPECT_GE(withTransfers, expected + (pp - 1) * 2 * p);
      EXPECT_LE(withTransfers, expected + (m + pp - 1) * 2 * p);
    }
  }
  EXPECT_EQ(oneForwardOneBackward({{}, {}}, {{}, {}}, {}), 0);
  EXPECT_THROW(oneForwardOneBackward({{1.0}}, {{1.0}, {1.0}}, {0.0}), InvalidArgument);
}

TEST(CostModelTest, OneForwardOneBackwardByHand) {
  // Two stages, micro-batches of cost 3 then 9 (forward a third): stage 0 runs F0 F1 B0 B1,
  // stage 1 F0 B0 F1 B1; no transfer time.
  //   s0: F0 [0,1], F1 [1,4]
  //   s1: F0 [1,2], B0 [2,4], F1 [4,7], B1 [7,13]
  //   s0: B0 [4,6], B1 [13,19]
  const double t = oneForwardOneBackward({{1, 3}, {1, 3}}, {{2, 6}, {2, 6}}, {0, 0});
  EXPECT_DOUBLE_EQ(t, 19);
  // Unequal micro-batches stall the pipeline beyond sum + (pp - 1) * the largest.
  std::vector<std::vector<double>> f(4), b(4);
  const std::vector<double> costs = {1, 9, 1, 1, 9, 1, 1, 1};
  double sum = 0, largest = 0;
  for (double c : costs) {
    sum += c;
    largest = std::max(largest, c);
  }
  for (int j = 0; j < 4; ++j) {
    for (double c : costs) {
      f[j].push_back(c / 3);
      b[j].push_back(2 * c / 3);
    }
  }
  EXPECT_GT(oneForwardOneBackward(f, b, std::vector<double>(costs.size(), 0)), sum + 3 * largest);
  // Never faster than any one stage's own work.
  EXPECT_GE(oneForwardOneBackward(f, b, std::vector<double>(costs.size(), 0)), sum);
}

TEST(CostModelTest, PhaseRunsTheLastStageAndMiddleStagesThroughOneForwardOneBackward) {
  HardwareProfile hw = unitHardware();
  hw.layerOverheadSeconds = 0.25;
  hw.intraNodeLatency = 1e-3;
  CostModel cost(tiny(), hw, Topology(2, 2));
  // pp2, micro-batches {5, 3} and {7}: the first stage runs one layer, the last one layer
  // and the head.
  const Layout layout(1, 1, 2);
  const LayoutTerms t = cost.terms(layout);
  PhaseCost p = cost.phase(layout, {{{5, 3}, {7}}});
  auto last = [&](double n, double squares, int count) {
    return t.alpha() * n + t.beta * squares + t.gamma * count + t.microBatchSeconds;
  };
  const double l0 = last(8, 34, 2), l1 = last(7, 49, 1);
  const double m0 = l0 - 8 * t.lastStageAlpha - t.lastStageMicroBatchSeconds;
  const double m1 = l1 - 7 * t.lastStageAlpha - t.lastStageMicroBatchSeconds;
  EXPECT_LT(m0, l0);
  const double run = oneForwardOneBackward({{m0 / 3, m1 / 3}, {l0 / 3, l1 / 3}},
                                           {{2 * m0 / 3, 2 * m1 / 3}, {2 * l0 / 3, 2 * l1 / 3}},
                                           {8 * t.p2pPerToken + t.p2pLatency, 7 * t.p2pPerToken + t.p2pLatency});
  EXPECT_NEAR(p.runSeconds(), run, 1e-12);
  EXPECT_NEAR(p.computeSeconds + p.tpSeconds, l0 + l1, 1e-12);
  EXPECT_NEAR(p.ppSeconds, run - l0 - l1, 1e-12);
  EXPECT_EQ(p.dpSeconds, 0);
}

TEST(CostModelTest, ProductEfficiencySaturatesInTheWorkOfOneKernel) {
  // With memory traffic modelled, a micro-batch of n tokens costs alpha * n + o in products:
  // its achieved FLOP rate rises with n, quickly at first, then levels off below
  // peak * efficiency.
  ModelConfig m = ModelConfig::preset("llama-7b");
  HardwareProfile hw = HardwareProfile::preset("h100-datasheet");
  hw.memoryEfficiency = 0.5;
  hw.attentionEfficiency = 1.0;
  CostModel cost(m, hw, Topology(1, 1));
  const Layout layout(1, 1, 1);
  std::vector<double> rates;
  for (int64_t n : {16, 128, 1024, 8192, 65536}) {
    // n sequences of one token: attention is negligible.
    const double seconds = cost.phase(layout, {{std::vector<int64_t>(n, 1)}}).totalSeconds;
    rates.push_back(3 * (cost.forwardFlops(1) - 2.0 * 32 * 4096) * n / seconds);
    EXPECT_LT(rates.back(), hw.achievedFlops()) << n;
    if (rates.size() > 1) EXPECT_GT(rates.back(), rates[rates.size() - 2]) << n;
  }
  EXPECT_GT(rates[1] / rates[0], 1.5);
  EXPECT_LT(rates[4] / rates[3], 1.05);
  // Narrower shards move more bytes per FLOP: tp = 2 costs a rank more than half of tp = 1.
  CostModel node(m, hw, Topology(8, 8));
  const LayoutTerms one = node.terms(Layout(8, 1, 1)), two = node.terms(Layout(4, 2, 1));
  EXPECT_GT(two.alphaCompute, one.alphaCompute / 2);
  // With infinite memory bandwidth (not modelled), exactly half.
  hw.memoryBandwidth = 0;
  CostModel flat(m, hw, Topology(8, 8));
  EXPECT_NEAR(flat.terms(Layout(4, 2, 1)).alphaCompute, flat.terms(Layout(8, 1, 1)).alphaCompute / 2, 1e-18);
}

TEST(CostModelTest, AttentionEfficiencyIsHalfAtTheHalfLength) {
  HardwareProfile hw = unitHardware();
  const double half = 512;
  hw.attentionHalfLength = half;
  CostModel withCurve(tiny(), hw, Topology(1, 1));
  CostModel without(tiny(), unitHardware(), Topology(1, 1));
  const Layout layout(1, 1, 1);
  const LayoutTerms a = withCurve.terms(layout), b = without.terms(layout);
  // The curve adds beta * half per token: at s = half attention takes twice as long.
  EXPECT_DOUBLE_EQ(a.alphaCompute - b.alphaCompute, b.beta * half);
  EXPECT_DOUBLE_EQ(a.beta, b.beta);
  const auto s = static_cast<int64_t>(half);
  const double attentionWith = a.beta * s * s + (a.alphaCompute - b.alphaCompute) * s;
  EXPECT_DOUBLE_EQ(attentionWith, 2 * b.beta * s * s);
  // Long sequences approach the full efficiency.
  const int64_t longSeq = 1 << 20;
  const double ratio = (a.beta * longSeq * longSeq + a.beta * half * longSeq) / (b.beta * longSeq * longSeq);
  EXPECT_LT(ratio, 1.001);
}

TEST(CostModelTest, PaddedSequencesCostAtLeastPackedOnes) {
  CostModel cost(ModelConfig::preset("llama-7b"), HardwareProfile::preset("h100"), Topology(8, 8));
  const std::vector<int64_t> lengths = {100, 4000, 700, 31, 2048, 8192, 5, 900};
  const int64_t padTo = 8192;
  for (const Layout& layout : {Layout(2, 4, 1), Layout(1, 4, 2), Layout(1, 2, 4)}) {
    // Two sequences per micro-batch, packed (their own lengths) or padded to 8192 each.
    PhaseBatches packed(layout.dp()), padded(layout.dp());
    for (size_t i = 0; i < lengths.size(); i += 2) {
      const int r = static_cast<int>(i / 2) % layout.dp();
      packed[r].push_back({lengths[i], lengths[i + 1]});
      padded[r].push_back({padTo, padTo});
    }
    const PhaseCost a = cost.phase(layout, packed), b = cost.phase(layout, padded);
    EXPECT_GT(b.totalSeconds, a.totalSeconds) << layout.name();
    EXPECT_GE(b.activationBytes, a.activationBytes) << layout.name();
  }
}

TEST(CostModelTest, MoreTokensNeverCostLess) {
  CostModel cost(ModelConfig::preset("llama-7b"), HardwareProfile::preset("h100"), Topology(16, 8));
  for (const Layout& layout : {Layout(16, 1, 1), Layout(2, 8, 1), Layout(2, 2, 4), Layout(1, 16, 1)}) {
    double previous = 0;
    for (int64_t s : {1, 64, 512, 4096, 32768}) {
      const double t = cost.phase(layout, PhaseBatches(layout.dp(), {{s}, {s}})).totalSeconds;
      EXPECT_GT(t, previous) << layout.name() << " " << s;
      previous = t;
    }
  }
}

TEST(CostModelTest, CollectivesUseTheSlowLinkAcrossNodes) {
  CostModel cost(tiny(), unitHardware(), Topology(4, 2));
  // tp2 groups {0,1},{2,3} stay in a node; dp2 groups {0,2},{1,3} cross nodes.
  Layout layout(2, 2, 1);
  EXPECT_DOUBLE_EQ(cost.collectiveSeconds(layout, Axis::kTp, 1000, false), 1 * (500 / 1e3));
  EXPECT_DOUBLE_EQ(cost.collectiveSeconds(layout, Axis::kDp, 1000, true), 2 * (500 / 1e2));
  EXPECT_EQ(cost.collectiveSeconds(layout, Axis::kPp, 1000, true), 0);
}

TEST(CostModelTest, PipelineBubbleAndMemoryShrinkWithStages) {
  CostModel cost(tiny(), unitHardware(), Topology(2, 2));
  PhaseCost flat = cost.phase(Layout(2, 1, 1), {{{4}, {4}}, {{4}, {4}}});
  PhaseCost piped = cost.phase(Layout(1, 1, 2), {{{4}, {4}, {4}, {4}}});
  // Same layer work per rank, but the pipeline pays a bubble of one stage time (and its last
  // stage runs the head for every micro-batch).
  EXPECT_GT(piped.runSeconds(), flat.runSeconds());
  EXPECT_GT(piped.ppSeconds, 0);
  EXPECT_GT(piped.computeSeconds, flat.computeSeconds);
  EXPECT_LT(piped.staticBytes, flat.staticBytes);
}

TEST(CostModelTest, RejectsWhatTheLayoutCannotShard) {
  CostModel cost(tiny(), unitHardware(), Topology(4, 4));
  auto message = [&](const Layout& l, const PhaseBatches& b) {
    return testing::invalidArgumentMessage([&] { cost.phase(l, b); });
  };
  EXPECT_NE(message(Layout(1, 4, 1), {{{4}}}).find("num_attention_heads(2) is not divisible by tp(4)"),
            std::string::npos);
  EXPECT_NE(message(Layout(1, 1, 4), {{{4}}}).find("num_layers(2) is not divisible by pp(4)"),
            std::string::npos);
  EXPECT_NE(message(Layout(4, 1, 1), {{{4}}}).find("got 1 replicas"), std::string::npos);
  EXPECT_NE(message(Layout(2, 2, 1), {{{4}}, {{0}}}).find("sequence length must be >= 1, got 0"),
            std::string::npos);
  EXPECT_THROW(ModelConfig::preset("gpt-5"), InvalidArgument);
  EXPECT_THROW(HardwareProfile::preset("tpu"), InvalidArgument);
  HardwareProfile bad = unitHardware();
  bad.efficiency = 1.5;
  EXPECT_THROW(CostModel(tiny(), bad, Topology(1, 1)), InvalidArgument);
}

TEST(CostModelTest, PresetsFromTheFitAndDataSheets) {
  const HardwareProfile sheet = HardwareProfile::preset("h100-datasheet");
  EXPECT_DOUBLE_EQ(sheet.peakFlops, 989e12);
  EXPECT_DOUBLE_EQ(sheet.efficiency, 0.5);
  EXPECT_DOUBLE_EQ(sheet.intraNodeBandwidth, 450e9);
  EXPECT_DOUBLE_EQ(sheet.interNodeBandwidth, 50e9);
  EXPECT_DOUBLE_EQ(sheet.layerOverheadSeconds, 100e-6);
  const HardwareProfile h100 = HardwareProfile::preset("h100");
  EXPECT_DOUBLE_EQ(h100.peakFlops, sheet.peakFlops);
  EXPECT_DOUBLE_EQ(h100.memoryBandwidth, 3.35e12);
  // Fitted links never exceed the data sheet's.
  EXPECT_LE(h100.intraNodeBandwidth, sheet.intraNodeBandwidth);
  EXPECT_LE(h100.interNodeBandwidth, sheet.interNodeBandwidth);
  // The other devices: the fit scaled by data-sheet ratios; efficiencies and overheads kept.
  const HardwareProfile h200 = HardwareProfile::preset("h200"), a800 = HardwareProfile::preset("a800"),
                        a100 = HardwareProfile::preset("a100");
  EXPECT_EQ(h200.memoryBytes, 141LL << 30);
  EXPECT_DOUBLE_EQ(h200.memoryBandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(h200.intraNodeBandwidth, h100.intraNodeBandwidth);
  EXPECT_DOUBLE_EQ(a100.peakFlops, 312e12);
  EXPECT_DOUBLE_EQ(a100.intraNodeBandwidth, h100.intraNodeBandwidth * 600 / 900);
  EXPECT_DOUBLE_EQ(a800.intraNodeBandwidth, h100.intraNodeBandwidth * 400 / 900);
  EXPECT_DOUBLE_EQ(a800.interNodeBandwidth, h100.interNodeBandwidth / 2);
  for (const HardwareProfile* h : {&h200, &a800, &a100}) {
    EXPECT_DOUBLE_EQ(h->efficiency, h100.efficiency);
    EXPECT_DOUBLE_EQ(h->attentionEfficiency, h100.attentionEfficiency);
    EXPECT_DOUBLE_EQ(h->layerOverheadSeconds, h100.layerOverheadSeconds);
    EXPECT_NO_THROW(h->validate());
  }
  for (const auto& name : ModelConfig::presetNames()) EXPECT_NO_THROW(ModelConfig::preset(name).validate());
  for (const auto& name : HardwareProfile::presetNames()) EXPECT_EQ(HardwareProfile::preset(name).name, name);
}

TEST(CostModelTest, GptFamilyCountsTwoMatricesBiasesAndTiedEmbeddings) {
  ModelConfig gpt = tiny();
  gpt.family = ModelFamily::kGpt;
  gpt.tiedEmbeddings = true;
  gpt.maxPositions = 16;
  // qkv 8 * 24 = 192, proj 64, fc1 8 * 16 = 128, fc2 128; biases 24 + 8 + 16 + 8; LayerNorms 4 * 8.
  EXPECT_EQ(gpt.layerParams(), 192 + 64 + 128 + 128 + 56 + 32);
  const auto matrices = gpt.layerMatrices(2);
  ASSERT_EQ(matrices.size(), 4u);
  EXPECT_EQ(matrices[2], std::make_pair(int64_t{8}, int64_t{8}));  // fc1: h x f / tp
  EXPECT_EQ(tiny().layerMatrices(2)[2], std::make_pair(int64_t{8}, int64_t{16}));  // gate/up fused
  // Embedding and positions first; final LayerNorm last, the head tied.
  EXPECT_EQ(gpt.firstStageParams(), 80 + 16 * 8);
  EXPECT_EQ(gpt.lastStageParams(), 16);
  EXPECT_EQ(gpt.totalParams(), 2 * gpt.layerParams() + 80 + 128 + 16);
  // A GeLU MLP of two matrices costs fewer FLOPs than SwiGLU of three at the same ffn size.
  CostModel a(gpt, unitHardware(), Topology(1, 1)), b(tiny(), unitHardware(), Topology(1, 1));
  EXPECT_LT(a.forwardFlops(7), b.forwardFlops(7));
  EXPECT_THROW(parseModelFamily("bert"), InvalidArgument);
  EXPECT_EQ(std::string(modelFamilyName(parseModelFamily("gpt"))), "gpt");
}

TEST(CostModelTest, SequenceParallelismSplitsTheNormRegionAndStageTransfers) {
  ModelConfig m = ModelConfig::preset("llama-7b");
  HardwareProfile hw = HardwareProfile::preset("h100");
  CostOptions off;
  off.sequenceParallel = false;
  CostModel with(m, hw, Topology(8, 8)), without(m, hw, Topology(8, 8), off);
  const Layout layout(1, 4, 2);
  const LayoutTerms a = with.terms(layout), b = without.terms(layout);
  EXPECT_GT(b.alphaCompute, a.alphaCompute);  // norms and residual adds on every rank
  EXPECT_DOUBLE_EQ(b.p2pPerToken, 4 * a.p2pPerToken);
  // tp == 1 has nothing to split.
  EXPECT_DOUBLE_EQ(with.terms(Layout(4, 1, 2)).alphaCompute, without.terms(Layout(4, 1, 2)).alphaCompute);
}

TEST(CostModelTest, TensorParallelCollectivesPerLayerFollowSequenceParallelismAndOverlap) {
  // Per layer: 10 collectives under sequence parallelism (the backward gathers each
  // column-parallel product's input again), 8 without (4 all-reduces); full recomputation
  // runs the forward's 4 again. tpOverlap hides that share of the 4 the column-parallel
  // products' backward runs beside them. The layers' latency terms, less the head's: the
  // head runs eagerly whatever the layers do, its backward's collectives hidden, so under
  // sequence parallelism its forward gather alone is exposed, and none without.
  HardwareProfile hw = unitHardware();
  hw.intraNodeLatency = 1e-3;
  const Layout tp2(1, 2, 1);
  auto perLayer = [&](bool sp, double overlap, Recompute r) {
    CostOptions o;
    o.sequenceParallel = sp;
    o.tpOverlap = overlap;
    const LayoutTerms terms = CostModel(tiny(), hw, Topology(2, 2), o).terms(tp2, r);
    const double headCollectives = sp ? 1 : 0;
    const double head = headCollectives * 0.5 * 8 * 2 / 1e3 + 3 * 2 * 0.5 * 4 / 1e3;
    EXPECT_NEAR((terms.alphaTp - head) / (2 * 0.5 * 8 * 2 / 1e3),
                (terms.microBatchTpSeconds - (headCollectives + 3 * 2) * 1e-3) / (2 * 1e-3), 1e-9);
    return (terms.microBatchTpSeconds - (headCollectives + 3 * 2) * 1e-3) / (2 * 1e-3);
  };
  EXPECT_NEAR(perLayer(true, 0, Recompute::kNone), 10, 1e-9);
  EXPECT_NEAR(perLayer(true, 0, Recompute::kSelective), 10, 1e-9);
  EXPECT_NEAR(perLayer(true, 0, Recompute::kFull), 14, 1e-9);
  EXPECT_NEAR(perLayer(false, 0, Recompute::kNone), 8, 1e-9);
  EXPECT_NEAR(perLayer(false, 0, Recompute::kFull), 12, 1e-9);
  EXPECT_NEAR(perLayer(true, 1, Recompute::kNone), 6, 1e-9);
  EXPECT_NEAR(perLayer(true, 1, Recompute::kFull), 10, 1e-9);
  EXPECT_NEAR(perLayer(false, 1, Recompute::kNone), 4, 1e-9);
  EXPECT_NEAR(perLayer(true, 0.5, Recompute::kNone), 8, 1e-9);
  // The head's terms: the same at any overlap; sequence parallelism adds its forward gather.
  auto headTerms = [&](bool sp, double overlap) {
    CostOptions o;
    o.sequenceParallel = sp;
    o.tpOverlap = overlap;
    const LayoutTerms terms = CostModel(tiny(), hw, Topology(2, 2), o).terms(tp2);
    return std::make_pair(terms.lastStageAlpha, terms.lastStageMicroBatchSeconds);
  };
  EXPECT_EQ(headTerms(true, 0), headTerms(true, 1));
  EXPECT_EQ(headTerms(false, 0), headTerms(false, 1));
  EXPECT_NEAR(headTerms(true, 1).first - headTerms(false, 1).first, 0.5 * 8 * 2 / 1e3, 1e-12);
  EXPECT_NEAR(headTerms(true, 1).second - headTerms(false, 1).second, 1e-3, 1e-12);
  EXPECT_DOUBLE_EQ(CostOptions{}.tpOverlap, 1.0);
  // A rerun that stops early (recomputeChunkLayers k) skips each chunk's last reduce-scatter,
  // or its last all-reduce (two collectives' traffic) without sequence parallelism: as this
  // runtime posts 13 per layer at k = 1 and 13.5 at k = 2, where Megatron-LM posts 14.
  auto early = [&](bool sp, int64_t k, Recompute r) {
    CostOptions o;
    o.sequenceParallel = sp;
    o.tpOverlap = 0;
    o.recomputeChunkLayers = k;
    const LayoutTerms terms = CostModel(tiny(), hw, Topology(2, 2), o).terms(tp2, r);
    return (terms.microBatchTpSeconds - ((sp ? 1 : 0) + 3 * 2) * 1e-3) / (2 * 1e-3);
  };
  EXPECT_NEAR(early(true, 1, Recompute::kFull), 13, 1e-9);
  EXPECT_NEAR(early(true, 2, Recompute::kFull), 13.5, 1e-9);
  EXPECT_NEAR(early(true, 3, Recompute::kFull), 13.5, 1e-9);  // 2 layers: one chunk of 3 still
  EXPECT_NEAR(early(false, 1, Recompute::kFull), 10, 1e-9);
  EXPECT_NEAR(early(true, 1, Recompute::kNone), 10, 1e-9);  // nothing is rerun
  EXPECT_NEAR(early(true, 1, Recompute::kSelective), 10, 1e-9);
  {
    CostOptions o;
    o.recomputeChunkLayers = -1;
    EXPECT_THROW(CostModel(tiny(), hw, Topology(2, 2), o), InvalidArgument);
  }
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    CostOptions o;
    o.tpOverlap = bad;
    EXPECT_THROW(CostModel(tiny(), hw, Topology(2, 2), o), InvalidArgument) << bad;
  }
}

TEST(CostModelTest, CollectivesAcrossNodesSpreadOverTheGroupsNics) {
  HardwareProfile hw = unitHardware();
  hw.intraNodeBandwidth = 1e3;
  hw.interNodeBandwidth = 50;
  CostModel cost(tiny(), hw, Topology(16, 8));
  // tp16 over two nodes: 8 ranks a node, 8 NICs: min(1e3, 8 * 50) = 400 B/s.
  EXPECT_EQ(cost.groupRanksPerNode(Layout(1, 16, 1), Axis::kTp), 8);
  EXPECT_DOUBLE_EQ(cost.collectiveSeconds(Layout(1, 16, 1), Axis::kTp, 1600, false), 15 * (100 / 400.0));
  // dp2 over tp8 groups: one rank a node, one NIC.
  EXPECT_EQ(cost.groupRanksPerNode(Layout(2, 8, 1), Axis::kDp), 1);
  EXPECT_DOUBLE_EQ(cost.collectiveSeconds(Layout(2, 8, 1), Axis::kDp, 1000, false), 1 * (500 / 50.0));
}

TEST(CostModelTest, StepSecondsGatherParametersAndUpdateTheShard) {
  HardwareProfile hw = unitHardware();
  hw.stepOverheadSeconds = 0.5;
  CostOptions zero;
  zero.zero = true;
  CostModel plain(tiny(), hw, Topology(2, 2)), sharded(tiny(), hw, Topology(2, 2), zero);
  const Layout layout(2, 1, 1);
  // No memory traffic modelled: the overhead, and under ZeRO the all-gather of 1480 bf16
  // parameters over dp2: 1 step of half the bytes at 1e3 B/s.
  EXPECT_DOUBLE_EQ(plain.stepSeconds(layout), 0.5);
  EXPECT_DOUBLE_EQ(sharded.stepSeconds(layout), 0.5 + 1480 * 2 / 2 / 1e3);
  // With memory bandwidth: the shard's update (4 + 2 * 12 + 2 bytes) and the zeroed buffer (4).
  hw.memoryBandwidth = 1e4;
  CostModel updating(tiny(), hw, Topology(2, 2), zero);
  EXPECT_DOUBLE_EQ(updating.stepSeconds(layout), 0.5 + 1480 * 2 / 2 / 1e3 + (740 * 30 + 1480 * 4) / 1e4);
}

// Found by the planner fuzzer: an infinite latency passed validation and made the cost of a
// micro-batch inf - inf = NaN; every rate, latency and overhead must be finite.
TEST(CostModelTest, RejectsInfiniteHardwareFigures) {
  const double inf = std::numeric_limits<double>::infinity();
  HardwareProfile h = unitHardware();
  h.interNodeLatency = inf;
  EXPECT_NE(testing::invalidArgumentMessage([&] { h.validate(); }).find("inter_node_latency must be finite, got inf"),
            std::string::npos);
  h = unitHardware();
  h.peakFlops = inf;
  EXPECT_THROW(h.validate(), InvalidArgument);
  h = unitHardware();
  h.layerOverheadSeconds = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(CostModel(tiny(), h, Topology(2, 2)), InvalidArgument);
}

TEST(CostModelTest, RecomputeTradesTimeForMemory) {
  CostModel cost(ModelConfig::preset("llama-7b"), HardwareProfile::preset("a800"), Topology(8, 8),
                 CostOptions{true, 4, 12});
  const Layout layout(4, 2, 1);
  const PhaseBatches batches(4, {{8192}, {4096, 4096}});
  const LayoutTerms none = cost.terms(layout, Recompute::kNone);
  const LayoutTerms selective = cost.terms(layout, Recompute::kSelective);
  const LayoutTerms full = cost.terms(layout, Recompute::kFull);
  EXPECT_EQ(cost.terms(layout).recompute, Recompute::kNone);  // the model's own setting
  EXPECT_EQ(full.recompute, Recompute::kFull);
  // Either granularity reruns the attention core's forward: 9 of its FLOPs instead of 7.
  EXPECT_NEAR(selective.beta, none.beta * 9 / 7, 1e-9 * none.beta);
  EXPECT_DOUBLE_EQ(full.beta, selective.beta);
  // Only full reruns the products, the elementwise kernels and the collectives.
  EXPECT_GT(selective.alphaCompute, none.alphaCompute);
  EXPECT_GT(full.alphaCompute, selective.alphaCompute + 0.25 * (none.alphaCompute - none.lastStageAlpha));
  EXPECT_DOUBLE_EQ(selective.alphaTp, none.alphaTp);
  EXPECT_GT(full.alphaTp, none.alphaTp);
  EXPECT_DOUBLE_EQ(full.dpSeconds, none.dpSeconds);

  const PhaseCost pn = cost.phase(layout, Recompute::kNone, batches);
  const PhaseCost ps = cost.phase(layout, Recompute::kSelective, batches);
  const PhaseCost pf = cost.phase(layout, Recompute::kFull, batches);
  EXPECT_LT(pn.totalSeconds, ps.totalSeconds);
  EXPECT_LT(ps.totalSeconds, pf.totalSeconds);
  EXPECT_LT(pf.totalSeconds, 1.5 * pn.totalSeconds);  // about one forward more, not a step
  EXPECT_EQ(pf.staticBytes, pn.staticBytes);
  // By hand, 8192 tokens in flight, tp 2, bf16: without recomputation 34 h / 2 bytes per token
  // per layer; with full 2 h / 2 per layer plus one layer rebuilt; fp32 logits and gradients.
  const int64_t n = 8192, h = 4096, layers = 32, logits = n * 16000 * 8;
  EXPECT_EQ(pn.activationBytes, n * 34 * h / 2 * layers + logits);
  EXPECT_EQ(pf.activationBytes, n * 2 * h / 2 * layers + n * 34 * h / 2 + logits);
  // Flash attention keeps no scores: the selective granularity saves nothing here.
  EXPECT_EQ(ps.activationBytes, pn.activationBytes);

  // Without flash attention the attention core keeps 5 bytes per head per token^2 of each
  // sequence (its scores, softmax and dropout mask), which either granularity drops.
  CostOptions eager{true, 4, 12};
  eager.flashAttention = false;
  CostModel plain(ModelConfig::preset("llama-7b"), HardwareProfile::preset("a800"), Topology(8, 8), eager);
  const PhaseCost qn = plain.phase(layout, Recompute::kNone, batches);
  const PhaseCost qs = plain.phase(layout, Recompute::kSelective, batches);
  const PhaseCost qf = plain.phase(layout, Recompute::kFull, batches);
  const int64_t scores = 5 * 32 / 2 * n * n;  // per layer, 32 heads over tp 2
  EXPECT_EQ(qn.activationBytes, pn.activationBytes + scores * layers);
  EXPECT_EQ(qs.activationBytes, pn.activationBytes);
  EXPECT_EQ(qf.activationBytes, pf.activationBytes + scores);  // the layer being rebuilt
  EXPECT_DOUBLE_EQ(qn.totalSeconds, pn.totalSeconds);
}

TEST(CostModelTest, RecomputeFlopsByGranularity) {
  CostModel cost(tiny(), unitHardware(), Topology(1, 1));
  const int64_t s = 5;
  const double products = 2 * 2.0 * 640 * s, attention = 2 * 2.0 * s * s * 8, head = 2.0 * 10 * 8 * s;
  EXPECT_DOUBLE_EQ(cost.trainingFlops(s, Recompute::kNone), cost.trainingFlops(s));
  EXPECT_DOUBLE_EQ(cost.trainingFlops(s, Recompute::kSelective), 3 * products + 4.5 * attention + 3 * head);
  EXPECT_DOUBLE_EQ(cost.trainingFlops(s, Recompute::kFull), 4 * products + 4.5 * attention + 3 * head);
  EXPECT_EQ(parseRecompute("selective"), Recompute::kSelective);
  EXPECT_STREQ(recomputeName(Recompute::kFull), "full");
  EXPECT_THROW(parseRecompute("partial"), InvalidArgument);
}

TEST(CostModelTest, GraphBucketsWeighThePaddingAgainstTheLaunchesSaved) {
  HardwareProfile hw = unitHardware();
  hw.layerOverheadSeconds = 0.05;  // per layer: tiny() has 2
  CostOptions options;
  options.graphBuckets = {8, 64};
  options.graphLayerOverheadSeconds = 0.01;
  CostModel plain(tiny(), hw, Topology(1, 1)), graphs(tiny(), hw, Topology(1, 1), options);
  const Layout dp(1, 1, 1);
  const LayoutTerms t = graphs.terms(dp);
  ASSERT_TRUE(t.graphs);
  EXPECT_DOUBLE_EQ(t.graphSavedSeconds, 2 * (0.05 - 0.01));
  EXPECT_FALSE(plain.terms(dp).graphs);

  // What padding n tokens to the bucket b adds: one more sequence of b - n tokens.
  auto added = [&](double n, double b) {
    const double pad = b - n;
    return t.alpha() * pad + t.beta * pad * pad + (pad > 0 ? t.gamma : 0.0) - t.graphSavedSeconds;
  };
  // 8 tokens fill the first bucket: only the launches change. 7 pad one token; 9 pad 55 and cost
  // more than they save; 70 fit no bucket.
  ASSERT_LT(added(7, 8), 0);
  ASSERT_GT(added(9, 64), 0);
  EXPECT_EQ(graphs.graphTokens(t, {5, 3}), 8);
  EXPECT_EQ(graphs.graphTokens(t, {7}), 8);
  EXPECT_EQ(graphs.graphTokens(t, {4, 5}), 0);
  EXPECT_EQ(graphs.graphTokens(t, {70}), 0);
  EXPECT_EQ(plain.graphTokens(plain.terms(dp), {5, 3}), 0);
  EXPECT_THROW(graphs.graphTokens(t, {0}), InvalidArgument);

  const PhaseBatches batches{{{5, 3}, {7}, {4, 5}, {70}}};
  const PhaseCost with = graphs.phase(dp, batches), without = plain.phase(dp, batches);
  EXPECT_EQ(with.graphedMicroBatches, 2);
  EXPECT_EQ(without.graphedMicroBatches, 0);
  EXPECT_NEAR(with.totalSeconds, without.totalSeconds + added(8, 8) + added(7, 8), 1e-12);
  // A padded micro-batch keeps the activations of its bucket's tokens.
  EXPECT_EQ(graphs.phase(dp, {{{7}}}).activationBytes, plain.phase(dp, {{{8}}}).activationBytes);

  // Graphs under tensor parallelism when every bucket is a multiple of tp (the padded pack
  // cuts into equal sequence-parallel slices), the same saving per layer; none across stages,
  // under context parallelism or full recomputation. (With no tp traffic hidden in eager
  // layers, tpOverlap 0, the graphed ones pay no more collectives.)
  CostOptions serial = options;
  serial.tpOverlap = 0;
  CostModel pair(tiny(), hw, Topology(2, 2), serial);
  EXPECT_TRUE(pair.terms(Layout(2, 1, 1)).graphs);
  const LayoutTerms tp2 = pair.terms(Layout(1, 2, 1));
  EXPECT_TRUE(tp2.graphs);
  EXPECT_DOUBLE_EQ(tp2.graphSavedSeconds, 2 * (0.05 - 0.01));
  EXPECT_EQ(tp2.graphTpAlpha, 0);
  EXPECT_EQ(pair.graphTokens(tp2, {5, 3}), 8);
  EXPECT_EQ(pair.phase(Layout(1, 2, 1), {{{5, 3}}}).graphedMicroBatches, 1);
  // The graphed layers are compiled and hide nothing: where eager layers hide the column-
  // parallel products' 4 backward collectives (tpOverlap 1), a graphed micro-batch pays them
  // for its bucket's tokens (2 layers * 4 * (tp - 1) / tp * 8 * 2 bytes at 1e3 B/s), and so
  // costs what it does at tpOverlap 0, while an eager one costs less.
  CostModel hiding(tiny(), hw, Topology(2, 2), options);
  const LayoutTerms tp2h = hiding.terms(Layout(1, 2, 1));
  EXPECT_DOUBLE_EQ(tp2h.graphTpAlpha, 2 * 4 * 0.5 * 8 * 2 / 1e3);
  EXPECT_DOUBLE_EQ(tp2h.alphaTp + tp2h.graphTpAlpha, tp2.alphaTp);
  const std::vector<std::vector<int64_t>> graphed{{8}}, eager{{0}};
  EXPECT_NEAR(hiding.phase(Layout(1, 2, 1), tp2h, {{{5, 3}}}, &graphed).totalSeconds,
              pair.phase(Layout(1, 2, 1), tp2, {{{5, 3}}}, &graphed).totalSeconds, 1e-12);
  EXPECT_LT(hiding.phase(Layout(1, 2, 1), tp2h, {{{5, 3}}}, &eager).totalSeconds,
            pair.phase(Layout(1, 2, 1), tp2, {{{5, 3}}}, &eager).totalSeconds);
  EXPECT_EQ(hiding.graphTokens(tp2h, {5, 3}), 0);  // 0.512 s more traffic than the 0.08 s saved
  CostOptions odd = options;
  odd.graphBuckets = {8, 63};
  CostModel oddPair(tiny(), hw, Topology(2, 2), odd);
  EXPECT_TRUE(oddPair.terms(Layout(2, 1, 1)).graphs);
  EXPECT_FALSE(oddPair.terms(Layout(1, 2, 1)).graphs);
  EXPECT_EQ(oddPair.phase(Layout(1, 2, 1), {{{5, 3}}}).graphedMicroBatches, 0);
  EXPECT_FALSE(pair.terms(Layout(1, 1, 2)).graphs);
  EXPECT_FALSE(pair.terms(Layout(1, 1, 1, 2)).graphs);
  EXPECT_FALSE(pair.terms(Layout(1, 2, 1), Recompute::kFull).graphs);
  EXPECT_FALSE(graphs.terms(dp, Recompute::kFull).graphs);
  EXPECT_TRUE(graphs.terms(dp, Recompute::kSelective).graphs);

  CostOptions descending = options;
  descending.graphBuckets = {64, 8};
  EXPECT_THROW(CostModel(tiny(), hw, Topology(2, 2), descending), InvalidArgument);
  CostOptions negative = options;
  negative.graphLayerOverheadSeconds = -1;
  EXPECT_THROW(CostModel(tiny(), hw, Topology(2, 2), negative), InvalidArgument);
}

TEST(CostModelTest, GraphBucketsRunOnlyWhereTheAttentionIsStatic) {
  // A mask kernel holds at most graphMaxScores scores (heads per rank * B^2) in one call:
  // tiny() has 2 heads, so under 8,192 scores tp1 graphs 64 tokens (8,192) and no more, and
  // tp2 (1 head) up to 64 as well but not 128 (16,384).
  HardwareProfile hw = unitHardware();
  hw.layerOverheadSeconds = 10.0;  // graphs that save this pay any padding
  CostOptions options;
  options.graphBuckets = {8, 64, 128};
  options.graphMaxScores = 8192;
  const CostModel bounded(tiny(), hw, Topology(2, 2), options);
  options.graphMaxScores.reset();
  const CostModel unbounded(tiny(), hw, Topology(2, 2), options);
  const Layout dp(2, 1, 1), tp(1, 2, 1);
  EXPECT_EQ(bounded.terms(dp).graphMaxTokens, 64);
  EXPECT_EQ(bounded.terms(tp).graphMaxTokens, 64);
  EXPECT_EQ(unbounded.terms(dp).graphMaxTokens, 128);
  options.graphMaxScores = 16384;
  EXPECT_EQ(CostModel(tiny(), hw, Topology(2, 2), options).terms(dp).graphMaxTokens, 64);
  EXPECT_EQ(CostModel(tiny(), hw, Topology(2, 2), options).terms(tp).graphMaxTokens, 128);
  options.graphMaxScores = 0;  // no pack is static: graphs are never chosen
  const CostModel none(tiny(), hw, Topology(2, 2), options);
  EXPECT_EQ(none.terms(dp).graphMaxTokens, 0);
  EXPECT_EQ(none.graphTokens(none.terms(dp), {5}), 0);
  // The choice: the smallest bucket holding the micro-batch, none when it is over the bound.
  EXPECT_EQ(bounded.graphTokens(bounded.terms(dp), {60}), 64);
  EXPECT_EQ(bounded.graphTokens(bounded.terms(dp), {100}), 0);
  EXPECT_EQ(unbounded.graphTokens(unbounded.terms(dp), {100}), 128);
  const PhaseBatches batches{{{100}}, {{60}}};
  EXPECT_EQ(bounded.phase(dp, batches).graphedMicroBatches, 1);
  EXPECT_EQ(unbounded.phase(dp, batches).graphedMicroBatches, 2);
  // A phase cannot have run a bucket over the bound from the graphs; a negative bound is refused.
  const std::vector<std::vector<int64_t>> ran{{128}, {64}};
  EXPECT_THROW(bounded.phase(dp, bounded.terms(dp), batches, &ran), InvalidArgument);
  EXPECT_NO_THROW(unbounded.phase(dp, unbounded.terms(dp), batches, &ran));
  options.graphMaxScores = -1;
  EXPECT_THROW(CostModel(tiny(), hw, Topology(2, 2), options), InvalidArgument);
}

TEST(CostModelTest, GraphCopiesAreHeldInEveryLayoutsStaticMemory) {
  // Each layer's matrices of a graphed layout's shard at the copies' bytes (param bytes by
  // default), its norms whole: tiny() has 2 layers of 640 matrix and 2 * 8 norm parameters.
  CostOptions options;
  options.graphBuckets = {8, 64};
  CostModel graphs(tiny(), unitHardware(), Topology(2, 2), options), plain(tiny(), unitHardware(), Topology(2, 2));
  const int64_t bytes = tiny().paramBytes;
  EXPECT_EQ(tiny().layerParams(), 640 + 2 * 8);
  EXPECT_EQ(graphs.graphCopyBytes(Layout(2, 1, 1)), 2 * 656 * bytes);
  EXPECT_EQ(graphs.graphCopyBytes(Layout(1, 2, 1)), 2 * (640 / 2 + 16) * bytes);
  CostOptions narrow = options;
  narrow.graphCopyParamBytes = 1;  // matrices copied narrower than the parameters are kept
  // The untied head then computes through a copy too: its shard of 10 / 2 rows of 8.
  EXPECT_FALSE(tiny().tiedEmbeddings);
  EXPECT_EQ(CostModel(tiny(), unitHardware(), Topology(2, 2), narrow).graphCopyBytes(Layout(1, 2, 1)),
            2 * (640 / 2 * 1 + 16 * bytes) + 10 / 2 * 8 * 1);
  ModelConfig tied = tiny();
  tied.tiedEmbeddings = true;  // a tied head stays with the embedding on its stage: no copy
  EXPECT_EQ(CostModel(tied, unitHardware(), Topology(2, 2), narrow).graphCopyBytes(Layout(1, 2, 1)),
            2 * (640 / 2 * 1 + 16 * bytes));
  narrow.graphCopyParamBytes = -2;
  EXPECT_THROW(CostModel(tiny(), unitHardware(), Topology(2, 2), narrow), InvalidArgument);
  EXPECT_EQ(graphs.graphCopyBytes(Layout(1, 1, 2)), 0);     // two stages run no graphs
  EXPECT_EQ(graphs.graphCopyBytes(Layout(1, 1, 1, 2)), 0);  // nor does cp
  EXPECT_EQ(plain.graphCopyBytes(Layout(2, 1, 1)), 0);
  CostOptions odd = options;
  odd.graphBuckets = {8, 63};
  EXPECT_EQ(CostModel(tiny(), unitHardware(), Topology(2, 2), odd).graphCopyBytes(Layout(1, 2, 1)), 0);
  // Held copies count in every layout's static memory and so in each phase's peak, graphed or not.
  EXPECT_EQ(graphs.options().graphCopiesHeldBytes, 0);
  const CostModel held = graphs.withGraphCopiesHeld(1000);
  EXPECT_EQ(held.options().graphCopiesHeldBytes, 1000);
  for (const Layout& l : {Layout(2, 1, 1), Layout(1, 2, 1), Layout(1, 1, 2)}) {
    EXPECT_EQ(held.staticBytes(l), graphs.staticBytes(l) + 1000) << l.name();
  }
  const PhaseBatches batches{{{5}}, {{3}}};
  EXPECT_EQ(held.phase(Layout(2, 1, 1), batches).peakBytes, graphs.phase(Layout(2, 1, 1), batches).peakBytes + 1000);
  EXPECT_THROW(graphs.withGraphCopiesHeld(-1), InvalidArgument);
  // Only the layouts named in graphLayouts capture graphs and keep copies.
  CostOptions named = options;
  named.graphLayouts = std::vector<std::string>{"tp2"};
  const CostModel tp2Only(tiny(), unitHardware(), Topology(2, 2), named);
  EXPECT_EQ(tp2Only.graphCopyBytes(Layout(2, 1, 1)), 0);
  EXPECT_FALSE(tp2Only.terms(Layout(2, 1, 1)).graphs);
  EXPECT_EQ(tp2Only.graphCopyBytes(Layout(1, 2, 1)), graphs.graphCopyBytes(Layout(1, 2, 1)));
  EXPECT_TRUE(tp2Only.terms(Layout(1, 2, 1)).graphs);
  named.graphLayouts = std::vector<std::string>{"tp2", "tp2"};
  EXPECT_THROW(CostModel(tiny(), unitHardware(), Topology(2, 2), named), InvalidArgument);
  named.graphLayouts = std::vector<std::string>{"tp02"};  // not as Layout::name writes it
  EXPECT_THROW(CostModel(tiny(), unitHardware(), Topology(2, 2), named), InvalidArgument);
}

TEST(CostModelTest, APhaseIsPricedWithTheGraphBucketsItRanWith) {
  // How a phase that ran is priced again (online re-calibration): each micro-batch at the
  // graph bucket it ran padded to, whatever the model's own choice would be.
  HardwareProfile hw = unitHardware();
  hw.layerOverheadSeconds = 0.05;
  CostOptions options;
  options.graphBuckets = {8, 64};
  options.graphLayerOverheadSeconds = 0.01;
  CostModel graphs(tiny(), hw, Topology(1, 1), options), plain(tiny(), hw, Topology(1, 1));
  const Layout dp(1, 1, 1);
  const LayoutTerms t = graphs.terms(dp);
  const PhaseBatches batches{{{5, 3}, {7}, {4, 5}, {70}}};
  auto added = [&](double n, double b) {
    const double pad = b - n;
    return t.alpha() * pad + t.beta * pad * pad + (pad > 0 ? t.gamma : 0.0) - t.graphSavedSeconds;
  };
  // As chosen: the same as without the tokens.
  const std::vector<std::vector<int64_t>> chosen{{8, 8, 0, 0}};
  EXPECT_DOUBLE_EQ(graphs.phase(dp, t, batches, &chosen).totalSeconds, graphs.phase(dp, batches).totalSeconds);
  // Against the choice: 9 tokens padded to 64 (more than the launches save), 7 run as they are.
  const std::vector<std::vector<int64_t>> ran{{8, 0, 64, 0}};
  const PhaseCost cost = graphs.phase(dp, t, batches, &ran);
  EXPECT_EQ(cost.graphedMicroBatches, 2);
  EXPECT_NEAR(cost.totalSeconds, plain.phase(dp, batches).totalSeconds + added(8, 8) + added(9, 64), 1e-12);
  // A micro-batch padded to 64 keeps the activations of itself and its padding sequence.
  const std::vector<std::vector<int64_t>> padded{{64}};
  EXPECT_EQ(graphs.phase(dp, t, {{{4, 5}}}, &padded).activationBytes, plain.phase(dp, {{{4, 5, 55}}}).activationBytes);
  // None graphed: the plain model's price.
  const std::vector<std::vector<int64_t>> none{{0, 0, 0, 0}};
  EXPECT_DOUBLE_EQ(graphs.phase(dp, t, batches, &none).totalSeconds, plain.phase(dp, batches).totalSeconds);

  for (const auto& bad : std::vector<std::vector<std::vector<int64_t>>>{
           {{8, 0, 0}},            // one entry short
           {{8, 0, 0, 0}, {0}},    // a replica too many
           {{4, 0, 0, 0}},         // a bucket that does not hold 8 tokens
           {{16, 0, 0, 0}},        // not a bucket
           {{0, 0, 0, 70}}}) {     // not a bucket either
    EXPECT_THROW(graphs.phase(dp, t, batches, &bad), InvalidArgument);
  }
  // A layout without graphs (two stages) ran none.
  CostModel pair(tiny(), hw, Topology(2, 2), options);
  const Layout pp2(1, 1, 2);
  const std::vector<std::vector<int64_t>> ppRan{{8}};
  EXPECT_THROW(pair.phase(pp2, pair.terms(pp2), {{{5, 3}}}, &ppRan), InvalidArgument);
  const std::vector<std::vector<int64_t>> ppNone{{0}};
  EXPECT_DOUBLE_EQ(pair.phase(pp2, pair.terms(pp2), {{{5, 3}}}, &ppNone).totalSeconds,
                   pair.phase(pp2, {{{5, 3}}}).totalSeconds);
}

}  // namespace
}  // namespace hotswitch
