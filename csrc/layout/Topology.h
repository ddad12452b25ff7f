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
  int node(int rank) const { return rank / ranksPerNode_; }
  bool sameNode(int a, int b) const { return node(a) == node(b); }
  std::string toString() const;

  bool operator==(const Topology& o) const {
    return world_ == o.world_ && ranksPerNode_ == o.ranksPerNode_;
  }

 private:
  int world_;
  int ranksPerNode_;
};

}  // namespace hotswitch
