#pragma once

// Dinic's maximum flow on a small directed graph with int64 capacities.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hotswitch {

class MaxFlow {
 public:
  explicit MaxFlow(int numNodes);

  // Returns the edge id, for flowOn().
  int addEdge(int from, int to, int64_t capacity);
  void setCapacity(int edge, int64_t capacity);
  // Computes the maximum flow from source to sink, starting from zero flow.
  int64_t run(int source, int sink);
  int64_t flowOn(int edge) const;

 private:
  struct Edge {
    int to;
    int64_t capacity;
    int64_t flow;
  };
  bool bfs(int source, int sink);
  int64_t dfs(int node, int sink, int64_t pushed);

  std::vector<Edge> edges_;
  std::vector<std::vector<int>> adjacency_;
  std::vector<int> level_;
  std::vector<size_t> next_;
};

}  // namespace hotswitch
