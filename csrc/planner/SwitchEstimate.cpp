#include "planner/SwitchEstimate.h"

#include <algorithm>
#include <utility>

#include "common/Check.h"

namespace hotswitch {

namespace {

// Elements in both boxes, without building the intersection.
int64_t overlap(const Box& a, const Box& b) {
  int64_t n = 1;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    const int64_t extent = std::min(a.hi[d], b.hi[d]) - std::max(a.lo[d], b.lo[d]);
    if (extent <= 0) return 0;
    n *= extent;
  }
  return n;
}

// Per tensor, the distinct (summand, box) pairs some ranks hold.
using Holdings = std::vector<std::vector<std::pair<int, const Box*>>>;

void collect(const RankPlacement& rank, Holdings& into) {
  for (const Piece& p : rank.pieces) {
    auto& held = into[p.tensor];
    bool seen = false;
    for (const auto& [summand, box] : held) seen = seen || (summand == p.summand && *box == p.box);
    if (!seen) held.push_back({p.summand, &p.box});
  }
}

int64_t covered(const std::vector<std::pair<int, const Box*>>& held, const Box& box) {
  int64_t n = 0;
  for (const auto& [summand, b] : held) n += overlap(*b, box);
  return n;
}

}  // namespace

SwitchEstimate SwitchEstimate::of(const TensorSet& set, const Placement& from, const Placement& to,
                                  const Topology& topology) {
  const int world = from.world();
  HS_CHECK(to.world() == world, "switch estimate between worlds ", world, " and ", to.world());
  HS_CHECK(topology.world() == world, "topology of world ", topology.world(), " for placements of world ", world);
  HS_CHECK(to.kind() != PlacementKind::kPartial, "the destination of a switch cannot be partial (",
           to.key(), ")");
  const size_t numTensors = set.specs.size();
  std::vector<int64_t> elementBytes(numTensors);
  for (size_t t = 0; t < numTensors; ++t) elementBytes[t] = elementSize(set.specs[t].dtype);

  std::vector<Holdings> onNode(topology.numNodes(), Holdings(numTensors));
  for (int r = 0; r < world; ++r) collect(from.rank(r), onNode[topology.node(r)]);

  SwitchEstimate out;
  out.recvIntraNodeBytes.assign(world, 0);
  out.recvInterNodeBytes.assign(world, 0);
  Holdings mine(numTensors);
  for (int r = 0; r < world; ++r) {
    for (auto& held : mine) held.clear();
    collect(from.rank(r), mine);
    const Holdings& node = onNode[topology.node(r)];
    for (const Piece& d : to.rank(r).pieces) {
      // Every summand of every element; distinct boxes of one summand do not overlap.
      const int64_t need = from.numSummands(d.tensor) * d.box.numel();
      const int64_t local = std::min(covered(mine[d.tensor], d.box), need);
      const int64_t nodeLocal = std::max(std::min(covered(node[d.tensor], d.box), need), local);
      out.recvIntraNodeBytes[r] += (nodeLocal - local) * elementBytes[d.tensor];
      out.recvInterNodeBytes[r] += (need - nodeLocal) * elementBytes[d.tensor];
    }
    out.totalBytes += out.recvIntraNodeBytes[r] + out.recvInterNodeBytes[r];
  }
  return out;
}

double SwitchEstimate::seconds(double intraBandwidth, double interBandwidth) const {
  HS_CHECK(intraBandwidth > 0 && interBandwidth > 0, "bandwidths must be > 0, got ", intraBandwidth, " and ",
           interBandwidth);
  double worst = 0;
  for (size_t r = 0; r < recvIntraNodeBytes.size(); ++r) {
    worst = std::max(worst, recvIntraNodeBytes[r] / intraBandwidth + recvInterNodeBytes[r] / interBandwidth);
  }
  return worst;
}

}  // namespace hotswitch
