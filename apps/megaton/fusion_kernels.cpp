#include "fusion_kernels.h"

#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "bench_timing.h"
#include "megaton/kernels/activation.h"
#include "megaton/kernels/fp8_gemm.h"
#include "megaton/kernels/fp8_sources.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/norm.h"

namespace megaton::app {

namespace {

struct Case {
  std::string fusion, pass;
  // Bytes read + written by the passes outside the GEMM, unfused and fused.
  double unfused_bytes, fused_bytes;
  std::function<void()> unfused, fused;
};

}  // namespace

void print_fusion_kernels(const models::TransformerConfig& c, int64_t N, int repeats, bool json, DType dtype) {
  const Device cpu = Device::cpu();
  const kernels::ExecContext ctx{cpu, nullptr};
  const bool swiglu = c.activation == models::Activation::SwiGLU;
  const bool rms = c.normalization == models::Normalization::RMSNorm;
  const int64_t H = c.hidden_size, A = c.ffn_hidden_size, F = swiglu ? 2 * A : A;
  auto t = [&](Shape s, uint64_t seed, const char* name, DType d) { return random_tensor(std::move(s), d, cpu, seed, name); };
  // fc1 and its activation.
  const Tensor x = t({N, H}, 1, "x", dtype), w1 = t({F, H}, 2, "w1", dtype), b1 = t({F}, 3, "b1", DType::F32);
  const Tensor h = t({N, F}, 4, "h", dtype), a = t({N, A}, 5, "a", dtype), da = t({N, A}, 6, "da", dtype);
  const Tensor dh = t({N, F}, 7, "dh", dtype), db1 = t({F}, 8, "db1", DType::F32);
  // The residual stream and the norm.
  const Tensor branch = t({N, H}, 9, "branch", dtype), resid = t({N, H}, 10, "resid", dtype);
  const Tensor out = t({N, H}, 11, "out", dtype), gamma = t({H}, 12, "gamma", DType::F32);
  const Tensor beta = rms ? Tensor() : t({H}, 13, "beta", DType::F32);
  const Tensor mean = t({N}, 14, "mean", DType::F32), rstd = t({N}, 15, "rstd", DType::F32);
  const Tensor dout = t({N, H}, 16, "dout", dtype), dx = t({N, H}, 17, "dx", dtype), dres = t({N, H}, 18, "dres", dtype);

  auto act = [&] { swiglu ? kernels::swiglu_forward(ctx, a, h) : kernels::gelu_forward(ctx, a, h); };
  auto norm = [&](const Tensor& in) {
    rms ? kernels::rmsnorm_forward(ctx, out, rstd, in, gamma, c.norm_epsilon)
        : kernels::layernorm_forward(ctx, out, mean, rstd, in, gamma, beta, c.norm_epsilon);
  };
  auto norm_backward = [&](const Tensor& dresidual) {
    rms ? kernels::rmsnorm_backward_input(ctx, dx, dout, resid, gamma, rstd, dresidual)
        : kernels::layernorm_backward_input(ctx, dx, dout, resid, gamma, mean, rstd, dresidual);
  };
  norm(resid);  // statistics for the backward cases
  const double e = static_cast<double>(dtype_size(dtype));
  const double NF = static_cast<double>(N * F), NA = static_cast<double>(N * A), NH = static_cast<double>(N * H);
  std::vector<Case> cases{
      // Unfused: the GEMM seeds its output with the bias and accumulates onto it (OpenBLAS: a write
      // and a read of h; oneDNN adds it in its epilogue), then the activation reads h.
      {"bias_activation", "forward", e * (2 * NF + NF + NA), e * (NF + NA),
       [&] {
         kernels::linear_forward(ctx, h, x, w1, b1);
         act();
       },
       [&] {
         kernels::linear_forward(ctx, h, x, w1, Tensor());
         swiglu ? kernels::bias_swiglu_forward(ctx, a, h, b1) : kernels::bias_gelu_forward(ctx, a, h, b1);
       }},
      {"bias_activation", "backward", e * (NA + 2 * NF + NF), e * (NA + 2 * NF),
       [&] {
         swiglu ? kernels::swiglu_backward(ctx, dh, da, h) : kernels::gelu_backward(ctx, dh, da, h);
         kernels::bias_backward(ctx, db1, dh);
       },
       [&] {
         swiglu ? kernels::bias_swiglu_backward(ctx, dh, db1, da, h, b1)
                : kernels::bias_gelu_backward(ctx, dh, db1, da, h, b1);
       }},
      // Unfused: the add reads two and writes the sum; the norm reads it again and writes its output.
      {"residual_norm", "forward", e * (3 * NH + 2 * NH), e * 4 * NH,
       [&] {
         kernels::residual_forward(ctx, branch, branch, resid);
         norm(branch);
       },
       [&] {
         rms ? kernels::add_rmsnorm_forward(ctx, branch, out, rstd, branch, resid, gamma, c.norm_epsilon)
             : kernels::add_layernorm_forward(ctx, branch, out, mean, rstd, branch, resid, gamma, beta, c.norm_epsilon);
       }},
      // Unfused: the norm backward reads dout and x and writes dx; the add reads dx and dres and writes dx.
      {"residual_norm", "backward", e * (3 * NH + 3 * NH), e * 4 * NH,
       [&] {
         norm_backward(Tensor());
         kernels::residual_forward(ctx, dx, dx, dres);
       },
       [&] { norm_backward(dres); }},
  };
  // The FP8 casts of LayerNormLinear and LayerNormMLP (nn/fusion.h), outside their GEMMs: both
  // layouts of the GEMM's 8-bit input (2 bytes per element), made from the norm's / activation's
  // written output (unfused) or straight from its producer (fused). Tensorwise current scaling
  // reads its input twice (amax, then codes), the tiled recipes once.
  const Tensor none;  // outlives the cases, which capture it
  for (const auto& [recipe, g, passes] : {std::tuple{"tensorwise", kernels::Fp8Granularity::Tensor, 2.0},
                                         std::tuple{"blockwise", kernels::Fp8Granularity::Tile1x128, 1.0}}) {
    const kernels::Fp8QuantizeOptions o{.granularity = g};
    auto quantize = [o](const kernels::Fp8Source& src) { (void)kernels::fp8_quantize_both(src, o, "q", "q_t"); };
    cases.push_back({std::string("layernorm_linear ") + recipe, "forward", e * NH * (2 + passes) + 2 * NH,
                     e * NH * (1 + passes) + 2 * NH,
                     [&, quantize] {
                       norm(resid);
                       quantize(kernels::fp8_source(out));
                     },
                     [&, quantize] {
                       kernels::norm_statistics(ctx, none, rms ? none : mean, rstd, resid, none, c.norm_epsilon);
                       quantize(kernels::norm_fp8_source(resid, rms ? none : mean, rstd, gamma, beta, "norm"));
                     }});
    cases.push_back({std::string("layernorm_mlp ") + recipe, "forward", e * (NF + NA + passes * NA) + 2 * NA,
                     e * passes * NF + 2 * NA,
                     [&, quantize] {
                       act();
                       quantize(kernels::fp8_source(a));
                     },
                     [&, quantize] { quantize(kernels::activation_fp8_source(h, none, swiglu, "act")); }});
  }
  // LayerNormMLP's epilogue: fc1's FP8 GEMM, then the activation + cast of fc2's input as one more
  // pass over the written h (unfused), or the GEMM handing each 128-row stripe of h to the cast while
  // it is in cache (fused; kernels/fp8_gemm.h's rows_done). The bytes are the passes over h outside
  // the GEMM and the codes written; current scaling's second pass still reads h from memory.
  const Tensor w1_fp8_src = t({F, H}, 19, "w1", DType::F32);
  for (const auto& [recipe, ga, gw, given, passes] :
       {std::tuple{"delayed", kernels::Fp8Granularity::Tensor, kernels::Fp8Granularity::Tensor, true, 1.0},
        std::tuple{"tensorwise", kernels::Fp8Granularity::Tensor, kernels::Fp8Granularity::Tensor, false, 2.0},
        std::tuple{"blockwise", kernels::Fp8Granularity::Tile1x128, kernels::Fp8Granularity::Block128x128, false,
                   1.0}}) {
    kernels::Fp8QuantizeOptions o{.granularity = ga};
    if (given) o.scale = 16.0f;  // delayed scaling: a scale from earlier steps
    const auto xq = std::make_shared<kernels::Fp8Matrix>(kernels::fp8_quantize(x, o));
    const auto wq = std::make_shared<kernels::Fp8Matrix>(kernels::fp8_quantize(w1_fp8_src, {.granularity = gw}));
    const kernels::Fp8Source act_src = kernels::activation_fp8_source(h, none, swiglu, "act");
    cases.push_back({std::string("layernorm_mlp epilogue ") + recipe, "forward", e * NF * passes + 2 * NA,
                     e * NF * (passes - 1) + 2 * NA,
                     [&ctx, &h, xq, wq, act_src, o] {
                       kernels::fp8_gemm(ctx, h, *xq, *wq);
                       (void)kernels::fp8_quantize_both(act_src, o, "q", "q_t");
                     },
                     [&ctx, &h, xq, wq, act_src, o] {
                       kernels::Fp8StripeQuantizer q(act_src, o, true, true, "q", "q_t");
                       kernels::fp8_gemm(ctx, h, *xq, *wq, false, {}, [&q](int64_t r0, int64_t r1) { q.rows(r0, r1); });
                       (void)q.finish();
                     }});
  }
  if (!json)
    std::printf("%s fused kernels at %ld rows, hidden %ld, fc1 width %ld (%s, %s); elementwise MB unfused -> fused\n",
                std::string(dtype_name(dtype)).c_str(), N, H, F, swiglu ? "swiglu" : "gelu", rms ? "rmsnorm" : "layernorm");
  for (const Case& k : cases) {
    const double unfused_s = median_seconds(cpu, repeats, 1, k.unfused);
    const double fused_s = median_seconds(cpu, repeats, 1, k.fused);
    const double unfused_mb = k.unfused_bytes / 1e6, fused_mb = k.fused_bytes / 1e6;
    if (json)
      std::printf("%s\n", nlohmann::json{{"fusion", k.fusion}, {"pass", k.pass}, {"rows", N}, {"dtype", dtype_name(dtype)},
                                         {"unfused_s", unfused_s}, {"fused_s", fused_s},
                                         {"unfused_mb", unfused_mb}, {"fused_mb", fused_mb}}
                              .dump()
                              .c_str());
    else
      std::printf("%-27s %-8s unfused %8.3f ms  fused %8.3f ms  (%5.1f%% less)  %7.1f -> %7.1f MB\n", k.fusion.c_str(),
                  k.pass.c_str(), 1e3 * unfused_s, 1e3 * fused_s, 100.0 * (1.0 - fused_s / unfused_s), unfused_mb,
                  fused_mb);
  }
}

}  // namespace megaton::app
