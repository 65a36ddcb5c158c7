#include "megaton/nn/block_spec.h"

#include <cmath>
#include <mutex>
#include <utility>

#include "megaton/nn/mla_attention.h"
#include "megaton/nn/mlp.h"
#include "megaton/nn/moe/moe_layer.h"

namespace megaton::nn {

namespace {
// Kind name -> factory, the built-in kinds first. Guarded because registration may come from any
// thread (tests register their own kinds).
template <typename Factory>
struct KindTable {
  const char* what;
  std::mutex mutex;
  std::vector<std::pair<std::string, Factory>> rows;

  void add(const std::string& kind, Factory f) {
    std::lock_guard lock(mutex);
    for (const auto& row : rows)
      if (row.first == kind) fail(what, " '", kind, "' is already registered");
    rows.emplace_back(kind, std::move(f));
  }
  std::vector<std::string> names() {
    std::lock_guard lock(mutex);
    std::vector<std::string> out;
    for (const auto& row : rows) out.push_back(row.first);
    return out;
  }
  Factory find(const std::string& kind) {
    {
      std::lock_guard lock(mutex);
      for (const auto& row : rows)
        if (row.first == kind) return row.second;
    }
    std::string known;
    for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
    fail("unknown ", what, " '", kind, "' (known: ", known, ")");
  }
};

KindTable<AttentionFactory>& attention_table() {
  static KindTable<AttentionFactory> table{
      "attention kind",
      {},
      {{"self_attention",  // multi-head / grouped-query attention with a fused QKV projection
        [](const std::string& name, const BlockSpec& s, const RopeTables* rope) -> std::unique_ptr<AttentionLayer> {
          return std::make_unique<SelfAttention>(name, s.attn, s.bias, rope, s.tp);
        }},
       {"mla",  // multi-latent attention (DeepSeek-V2 / V3): low-rank q and kv latents, a shared rope key
        [](const std::string& name, const BlockSpec& s, const RopeTables* rope) -> std::unique_ptr<AttentionLayer> {
          const double scale = s.softmax_scale > 0 ? s.softmax_scale : 1.0 / std::sqrt(double(s.mla.qk_dim()));
          return std::make_unique<MultiLatentAttention>(name, s.attn.hidden, s.attn.heads, s.mla, s.bias, s.norm_eps,
                                                        rope, scale, s.tp);
        }}}};
  return table;
}

KindTable<MlpFactory>& mlp_table() {
  static KindTable<MlpFactory> table{"mlp kind",
                                     {},
                                     {{"dense",  // linear_fc1 -> GeLU / SwiGLU -> linear_fc2
                                       [](const std::string& name, const BlockSpec& s) -> std::unique_ptr<MlpLayer> {
                                         return std::make_unique<Mlp>(name, s.attn.hidden, s.ffn_hidden, s.activation,
                                                                      s.bias, s.tp);
                                       }},
                                      {"moe",  // router -> permute -> grouped SwiGLU experts -> unpermute (+ shared)
                                       [](const std::string& name, const BlockSpec& s) -> std::unique_ptr<MlpLayer> {
                                         return std::make_unique<MoeLayer>(name, s.attn.hidden, s.moe, s.ep, s.tp);
                                       }}}};
  return table;
}
}  // namespace

std::vector<std::string> attention_kinds() { return attention_table().names(); }
std::vector<std::string> mlp_kinds() { return mlp_table().names(); }
void register_attention_kind(const std::string& kind, AttentionFactory factory) {
  attention_table().add(kind, std::move(factory));
}
void register_mlp_kind(const std::string& kind, MlpFactory factory) { mlp_table().add(kind, std::move(factory)); }

std::unique_ptr<AttentionLayer> make_attention(const std::string& name, const BlockSpec& spec,
                                               const RopeTables* rope) {
  return attention_table().find(spec.attention)(name, spec, rope);
}

std::unique_ptr<MlpLayer> make_mlp(const std::string& name, const BlockSpec& spec) {
  return mlp_table().find(spec.mlp)(name, spec);
}

}  // namespace megaton::nn
