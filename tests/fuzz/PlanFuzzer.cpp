// Fuzz target: redistribution plan generation.
//
// From the fuzz bytes: a world and topology, a tensor set (shapes, dtypes, sharding rules,
// fused groups, pipeline stages; sometimes malformed), two layouts (any degrees and rank
// order; sometimes parsed from text or not matching the world) and placement kinds. Bad
// input must raise InvalidArgument, nothing else. A plan that builds must deliver every
// destination element exactly once per summand, each from a rank whose source placement holds
// that element at the offset the segment reads, within the buffers' bounds; move exactly the
// lower-bound bytes; agree with SwitchEstimate on what each rank receives; and come out the
// same when built again.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "FuzzInput.h"
#include "PlanDump.h"
#include "TestModels.h"
#include "common/Check.h"
#include "layout/Placement.h"
#include "planner/SwitchEstimate.h"
#include "redistribute/PlanCache.h"
#include "redistribute/RedistributionPlan.h"

namespace hotswitch {
namespace fuzz {
namespace {

constexpr int64_t kMaxElements = 4096;  // per tensor, so the element-wise check stays fast

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

Layout::Order order(FuzzInput& in) {
  Layout::Order o = Layout::megatronOrder();
  for (int i = kNumAxes - 1; i > 0; --i) std::swap(o[i], o[in.range(0, i)]);
  return o;
}

Layout layout(FuzzInput& in, int world) {
  switch (in.range(0, 7)) {
    case 0: {  // any text, mostly layout-like
      static const char* kParts[] = {"dp", "tp", "pp", "cp", "/", "-", "x", "0"};
      std::string text;
      const int n = static_cast<int>(in.range(0, 6));
      for (int i = 0; i < n; ++i) {
        text += kParts[in.range(0, 7)];
        if (in.flag()) text += std::to_string(in.range(0, 1 << 20));
      }
      return Layout::parse(text);
    }
    case 1: {  // raw degrees: often not the world's, sometimes < 1 or far too large
      auto degree = [&] { return static_cast<int>(in.chance(8) ? int64_t{1} << in.range(15, 30) : in.range(-1, 20)); };
      const int dp = degree(), tp = degree(), pp = static_cast<int>(in.range(-1, 8));
      return Layout(dp, tp, pp, in.chance(16) ? degree() : 1, order(in));
    }
    default: {
      const std::vector<int> ds = divisors(world);
      const int pp = ds[in.range(0, static_cast<int64_t>(ds.size()) - 1)];
      const std::vector<int> rest = divisors(world / pp);
      const int tp = rest[in.range(0, static_cast<int64_t>(rest.size()) - 1)];
      const std::vector<int> cps = divisors(world / pp / tp);
      const int cp = in.chance(48) ? cps[in.range(0, static_cast<int64_t>(cps.size()) - 1)] : 1;
      return Layout(world / pp / tp / cp, tp, pp, cp, order(in));
    }
  }
}

ParamSpec spec(FuzzInput& in, int index, int numLayers) {
  ParamSpec s;
  s.name = in.chance(4) ? std::string() : "p" + std::to_string(in.chance(8) ? 0 : index);
  s.rule = static_cast<ShardRule>(in.range(0, 4));
  s.dtype = static_cast<DType>(in.chance(200) ? 0 : in.range(0, 5));
  s.stage = static_cast<StageRole>(in.range(0, 3));
  s.layer = static_cast<int>(in.chance(6) ? in.range(-2, numLayers + 2) : in.range(0, numLayers - 1));
  int ndim = static_cast<int>(in.range(s.rule == ShardRule::kReplicated ? 0 : 1, 3));
  if (in.chance(6)) ndim = static_cast<int>(in.range(0, 3));
  for (int d = 0; d < ndim; ++d) {
    int64_t size = in.range(1, 3) * (in.flag() ? 4 : 6);  // divisible by most tp degrees
    if (in.chance(16)) size = in.range(1, 13);
    if (in.chance(3)) size = in.range(-1, 0);
    if (in.chance(3)) size = int64_t{1} << in.range(30, 62);
    s.shape.push_back(size);
  }
  if (s.rule == ShardRule::kFusedColumn && !s.shape.empty() && s.shape[0] > 0 && s.shape[0] <= 64) {
    int64_t left = s.shape[0];
    while (left > 0) {
      int64_t g = std::min(left, in.range(1, 4) * 4);
      if (in.chance(8)) g = left;
      s.groups.push_back(g);
      left -= g;
    }
    if (in.chance(4)) s.groups.push_back(in.range(-1, 4));
  } else if (in.chance(4)) {
    s.groups.push_back(in.range(1, 4));
  }
  return s;
}

// Every element of every destination piece arrives once per summand from a rank that holds
// it where the segment reads it.
void checkDelivery(const TensorSet& set, const Placement& from, const Placement& to, const Topology& topo,
                   const RedistributionPlan& plan) {
  const int world = topo.world();
  auto inBounds = [&](const std::vector<std::vector<BufferSpec>>& buffers, int rank, int buffer, int64_t offset,
                      const Shape& strides, const Box& box) {
    if (buffer < 0 || buffer >= static_cast<int>(buffers[rank].size())) return false;
    if (strides.size() != box.ndim()) return false;
    int64_t last = offset;
    for (size_t d = 0; d < box.ndim(); ++d) {
      if (strides[d] < 0) return false;
      last += (box.hi[d] - box.lo[d] - 1) * strides[d];
    }
    return offset >= 0 && last < buffers[rank][buffer].numel();
  };
  auto checkSegment = [&](int src, int dst, const Segment& s) {
    FUZZ_CHECK(s.tensor >= 0 && s.tensor < static_cast<int>(set.specs.size()), "tensor ", s.tensor);
    FUZZ_CHECK(!s.box.empty(), "empty segment of tensor ", s.tensor);
    FUZZ_CHECK(inBounds(plan.srcBuffers, src, s.srcBuffer, s.srcOffset, s.srcStrides, s.box), "source view ",
               s.box.toString(), " of rank ", src, " buffer ", s.srcBuffer, " out of bounds");
    FUZZ_CHECK(inBounds(plan.dstBuffers, dst, s.dstBuffer, s.dstOffset, s.dstStrides, s.box),
               "destination view ", s.box.toString(), " of rank ", dst, " buffer ", s.dstBuffer, " out of bounds");
  };
  for (int r = 0; r < world; ++r) {
    for (const Segment& s : plan.localCopies[r]) checkSegment(r, r, s);
  }
  for (const Message& m : plan.messages) {
    FUZZ_CHECK(m.src != m.dst && m.src >= 0 && m.src < world && m.dst >= 0 && m.dst < world, "message ", m.src,
               " -> ", m.dst);
    int64_t bytes = 0;
    for (const Segment& s : m.segments) {
      checkSegment(m.src, m.dst, s);
      bytes += plan.segmentBytes(s);
    }
    FUZZ_CHECK(bytes == m.bytes, "message ", m.src, " -> ", m.dst, " says ", m.bytes, " B, segments hold ", bytes);
  }
  // Values name (tensor, element, summand), so a right value proves the right source.
  const testing::SimulationReport report = testing::simulate(set, from, to, topo, plan);
  FUZZ_CHECK(report.wrongValue == 0, report.wrongValue, " elements with a wrong value");
  FUZZ_CHECK(report.wrongWrites == 0, report.wrongWrites, " elements not written exactly once per summand");
  FUZZ_CHECK(report.strayWrites == 0, report.strayWrites, " writes into padding");
  FUZZ_CHECK(plan.stats.bytesMoved == report.lowerBoundBytes, "moved ", plan.stats.bytesMoved,
             " B, lower bound ", report.lowerBoundBytes);
  FUZZ_CHECK(plan.stats.lowerBoundBytes == report.lowerBoundBytes, "stated lower bound ",
             plan.stats.lowerBoundBytes, " vs ", report.lowerBoundBytes);
  FUZZ_CHECK(plan.stats.interNodeBytes == report.lowerBoundInterNodeBytes, "inter-node ", plan.stats.interNodeBytes,
             " B, lower bound ", report.lowerBoundInterNodeBytes);
  if (world <= 12) {  // recounted over every set of senders
    const int64_t optimum = testing::smallestLargestSend(report.sameNodeFirstSenders, world);
    FUZZ_CHECK(plan.stats.sameNodeFirstMaxSendBytes == optimum, "stated same-node-first optimum ",
               plan.stats.sameNodeFirstMaxSendBytes, " B, recounted ", optimum, " B");
  }
}

void run(FuzzInput& in) {
  const int world = static_cast<int>(in.range(1, 16));
  const std::vector<int> perNode = divisors(world);
  const int ranksPerNode = perNode[in.range(0, static_cast<int64_t>(perNode.size()) - 1)];
  TensorSet set;
  set.numLayers = static_cast<int>(in.chance(4) ? in.range(-1, 0) : in.range(1, 4));
  const int numSpecs = static_cast<int>(in.range(0, 6));
  for (int i = 0; i < numSpecs; ++i) set.specs.push_back(spec(in, i, std::max(1, set.numLayers)));
  const PlacementKind fromKind = static_cast<PlacementKind>(in.range(0, 2));
  const PlacementKind toKind = static_cast<PlacementKind>(in.chance(16) ? 2 : in.range(0, 1));
  PlanOptions options{in.chance(64) ? SenderPolicy::kGreedy : SenderPolicy::kBalanced};

  std::unique_ptr<Topology> topo;
  std::unique_ptr<Placement> from, to;
  std::unique_ptr<RedistributionPlan> plan;
  try {
    topo = std::make_unique<Topology>(world, ranksPerNode);
    const Layout a = layout(in, world);
    const Layout b = layout(in, world);
    // Placing a layout of a million ranks is legitimate but slow: such layouts go through the
    // world check that callers (PlanCache) run first; small mismatched ones reach build().
    if (a.world() > 64) a.validate(world);
    if (b.world() > 64) b.validate(world);
    if (in.chance(64)) {  // balance send time over links of random speeds, some invalid
      options.intraNodeBandwidth = static_cast<double>(in.range(0, 1 << 20));
      options.interNodeBandwidth = static_cast<double>(in.range(0, 1 << 20));
    }
    from = std::make_unique<Placement>(Placement::make(set, a, fromKind));
    to = std::make_unique<Placement>(Placement::make(set, b, toKind));
    plan = std::make_unique<RedistributionPlan>(RedistributionPlan::build(set, *from, *to, *topo, options));
  } catch (const InvalidArgument&) {
    return;  // bad input, rejected as documented
  }
  // What built must be what the docs allow.
  FUZZ_CHECK(toKind != PlacementKind::kPartial, "a partial destination was accepted");
  {
    const double intra = options.intraNodeBandwidth, inter = options.interNodeBandwidth;
    FUZZ_CHECK((intra == 0 && inter == 0) ||
                   (intra > 0 && inter > 0 && std::max(intra, inter) <= 1000 * std::min(intra, inter)),
               "bandwidths ", intra, " / ", inter, " accepted");
  }
  FUZZ_CHECK(from->world() == world && to->world() == world, "worlds ", from->world(), ", ", to->world(),
             " accepted for topology world ", world);
  for (const ParamSpec& s : set.specs) {
    FUZZ_CHECK(s.numel() >= 1 && s.numel() <= (int64_t{1} << 62), "spec ", s.toString(), " accepted");
  }
  int64_t largest = 0;
  for (const ParamSpec& s : set.specs) largest = std::max(largest, s.numel());
  if (largest > kMaxElements) return;  // too large to check element by element

  checkDelivery(set, *from, *to, *topo, *plan);
  if (options.senderPolicy == SenderPolicy::kBalanced) {
    if (options.intraNodeBandwidth > 0) {
      // Time units round each class's quota down by under one byte per sender.
      FUZZ_CHECK(plan->stats.maxSendSeconds >= plan->stats.sameNodeFirstMaxSendSeconds * (1 - 1.0 / 256),
                 "slowest send ", plan->stats.maxSendSeconds, " s below the same-node-first optimum ",
                 plan->stats.sameNodeFirstMaxSendSeconds, " s");
    } else {
      FUZZ_CHECK(plan->stats.maxSendBytes >= plan->stats.sameNodeFirstMaxSendBytes, "largest send ",
                 plan->stats.maxSendBytes, " below the same-node-first optimum ",
                 plan->stats.sameNodeFirstMaxSendBytes);
      FUZZ_CHECK(plan->stats.maxSendSeconds == 0 && plan->stats.sameNodeFirstMaxSendSeconds == 0,
                 "seconds stated without bandwidths");
    }
    const SwitchEstimate estimate = SwitchEstimate::of(set, *from, *to, *topo);
    for (int r = 0; r < world; ++r) {
      FUZZ_CHECK(estimate.recvIntraNodeBytes[r] + estimate.recvInterNodeBytes[r] == plan->recvBytes[r],
                 "rank ", r, " receives ", plan->recvBytes[r], " B, estimated ", estimate.recvIntraNodeBytes[r],
                 " + ", estimate.recvInterNodeBytes[r], " (", from->key(), " -> ", to->key(), ")");
    }
  }
  const std::string dump = testing::dumpPlan(*plan);
  FUZZ_CHECK(testing::dumpPlan(RedistributionPlan::build(set, *from, *to, *topo, options)) == dump,
             "rebuilding ", from->key(), " -> ", to->key(), " gave another plan");
  PlanCache cache;
  auto cached = cache.get(set, from->layout(), fromKind, to->layout(), toKind, *topo, options);
  FUZZ_CHECK(testing::dumpPlan(cached->plan) == dump, "the cache built another plan");
}

}  // namespace
}  // namespace fuzz
}  // namespace hotswitch

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  hotswitch::fuzz::FuzzInput in(data, size);
  hotswitch::fuzz::run(in);
  return 0;
}
