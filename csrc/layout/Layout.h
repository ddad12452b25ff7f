#pragma once

// One parallel strategy over the whole world.
//
// A layout has a degree per axis: tp (tensor parallel), cp (context parallel: each sequence
// split over the cp ranks), dp (data parallel) and pp (pipeline parallel), with
// dp * tp * pp * cp == world.
// Its rank order says which axis varies fastest as the rank grows; Megatron's order, the
// default, is tp fastest, then cp, dp, pp. A rank's coordinate on each axis follows from
// the order: rank = c[order[0]] + d[order[0]] * (c[order[1]] + d[order[1]] * (...)).
//
// A group along an axis is the set of ranks that differ only in that axis' coordinate (the
// TP group of a rank is the ranks holding the other TP shards of its tensors).
// Parameters are replicated over cp as over dp: the "data" group of a rank, over which
// gradients are reduced and ZeRO shards spread, is its dp x cp group.

#include <array>
#include <string>
#include <vector>

namespace hotswitch {

enum class Axis { kTp = 0, kCp = 1, kDp = 2, kPp = 3 };
constexpr int kNumAxes = 4;

const char* axisName(Axis axis);

using Coord = std::array<int, kNumAxes>;  // indexed by static_cast<int>(Axis)

class Layout {
 public:
  using Order = std::array<Axis, kNumAxes>;  // fastest-varying axis first
  static Order megatronOrder() { return {Axis::kTp, Axis::kCp, Axis::kDp, Axis::kPp}; }

  // Throws InvalidArgument unless every degree is >= 1, their product (the world) fits in an
  // int, and order is a permutation of the four axes.
  Layout(int dp, int tp, int pp, int cp = 1, Order order = megatronOrder());

  // Parses "dp2tp4", "tp2pp2", "dp8" (missing axes are 1), optionally followed by an
  // order such as "/tp-cp-dp-pp". Throws InvalidArgument naming the text.
  static Layout parse(const std::string& text);
  static Order parseOrder(const std::string& text);

  // Every layout of `world` with cp <= maxCp and the default order, sorted by (cp, pp, tp, dp).
  // Throws InvalidArgument for world < 1 or maxCp < 1.
  static std::vector<Layout> enumerate(int world, int maxCp = 1);

  int dp() const { return degree(Axis::kDp); }
  int tp() const { return degree(Axis::kTp); }
  int pp() const { return degree(Axis::kPp); }
  int cp() const { return degree(Axis::kCp); }
  int degree(Axis axis) const { return degrees_[static_cast<int>(axis)]; }
  const Order& order() const { return order_; }
  int world() const;

  // Throws InvalidArgument naming the arithmetic when the degrees do not multiply to
  // `world`: "dp(2) * tp(3) * pp(1) * cp(1) = 6 != world(8)".
  void validate(int world) const;

  Coord coord(int rank) const;
  int rank(const Coord& coord) const;

  // Ranks that differ from `rank` only along `axis`, ordered by that coordinate.
  std::vector<int> group(Axis axis, int rank) const;
  // Every group along `axis`, ordered by their smallest rank.
  std::vector<std::vector<int>> groups(Axis axis) const;

  // Index and size of `rank` in its data (dp x cp) group: dp coordinate * cp + cp coordinate.
  int dataIndex(int rank) const;
  int dataSize() const { return dp() * cp(); }
  std::vector<int> dataGroup(int rank) const;

  // "dp2tp4" (axes of degree 1 omitted, "dp1" for world 1), with "/order" appended when the
  // order is not Megatron's. parse(name()) == *this.
  std::string name() const;
  std::string orderName() const;

  bool operator==(const Layout& o) const { return degrees_ == o.degrees_ && order_ == o.order_; }
  bool operator!=(const Layout& o) const { return !(*this == o); }

 private:
  std::array<int, kNumAxes> degrees_;
  Order order_;
};

}  // namespace hotswitch
