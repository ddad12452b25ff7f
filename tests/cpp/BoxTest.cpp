#include "layout/Box.h"

#include <gtest/gtest.h>

namespace hotswitch {
namespace {

TEST(BoxTest, IntersectAndContain) {
  Box a{{0, 2}, {4, 6}};
  Box b{{3, 0}, {7, 3}};
  Box i = intersect(a, b);
  EXPECT_EQ(i, (Box{{3, 2}, {4, 3}}));
  EXPECT_EQ(i.numel(), 1);
  EXPECT_TRUE(a.contains(i));
  EXPECT_FALSE(i.contains(a));
  EXPECT_TRUE(intersect(a, Box{{5, 0}, {6, 1}}).empty());
}

TEST(BoxTest, ScalarBoxHasOneElement) {
  Box s = Box::full({});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(flatRangeBoxes({}, 0, 1).size(), 1u);
}

// Every flat range of awkward shapes decomposes into contiguous runs that cover it exactly.
TEST(BoxTest, FlatRangeBoxesCoverExactly) {
  for (Shape shape : std::vector<Shape>{{7}, {3, 5}, {2, 3, 4}, {1, 1, 5}, {4, 1, 3}}) {
    const int64_t n = numelOf(shape);
    Shape strides = contiguousStrides(shape);
    for (int64_t b = 0; b <= n; ++b) {
      for (int64_t e = b; e <= n; ++e) {
        std::vector<Box> boxes = flatRangeBoxes(shape, b, e);
        EXPECT_LE(boxes.size(), 2 * shape.size() - 1 + 0u);
        int64_t expectStart = b;
        for (const Box& box : boxes) {
          int64_t start = 0;
          for (size_t d = 0; d < shape.size(); ++d) start += box.lo[d] * strides[d];
          EXPECT_EQ(start, expectStart) << "shape " << shape.size() << " range " << b << "," << e;
          expectStart += box.numel();
          // Contiguous: the inner dims after the first non-unit one are full.
          bool seenPartial = false;
          for (size_t d = 0; d < shape.size(); ++d) {
            int64_t extent = box.hi[d] - box.lo[d];
            if (seenPartial) EXPECT_EQ(extent, shape[d]);
            if (extent > 1) seenPartial = true;
          }
        }
        EXPECT_EQ(expectStart, e);
      }
    }
  }
}

}  // namespace
}  // namespace hotswitch
