#pragma once

// An index box of a tensor: per dim the half-open range [lo, hi). A 0-dim box (scalar)
// has one element.

#include <cstdint>
#include <string>
#include <vector>

namespace hotswitch {

using Shape = std::vector<int64_t>;

struct Box {
  Shape lo;
  Shape hi;

  static Box full(const Shape& shape);

  size_t ndim() const { return lo.size(); }
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  Shape sizes() const;
  bool contains(const Box& other) const;
  std::string toString() const;

  bool operator==(const Box& other) const { return lo == other.lo && hi == other.hi; }
  bool operator<(const Box& other) const {
    return lo != other.lo ? lo < other.lo : hi < other.hi;
  }
};

// The intersection; empty (numel 0) when the boxes do not overlap.
Box intersect(const Box& a, const Box& b);

int64_t numelOf(const Shape& shape);

// Row-major strides of a contiguous tensor of this shape.
Shape contiguousStrides(const Shape& shape);

// The elements [begin, end) of a row-major tensor of `shape`, as the fewest boxes each of
// which is one contiguous run in row-major order (at most 2 * ndim - 1 of them).
std::vector<Box> flatRangeBoxes(const Shape& shape, int64_t begin, int64_t end);

}  // namespace hotswitch
