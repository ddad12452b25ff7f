#include "layout/Placement.h"

#include <gtest/gtest.h>

#include "TestModels.h"
#include "common/Check.h"

namespace hotswitch {
namespace {

using testing::transformerSet;

int tensorIndex(const TensorSet& set, const std::string& name) {
  for (size_t i = 0; i < set.specs.size(); ++i) {
    if (set.specs[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<Box> boxesOf(const Placement& p, int rank, int tensor) {
  std::vector<Box> out;
  for (const Piece& piece : p.rank(rank).pieces) {
    if (piece.tensor == tensor) out.push_back(piece.box);
  }
  return out;
}

TEST(PlacementTest, FusedColumnShardHoldsMatchingParts) {
  TensorSet set = transformerSet(2, 8);  // h=8: qkv groups {8, 4, 4}
  Placement p = Placement::make(set, Layout(1, 2, 1));
  int qkv = tensorIndex(set, "layers.0.qkv.weight");
  // TP rank 1 holds rows [4,8) of q, [10,12) of k, [14,16) of v, concatenated.
  std::vector<Box> boxes = boxesOf(p, 1, qkv);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0], (Box{{4, 0}, {8, 8}}));
  EXPECT_EQ(boxes[1], (Box{{10, 0}, {12, 8}}));
  EXPECT_EQ(boxes[2], (Box{{14, 0}, {16, 8}}));
  for (const BufferSpec& b : p.rank(1).buffers) {
    if (b.tensor == qkv) EXPECT_EQ(b.shape, (Shape{8, 8}));
  }
}

TEST(PlacementTest, RowAndVocabSplits) {
  TensorSet set = transformerSet(1, 8);
  Placement p = Placement::make(set, Layout(1, 4, 1));
  EXPECT_EQ(boxesOf(p, 2, tensorIndex(set, "layers.0.proj.weight")).front(), (Box{{0, 4}, {8, 6}}));
  EXPECT_EQ(boxesOf(p, 3, tensorIndex(set, "embedding.weight")).front(), (Box{{18, 0}, {24, 8}}));
  EXPECT_EQ(boxesOf(p, 3, tensorIndex(set, "final_norm.weight")).front(), Box::full({8}));
}

TEST(PlacementTest, PipelineStagesAreContiguousAndBalanced) {
  EXPECT_EQ(Placement::stageOfLayer(0, 5, 2), 0);
  EXPECT_EQ(Placement::stageOfLayer(2, 5, 2), 0);
  EXPECT_EQ(Placement::stageOfLayer(3, 5, 2), 1);
  EXPECT_EQ(Placement::stageOfLayer(6, 7, 3), 2);
  TensorSet tied = transformerSet(4, 4, /*tied=*/true);
  Placement p = Placement::make(tied, Layout(1, 1, 2));
  int emb = tensorIndex(tied, "embedding.weight");
  EXPECT_EQ(boxesOf(p, 0, emb).size(), 1u);
  EXPECT_EQ(boxesOf(p, 1, emb).size(), 1u);  // tied: on the last stage too
  EXPECT_TRUE(boxesOf(p, 0, tensorIndex(tied, "layers.2.qkv.weight")).empty());
  EXPECT_EQ(boxesOf(p, 1, tensorIndex(tied, "layers.2.qkv.weight")).size(), 1u);
}

TEST(PlacementTest, ZeroShardsCoverTheStageOnceOverTheDataGroup) {
  TensorSet set = transformerSet(2, 8);
  Layout layout(3, 2, 1);
  Placement p = Placement::make(set, layout, PlacementKind::kZero);
  // Elements per TP shard, counted over the data group, equal the shard's size.
  for (int tpRank = 0; tpRank < 2; ++tpRank) {
    int64_t covered = 0, capacity = 0;
    for (int r : layout.dataGroup(tpRank)) {
      ASSERT_EQ(p.rank(r).buffers.size(), 1u);
      capacity += p.rank(r).buffers[0].numel();
      for (const Piece& piece : p.rank(r).pieces) covered += piece.box.numel();
    }
    int64_t shard = 0;
    for (const ParamSpec& s : set.specs) shard += s.splitDim() < 0 ? s.numel() : s.numel() / 2;
    EXPECT_EQ(covered, shard);
    EXPECT_GE(capacity, shard);
    EXPECT_LT(capacity - shard, 3);
  }
}

TEST(PlacementTest, PartialMarksSummandsByDataIndex) {
  TensorSet set = transformerSet(1, 4);
  Layout layout(2, 1, 1, 2);  // dp2 x cp2: four summands
  Placement p = Placement::make(set, layout, PlacementKind::kPartial);
  EXPECT_EQ(p.numSummands(0), 4);
  for (int r = 0; r < 4; ++r) {
    for (const Piece& piece : p.rank(r).pieces) EXPECT_EQ(piece.summand, layout.dataIndex(r));
  }
}

TEST(PlacementTest, TiedEmbeddingHasASummandPerStage) {
  TensorSet tied = transformerSet(4, 4, /*tied=*/true);
  Layout layout(2, 1, 2);  // dp2 pp2: the embedding lives on both stages
  Placement p = Placement::make(tied, layout, PlacementKind::kPartial);
  EXPECT_EQ(p.numSummands(0), 4);
  EXPECT_EQ(p.numSummands(1), 2);
  std::vector<int> seen;
  for (int r = 0; r < 4; ++r) {
    for (const Piece& piece : p.rank(r).pieces) {
      if (piece.tensor == 0) seen.push_back(piece.summand);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3}));
}

TEST(PlacementTest, RejectsUnevenSplitsAndTooManyStages) {
  TensorSet set = transformerSet(2, 6);  // qkv groups {6, 3, 3}
  try {
    Placement::make(set, Layout(1, 2, 1));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("group of size 3 is not divisible by tp(2)"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(Placement::make(set, Layout(1, 1, 3)), InvalidArgument);
  TensorSet mixed = transformerSet(1, 4);
  mixed.specs[1].dtype = DType::kBFloat16;
  EXPECT_THROW(Placement::make(mixed, Layout(2, 1, 1), PlacementKind::kZero), InvalidArgument);
}

// Found by the plan fuzzer: a shape whose element count overflowed int64 made placing it
// undefined; such specs are rejected up front.
TEST(PlacementTest, RejectsParamsTooLargeToIndex) {
  TensorSet set;
  ParamSpec huge;
  huge.name = "huge";
  huge.shape = {96, int64_t{1} << 57};
  set.specs.push_back(huge);
  for (PlacementKind kind : {PlacementKind::kSharded, PlacementKind::kZero}) {
    try {
      Placement::make(set, Layout(2, 1, 1), kind);
      FAIL() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("param 'huge': shape [96, 144115188075855872] of float32 exceeds the "
                                           "largest parameter, 281474976710656 bytes"),
                std::string::npos)
          << e.what();
    }
  }
  set.specs[0].shape = {int64_t{1} << 24, int64_t{1} << 23};  // 2^49 bytes at fp32
  EXPECT_THROW(set.validate(), InvalidArgument);
  set.specs[0].dtype = DType::kFloat16;  // exactly 2^48 bytes
  EXPECT_NO_THROW(set.validate());
}

}  // namespace
}  // namespace hotswitch
