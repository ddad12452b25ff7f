#pragma once

// The shape of a LLaMA-style decoder, as the cost model and planner see it.

#include <cstdint>
#include <string>
#include <vector>

#include "layout/Layout.h"

namespace hotswitch {

struct ModelConfig {
  std::string name;
  int numLayers = 32;
  int64_t hiddenSize = 4096;
  int numAttentionHeads = 32;
  int numQueryGroups = 32;  // KV heads; == heads without grouped-query attention
  int64_t ffnHiddenSize = 11008;
  int64_t vocabSize = 32000;
  int64_t paramBytes = 2;      // bytes of one parameter or activation element (bf16: 2)
  bool recompute = false;      // full activation recomputation

  // llama-7b, llama-13b, llama-32b, llama-70b; InvalidArgument naming the value otherwise.
  static ModelConfig preset(const std::string& name);
  static std::vector<std::string> presetNames();

  int64_t headDim() const { return hiddenSize / numAttentionHeads; }
  // Parameters of one decoder layer, of the embedding (and, untied, of the head).
  int64_t layerParams() const;
  int64_t embeddingParams() const { return vocabSize * hiddenSize; }
  int64_t totalParams() const;

  // Throws InvalidArgument when malformed (e.g. heads not dividing hidden, query groups not
  // dividing heads).
  void validate() const;
  // Throws InvalidArgument naming the arithmetic when the layout cannot shard the model:
  // heads, query groups and FFN size must divide by tp, layers by pp.
  void validate(const Layout& layout) const;
};

}  // namespace hotswitch
