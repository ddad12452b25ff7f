#pragma once

// Where the elements of a tensor set live under one layout.
//
// Every rank holds a list of local buffers. For kSharded and kPartial placements there is
// one buffer per tensor the rank owns: its TP shard (for kFusedColumn the rank's part of
// every group, concatenated along dim 0), in spec order. For kZero there is one flat 1-D
// buffer: the rank's TP/PP shards concatenated in spec order, padded to a multiple of the
// data-group size and cut evenly over the data (dp x cp) group; the data index d holds
// chunk d. All specs of a ZeRO placement must share a dtype.
//
// A piece maps a box of the logical (full) tensor to a strided view of a local buffer:
// element x of the box sits at buffer offset `offset + sum((x - box.lo) * strides)`.
//
// kPartial is the state of gradients before data-parallel reduction: the layout's shards,
// where the rank with data index k holds summand k of its region; the full value is the sum
// of all dp * cp summands. A tensor held by two pipeline stages (a tied embedding) has a
// summand per stage too: the last stage's copy of data index k is summand dp * cp + k.

#include <cstdint>
#include <string>
#include <vector>

#include "layout/Layout.h"
#include "layout/ParamSpec.h"

namespace hotswitch {

enum class PlacementKind { kSharded = 0, kZero, kPartial };
const char* placementKindName(PlacementKind kind);
PlacementKind parsePlacementKind(const std::string& name);

struct Piece {
  int tensor = 0;    // index into TensorSet::specs
  Box box;           // in logical tensor coordinates
  int buffer = 0;    // index into RankPlacement::buffers
  int64_t offset = 0;
  Shape strides;
  int summand = -1;  // kPartial: which summand this is (see above); -1 otherwise
};

struct BufferSpec {
  int tensor = -1;   // the tensor this buffer holds, or -1 for a ZeRO flat buffer
  Shape shape;
  DType dtype = DType::kFloat32;
  int64_t numel() const { return numelOf(shape); }
};

struct RankPlacement {
  std::vector<BufferSpec> buffers;
  std::vector<Piece> pieces;
};

class Placement {
 public:
  // Throws InvalidArgument when the layout cannot shard the set: a split dim not divisible
  // by tp, more pipeline stages than layers, mixed dtypes under kZero.
  static Placement make(const TensorSet& set, const Layout& layout,
                        PlacementKind kind = PlacementKind::kSharded);

  const Layout& layout() const { return layout_; }
  PlacementKind kind() const { return kind_; }
  int world() const { return static_cast<int>(ranks_.size()); }
  // Throws InvalidArgument for a rank outside the world.
  const RankPlacement& rank(int r) const;
  // Number of summands per element of the tensor: 1 unless kPartial; for kPartial dp * cp
  // times the number of pipeline stages holding the tensor.
  int numSummands(int tensor) const { return summands_.at(tensor); }
  // "dp2tp2:sharded"; used in cache keys and messages.
  std::string key() const;

  // The pipeline stage (0-based) that owns `layer` when numLayers layers are cut into pp
  // contiguous stages whose sizes differ by at most one (earlier stages take the extra).
  static int stageOfLayer(int layer, int numLayers, int pp);
  // Stages that hold the spec.
  static std::vector<int> stagesOf(const ParamSpec& spec, int numLayers, int pp);

 private:
  Placement(Layout layout, PlacementKind kind) : layout_(layout), kind_(kind) {}

  Layout layout_;
  PlacementKind kind_;
  std::vector<RankPlacement> ranks_;
  std::vector<int> summands_;  // per tensor
};

}  // namespace hotswitch
