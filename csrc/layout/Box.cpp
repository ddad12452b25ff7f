#include "layout/Box.h"

#include <algorithm>
#include <sstream>

#include "common/Check.h"

namespace hotswitch {

Box Box::full(const Shape& shape) {
  return Box{Shape(shape.size(), 0), shape};
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (size_t d = 0; d < lo.size(); ++d) {
    n *= std::max<int64_t>(0, hi[d] - lo[d]);
  }
  return n;
}

Shape Box::sizes() const {
  Shape s(lo.size());
  for (size_t d = 0; d < lo.size(); ++d) {
    s[d] = hi[d] - lo[d];
  }
  return s;
}

bool Box::contains(const Box& other) const {
  for (size_t d = 0; d < lo.size(); ++d) {
    if (other.lo[d] < lo[d] || other.hi[d] > hi[d]) {
      return false;
    }
  }
  return true;
}

std::string Box::toString() const {
  std::ostringstream os;
  os << '[';
  for (size_t d = 0; d < lo.size(); ++d) {
    os << (d ? ", " : "") << lo[d] << ':' << hi[d];
  }
  os << ']';
  return os.str();
}

Box intersect(const Box& a, const Box& b) {
  HS_INTERNAL_CHECK(a.ndim() == b.ndim(), "intersecting boxes of rank ", a.ndim(), " and ",
                    b.ndim());
  Box out{a.lo, a.hi};
  for (size_t d = 0; d < a.ndim(); ++d) {
    out.lo[d] = std::max(a.lo[d], b.lo[d]);
    out.hi[d] = std::max(out.lo[d], std::min(a.hi[d], b.hi[d]));
  }
  return out;
}

int64_t numelOf(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    n *= s;
  }
  return n;
}

Shape contiguousStrides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

namespace {

// Appends the boxes of [begin, end) within shape[dim:], prefixed by `prefix` for dims < dim.
void flatRangeRec(const Shape& shape, size_t dim, int64_t begin, int64_t end, Box prefix,
                  std::vector<Box>& out) {
  if (begin >= end) {
    return;
  }
  if (dim == shape.size()) {
    out.push_back(prefix);
    return;
  }
  int64_t inner = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) {
    inner *= shape[d];
  }
  auto withRows = [&](int64_t r0, int64_t r1) {
    Box b = prefix;
    b.lo[dim] = r0;
    b.hi[dim] = r1;
    return b;
  };
  int64_t r0 = begin / inner;
  int64_t r1 = end / inner;
  if (r0 == r1 || (r1 == r0 + 1 && end % inner == 0 && begin % inner != 0)) {
    // Inside one row (possibly ending at its end).
    flatRangeRec(shape, dim + 1, begin - r0 * inner, end - r0 * inner, withRows(r0, r0 + 1), out);
    return;
  }
  if (begin % inner != 0) {
    flatRangeRec(shape, dim + 1, begin - r0 * inner, inner, withRows(r0, r0 + 1), out);
    ++r0;
  }
  if (r1 > r0) {
    Box rows = withRows(r0, r1);
    for (size_t d = dim + 1; d < shape.size(); ++d) {
      rows.lo[d] = 0;
      rows.hi[d] = shape[d];
    }
    out.push_back(rows);
  }
  if (end % inner != 0) {
    flatRangeRec(shape, dim + 1, 0, end - r1 * inner, withRows(r1, r1 + 1), out);
  }
}

}  // namespace

std::vector<Box> flatRangeBoxes(const Shape& shape, int64_t begin, int64_t end) {
  HS_INTERNAL_CHECK(0 <= begin && begin <= end && end <= numelOf(shape), "flat range [", begin,
                    ", ", end, ") outside a tensor of ", numelOf(shape), " elements");
  std::vector<Box> out;
  flatRangeRec(shape, 0, begin, end, Box::full(shape), out);
  return out;
}

}  // namespace hotswitch
