// Time to build a redistribution plan for a LLaMA-7B-shaped tensor set.

#include <benchmark/benchmark.h>

#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace {

TensorSet llama7b() {
  TensorSet set;
  set.numLayers = 32;
  const int64_t h = 4096, ffn = 11008, vocab = 32000;
  auto add = [&](std::string name, Shape shape, ShardRule rule, StageRole stage, int layer,
                 std::vector<int64_t> groups = {}) {
    set.specs.push_back(ParamSpec{std::move(name), std::move(shape), DType::kBFloat16, rule,
                                  std::move(groups), stage, layer});
  };
  add("embedding.weight", {vocab, h}, ShardRule::kVocab, StageRole::kFirst, 0);
  for (int l = 0; l < 32; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLayer, l);
    add(p + "qkv.weight", {3 * h, h}, ShardRule::kFusedColumn, StageRole::kLayer, l, {h, h, h});
    add(p + "proj.weight", {h, h}, ShardRule::kRow, StageRole::kLayer, l);
    add(p + "post_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLayer, l);
    add(p + "gate_up.weight", {2 * ffn, h}, ShardRule::kFusedColumn, StageRole::kLayer, l, {ffn, ffn});
    add(p + "down.weight", {h, ffn}, ShardRule::kRow, StageRole::kLayer, l);
  }
  add("final_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLast, 0);
  add("head.weight", {vocab, h}, ShardRule::kVocab, StageRole::kLast, 0);
  return set;
}

void BM_PlanLlama7b(benchmark::State& state, const char* from, const char* to) {
  TensorSet set = llama7b();
  Topology topo(16, 8);
  Placement a = Placement::make(set, Layout::parse(from));
  Placement b = Placement::make(set, Layout::parse(to));
  for (auto _ : state) {
    benchmark::DoNotOptimize(RedistributionPlan::build(set, a, b, topo));
  }
}

BENCHMARK_CAPTURE(BM_PlanLlama7b, dp16_to_tp8dp2, "dp16", "dp2tp8")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanLlama7b, tp8dp2_to_pp4tp4, "dp2tp8", "tp4pp4")->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hotswitch
