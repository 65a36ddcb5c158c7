// A decoder block as Megatron-Core's ModuleSpec assembles it: the model config names the norm, the
// attention kind and the MLP kind, and the block builds its sublayers from that spec through the
// kind tables here. A new kind (multi-latent attention, a mixture of experts) is a new row in
// these tables with its own module and context, not a flag threaded through every module.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megaton/nn/attention.h"
#include "megaton/nn/layer_kinds.h"
#include "megaton/nn/mla_config.h"
#include "megaton/nn/moe/moe_config.h"
#include "megaton/nn/sublayer.h"

namespace megaton::nn {

struct BlockSpec {
  std::string attention = "self_attention";  // one of attention_kinds()
  std::string mlp = "dense";                 // one of mlp_kinds()
  Normalization norm = Normalization::LayerNorm;
  double norm_eps = 1e-5;
  AttentionShape attn{};
  MlaConfig mla;                             // of the "mla" attention kind
  double softmax_scale = 0.0;                // 0: 1 / sqrt(the query head's size)
  int64_t ffn_hidden = 0;
  Activation activation = Activation::GeLU;  // of the dense MLP
  MoeConfig moe;                             // of the "moe" MLP kind
  bool bias = true;                          // biases on the linears
  TensorParallel tp;                         // the group the sublayers are split over (none by default)
  ExpertParallel ep;                         // the group the moe kind's routed experts are split over
};

// `name` is the sublayer's global prefix (e.g. "decoder.layers.3.self_attention"); rope may be null.
using AttentionFactory =
    std::function<std::unique_ptr<AttentionLayer>(const std::string& name, const BlockSpec&, const RopeTables* rope)>;
using MlpFactory = std::function<std::unique_ptr<MlpLayer>(const std::string& name, const BlockSpec&)>;

// The kinds a spec may name: the built-in ones ("self_attention"; "dense"), then any registered.
std::vector<std::string> attention_kinds();
std::vector<std::string> mlp_kinds();
// Adds a kind; naming one that exists throws.
void register_attention_kind(const std::string& kind, AttentionFactory factory);
void register_mlp_kind(const std::string& kind, MlpFactory factory);
// Builds the kind the spec names; an unknown kind throws naming it and the known ones.
std::unique_ptr<AttentionLayer> make_attention(const std::string& name, const BlockSpec& spec,
                                               const RopeTables* rope);
std::unique_ptr<MlpLayer> make_mlp(const std::string& name, const BlockSpec& spec);

}  // namespace megaton::nn
