#pragma once

// Tensor sets shaped like a Megatron transformer, and a plain-array simulation of a plan,
// shared by the C++ tests.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/Check.h"
#include "layout/ParamSpec.h"
#include "layout/Placement.h"
#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace testing {

// A decoder whose every split dim is a multiple of `unit / 2` (unit even): embedding, per layer norms, fused
// QKV (GQA: q twice the size of k and v), attention projection, fused gate/up, down
// projection, then final norm and head (or a tied embedding).
inline TensorSet transformerSet(int numLayers, int64_t unit, bool tied = false,
                                DType dtype = DType::kFloat32) {
  const int64_t h = unit, vocab = 3 * unit, ffn = 2 * unit;
  TensorSet set;
  set.numLayers = numLayers;
  auto add = [&](std::string name, Shape shape, ShardRule rule, StageRole stage, int layer,
                 std::vector<int64_t> groups = {}) {
    ParamSpec s;
    s.name = std::move(name);
    s.shape = std::move(shape);
    s.dtype = dtype;
    s.rule = rule;
    s.stage = stage;
    s.layer = layer;
    s.groups = std::move(groups);
    set.specs.push_back(s);
  };
  add("embedding.weight", {vocab, h}, ShardRule::kVocab,
      tied ? StageRole::kFirstAndLast : StageRole::kFirst, 0);
  for (int l = 0; l < numLayers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLayer, l);
    add(p + "qkv.weight", {2 * h, h}, ShardRule::kFusedColumn, StageRole::kLayer, l,
        {h, h / 2, h / 2});
    add(p + "proj.weight", {h, h}, ShardRule::kRow, StageRole::kLayer, l);
    add(p + "post_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLayer, l);
    add(p + "gate_up.weight", {2 * ffn, h}, ShardRule::kFusedColumn, StageRole::kLayer, l,
        {ffn, ffn});
    add(p + "down.weight", {h, ffn}, ShardRule::kRow, StageRole::kLayer, l);
  }
  add("final_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLast, 0);
  if (!tied) add("head.weight", {vocab, h}, ShardRule::kVocab, StageRole::kLast, 0);
  return set;
}

// LLaMA-7B as hotswitch.llama_tensor_set() builds it: 32 layers, hidden 4096, FFN 11008, 32
// heads without grouping, vocabulary 32000, untied, bf16.
inline TensorSet llama7b() {
  const int64_t h = 4096, ffn = 11008, vocab = 32000;
  TensorSet set;
  set.numLayers = 32;
  auto add = [&](std::string name, Shape shape, ShardRule rule, StageRole stage, int layer,
                 std::vector<int64_t> groups = {}) {
    set.specs.push_back(ParamSpec{std::move(name), std::move(shape), DType::kBFloat16, rule,
                                  std::move(groups), stage, layer});
  };
  add("embedding.weight", {vocab, h}, ShardRule::kVocab, StageRole::kFirst, 0);
  for (int l = 0; l < set.numLayers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    add(p + "input_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLayer, l);
    add(p + "qkv.weight", {3 * h, h}, ShardRule::kFusedColumn, StageRole::kLayer, l, {h, h, h});
    add(p + "proj.weight", {h, h}, ShardRule::kRow, StageRole::kLayer, l);
    add(p + "post_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLayer, l);
    add(p + "gate_up.weight", {2 * ffn, h}, ShardRule::kFusedColumn, StageRole::kLayer, l, {ffn, ffn});
    add(p + "down.weight", {h, ffn}, ShardRule::kRow, StageRole::kLayer, l);
  }
  add("final_norm.weight", {h}, ShardRule::kReplicated, StageRole::kLast, 0);
  add("head.weight", {vocab, h}, ShardRule::kVocab, StageRole::kLast, 0);
  set.validate();
  return set;
}

// The value element `x` of tensor `t` holds in summand k (k = -1: not partial).
inline double probeValue(int t, const Box& full, const Shape& x, int k) {
  int64_t flat = 0;
  for (size_t d = 0; d < x.size(); ++d) flat = flat * full.hi[d] + x[d];
  return t * 1e6 + flat + (k < 0 ? 0 : (k + 1) * 1e9);
}

// Calls fn(x, bufferOffset) for every element x of the piece.
template <typename Fn>
void forEachElement(const Piece& piece, Fn fn) {
  const size_t n = piece.box.ndim();
  if (piece.box.empty()) return;
  Shape x = piece.box.lo;
  while (true) {
    int64_t off = piece.offset;
    for (size_t d = 0; d < n; ++d) off += (x[d] - piece.box.lo[d]) * piece.strides[d];
    fn(x, off);
    int d = static_cast<int>(n) - 1;
    for (; d >= 0; --d) {
      if (++x[d] < piece.box.hi[d]) break;
      x[d] = piece.box.lo[d];
    }
    if (d < 0) return;
  }
}

// Runs the plan on plain arrays filled with probeValue and reports, per check, how many
// elements broke it. A correct plan leaves every counter at zero.
struct SimulationReport {
  int64_t wrongValue = 0;     // destination element whose value is not the expected one
  int64_t wrongWrites = 0;    // element not written exactly once per summand
  int64_t strayWrites = 0;    // a write outside every destination piece (e.g. padding)
  int64_t lowerBoundBytes = 0;        // recomputed by brute force
  int64_t lowerBoundInterNodeBytes = 0;
  // Bytes to move, by the set of ranks allowed to send them (bit q: rank q), recomputed
  // element by element: any owner, or owners on the receiver's node whenever there is one.
  std::map<uint64_t, int64_t> anyOwnerSenders;
  std::map<uint64_t, int64_t> sameNodeFirstSenders;
};

// The smallest largest per-rank send when each class of bytes may be split freely among its
// allowed senders, rounded up to whole bytes. By Hall's theorem it is the largest over sender
// sets S of (bytes only S may send) / |S|. Enumerates every set of ranks: worlds up to 16.
inline int64_t smallestLargestSend(const std::map<uint64_t, int64_t>& bytesBySenders, int world) {
  HS_CHECK(world <= 16, "world(", world, ") too large to enumerate its sender sets");
  int64_t best = 0;
  for (uint64_t set = 1; set < (uint64_t{1} << world); ++set) {
    int64_t bytes = 0;
    for (const auto& [senders, b] : bytesBySenders) {
      if ((senders & ~set) == 0) bytes += b;
    }
    const int64_t size = __builtin_popcountll(set);
    best = std::max(best, (bytes + size - 1) / size);
  }
  return best;
}

inline SimulationReport simulate(const TensorSet& set, const Placement& from, const Placement& to,
                                 const Topology& topo, const RedistributionPlan& plan) {
  const int world = topo.world();
  std::vector<Box> full;
  for (const ParamSpec& s : set.specs) full.push_back(Box::full(s.shape));
  auto alloc = [](const std::vector<BufferSpec>& specs, double fill) {
    std::vector<std::vector<double>> out;
    for (const BufferSpec& b : specs) out.emplace_back(b.numel(), fill);
    return out;
  };
  std::vector<std::vector<std::vector<double>>> src(world), dst(world), writes(world);
  // held[r][t][slot * numel + flat]: rank r holds that element of summand slot in the source.
  std::vector<std::vector<std::vector<char>>> held(world);
  auto flatOf = [&](int t, const Shape& x) {
    int64_t flat = 0;
    for (size_t d = 0; d < x.size(); ++d) flat = flat * full[t].hi[d] + x[d];
    return flat;
  };
  for (int r = 0; r < world; ++r) {
    src[r] = alloc(from.rank(r).buffers, -1);
    dst[r] = alloc(to.rank(r).buffers, 0);
    writes[r] = alloc(to.rank(r).buffers, 0);
    for (size_t t = 0; t < set.specs.size(); ++t) {
      held[r].emplace_back(from.numSummands(static_cast<int>(t)) * set.specs[t].numel(), 0);
    }
    for (const Piece& p : from.rank(r).pieces) {
      const int slot = p.summand < 0 ? 0 : p.summand;
      forEachElement(p, [&](const Shape& x, int64_t off) {
        src[r][p.buffer][off] = probeValue(p.tensor, full[p.tensor], x, p.summand);
        held[r][p.tensor][slot * full[p.tensor].numel() + flatOf(p.tensor, x)] = 1;
      });
    }
  }
  auto apply = [&](int srcRank, int dstRank, const Segment& s) {
    Piece sp{s.tensor, s.box, s.srcBuffer, s.srcOffset, s.srcStrides, s.summand};
    std::vector<double> values;
    forEachElement(sp, [&](const Shape&, int64_t off) { values.push_back(src[srcRank][s.srcBuffer][off]); });
    Piece dp{s.tensor, s.box, s.dstBuffer, s.dstOffset, s.dstStrides, s.summand};
    size_t i = 0;
    forEachElement(dp, [&](const Shape&, int64_t off) {
      dst[dstRank][s.dstBuffer][off] += values[i++];
      writes[dstRank][s.dstBuffer][off] += 1;
    });
  };
  for (int r = 0; r < world; ++r) {
    for (const Segment& s : plan.localCopies[r]) apply(r, r, s);
  }
  for (const Message& m : plan.messages) {
    for (const Segment& s : m.segments) apply(m.src, m.dst, s);
  }
  SimulationReport report;
  for (int r = 0; r < world; ++r) {
    auto covered = alloc(to.rank(r).buffers, 0);
    for (const Piece& p : to.rank(r).pieces) {
      const int64_t elem = elementSize(set.specs[p.tensor].dtype);
      const int numSummands = from.numSummands(p.tensor);
      forEachElement(p, [&](const Shape& x, int64_t off) {
        covered[p.buffer][off] = 1;
        double expected = 0;
        for (int k = 0; k < numSummands; ++k) {
          int summand = from.kind() == PlacementKind::kPartial ? k : -1;
          expected += probeValue(p.tensor, full[p.tensor], x, summand);
          const int64_t at = k * full[p.tensor].numel() + flatOf(p.tensor, x);
          if (!held[r][p.tensor][at]) {
            report.lowerBoundBytes += elem;
            uint64_t nearOwners = 0, owners = 0;
            bool near = false;
            for (int q = 0; q < world; ++q) {
              if (!held[q][p.tensor][at]) continue;
              if (q < 64) owners |= uint64_t{1} << q;
              if (q < 64 && topo.sameNode(q, r)) nearOwners |= uint64_t{1} << q;
              if (topo.sameNode(q, r)) near = true;
            }
            if (!near) report.lowerBoundInterNodeBytes += elem;
            report.anyOwnerSenders[owners] += elem;
            report.sameNodeFirstSenders[near ? nearOwners : owners] += elem;
          }
        }
        if (dst[r][p.buffer][off] != expected) ++report.wrongValue;
        if (writes[r][p.buffer][off] != numSummands) ++report.wrongWrites;
      });
    }
    for (size_t b = 0; b < covered.size(); ++b) {
      for (size_t i = 0; i < covered[b].size(); ++i) {
        if (!covered[b][i] && writes[r][b][i] != 0) ++report.strayWrites;
      }
    }
  }
  return report;
}

}  // namespace testing
}  // namespace hotswitch
