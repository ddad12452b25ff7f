#include "layout/Placement.h"

#include <algorithm>

#include "common/Check.h"

namespace hotswitch {

namespace {
const char* kKindNames[] = {"sharded", "zero", "partial"};

// A box of the rank's local shard and the box of the logical tensor it holds.
struct ShardPart {
  Box local;
  Box global;
};

// The local shard shape and its parts for TP coordinate t of degree T.
std::vector<ShardPart> tpShard(const ParamSpec& spec, int t, int T, Shape* localShape) {
  *localShape = spec.shape;
  int dim = spec.splitDim();
  if (dim < 0 || T == 1) {
    return {ShardPart{Box::full(spec.shape), Box::full(spec.shape)}};
  }
  std::vector<int64_t> groups = spec.groups.empty() ? std::vector<int64_t>{spec.shape[dim]}
                                                    : spec.groups;
  std::vector<ShardPart> parts;
  int64_t globalStart = 0;
  int64_t localStart = 0;
  for (int64_t g : groups) {
    HS_CHECK(g % T == 0, "param '", spec.name, "': ",
             spec.groups.empty() ? str("dim ", dim, " size ") : str("group of size "), g,
             " is not divisible by tp(", T, ")");
    int64_t part = g / T;
    ShardPart p{Box::full(spec.shape), Box::full(spec.shape)};
    p.global.lo[dim] = globalStart + t * part;
    p.global.hi[dim] = globalStart + (t + 1) * part;
    p.local.lo[dim] = localStart;
    p.local.hi[dim] = localStart + part;
    parts.push_back(p);
    globalStart += g;
    localStart += part;
  }
  (*localShape)[dim] = localStart;
  return parts;
}

int64_t flatIndex(const Shape& strides, const Shape& at) {
  int64_t i = 0;
  for (size_t d = 0; d < at.size(); ++d) {
    i += at[d] * strides[d];
  }
  return i;
}

// Adds the pieces of local flat elements [begin, end) of a shard, stored in buffer `buffer`
// with local element e at offset `base + e`.
void addWindow(RankPlacement& out, int tensor, const Shape& localShape,
               const std::vector<ShardPart>& parts, int64_t begin, int64_t end, int buffer,
               int64_t base, int summand) {
  Shape strides = contiguousStrides(localShape);
  for (const Box& run : flatRangeBoxes(localShape, begin, end)) {
    for (const ShardPart& part : parts) {
      Box local = intersect(run, part.local);
      if (local.empty()) continue;
      Piece piece;
      piece.tensor = tensor;
      piece.box = local;
      for (size_t d = 0; d < local.ndim(); ++d) {
        piece.box.lo[d] = part.global.lo[d] + local.lo[d] - part.local.lo[d];
        piece.box.hi[d] = part.global.lo[d] + local.hi[d] - part.local.lo[d];
      }
      piece.buffer = buffer;
      piece.offset = base + flatIndex(strides, local.lo);
      piece.strides = strides;
      piece.summand = summand;
      out.pieces.push_back(piece);
    }
  }
}

}  // namespace

const char* placementKindName(PlacementKind kind) { return kKindNames[static_cast<int>(kind)]; }

PlacementKind parsePlacementKind(const std::string& name) {
  for (int i = 0; i < 3; ++i) {
    if (name == kKindNames[i]) return static_cast<PlacementKind>(i);
  }
  HS_CHECK(false, "placement kind '", name, "' is not one of sharded, zero, partial");
  return PlacementKind::kSharded;
}

std::string Placement::key() const {
  return layout_.name() + ":" + placementKindName(kind_);
}

const RankPlacement& Placement::rank(int r) const {
  HS_CHECK(r >= 0 && r < world(), "rank ", r, " outside the placement's world(", world(), ")");
  return ranks_[r];
}

int Placement::stageOfLayer(int layer, int numLayers, int pp) {
  int base = numLayers / pp;
  int extra = numLayers % pp;
  // Stages [0, extra) hold base + 1 layers, the rest hold base.
  int boundary = extra * (base + 1);
  if (layer < boundary) return layer / (base + 1);
  return extra + (layer - boundary) / base;
}

std::vector<int> Placement::stagesOf(const ParamSpec& spec, int numLayers, int pp) {
  switch (spec.stage) {
    case StageRole::kLayer: return {stageOfLayer(spec.layer, numLayers, pp)};
    case StageRole::kFirst: return {0};
    case StageRole::kLast: return {pp - 1};
    case StageRole::kFirstAndLast:
      return pp == 1 ? std::vector<int>{0} : std::vector<int>{0, pp - 1};
  }
  return {};
}

Placement Placement::make(const TensorSet& set, const Layout& layout, PlacementKind kind) {
  set.validate();
  HS_CHECK(layout.pp() <= set.numLayers, "layout ", layout.name(), " has pp(", layout.pp(),
           ") > num_layers(", set.numLayers, "): every pipeline stage needs a layer");
  if (kind == PlacementKind::kZero) {
    for (const ParamSpec& spec : set.specs) {
      HS_CHECK(spec.dtype == set.specs.front().dtype, "zero placement needs one dtype; param '",
               spec.name, "' is ", dtypeName(spec.dtype), " but '", set.specs.front().name,
               "' is ", dtypeName(set.specs.front().dtype));
    }
  }
  Placement placement(layout, kind);
  const int world = layout.world();
  placement.ranks_.resize(world);
  for (const ParamSpec& spec : set.specs) {
    int stages = static_cast<int>(stagesOf(spec, set.numLayers, layout.pp()).size());
    placement.summands_.push_back(kind == PlacementKind::kPartial ? layout.dataSize() * stages : 1);
  }
  for (int r = 0; r < world; ++r) {
    Coord c = layout.coord(r);
    int stage = c[static_cast<int>(Axis::kPp)];
    int t = c[static_cast<int>(Axis::kTp)];
    RankPlacement& out = placement.ranks_[r];

    // Owned tensors with their shards, in spec order.
    struct Owned {
      int tensor;
      Shape shape;
      std::vector<ShardPart> parts;
    };
    std::vector<Owned> owned;
    for (int i = 0; i < static_cast<int>(set.specs.size()); ++i) {
      const ParamSpec& spec = set.specs[i];
      std::vector<int> stages = stagesOf(spec, set.numLayers, layout.pp());
      Owned o{i, {}, {}};
      o.parts = tpShard(spec, t, layout.tp(), &o.shape);  // checks divisibility on every rank
      if (std::find(stages.begin(), stages.end(), stage) != stages.end()) {
        owned.push_back(std::move(o));
      }
    }

    if (kind != PlacementKind::kZero) {
      for (const Owned& o : owned) {
        int summand = -1;
        if (kind == PlacementKind::kPartial) {
          std::vector<int> stages = stagesOf(set.specs[o.tensor], set.numLayers, layout.pp());
          int copy = static_cast<int>(std::find(stages.begin(), stages.end(), stage) - stages.begin());
          summand = copy * layout.dataSize() + layout.dataIndex(r);
        }
        int buffer = static_cast<int>(out.buffers.size());
        out.buffers.push_back(BufferSpec{o.tensor, o.shape, set.specs[o.tensor].dtype});
        addWindow(out, o.tensor, o.shape, o.parts, 0, numelOf(o.shape), buffer, 0, summand);
      }
      continue;
    }

    int64_t total = 0;
    for (const Owned& o : owned) total += numelOf(o.shape);
    const int D = layout.dataSize();
    const int64_t chunk = (total + D - 1) / D;
    const int64_t lo = layout.dataIndex(r) * chunk;
    const int64_t hi = lo + chunk;
    DType dtype = set.specs.empty() ? DType::kFloat32 : set.specs.front().dtype;
    out.buffers.push_back(BufferSpec{-1, {chunk}, dtype});
    int64_t start = 0;  // flat position of the tensor's shard in the concatenation
    for (const Owned& o : owned) {
      int64_t n = numelOf(o.shape);
      int64_t b = std::max(lo, start) - start;
      int64_t e = std::min(hi, start + n) - start;
      if (b < e) {
        addWindow(out, o.tensor, o.shape, o.parts, b, e, 0, start - lo, -1);
      }
      start += n;
    }
  }
  return placement;
}

}  // namespace hotswitch
