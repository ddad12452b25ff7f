#pragma once

// How the ranks of the world map to nodes: ranks [k * ranksPerNode, (k + 1) * ranksPerNode)
// form node k. Links inside a node are fast, links between nodes slow.

#include <string>

namespace hotswitch {

class Topology {
 public:
  // Throws InvalidArgument unless world >= 1, ranksPerNode >= 1 and ranksPerNode divides
  // world.
  Topology(int world, int ranksPerNode);

  int world() const { return world_; }
  int ranksPerNode() const { return ranksPerNode_; }
  int numNodes() const { return world_ / ranksPerNode_; }
  // Throws InvalidArgument for a rank outside the world.
  int node(int rank) const;
  bool sameNode(int a, int b) const { return a / ranksPerNode_ == b / ranksPerNode_; }
  std::string toString() const;

  bool operator==(const Topology& o) const {
    return world_ == o.world_ && ranksPerNode_ == o.ranksPerNode_;
  }

 private:
  int world_;
  int ranksPerNode_;
};

}  // namespace hotswitch
