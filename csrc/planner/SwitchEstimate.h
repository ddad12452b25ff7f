#pragma once

// The bytes each rank must receive in a switch between two placements, without building the
// redistribution plan: what a switch costs the planner when the world is too large to plan
// every pair of candidate layouts (planning one pair of a 256-rank world takes seconds).
//
// A destination rank needs, per element of its destination pieces, every source summand
// (one, unless the source is kPartial); what it already holds under the source is a local
// copy, what another rank of its node holds crosses the intra-node links, the rest the
// inter-node links. These are exactly the receive volumes of any plan that takes each element
// from its own node when it can (RedistributionPlan's balanced policy does; its send volumes
// are balanced separately and are not estimated here). Distinct source boxes of one tensor
// and summand on a node are taken to be disjoint, as the layouts' sharding rules make them.

#include <cstdint>
#include <vector>

#include "layout/ParamSpec.h"
#include "layout/Placement.h"
#include "layout/Topology.h"

namespace hotswitch {

struct SwitchEstimate {
  std::vector<int64_t> recvIntraNodeBytes;  // per rank
  std::vector<int64_t> recvInterNodeBytes;  // per rank
  int64_t totalBytes = 0;                   // all ranks, both kinds

  // Throws InvalidArgument when the placements are over different worlds, the topology's
  // world differs, or the destination is kPartial.
  static SwitchEstimate of(const TensorSet& set, const Placement& from, const Placement& to,
                           const Topology& topology);

  // The slowest rank's receive time: max over ranks of intra / intraBandwidth + inter /
  // interBandwidth (bytes/s).
  double seconds(double intraBandwidth, double interBandwidth) const;
};

}  // namespace hotswitch
