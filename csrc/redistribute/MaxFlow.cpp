#include "redistribute/MaxFlow.h"

#include <algorithm>
#include <limits>
#include <queue>

namespace hotswitch {

MaxFlow::MaxFlow(int numNodes) : adjacency_(numNodes), level_(numNodes), next_(numNodes) {}

int MaxFlow::addEdge(int from, int to, int64_t capacity) {
  int id = static_cast<int>(edges_.size());
  edges_.push_back({to, capacity, 0});
  adjacency_[from].push_back(id);
  edges_.push_back({from, 0, 0});
  adjacency_[to].push_back(id + 1);
  return id;
}

void MaxFlow::setCapacity(int edge, int64_t capacity) { edges_[edge].capacity = capacity; }

int64_t MaxFlow::flowOn(int edge) const { return edges_[edge].flow; }

bool MaxFlow::bfs(int source, int sink) {
  std::fill(level_.begin(), level_.end(), -1);
  std::queue<int> queue;
  level_[source] = 0;
  queue.push(source);
  while (!queue.empty()) {
    int v = queue.front();
    queue.pop();
    for (int id : adjacency_[v]) {
      const Edge& e = edges_[id];
      if (e.capacity - e.flow > 0 && level_[e.to] < 0) {
        level_[e.to] = level_[v] + 1;
        queue.push(e.to);
      }
    }
  }
  return level_[sink] >= 0;
}

int64_t MaxFlow::dfs(int node, int sink, int64_t pushed) {
  if (node == sink || pushed == 0) return pushed;
  for (size_t& i = next_[node]; i < adjacency_[node].size(); ++i) {
    int id = adjacency_[node][i];
    Edge& e = edges_[id];
    if (level_[e.to] != level_[node] + 1 || e.capacity - e.flow <= 0) continue;
    int64_t got = dfs(e.to, sink, std::min(pushed, e.capacity - e.flow));
    if (got > 0) {
      e.flow += got;
      edges_[id ^ 1].flow -= got;
      return got;
    }
  }
  return 0;
}

int64_t MaxFlow::run(int source, int sink) {
  for (Edge& e : edges_) e.flow = 0;
  int64_t total = 0;
  while (bfs(source, sink)) {
    std::fill(next_.begin(), next_.end(), 0);
    while (int64_t f = dfs(source, sink, std::numeric_limits<int64_t>::max())) {
      total += f;
    }
  }
  return total;
}

}  // namespace hotswitch
