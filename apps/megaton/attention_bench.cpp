#include "attention_bench.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_timing.h"
#include "megaton/kernels/attention.h"

namespace megaton::app {

void print_attention_bench(const models::TransformerConfig& cfg, int64_t batch, int64_t seq_len, int repeats, bool json,
                           Device device, DType dtype) {
  const int64_t Hq = cfg.num_attention_heads, Hkv = cfg.is_mla() ? Hq : cfg.num_query_groups;
  const kernels::HeadDim D = cfg.is_mla() ? kernels::HeadDim{cfg.mla.qk_dim(), cfg.mla.v_head_dim}
                                          : kernels::HeadDim{cfg.head_dim()};
  // Megatron's fused QKV rows: per kv group its query heads, then its key and its value head.
  const int64_t group = Hq / Hkv, block = group * D.qk + D.qk + D.v, row = Hkv * block;
  const kernels::HeadStrides at{row, block};
  const int64_t k_off = group * D.qk, v_off = k_off + D.qk, tokens = batch * seq_len;
  const DType lse_dtype = dtype == DType::BF16 || dtype == DType::F16 ? DType::F32 : dtype;
  const Tensor qkv = random_tensor({tokens, row}, dtype, device, 1, "qkv");
  const Tensor dout = random_tensor({tokens, Hq * D.v}, dtype, device, 2, "dout");
  const Tensor out = Tensor::empty({tokens, Hq * D.v}, dtype, MemCategory::Workspace, "out", device);
  const Tensor lse = Tensor::empty({batch * Hq, seq_len}, lse_dtype, MemCategory::Workspace, "lse", device);
  const Tensor dqkv = Tensor::empty({tokens, row}, dtype, MemCategory::Workspace, "dqkv", device);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D.qk));
  const kernels::ExecContext ctx{device, nullptr};
  const auto forward = [&] {
    kernels::attention_forward(ctx, out, lse, {qkv, 0}, {qkv, k_off}, {qkv, v_off}, batch, seq_len, Hq, Hkv, D, at, at,
                               scale);
  };
  const auto backward = [&] {
    kernels::attention_backward(ctx, {dqkv, 0}, {dqkv, k_off}, {dqkv, v_off}, dout, out, lse, {qkv, 0}, {qkv, k_off},
                                {qkv, v_off}, batch, seq_len, Hq, Hkv, D, at, at, scale);
  };
  forward();  // the backward reads the forward's out and lse
  const int calls = device.is_cpu() ? 1 : 10;
  const double fwd_flops = 2.0 * static_cast<double>(batch) * Hq * seq_len * seq_len * (D.qk + D.v) / 2.0;
  const struct {
    const char* pass;
    double flops, seconds;
  } passes[] = {{"forward", fwd_flops, median_seconds(device, repeats, calls, forward)},
                {"backward", 2.5 * fwd_flops, median_seconds(device, repeats, calls, backward)}};
  for (const auto& p : passes) {
    const double tflops = p.flops / p.seconds / 1e12;
    if (json)
      std::printf("%s\n", nlohmann::json{{"model", cfg.name}, {"pass", p.pass}, {"batch", batch}, {"seq_len", seq_len},
                                         {"heads", Hq}, {"kv_heads", Hkv}, {"head_dim_qk", D.qk}, {"head_dim_v", D.v},
                                         {"device", device.str()}, {"dtype", dtype_name(dtype)},
                                         {"seconds", p.seconds}, {"tflops", tflops}}
                              .dump()
                              .c_str());
    else
      std::printf("%s attention %-8s %s B %ld T %ld heads %ld/%ld D %ld/%ld: %.3f ms, %.1f TFLOP/s\n",
                  cfg.name.c_str(), p.pass, std::string(dtype_name(dtype)).c_str(), batch, seq_len, Hq, Hkv, D.qk, D.v,
                  1e3 * p.seconds, tflops);
  }
}

}  // namespace megaton::app
