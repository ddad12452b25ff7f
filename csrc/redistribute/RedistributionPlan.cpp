#include "redistribute/RedistributionPlan.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <tuple>

#include "common/Check.h"
#include "common/Logging.h"
#include "redistribute/MaxFlow.h"

namespace hotswitch {

namespace {

struct PieceRef {
  int rank;
  const Piece* piece;
};

// Elements of a destination piece that must come from another rank.
struct Demand {
  int tensor;
  int summand;
  Box box;
  int needer;
  const Piece* dstPiece;
  std::vector<PieceRef> candidates;  // sorted by rank
};

int64_t viewOffset(const Piece& piece, const Box& box) {
  int64_t offset = piece.offset;
  for (size_t d = 0; d < box.ndim(); ++d) {
    offset += (box.lo[d] - piece.box.lo[d]) * piece.strides[d];
  }
  return offset;
}

Segment makeSegment(const Demand& demand, const Box& box, const Piece& src) {
  Segment s;
  s.tensor = demand.tensor;
  s.summand = demand.summand;
  s.box = box;
  s.srcBuffer = src.buffer;
  s.srcOffset = viewOffset(src, box);
  s.srcStrides = src.strides;
  s.dstBuffer = demand.dstPiece->buffer;
  s.dstOffset = viewOffset(*demand.dstPiece, box);
  s.dstStrides = demand.dstPiece->strides;
  return s;
}

// Boxes of `box` holding its row-major elements [begin, end).
std::vector<Box> subBoxes(const Box& box, int64_t begin, int64_t end) {
  std::vector<Box> out = flatRangeBoxes(box.sizes(), begin, end);
  for (Box& b : out) {
    for (size_t d = 0; d < b.ndim(); ++d) {
      b.lo[d] += box.lo[d];
      b.hi[d] += box.lo[d];
    }
  }
  return out;
}

bool segmentLess(const Segment& a, const Segment& b) {
  return std::tie(a.tensor, a.summand, a.box) < std::tie(b.tensor, b.summand, b.box);
}

// Splits the destination piece into cells, each held whole or not at all by every source
// piece, and calls fn(cell, owners) for each.
template <typename Fn>
void forEachCell(const Piece& dst, const std::vector<PieceRef>& sources, Fn fn) {
  const size_t ndim = dst.box.ndim();
  std::vector<PieceRef> overlapping;
  std::vector<std::vector<int64_t>> cuts(ndim);
  for (size_t d = 0; d < ndim; ++d) cuts[d] = {dst.box.lo[d], dst.box.hi[d]};
  for (const PieceRef& ref : sources) {
    Box overlap = intersect(dst.box, ref.piece->box);
    if (overlap.empty()) continue;
    overlapping.push_back(ref);
    for (size_t d = 0; d < ndim; ++d) {
      cuts[d].push_back(overlap.lo[d]);
      cuts[d].push_back(overlap.hi[d]);
    }
  }
  for (auto& c : cuts) {
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
  }
  std::vector<size_t> at(ndim, 0);
  while (true) {
    Box cell{Shape(ndim), Shape(ndim)};
    for (size_t d = 0; d < ndim; ++d) {
      cell.lo[d] = cuts[d][at[d]];
      cell.hi[d] = cuts[d][at[d] + 1];
    }
    std::vector<PieceRef> owners;
    for (const PieceRef& ref : overlapping) {
      if (ref.piece->box.contains(cell)) owners.push_back(ref);
    }
    fn(cell, std::move(owners));
    int d = static_cast<int>(ndim) - 1;
    for (; d >= 0; --d) {
      if (++at[d] + 1 < cuts[d].size()) break;
      at[d] = 0;
    }
    if (d < 0) return;
  }
}

// The smallest largest per-sender load: demand class c carries units[c] to any of ranks[c];
// minimumCapacity() finds the least T for which senders of capacity T take every unit (a
// binary search over max flows), and leaves the flow at that T for flowTo().
class SendBalancer {
 public:
  SendBalancer(const std::vector<std::vector<int>>& ranks, const std::vector<int64_t>& units, int world)
      : ranks_(ranks), units_(units), world_(world), flow_(static_cast<int>(ranks.size()) + world + 2) {
    const int numClasses = static_cast<int>(ranks.size());
    source_ = numClasses + world;
    sink_ = source_ + 1;
    edges_.resize(numClasses);
    for (int c = 0; c < numClasses; ++c) {
      flow_.addEdge(source_, c, units[c]);
      for (int r : ranks[c]) edges_[c][r] = flow_.addEdge(c, numClasses + r, units[c]);
      total_ += units[c];
    }
    for (int r = 0; r < world; ++r) senderEdges_.push_back(flow_.addEdge(numClasses + r, sink_, 0));
  }

