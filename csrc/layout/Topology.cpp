#include "layout/Topology.h"

#include "common/Check.h"

namespace hotswitch {

Topology::Topology(int world, int ranksPerNode) : world_(world), ranksPerNode_(ranksPerNode) {
  HS_CHECK(world >= 1, "world must be >= 1, got ", world);
  HS_CHECK(ranksPerNode >= 1, "ranks_per_node must be >= 1, got ", ranksPerNode);
  HS_CHECK(world % ranksPerNode == 0, "world(", world, ") is not a multiple of ranks_per_node(",
           ranksPerNode, ")");
}

int Topology::node(int rank) const {
  HS_CHECK(rank >= 0 && rank < world_, "rank ", rank, " outside world(", world_, ")");
  return rank / ranksPerNode_;
}

std::string Topology::toString() const {
  return str("Topology(world=", world_, ", ranks_per_node=", ranksPerNode_, ")");
}

}  // namespace hotswitch
