#include "planner/CostModel.h"

#include <gtest/gtest.h>

#include <limits>

#include "TestUtil.h"
#include "common/Check.h"

namespace hotswitch {
namespace {

// A model small enough to count by hand: 2 layers, hidden 8, 2 heads (no GQA), FFN 16,
// vocab 10, bf16.
ModelConfig tiny() {
  ModelConfig m;
  m.name = "tiny";
  m.numLayers = 2;
  m.hiddenSize = 8;
  m.numAttentionHeads = 2;
  m.numQueryGroups = 2;
  m.ffnHiddenSize = 16;
  m.vocabSize = 10;
  return m;
}

HardwareProfile unitHardware() {
  HardwareProfile h;
  h.name = "unit";
  h.peakFlops = 1e6;
  h.efficiency = 1.0;
  h.attentionEfficiency = 1.0;
  h.memoryBytes = 1 << 20;
  h.intraNodeBandwidth = 1e3;
  h.interNodeBandwidth = 1e2;
  h.intraNodeLatency = 0;
  h.interNodeLatency = 0;
  return h;
}

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
  const double forward = 2 * (2.0 * 640 * s + 2.0 * s * s * 8) + 2.0 * 10 * 8 * s;
  EXPECT_DOUBLE_EQ(cost.forwardFlops(s), forward);
  EXPECT_DOUBLE_EQ(cost.trainingFlops(s), 3 * forward);
  ModelConfig recompute = tiny();
  recompute.recompute = true;
  // Recomputation reruns the layers' forward, not the head's.
  const double head = 2.0 * 10 * 8 * s;
  EXPECT_DOUBLE_EQ(CostModel(recompute, unitHardware(), Topology(1, 1)).trainingFlops(s),
                   4 * (forward - head) + 3 * head);
  // Attention is quadratic: one sequence of 2s costs more than two of s.
  EXPECT_GT(cost.forwardFlops(2 * s), 2 * cost.forwardFlops(s));
}

TEST(CostModelTest, SingleDevicePhaseIsComputeOverFlops) {
  CostModel cost(tiny(), unitHardware(), Topology(1, 1));
  PhaseCost p = cost.phase(Layout(1, 1, 1), {{{5, 3}, {7}}});
  const double flops = cost.trainingFlops(5) + cost.trainingFlops(3) + cost.trainingFlops(7);
  EXPECT_NEAR(p.totalSeconds, flops / 1e6, 1e-12);
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
  // tiny(): 2 layers, hidden 8, linear params 640 per layer, vocab 10, bf16.
  HardwareProfile hw = unitHardware();
  hw.attentionEfficiency = 0.5;  // attention at half the linear layers' rate
  hw.intraNodeLatency = 1e-3;
  hw.layerOverheadSeconds = 0.25;
  hw.sequenceOverheadSeconds = 0.125;
  CostModel cost(tiny(), hw, Topology(2, 2));
  LayoutTerms one = cost.terms(Layout(2, 1, 1));
  // Per token: 3 * (2 layers * 2 * 640) + 3 * (2 * 10 * 8) FLOPs at 1e6 FLOP/s.
  EXPECT_DOUBLE_EQ(one.alphaCompute, (3 * 2 * 2 * 640 + 3 * 2 * 10 * 8) / 1e6);
  // Per token^2: 3 * 2 layers * 2 * 8 FLOPs at 0.5e6 FLOP/s.
  EXPECT_DOUBLE_EQ(one.beta, 3 * 2 * 2 * 8 / 0.5e6);
  EXPECT_DOUBLE_EQ(one.gamma, 2 * 0.125);
  EXPECT_DOUBLE_EQ(one.alphaTp, 0);
  EXPECT_DOUBLE_EQ(one.microBatchSeconds, 2 * 0.25);
  // dp2 all-reduce of (2 * 656 + 80) fp32 gradients: 2 steps of half the bytes at 1e3 B/s + latency.
  EXPECT_DOUBLE_EQ(one.dpSeconds, 2 * ((2 * 656 + 80) * 4 / 2 / 1e3 + 1e-3));

  LayoutTerms tp = cost.terms(Layout(1, 2, 1));
  EXPECT_DOUBLE_EQ(tp.alphaCompute, one.alphaCompute / 2);
  EXPECT_DOUBLE_EQ(tp.beta, one.beta / 2);
  // 8 collectives per layer, each (tp - 1) / tp of the token's 8 * 2 bytes at 1e3 B/s.
  EXPECT_DOUBLE_EQ(tp.alphaTp, 2 * 8 * 0.5 * 8 * 2 / 1e3);
  EXPECT_DOUBLE_EQ(tp.microBatchTpSeconds, 2 * 8 * 1 * 1e-3);
  EXPECT_DOUBLE_EQ(tp.microBatchSeconds, 2 * 0.25 + tp.microBatchTpSeconds);

  LayoutTerms pp = cost.terms(Layout(1, 1, 2));
  EXPECT_DOUBLE_EQ(pp.beta, one.beta / 2);  // one layer per stage
  EXPECT_DOUBLE_EQ(pp.p2pPerToken, 8 * 2 / 1e3);
  EXPECT_DOUBLE_EQ(pp.p2pLatency, 1e-3);
  EXPECT_DOUBLE_EQ(pp.microBatchSeconds, 0.25);
}

TEST(CostModelTest, PhaseFromTermsByHand) {
  HardwareProfile hw = unitHardware();
  hw.layerOverheadSeconds = 0.25;
  hw.intraNodeLatency = 1e-3;
  CostModel cost(tiny(), hw, Topology(2, 2));
  // pp2, micro-batches {5, 3} and {7}: sum of stage times plus one bubble of the largest
  // (stage time plus its two transfers).
  const Layout layout(1, 1, 2);
  const LayoutTerms t = cost.terms(layout);
  PhaseCost p = cost.phase(layout, {{{5, 3}, {7}}});
  const double first = t.u(5) + t.u(3) + t.microBatchSeconds, second = t.u(7) + t.microBatchSeconds;
  const double c1 = first + 2 * (8 * t.p2pPerToken + t.p2pLatency);
  const double c2 = second + 2 * (7 * t.p2pPerToken + t.p2pLatency);
  EXPECT_NEAR(p.runSeconds(), first + second + std::max(c1, c2), 1e-12);
  EXPECT_NEAR(p.ppSeconds, c1 > c2 ? c1 - first : c2 - second, 1e-12);
  EXPECT_NEAR(p.computeSeconds + p.tpSeconds + p.ppSeconds, p.runSeconds(), 1e-12);
  EXPECT_EQ(p.dpSeconds, 0);
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
  // Same work per rank, but the pipeline pays a bubble of one stage time.
  EXPECT_GT(piped.computeSeconds, flat.computeSeconds);
  EXPECT_GT(piped.ppSeconds, 0);
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

TEST(CostModelTest, PresetsFromDataSheets) {
  HardwareProfile h200 = HardwareProfile::preset("h200");
  EXPECT_EQ(h200.memoryBytes, 141LL << 30);
  EXPECT_DOUBLE_EQ(h200.intraNodeBandwidth, 450e9);
  EXPECT_DOUBLE_EQ(h200.interNodeBandwidth, 50e9);
  EXPECT_DOUBLE_EQ(HardwareProfile::preset("a800").intraNodeBandwidth, 200e9);
  for (const auto& name : ModelConfig::presetNames()) EXPECT_NO_THROW(ModelConfig::preset(name).validate());
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

}  // namespace
}  // namespace hotswitch
