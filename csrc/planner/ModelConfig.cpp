#include "planner/ModelConfig.h"

#include "common/Check.h"

namespace hotswitch {

namespace {
struct Preset {
  const char* name;
  int layers;
  int64_t hidden;
  int heads;
  int groups;
  int64_t ffn;
};
// Shapes as published for LLaMA (7B, 13B, 33B "32B") and Llama 2 70B (grouped-query attention).
constexpr Preset kPresets[] = {
    {"llama-7b", 32, 4096, 32, 32, 11008},
    {"llama-13b", 40, 5120, 40, 40, 13824},
    {"llama-32b", 60, 6656, 52, 52, 17920},
    {"llama-70b", 80, 8192, 64, 8, 28672},
};
}  // namespace

ModelFamily parseModelFamily(const std::string& name) {
  if (name == "llama") return ModelFamily::kLlama;
  if (name == "gpt") return ModelFamily::kGpt;
  HS_CHECK(false, "model family '", name, "' is not one of llama, gpt");
  return ModelFamily::kLlama;
}

const char* modelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kGpt: return "gpt";
  }
  return "?";
}

Recompute parseRecompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  HS_CHECK(false, "recompute '", name, "' is not one of none, selective, full");
  return Recompute::kNone;
}

const char* recomputeName(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

ModelConfig ModelConfig::preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      ModelConfig c;
      c.name = p.name;
      c.numLayers = p.layers;
      c.hiddenSize = p.hidden;
      c.numAttentionHeads = p.heads;
      c.numQueryGroups = p.groups;
      c.ffnHiddenSize = p.ffn;
      c.vocabSize = 32000;
      return c;
    }
  }
  std::string names;
  for (const Preset& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
  HS_CHECK(false, "model preset '", name, "' is not one of ", names);
  return {};
}

std::vector<std::string> ModelConfig::presetNames() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  return out;
}

std::vector<std::pair<int64_t, int64_t>> ModelConfig::layerMatrices(int tp) const {
  const int64_t h = hiddenSize, kv = numQueryGroups * headDim(), f = ffnHiddenSize;
  const int64_t up = family == ModelFamily::kLlama ? 2 * f : f;  // SwiGLU fuses gate and up
  return {{h, (h + 2 * kv) / tp}, {h / tp, h}, {h, up / tp}, {f / tp, h}};
}

int64_t ModelConfig::layerParams() const {
  int64_t params = 0;
  for (const auto& [k, n] : layerMatrices()) params += k * n;
  const int64_t h = hiddenSize, kv = numQueryGroups * headDim();
  if (family == ModelFamily::kGpt) {
    params += (h + 2 * kv) + h + ffnHiddenSize + h;  // biases of QKV, projection, fc1, fc2
    params += 2 * 2 * h;                            // two LayerNorms: weight and bias
  } else {
    params += 2 * h;  // two RMSNorm weights
  }
  return params;
}

int64_t ModelConfig::firstStageParams() const { return embeddingParams() + maxPositions * hiddenSize; }

int64_t ModelConfig::lastStageParams() const {
  const int64_t norm = family == ModelFamily::kGpt ? 2 * hiddenSize : hiddenSize;
  return norm + (tiedEmbeddings ? 0 : embeddingParams());
}

int64_t ModelConfig::totalParams() const {
  return numLayers * layerParams() + firstStageParams() + lastStageParams();
}

void ModelConfig::validate() const {
  HS_CHECK(numLayers >= 1, "num_layers must be >= 1, got ", numLayers);
  HS_CHECK(hiddenSize >= 1 && numAttentionHeads >= 1 && hiddenSize % numAttentionHeads == 0,
           "hidden_size(", hiddenSize, ") must be a positive multiple of num_attention_heads(",
           numAttentionHeads, ")");
  HS_CHECK(numQueryGroups >= 1 && numAttentionHeads % numQueryGroups == 0,
           "num_attention_heads(", numAttentionHeads, ") must be a multiple of num_query_groups(",
           numQueryGroups, ")");
  HS_CHECK(ffnHiddenSize >= 1, "ffn_hidden_size must be >= 1, got ", ffnHiddenSize);
  HS_CHECK(vocabSize >= 1, "vocab_size must be >= 1, got ", vocabSize);
  HS_CHECK(paramBytes == 2 || paramBytes == 4, "param_bytes must be 2 or 4, got ", paramBytes);
  HS_CHECK(maxPositions >= 0, "max_positions must be >= 0 (0: no learned positions), got ", maxPositions);
}

void ModelConfig::validate(const Layout& layout) const {
  validate();
  const int tp = layout.tp();
  HS_CHECK(numAttentionHeads % tp == 0, "num_attention_heads(", numAttentionHeads,
           ") is not divisible by tp(", tp, ") of layout ", layout.name());
  HS_CHECK(numQueryGroups % tp == 0, "num_query_groups(", numQueryGroups, ") is not divisible by tp(",
           tp, ") of layout ", layout.name());
  HS_CHECK(ffnHiddenSize % tp == 0, "ffn_hidden_size(", ffnHiddenSize, ") is not divisible by tp(",
           tp, ") of layout ", layout.name());
  HS_CHECK(numLayers % layout.pp() == 0, "num_layers(", numLayers, ") is not divisible by pp(",
           layout.pp(), ") of layout ", layout.name());
}

}  // namespace hotswitch