  int64_t minimumCapacity() {
    if (total_ == 0) return 0;
    int64_t lo = 0, hi = total_;
    for (size_t c = 0; c < ranks_.size(); ++c) {
      if (ranks_[c].size() == 1) lo = std::max(lo, units_[c] - 1);
    }
    lo = std::max<int64_t>(lo, (total_ + world_ - 1) / world_ - 1);
    while (hi - lo > 1) {  // invariant: lo infeasible (or below any need), hi feasible
      int64_t mid = lo + (hi - lo) / 2;
      (feasible(mid) ? hi : lo) = mid;
    }
    feasible(hi);
    return hi;
  }

  // Units of class c that the last flow gives to rank r.
  int64_t flowTo(int c, int r) const {
    auto it = edges_[c].find(r);
    return it == edges_[c].end() ? 0 : flow_.flowOn(it->second);
  }

 private:
  bool feasible(int64_t capacity) {
    for (int edge : senderEdges_) flow_.setCapacity(edge, capacity);
    return flow_.run(source_, sink_) == total_;
  }

  const std::vector<std::vector<int>>& ranks_;
  const std::vector<int64_t>& units_;
  int world_;
  MaxFlow flow_;
  int source_ = 0;
  int sink_ = 0;
  int64_t total_ = 0;
  std::vector<std::map<int, int>> edges_;
  std::vector<int> senderEdges_;
};

// Integer time units per byte over the intra- and inter-node links: the faster link's byte
// costs kTimeResolution units, the slower one's proportionally more.
constexpr int64_t kTimeResolution = 256;
constexpr double kMaxBandwidthRatio = 1000;
// The most time units a switch may weigh: the flow sums every class's units, in int64.
constexpr int64_t kMaxTimeUnits = int64_t{1} << 62;

}  // namespace

RedistributionPlan RedistributionPlan::build(const TensorSet& set, const Placement& from,
                                             const Placement& to, const Topology& topology,
                                             const PlanOptions& options) {
  HS_CHECK(from.world() == topology.world() && to.world() == topology.world(),
           "placements ", from.key(), " (world ", from.world(), ") and ", to.key(), " (world ",
           to.world(), ") must both cover the topology's world(", topology.world(), ")");
  HS_CHECK(to.kind() != PlacementKind::kPartial, "destination placement ", to.key(),
           " is partial; a partial placement can only be a source (its summands are summed into "
           "a sharded or zero destination)");
  const double intraBw = options.intraNodeBandwidth, interBw = options.interNodeBandwidth;
  const bool timed = intraBw != 0 || interBw != 0;
  HS_CHECK(!timed || (intraBw > 0 && interBw > 0 &&
                      std::max(intraBw, interBw) <= kMaxBandwidthRatio * std::min(intraBw, interBw)),
           "link bandwidths must both be 0 (balance bytes) or both > 0 and within a factor ",
           kMaxBandwidthRatio, " of each other, got intra-node ", intraBw, " and inter-node ", interBw,
           " bytes/s");
  const int world = topology.world();
  const int numTensors = static_cast<int>(set.specs.size());

  RedistributionPlan plan;
  plan.world = world;
  plan.sumsSummands = from.kind() == PlacementKind::kPartial;
  for (const ParamSpec& spec : set.specs) {
    plan.dtypes.push_back(spec.dtype);
    plan.elementSizes.push_back(elementSize(spec.dtype));
  }
  plan.localCopies.resize(world);
  plan.sendBytes.assign(world, 0);
  plan.recvBytes.assign(world, 0);
  for (int r = 0; r < world; ++r) {
    plan.srcBuffers.push_back(from.rank(r).buffers);
    plan.dstBuffers.push_back(to.rank(r).buffers);
    std::vector<int64_t> covered(to.rank(r).buffers.size(), 0);
    for (const Piece& p : to.rank(r).pieces) covered[p.buffer] += p.box.numel();
    std::vector<bool> full;
    for (size_t b = 0; b < covered.size(); ++b) full.push_back(covered[b] == to.rank(r).buffers[b].numel());
    plan.dstFullyCovered.push_back(std::move(full));
  }

  // Source pieces per (tensor, summand slot).
  std::vector<std::vector<std::vector<PieceRef>>> sources(numTensors);
  for (int t = 0; t < numTensors; ++t) sources[t].resize(from.numSummands(t));
  for (int r = 0; r < world; ++r) {
    for (const Piece& p : from.rank(r).pieces) {
      sources[p.tensor][plan.sumsSummands ? p.summand : 0].push_back({r, &p});
    }
  }

  std::vector<Demand> demands;
  for (int r = 0; r < world; ++r) {
    for (const Piece& dst : to.rank(r).pieces) {
      for (int k = 0; k < from.numSummands(dst.tensor); ++k) {
        int summand = plan.sumsSummands ? k : -1;
        forEachCell(dst, sources[dst.tensor][k], [&](const Box& cell, std::vector<PieceRef> owners) {
          HS_INTERNAL_CHECK(!owners.empty(), "no source holds ", set.specs[dst.tensor].name, " ",
                            cell.toString(), " under ", from.key());
          for (const PieceRef& owner : owners) {
            if (owner.rank == r) {
              Demand local{dst.tensor, summand, cell, r, &dst, {}};
              plan.localCopies[r].push_back(makeSegment(local, cell, *owner.piece));
              plan.stats.localCopyBytes += cell.numel() * plan.elementSizes[dst.tensor];
              return;
            }
          }
          std::vector<PieceRef> near;
          for (const PieceRef& owner : owners) {
            if (topology.sameNode(owner.rank, r)) near.push_back(owner);
          }
          int64_t bytes = cell.numel() * plan.elementSizes[dst.tensor];
          plan.stats.lowerBoundBytes += bytes;
          if (near.empty()) plan.stats.lowerBoundInterNodeBytes += bytes;
          demands.push_back(Demand{dst.tensor, summand, cell, r, &dst,
                                   near.empty() ? std::move(owners) : std::move(near)});
        });
      }
    }
  }

  // Demands with the same candidate senders form one class of the flow problem; balancing
  // time, also the same link: a class's candidates are all on its receivers' node or none is.
  std::map<std::pair<std::vector<int>, bool>, int> classOf;
  std::vector<std::vector<int>> classRanks;
  std::vector<int64_t> classBytes;
  std::vector<bool> classInterNode;
  std::vector<int> demandClass(demands.size());
  for (size_t i = 0; i < demands.size(); ++i) {
    std::vector<int> ranks;
    for (const PieceRef& c : demands[i].candidates) ranks.push_back(c.rank);
    const bool interNode = !topology.sameNode(ranks.front(), demands[i].needer);
    auto key = std::make_pair(ranks, timed && interNode);
    auto it = classOf.find(key);
    if (it == classOf.end()) {
      it = classOf.emplace(key, static_cast<int>(classRanks.size())).first;
      classRanks.push_back(ranks);
      classBytes.push_back(0);
      classInterNode.push_back(interNode);
    }
    demandClass[i] = it->second;
    classBytes[it->second] += demands[i].box.numel() * plan.elementSizes[demands[i].tensor];
  }
  const int numClasses = static_cast<int>(classRanks.size());

  // The smallest largest per-rank send in bytes under same-node-first; balancing time, the
  // smallest slowest send in time units, and the flow that reaches it assigns the senders.
  SendBalancer bytes(classRanks, classBytes, world);
  plan.stats.sameNodeFirstMaxSendBytes = bytes.minimumCapacity();
  std::vector<int64_t> unitsPerByte(numClasses, 1);
  std::unique_ptr<SendBalancer> seconds;
  std::vector<int64_t> classUnits;
  if (timed) {
    const double fastest = std::max(intraBw, interBw);
    const int64_t intraUnits = std::llround(kTimeResolution * fastest / intraBw);
    const int64_t interUnits = std::llround(kTimeResolution * fastest / interBw);
    int64_t totalBytes = 0;
    for (int64_t b : classBytes) totalBytes += b;
    const int64_t slowest = std::max(intraUnits, interUnits);
    HS_CHECK(totalBytes <= kMaxTimeUnits / slowest, "balancing send time over links ", fastest / std::min(intraBw, interBw),
             "x apart weighs up to ", kMaxTimeUnits / slowest, " bytes to send, this switch sends ", totalBytes,
             " bytes; balance bytes instead (both bandwidths 0)");
    for (int c = 0; c < numClasses; ++c) {
      unitsPerByte[c] = classInterNode[c] ? interUnits : intraUnits;
      classUnits.push_back(classBytes[c] * unitsPerByte[c]);
    }
    seconds = std::make_unique<SendBalancer>(classRanks, classUnits, world);
    plan.stats.sameNodeFirstMaxSendSeconds =
        static_cast<double>(seconds->minimumCapacity()) / (kTimeResolution * fastest);
  }
  const SendBalancer& balancer = timed ? *seconds : bytes;

  // Assign each demand (or part of it) to a sender.
  std::map<std::pair<int, int>, std::vector<Segment>> bySenderPair;
  auto assign = [&](const Demand& d, const Box& box, int rank) {
    const Piece* piece = nullptr;
    for (const PieceRef& c : d.candidates) {
      if (c.rank == rank) piece = c.piece;
    }
    HS_INTERNAL_CHECK(piece != nullptr, "rank ", rank, " is not a candidate sender");
    bySenderPair[{rank, d.needer}].push_back(makeSegment(d, box, *piece));
  };

  if (options.senderPolicy == SenderPolicy::kGreedy) {
    std::vector<int64_t> sent(world, 0);
    std::vector<size_t> order(demands.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return demands[a].tensor < demands[b].tensor;
    });
    for (size_t i : order) {
      const Demand& d = demands[i];
      int best = d.candidates.front().rank;
      for (const PieceRef& c : d.candidates) {
        if (sent[c.rank] < sent[best]) best = c.rank;
      }
      sent[best] += d.box.numel() * plan.elementSizes[d.tensor];
      assign(d, d.box, best);
    }
  } else if (!demands.empty()) {
    // Quotas in bytes; time units round down, and a class's last sender takes what remains.
    std::vector<std::vector<std::pair<int, int64_t>>> quotas(numClasses);
    for (int c = 0; c < numClasses; ++c) {
      for (int r : classRanks[c]) {
        const int64_t units = balancer.flowTo(c, r);
        if (units > 0) quotas[c].push_back({r, units / unitsPerByte[c]});
      }
    }
    std::vector<std::vector<size_t>> members(numClasses);
    for (size_t i = 0; i < demands.size(); ++i) members[demandClass[i]].push_back(i);
    for (int c = 0; c < numClasses; ++c) {
      std::stable_sort(members[c].begin(), members[c].end(), [&](size_t a, size_t b) {
        return std::tie(demands[a].needer, demands[a].tensor, demands[a].summand, demands[a].box) <
               std::tie(demands[b].needer, demands[b].tensor, demands[b].summand, demands[b].box);
      });
      size_t s = 0;
      for (size_t i : members[c]) {
        const Demand& d = demands[i];
        const int64_t elem = plan.elementSizes[d.tensor];
        std::deque<Box> pending{d.box};
        while (!pending.empty()) {
          Box box = pending.front();
          pending.pop_front();
          auto& [rank, quota] = quotas[c][s];
          int64_t bytes = box.numel() * elem;
          if (bytes <= quota || s + 1 == quotas[c].size()) {
            assign(d, box, rank);
            quota -= bytes;
            continue;
          }
          int64_t take = quota / elem;
          if (take > 0) {
            for (const Box& b : subBoxes(box, 0, take)) assign(d, b, rank);
          }
          std::vector<Box> rest = subBoxes(box, take, box.numel());
          pending.insert(pending.begin(), rest.begin(), rest.end());
          ++s;
        }
      }
    }
  }

