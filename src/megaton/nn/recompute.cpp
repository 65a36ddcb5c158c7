#include "megaton/nn/recompute.h"

#include <sstream>

#include "megaton/core/error.h"

namespace megaton::nn {

std::string describe(const RecomputeConfig& c) {
  switch (c.granularity) {
    case RecomputeGranularity::None: return "";
    case RecomputeGranularity::Full: {
      const std::string n = std::to_string(c.num_layers) + (c.num_layers == 1 ? " layer" : " layers");
      return c.method == RecomputeMethod::Uniform ? "full (uniform, " + n + " per unit)"
                                                  : "full (block, the first " + n + " of each chunk)";
    }
    case RecomputeGranularity::Selective: {
      std::string modules = c.core_attn ? "core_attn" : "";
      if (c.mlp) modules += modules.empty() ? "mlp" : ", mlp";
      if (c.layernorm) modules += modules.empty() ? "layernorm" : ", layernorm";
      if (c.moe_act) modules += modules.empty() ? "moe_act" : ", moe_act";
      return "selective (" + modules + ")";
    }
  }
  return "";
}

RecomputeConfig recompute_config_from_names(const std::string& granularity, const std::string& method,
                                            int64_t num_layers, const std::string& modules,
                                            const std::string& key_prefix) {
  RecomputeConfig c;
  if (granularity.empty()) return c;
  if (granularity == "full")
    c.granularity = RecomputeGranularity::Full;
  else if (granularity == "selective")
    c.granularity = RecomputeGranularity::Selective;
  else
    fail(key_prefix, "recompute_granularity '", granularity, "' is not one of full, selective (or empty for none)");
  if (method == "uniform")
    c.method = RecomputeMethod::Uniform;
  else if (method == "block")
    c.method = RecomputeMethod::Block;
  else
    fail(key_prefix, "recompute_method '", method, "' is not one of uniform, block");
  if (num_layers < 1) fail(key_prefix, "recompute_num_layers must be at least 1, got ", num_layers);
  c.num_layers = num_layers;
  if (c.full()) return c;
  std::string list = modules;
  for (char& ch : list)
    if (ch == ',') ch = ' ';
  std::istringstream words(list);
  for (std::string m; words >> m;) {
    if (m == "core_attn")
      c.core_attn = true;
    else if (m == "mlp")
      c.mlp = true;
    else if (m == "layernorm")
      c.layernorm = true;
    else if (m == "moe_act")
      c.moe_act = true;
    else
      fail(key_prefix, "recompute_modules: '", m, "' is not one of core_attn, mlp, layernorm, moe_act");
  }
  if (!c.core_attn && !c.mlp && !c.layernorm && !c.moe_act)
    fail(key_prefix,
         "recompute_modules is empty: selective recompute needs some of core_attn, mlp, layernorm, moe_act");
  return c;
}

}  // namespace megaton::nn
