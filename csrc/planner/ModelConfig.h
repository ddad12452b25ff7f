#pragma once

// The shape of a decoder-only transformer, as the cost model and planner see it.
//
// Two families, as Megatron-LM builds them:
// - llama: RMSNorm, rotary positions, a SwiGLU MLP of three matrices (gate and up fused into
//   one column-parallel product, then down), no biases, an untied head by default;
// - gpt: LayerNorm (weight and bias), learned absolute positions (`maxPositions` rows), a GeLU
//   MLP of two matrices, biases on every linear layer, the head tied to the embedding by default.
// Attention is grouped-query when numQueryGroups < numAttentionHeads (either family).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "layout/Layout.h"

namespace hotswitch {

enum class ModelFamily { kLlama = 0, kGpt };
// "llama", "gpt"; InvalidArgument naming the value otherwise.
ModelFamily parseModelFamily(const std::string& name);
const char* modelFamilyName(ModelFamily family);

// Activation recomputation, as Megatron-LM's --recompute-granularity names it: kSelective
// reruns each layer's attention core (softmax(QK^T)V) in the backward pass instead of keeping
// its activations; kFull keeps only each layer's input and reruns the whole layer's forward.
enum class Recompute { kNone = 0, kSelective, kFull };
// "none", "selective", "full"; InvalidArgument naming the value otherwise.
Recompute parseRecompute(const std::string& name);
const char* recomputeName(Recompute recompute);

struct ModelConfig {
  std::string name;
  ModelFamily family = ModelFamily::kLlama;
  int numLayers = 32;
  int64_t hiddenSize = 4096;
  int numAttentionHeads = 32;
  int numQueryGroups = 32;  // KV heads; == heads without grouped-query attention
  int64_t ffnHiddenSize = 11008;
  int64_t vocabSize = 32000;
  int64_t paramBytes = 2;      // bytes of one parameter or activation element (bf16: 2)
  Recompute recompute = Recompute::kNone;  // what CostModel::terms(layout) assumes
  bool tiedEmbeddings = false;  // the head reuses the embedding matrix
  int64_t maxPositions = 0;     // rows of a learned position table (gpt); 0: none (rotary)

  // llama-7b, llama-13b, llama-32b, llama-70b; InvalidArgument naming the value otherwise.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> presetNames();

  int64_t headDim() const { return hiddenSize / numAttentionHeads; }
  // Weight matrices of one decoder layer as one tensor-parallel rank of `tp` holds them, in
  // the order they run: (K, N) of each product y[n, N] = x[n, K] W[K, N]. llama: fused QKV,
  // attention projection, fused gate/up, down; gpt: fused QKV, projection, fc1, fc2.
  std::vector<std::pair<int64_t, int64_t>> layerMatrices(int tp = 1) const;
  // Parameters of one decoder layer (matrices, biases, norms), of the embedding (one of
  // embedding and head), and of the whole model.
  int64_t layerParams() const;
  int64_t embeddingParams() const { return vocabSize * hiddenSize; }
  int64_t totalParams() const;
  // Parameters outside the layers on the first stage (embedding, learned positions) and on
  // the last stage (final norm, and the head unless tied).
  int64_t firstStageParams() const;
  int64_t lastStageParams() const;

  // Throws InvalidArgument when malformed (e.g. heads not dividing hidden, query groups not
  // dividing heads).
  void validate() const;
  // Throws InvalidArgument naming the arithmetic when the layout cannot shard the model:
  // heads, query groups and FFN size must divide by tp, layers by pp.
  void validate(const Layout& layout) const;
};

}  // namespace hotswitch
