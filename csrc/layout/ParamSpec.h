#pragma once

// One logical parameter of a model and its sharding rule, and the set of them that a
// placement or a plan is built over.
//
// Sharding rules (Megatron's, for a PyTorch weight of shape [out, in]):
//   kReplicated   every TP rank holds the whole tensor (norms, row-parallel biases)
//   kColumn       split along dim 0 (output features of a column-parallel linear)
//   kRow          split along dim 1 (input features of a row-parallel linear)
//   kVocab        split along dim 0 (embedding or output head rows)
//   kFusedColumn  dim 0 is the concatenation of `groups` (QKV, gate/up); each group is split
//                 separately, so TP shard t holds part t of every group, concatenated.
// A split dim must divide evenly by tp; uneven splits are rejected (pad the vocabulary).
//
// Pipeline ownership: a kLayer parameter lives on the stage owning `layer` (layers are cut
// into contiguous, balanced stages); kFirst on the first stage (embedding), kLast on the
// last (final norm, head), kFirstAndLast on both (a tied embedding).

#include <cstdint>
#include <string>
#include <vector>

#include "layout/Box.h"

namespace hotswitch {

enum class DType { kFloat32 = 0, kFloat64, kFloat16, kBFloat16, kInt64, kInt32 };
int64_t elementSize(DType dtype);
const char* dtypeName(DType dtype);
DType parseDType(const std::string& name);

enum class ShardRule { kReplicated = 0, kColumn, kRow, kVocab, kFusedColumn };
const char* shardRuleName(ShardRule rule);
ShardRule parseShardRule(const std::string& name);

enum class StageRole { kLayer = 0, kFirst, kLast, kFirstAndLast };
const char* stageRoleName(StageRole role);
StageRole parseStageRole(const std::string& name);

// The largest parameter, in bytes (256 TiB): element counts and byte offsets of whole tensor
// sets stay far inside int64.
constexpr int64_t kMaxParamBytes = int64_t{1} << 48;

struct ParamSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::kFloat32;
  ShardRule rule = ShardRule::kReplicated;
  std::vector<int64_t> groups;  // kFusedColumn only: sizes along dim 0, summing to shape[0]
  StageRole stage = StageRole::kLayer;
  int layer = 0;  // kLayer only

  int64_t numel() const { return numelOf(shape); }
  int64_t bytes() const { return numel() * elementSize(dtype); }
  // The split dim of the rule, or -1 for kReplicated.
  int splitDim() const;
  // Throws InvalidArgument naming the spec when it is malformed (including a size over
  // kMaxParamBytes).
  void validate() const;
  std::string toString() const;
};

struct TensorSet {
  std::vector<ParamSpec> specs;
  int numLayers = 1;

  // Throws InvalidArgument naming the first malformed or duplicated spec.
  void validate() const;
  // A hash of every field, equal across processes for equal sets.
  uint64_t fingerprint() const;
};

// 64-bit FNV-1a, for fingerprints that must agree across processes.
uint64_t fnv1a(const std::string& text, uint64_t seed = 1469598103934665603ULL);

}  // namespace hotswitch
