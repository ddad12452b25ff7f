#include "layout/ParamSpec.h"

#include <numeric>
#include <set>

#include "common/Check.h"

namespace hotswitch {

int64_t elementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kInt64: return 8;
    case DType::kInt32: return 4;
  }
  return 0;
}

namespace {
const char* kDTypeNames[] = {"float32", "float64", "float16", "bfloat16", "int64", "int32"};
const char* kRuleNames[] = {"replicated", "column", "row", "vocab", "fused_column"};
const char* kStageNames[] = {"layer", "first", "last", "first_and_last"};

template <typename E, size_t N>
E parseName(const std::string& name, const char* (&names)[N], const char* what) {
  std::string options;
  for (size_t i = 0; i < N; ++i) {
    if (name == names[i]) {
      return static_cast<E>(i);
    }
    options += (i ? ", " : "") + std::string(names[i]);
  }
  HS_CHECK(false, what, " '", name, "' is not one of ", options);
  return static_cast<E>(0);
}
}  // namespace

const char* dtypeName(DType dtype) { return kDTypeNames[static_cast<int>(dtype)]; }
DType parseDType(const std::string& name) { return parseName<DType>(name, kDTypeNames, "dtype"); }
const char* shardRuleName(ShardRule rule) { return kRuleNames[static_cast<int>(rule)]; }
ShardRule parseShardRule(const std::string& name) {
  return parseName<ShardRule>(name, kRuleNames, "sharding rule");
}
const char* stageRoleName(StageRole role) { return kStageNames[static_cast<int>(role)]; }
StageRole parseStageRole(const std::string& name) {
  return parseName<StageRole>(name, kStageNames, "stage");
}

int ParamSpec::splitDim() const {
  switch (rule) {
    case ShardRule::kReplicated: return -1;
    case ShardRule::kRow: return 1;
    default: return 0;
  }
}

void ParamSpec::validate() const {
  HS_CHECK(!name.empty(), "param spec needs a non-empty name");
  int64_t bytes = elementSize(dtype);
  for (int64_t s : shape) {
    HS_CHECK(s >= 1, "param '", name, "': shape ", shape, " has a dim < 1");
    // Element counts and byte offsets are int64 everywhere: bound the size before anything
    // multiplies the dims (s >= 1, so the quotient below never rounds a fitting size away).
    HS_CHECK(s <= kMaxParamBytes / bytes, "param '", name, "': shape ", shape, " of ", dtypeName(dtype),
             " exceeds the largest parameter, ", kMaxParamBytes, " bytes");
    bytes *= s;
  }
  int dim = splitDim();
  HS_CHECK(dim < static_cast<int>(shape.size()), "param '", name, "': rule ", shardRuleName(rule),
           " splits dim ", dim, " but shape ", shape, " has ", shape.size(), " dims");
  if (rule == ShardRule::kFusedColumn) {
    HS_CHECK(!groups.empty(), "param '", name, "': fused_column needs groups (sizes along dim 0)");
    int64_t total = 0;
    for (int64_t g : groups) {
      HS_CHECK(g >= 1, "param '", name, "': group sizes ", groups, " must be >= 1");
      total += g;
    }
    HS_CHECK(total == shape[0], "param '", name, "': groups ", groups, " sum to ", total,
             ", expected shape[0] = ", shape[0]);
  } else {
    HS_CHECK(groups.empty(), "param '", name, "': groups ", groups, " given for rule ",
             shardRuleName(rule), "; only fused_column takes groups");
  }
  HS_CHECK(stage != StageRole::kLayer || layer >= 0, "param '", name, "': layer ", layer,
           " must be >= 0");
}

std::string ParamSpec::toString() const {
  std::string out = str("ParamSpec(name='", name, "', shape=", shape, ", dtype=", dtypeName(dtype),
                        ", rule=", shardRuleName(rule));
  if (!groups.empty()) out += str(", groups=", groups);
  out += str(", stage=", stageRoleName(stage));
  if (stage == StageRole::kLayer) out += str(", layer=", layer);
  return out + ")";
}

void TensorSet::validate() const {
  HS_CHECK(numLayers >= 1, "num_layers must be >= 1, got ", numLayers);
  std::set<std::string> names;
  for (const ParamSpec& spec : specs) {
    spec.validate();
    HS_CHECK(names.insert(spec.name).second, "param '", spec.name, "' appears twice");
    HS_CHECK(spec.stage != StageRole::kLayer || spec.layer < numLayers, "param '", spec.name,
             "': layer ", spec.layer, " outside [0, num_layers(", numLayers, "))");
  }
}

uint64_t fnv1a(const std::string& text, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

namespace {

uint64_t fnv1aBytes(const void* data, size_t size, uint64_t h) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= bytes[i];
    h *= 1099511628211ULL;
  }
  return h;
}

uint64_t fnv1aInt(int64_t value, uint64_t h) { return fnv1aBytes(&value, sizeof(value), h); }

// A list as its length, then its elements: no two different lists hash the same bytes.
uint64_t fnv1aInts(const std::vector<int64_t>& values, uint64_t h) {
  h = fnv1aInt(static_cast<int64_t>(values.size()), h);
  return values.empty() ? h : fnv1aBytes(values.data(), values.size() * sizeof(int64_t), h);
}

}  // namespace

uint64_t TensorSet::fingerprint() const {
  // Every field of every spec, each length-prefixed, hashed as it is stored: no text is
  // formatted (called on every switch, for sets of hundreds of tensors).
  uint64_t h = fnv1aInt(numLayers, fnv1a("hotswitch.TensorSet"));
  h = fnv1aInt(static_cast<int64_t>(specs.size()), h);
  for (const ParamSpec& spec : specs) {
    h = fnv1aInt(static_cast<int64_t>(spec.name.size()), h);
    h = fnv1aBytes(spec.name.data(), spec.name.size(), h);
    h = fnv1aInts(spec.shape, h);
    h = fnv1aInt(static_cast<int64_t>(spec.dtype), h);
    h = fnv1aInt(static_cast<int64_t>(spec.rule), h);
    h = fnv1aInts(spec.groups, h);
    h = fnv1aInt(static_cast<int64_t>(spec.stage), h);
    h = fnv1aInt(spec.layer, h);
  }
  return h;
}

}  // namespace hotswitch