  for (auto& [pair, segments] : bySenderPair) {
    std::sort(segments.begin(), segments.end(), segmentLess);
    Message m{pair.first, pair.second, std::move(segments), 0};
    for (const Segment& s : m.segments) m.bytes += plan.segmentBytes(s);
    plan.sendBytes[m.src] += m.bytes;
    plan.recvBytes[m.dst] += m.bytes;
    plan.stats.bytesMoved += m.bytes;
    if (!topology.sameNode(m.src, m.dst)) plan.stats.interNodeBytes += m.bytes;
    plan.messages.push_back(std::move(m));
  }
  for (auto& copies : plan.localCopies) std::sort(copies.begin(), copies.end(), segmentLess);
  plan.stats.numMessages = static_cast<int64_t>(plan.messages.size());
  for (int r = 0; r < world; ++r) {
    plan.stats.maxSendBytes = std::max(plan.stats.maxSendBytes, plan.sendBytes[r]);
    plan.stats.maxRecvBytes = std::max(plan.stats.maxRecvBytes, plan.recvBytes[r]);
  }
  if (timed) {
    std::vector<double> sendSeconds(world, 0);
    for (const Message& m : plan.messages) {
      sendSeconds[m.src] += m.bytes / (topology.sameNode(m.src, m.dst) ? intraBw : interBw);
    }
    plan.stats.maxSendSeconds = *std::max_element(sendSeconds.begin(), sendSeconds.end());
  }
  HS_LOG_DEBUG("planner", "plan ", from.key(), " -> ", to.key(), ": ", plan.summary());
  return plan;
}

std::string RedistributionPlan::summary() const {
  return str("moved ", stats.bytesMoved, " B (lower bound ", stats.lowerBoundBytes, "), inter-node ",
             stats.interNodeBytes, " B, max send ", stats.maxSendBytes, " B (same-node-first optimum ",
             stats.sameNodeFirstMaxSendBytes, "), max recv ", stats.maxRecvBytes, " B, ",
             stats.numMessages, " messages, local copies ", stats.localCopyBytes, " B");
}

}  // namespace hotswitch
