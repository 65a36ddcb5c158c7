// The tensor-level kernel API on every backend this build has: linear, RMSNorm and LayerNorm (with
// their residual-fused forms), GeLU and SwiGLU (with the fused bias too), the residual add, RoPE (tables and rotation), causal
// attention (GQA in fused QKV rows, MLA's head sizes, a KV cache), MoE permute / unpermute and the grouped linear,
// embedding and cross-entropy forward and backward, the reductions, the strided row copy and an AdamW step against
// the CPU reference kernels (or, for AdamW, its documented formula) in double on the same
// (dtype-rounded) inputs, and the dispatcher's errors. Outputs start as NaN, so an element a kernel
// does not write fails the comparison. On a machine without a CUDA device the CUDA cases report
// "skipped: no CUDA device" (or "built without CUDA").
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../support/temp_dir.h"
#include "finite_diff.h"
#include "megaton/kernels/activation.h"
#include "megaton/kernels/copy.h"
#include "megaton/kernels/attention.h"
#include "megaton/kernels/cpu/activation.h"
#include "megaton/kernels/cpu/attention.h"
#include "megaton/kernels/cpu/copy.h"
#include "megaton/kernels/cpu/cross_entropy.h"
#include "megaton/kernels/cpu/embedding.h"
#include "megaton/kernels/cpu/linear.h"
#include "megaton/kernels/cpu/moe.h"
#include "megaton/kernels/cpu/norm.h"
#include "megaton/kernels/cpu/rope.h"
#include "megaton/kernels/cross_entropy.h"
#include "megaton/kernels/embedding.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/moe.h"
#include "megaton/kernels/norm.h"
#include "megaton/kernels/reduce.h"
#include "megaton/kernels/rope.h"
#include "megaton/nn/parameter.h"
#include "megaton/optim/adamw.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/core/cuda/cuda_memory.h"
#endif

using namespace megaton;

namespace {

struct Backend {
  Device device;
  DType dtype;  // activations and weights
};

void PrintTo(const Backend& b, std::ostream* os) { *os << b.device.str() << " " << dtype_name(b.dtype); }

std::string backend_name(const ::testing::TestParamInfo<Backend>& info) {
  std::string d = info.param.device.is_cpu() ? "cpu" : "cuda";
  return d + "_" + std::string(dtype_name(info.param.dtype));
}

// Statistics (mean, rstd) are f32, except in the double-precision reference instantiation.
DType stat_dtype(DType dtype) { return dtype == DType::F64 ? DType::F64 : DType::F32; }

// TransformerEngine's bf16 tolerance; f32 and f64 at their rounding of short sums.
double tolerance(DType dtype) { return dtype == DType::BF16 ? 1.6e-2 : dtype == DType::F32 ? 2e-6 : 1e-12; }

// Values rounded to `dtype` (so the reference sees exactly what the kernel sees), as doubles.
std::vector<double> rounded(std::vector<double> v, DType dtype) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::F64);
  std::copy(v.begin(), v.end(), t.data<double>());
  Tensor back = t.to(dtype).to(DType::F64);
  return {back.data<double>(), back.data<double>() + back.numel()};
}

Tensor upload(const std::vector<double>& v, Shape shape, DType dtype, Device device, const std::string& name) {
  Tensor host = Tensor::empty(std::move(shape), DType::F64, MemCategory::Other, name);
  std::copy(v.begin(), v.end(), host.data<double>());
  Tensor t = host.to(dtype).to(device);
  t.set_name(name);
  return t;
}

// i32 ids (tokens, targets) on `device`.
Tensor upload_ids(const std::vector<int32_t>& ids, Device device, const std::string& name) {
  Tensor host = Tensor::empty({static_cast<int64_t>(ids.size())}, DType::I32, MemCategory::Other, name);
  std::copy(ids.begin(), ids.end(), host.data<int32_t>());
  Tensor t = host.to(device);
  t.set_name(name);
  return t;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> download(const Tensor& t) {
  Tensor host = t.to(Device::cpu()).to(DType::F64);
  return {host.data<double>(), host.data<double>() + host.numel()};
}

class Backends : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!GetParam().device.is_cuda()) return;
#ifdef MEGATON_WITH_CUDA
    if (cuda::device_count() == 0) GTEST_SKIP() << "skipped: no CUDA device";
#else
    GTEST_SKIP() << "skipped: built without CUDA";
#endif
  }
  kernels::ExecContext ctx() const { return {GetParam().device, nullptr}; }
  Tensor up(const std::vector<double>& v, Shape shape, const std::string& name, DType dtype) const {
    return upload(v, std::move(shape), dtype, GetParam().device, name);
  }
  Tensor up(const std::vector<double>& v, Shape shape, const std::string& name) const {
    return up(v, std::move(shape), name, GetParam().dtype);
  }
  // An output of `shape` filled with NaN: whatever the kernel leaves unwritten fails fd::close.
  Tensor poisoned(Shape shape, const std::string& name, DType dtype) const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return up(std::vector<double>(static_cast<size_t>(n), kNaN), std::move(shape), name, dtype);
  }
  Tensor ids(const std::vector<int32_t>& v, const std::string& name) const {
    return upload_ids(v, GetParam().device, name);
  }
};

}  // namespace

TEST_P(Backends, LinearForwardAndBothBackwardHalvesMatchTheReference) {
  const DType dt = GetParam().dtype;
  const int64_t N = 37, in = 24, out = 19;  // odd sizes: no tile divides them
  const auto x = rounded(fd::random_vector(N * in, 1), dt), w = rounded(fd::random_vector(out * in, 2), dt);
  const auto b = rounded(fd::random_vector(out, 3), dt), dy = rounded(fd::random_vector(N * out, 4), dt);
  // Gradients accumulate onto what is there: start from non-zero main grads (f32, or f64 in double).
  const DType grad_dt = stat_dtype(dt);
  const auto dw0 = rounded(fd::random_vector(out * in, 5), grad_dt), db0 = rounded(fd::random_vector(out, 6), grad_dt);

  std::vector<double> y_ref(N * out), dx_ref(N * in), dw_ref = dw0, db_ref = db0;
  kernels::cpu::linear_forward(y_ref.data(), x.data(), w.data(), b.data(), N, in, out);
  kernels::cpu::linear_backward_input(dx_ref.data(), dy.data(), w.data(), N, in, out);
  kernels::cpu::linear_backward_weight(dw_ref.data(), db_ref.data(), dy.data(), x.data(), N, in, out);

  Tensor X = up(x, {N, in}, "x"), W = up(w, {out, in}, "w"), B = up(b, {out}, "b"), DY = up(dy, {N, out}, "dy");
  Tensor Y = Tensor::empty({N, out}, dt, MemCategory::Other, "y", GetParam().device);
  Tensor DX = Tensor::empty({N, in}, dt, MemCategory::Other, "dx", GetParam().device);
  Tensor DW = up(dw0, {out, in}, "dw", grad_dt), DB = up(db0, {out}, "db", grad_dt);
  kernels::linear_forward(ctx(), Y, X, W, B);
  kernels::linear_backward_input(ctx(), DX, DY, W);
  kernels::linear_backward_weight(ctx(), DW, DB, DY, X);
  const double tol = tolerance(dt);
  EXPECT_TRUE(fd::close(download(Y), y_ref, tol)) << "forward";
  EXPECT_TRUE(fd::close(download(DX), dx_ref, tol)) << "backward input";
  // The accumulation itself runs in f32 (the main grad), whatever the input dtype.
  EXPECT_TRUE(fd::close(download(DW), dw_ref, tolerance(grad_dt) * (dt == DType::BF16 ? 1e4 : 1))) << "weight grad";
  EXPECT_TRUE(fd::close(download(DB), db_ref, tolerance(grad_dt) * (dt == DType::BF16 ? 1e4 : 1))) << "bias grad";
}

TEST_P(Backends, RmsNormForwardAndBothBackwardHalvesMatchTheReference) {
  const DType dt = GetParam().dtype, st = stat_dtype(dt);
  const int64_t N = 13, C = 40;
  const auto x = rounded(fd::random_vector(N * C, 7), dt), w = rounded(fd::random_vector(C, 8, 0.5, 1.5), dt);
  const auto dy = rounded(fd::random_vector(N * C, 9), dt), dw0 = rounded(fd::random_vector(C, 10), dt);
  std::vector<double> y_ref(N * C), rstd_ref(N), dx_ref(N * C), dw_ref = dw0;
  kernels::cpu::rmsnorm_forward(y_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, 1e-5);
  kernels::cpu::rmsnorm_backward_input(dx_ref.data(), dy.data(), x.data(), w.data(), rstd_ref.data(), N, C);
  kernels::cpu::rmsnorm_backward_weight(dw_ref.data(), dy.data(), x.data(), rstd_ref.data(), N, C);

  Tensor X = up(x, {N, C}, "x"), W = up(w, {C}, "w"), DY = up(dy, {N, C}, "dy"), DW = up(dw0, {C}, "dw");
  Tensor Y = Tensor::empty({N, C}, dt, MemCategory::Other, "y", GetParam().device);
  Tensor RSTD = Tensor::empty({N}, st, MemCategory::Other, "rstd", GetParam().device);
  Tensor DX = Tensor::empty({N, C}, dt, MemCategory::Other, "dx", GetParam().device);
  kernels::rmsnorm_forward(ctx(), Y, RSTD, X, W, 1e-5);
  kernels::rmsnorm_backward_input(ctx(), DX, DY, X, W, RSTD);
  kernels::rmsnorm_backward_weight(ctx(), DW, DY, X, RSTD);
  const double tol = tolerance(dt);
  EXPECT_TRUE(fd::close(download(Y), y_ref, tol)) << "forward";
  EXPECT_TRUE(fd::close(download(RSTD), rstd_ref, tolerance(st))) << "rstd";
  EXPECT_TRUE(fd::close(download(DX), dx_ref, tol)) << "backward input";
  EXPECT_TRUE(fd::close(download(DW), dw_ref, tol)) << "weight grad";
}

TEST_P(Backends, ResidualRmsNormFormsMatchTheReference) {
  // sum = x + residual, out = rmsnorm(sum) in one pass; dx of the norm + the residual stream's grad.
  const DType dt = GetParam().dtype, st = stat_dtype(dt);
  const int64_t N = 11, C = 300;  // C > the 256 threads of a row: a thread takes two columns
  const auto x = rounded(fd::random_vector(N * C, 40), dt), r = rounded(fd::random_vector(N * C, 41), dt);
  const auto w = rounded(fd::random_vector(C, 42, 0.5, 1.5), dt), dy = rounded(fd::random_vector(N * C, 43), dt);
  const auto dres = rounded(fd::random_vector(N * C, 44), dt);
  std::vector<double> sum_ref(N * C), y_ref(N * C), rstd_ref(N), dx_ref(N * C);
  kernels::cpu::add_rmsnorm_forward(sum_ref.data(), y_ref.data(), rstd_ref.data(), x.data(), r.data(), w.data(), N, C, 1e-5);
  kernels::cpu::rmsnorm_backward_input(dx_ref.data(), dy.data(), sum_ref.data(), w.data(), rstd_ref.data(), N, C,
                                       dres.data());
  Tensor X = up(x, {N, C}, "x"), R = up(r, {N, C}, "residual"), W = up(w, {C}, "w"), DY = up(dy, {N, C}, "dy");
  Tensor DRES = up(dres, {N, C}, "dresidual");
  Tensor SUM = poisoned({N, C}, "sum", dt), Y = poisoned({N, C}, "y", dt), RSTD = poisoned({N}, "rstd", st);
  Tensor DX = poisoned({N, C}, "dx", dt);
  kernels::add_rmsnorm_forward(ctx(), SUM, Y, RSTD, X, R, W, 1e-5);
  kernels::rmsnorm_backward_input(ctx(), DX, DY, SUM, W, RSTD, DRES);
  const double tol = tolerance(dt);
  EXPECT_TRUE(fd::close(download(SUM), sum_ref, tol)) << "sum";
  EXPECT_TRUE(fd::close(download(Y), y_ref, tol)) << "forward";
  EXPECT_TRUE(fd::close(download(RSTD), rstd_ref, tolerance(st) * (dt == DType::BF16 ? 1e4 : 1))) << "rstd";
  EXPECT_TRUE(fd::close(download(DX), dx_ref, tol)) << "backward input + dresidual";
}

TEST_P(Backends, LayerNormPlainAndResidualFormsMatchTheReference) {
  const DType dt = GetParam().dtype, st = stat_dtype(dt);
  const int64_t N = 13, C = 300;
  // An offset mean (|mean| >> std) checks that the variance is taken about the mean.
  const auto x = rounded(fd::random_vector(N * C, 50, 2.0, 3.0), dt), r = rounded(fd::random_vector(N * C, 51), dt);
  const auto w = rounded(fd::random_vector(C, 52, 0.5, 1.5), dt), b = rounded(fd::random_vector(C, 53), dt);
  const auto dy = rounded(fd::random_vector(N * C, 54), dt), dres = rounded(fd::random_vector(N * C, 55), dt);
  const auto dw0 = rounded(fd::random_vector(C, 56), dt), db0 = rounded(fd::random_vector(C, 57), dt);
  std::vector<double> sum_ref(N * C), y_ref(N * C), mean_ref(N), rstd_ref(N), dx_ref(N * C), dw_ref = dw0, db_ref = db0;
  kernels::cpu::add_layernorm_forward(sum_ref.data(), y_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(), r.data(),
                                      w.data(), b.data(), N, C, 1e-5);
  kernels::cpu::layernorm_backward_input(dx_ref.data(), dy.data(), sum_ref.data(), w.data(), mean_ref.data(),
                                         rstd_ref.data(), N, C, dres.data());
  kernels::cpu::layernorm_backward_weight(dw_ref.data(), db_ref.data(), dy.data(), sum_ref.data(), mean_ref.data(),
                                          rstd_ref.data(), N, C);
  Tensor X = up(x, {N, C}, "x"), R = up(r, {N, C}, "residual"), W = up(w, {C}, "w"), B = up(b, {C}, "b");
  Tensor DY = up(dy, {N, C}, "dy"), DRES = up(dres, {N, C}, "dresidual"), DW = up(dw0, {C}, "dw"), DB = up(db0, {C}, "db");
  Tensor SUM = poisoned({N, C}, "sum", dt), Y = poisoned({N, C}, "y", dt), Y2 = poisoned({N, C}, "y2", dt);
  Tensor MEAN = poisoned({N}, "mean", st), RSTD = poisoned({N}, "rstd", st);
  Tensor MEAN2 = poisoned({N}, "mean2", st), RSTD2 = poisoned({N}, "rstd2", st), DX = poisoned({N, C}, "dx", dt);
  kernels::add_layernorm_forward(ctx(), SUM, Y, MEAN, RSTD, X, R, W, B, 1e-5);
  kernels::layernorm_forward(ctx(), Y2, MEAN2, RSTD2, SUM, W, B, 1e-5);  // the plain form on the same rows
  kernels::layernorm_backward_input(ctx(), DX, DY, SUM, W, MEAN, RSTD, DRES);
  kernels::layernorm_backward_weight(ctx(), DW, DB, DY, SUM, MEAN, RSTD);
  const double tol = tolerance(dt), stat_tol = tolerance(st) * (dt == DType::BF16 ? 1e4 : 1);
  EXPECT_TRUE(fd::close(download(SUM), sum_ref, tol)) << "sum";
  EXPECT_TRUE(fd::close(download(Y), y_ref, tol)) << "residual forward";
  EXPECT_TRUE(fd::close(download(Y2), y_ref, tol)) << "plain forward";
  EXPECT_TRUE(fd::close(download(MEAN), mean_ref, stat_tol)) << "mean";
  EXPECT_TRUE(fd::close(download(RSTD), rstd_ref, stat_tol)) << "rstd";
  EXPECT_TRUE(fd::close(download(MEAN2), mean_ref, stat_tol)) << "plain mean";
  EXPECT_TRUE(fd::close(download(DX), dx_ref, tol)) << "backward input + dresidual";
  EXPECT_TRUE(fd::close(download(DW), dw_ref, tol)) << "weight grad";
  EXPECT_TRUE(fd::close(download(DB), db_ref, tol)) << "bias grad";
}

TEST_P(Backends, SwigluAndResidualAddMatchTheReference) {
  const DType dt = GetParam().dtype;
  const int64_t N = 7, H = 33;
  const auto gu = rounded(fd::random_vector(N * 2 * H, 60, -4.0, 4.0), dt), dy = rounded(fd::random_vector(N * H, 61), dt);
  const auto a = rounded(fd::random_vector(N * H, 62), dt);
  std::vector<double> y_ref(N * H), dgu_ref(N * 2 * H), sum_ref(N * H);
  kernels::cpu::swiglu_forward(y_ref.data(), gu.data(), N, H);
  kernels::cpu::swiglu_backward(dgu_ref.data(), dy.data(), gu.data(), N, H);
  for (int64_t i = 0; i < N * H; ++i) sum_ref[i] = a[i] + y_ref[i];
  Tensor GU = up(gu, {N, 2 * H}, "gu"), DY = up(dy, {N, H}, "dy"), A = up(a, {N, H}, "a");
  Tensor Y = poisoned({N, H}, "y", dt), DGU = poisoned({N, 2 * H}, "dgu", dt), SUM = poisoned({N, H}, "sum", dt);
  kernels::swiglu_forward(ctx(), Y, GU);
  kernels::swiglu_backward(ctx(), DGU, DY, GU);
  kernels::residual_forward(ctx(), SUM, A, Y);
  EXPECT_TRUE(fd::close(download(Y), y_ref, tolerance(dt))) << "swiglu forward";
  EXPECT_TRUE(fd::close(download(DGU), dgu_ref, tolerance(dt))) << "swiglu backward";
  EXPECT_TRUE(fd::close(download(SUM), sum_ref, tolerance(dt) * 2)) << "residual add";
}

TEST_P(Backends, RopeTablesAndRotationMatchTheReference) {
  const DType dt = GetParam().dtype;
  if (dt == DType::BF16) GTEST_SKIP() << "RoPE rotates f32 or f64 (bf16 training rotates an f32 copy)";
  // Megatron's fused QKV rows: Hq = 4, Hkv = 2, D = 8; rotate the 2 q and 1 k head of each group at
  // positions 3..7 of a 10-position table, both layouts, forward and inverse.
  const int64_t B = 2, Tlen = 5, Hkv = 2, D = 8, P = 10, H = 3, pos_offset = 3;
  const kernels::HeadStrides at{Hkv * 4 * D, 4 * D};
  const std::vector<double> inv_freq = {1.0, 0.3, 0.05, 0.001};
  std::vector<double> cos_ref(P * D / 2), sin_ref(P * D / 2);
  kernels::cpu::rope_tables(cos_ref.data(), sin_ref.data(), P, D, inv_freq, 1.0);
  Tensor COS = poisoned({P, D / 2}, "cos", dt), SIN = poisoned({P, D / 2}, "sin", dt);
  kernels::rope_tables(ctx(), COS, SIN, inv_freq);
  EXPECT_TRUE(fd::close(download(COS), cos_ref, tolerance(dt))) << "cos";
  EXPECT_TRUE(fd::close(download(SIN), sin_ref, tolerance(dt))) << "sin";
  for (kernels::RopeLayout layout : {kernels::RopeLayout::Half, kernels::RopeLayout::Interleaved})
    for (bool inverse : {false, true}) {
      auto x = rounded(fd::random_vector(B * Tlen * at.row, 70), dt);
      Tensor X = up(x, {B * Tlen, at.row}, "qkv");
      kernels::rope_apply(ctx(), X, COS, SIN, B, Tlen, Hkv, H, D, at, pos_offset, layout, inverse);
      kernels::cpu::rope_apply(x.data(), cos_ref.data(), sin_ref.data(), B, Tlen, Hkv, H, D, at, pos_offset, layout,
                               inverse);
      EXPECT_TRUE(fd::close(download(X), x, tolerance(dt))) << (inverse ? "inverse " : "") << static_cast<int>(layout);
    }
}

TEST_P(Backends, AttentionForwardAndBackwardMatchTheReference) {
  const DType dt = GetParam().dtype;
  if (dt == DType::BF16) GTEST_SKIP() << "bf16 attention: the CUDA flash kernels, in flash_attention_cuda_test";
  // exp and the order of the sums differ from the CPU's tiles: a few f32 ulps over the rows.
  const double tol = dt == DType::F32 ? 1e-5 : tolerance(dt);
  // GQA inside Megatron's fused QKV rows: Hq = 4 over Hkv = 2, D = 16, gradients into a fused dQKV.
  {
    const int64_t B = 2, Tlen = 7, Hq = 4, Hkv = 2, D = 16, row = Hkv * 4 * D;
    const kernels::HeadStrides at{row, 4 * D};
    const int64_t k_off = 2 * D, v_off = 3 * D;
    const auto qkv = rounded(fd::random_vector(B * Tlen * row, 80), dt), dy = rounded(fd::random_vector(B * Tlen * Hq * D, 81), dt);
    std::vector<double> out_ref(B * Tlen * Hq * D), lse_ref(B * Hq * Tlen), dqkv_ref(B * Tlen * row);
    kernels::cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), qkv.data() + k_off, qkv.data() + v_off, B,
                                    Tlen, Hq, Hkv, D, at, at, 0.25);
    kernels::cpu::attention_backward(dqkv_ref.data(), dqkv_ref.data() + k_off, dqkv_ref.data() + v_off, dy.data(),
                                     out_ref.data(), lse_ref.data(), qkv.data(), qkv.data() + k_off, qkv.data() + v_off,
                                     B, Tlen, Hq, Hkv, D, at, at, 0.25);
    Tensor QKV = up(qkv, {B * Tlen, row}, "qkv"), DY = up(dy, {B * Tlen, Hq * D}, "dy");
    Tensor OUT = poisoned({B * Tlen, Hq * D}, "out", dt), LSE = poisoned({B * Hq, Tlen}, "lse", dt);
    Tensor DQKV = poisoned({B * Tlen, row}, "dqkv", dt);
    kernels::attention_forward(ctx(), OUT, LSE, {QKV, 0}, {QKV, k_off}, {QKV, v_off}, B, Tlen, Hq, Hkv, D, at, at, 0.25);
    kernels::attention_backward(ctx(), {DQKV, 0}, {DQKV, k_off}, {DQKV, v_off}, DY, OUT, LSE, {QKV, 0}, {QKV, k_off},
                                {QKV, v_off}, B, Tlen, Hq, Hkv, D, at, at, 0.25);
    EXPECT_TRUE(fd::close(download(OUT), out_ref, tol)) << "forward";
    EXPECT_TRUE(fd::close(download(LSE), lse_ref, tol)) << "lse";
    EXPECT_TRUE(fd::close(download(DQKV), dqkv_ref, tol)) << "dq, dk, dv";
  }
  // Different q/k and v head sizes (MLA's), and a KV cache: 3 cached tokens, room for 12 per row.
  {
    const int64_t B = 2, Tlen = 4, H = 3, pos = 3, cap = 12;
    const kernels::HeadDim D{24, 16};
    const kernels::HeadStrides q_at{H * 24, 24}, k_at{H * 24, 24};
    const auto q = rounded(fd::random_vector(B * Tlen * H * 24, 82), dt), k = rounded(fd::random_vector(B * cap * H * 24, 83), dt);
    const auto v = rounded(fd::random_vector(B * cap * H * 24, 84), dt);
    std::vector<double> out_ref(B * Tlen * H * 16), lse_ref(B * H * Tlen);
    // k and v share kv_at in the API: v is laid out with k's strides ({H * 24, 24}), its heads 16 wide.
    kernels::cpu::attention_forward(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), B, Tlen, H, H, D,
                                    q_at, k_at, 0.2, pos, cap * k_at.row);
    Tensor Q = up(q, {B * Tlen, H * 24}, "q"), K = up(k, {B * cap, H * 24}, "k"), V = up(v, {B * cap, H * 24}, "v");
    Tensor OUT = poisoned({B * Tlen, H * 16}, "out", dt), LSE = poisoned({B * H, Tlen}, "lse", dt);
    kernels::attention_forward(ctx(), OUT, LSE, Q, K, V, B, Tlen, H, H, D, q_at, k_at, 0.2, pos, cap * k_at.row);
    EXPECT_TRUE(fd::close(download(OUT), out_ref, tol)) << "forward with a KV cache";
    EXPECT_TRUE(fd::close(download(LSE), lse_ref, tol)) << "lse with a KV cache";
  }
}

TEST_P(Backends, BiasGeluAndBiasSwigluMatchTheReference) {
  // The GEMM's bias fused into the activation; dbias sums the stored gradients over the rows.
  const DType dt = GetParam().dtype, bt = stat_dtype(dt);
  const int64_t N = 9, F = 70, H = 35;
  const auto h = rounded(fd::random_vector(N * F, 90, -3.0, 3.0), dt), dy = rounded(fd::random_vector(N * F, 91), dt);
  const auto dy_half = rounded(fd::random_vector(N * H, 92), dt);
  const auto bias = rounded(fd::random_vector(F, 93), bt), db0 = rounded(fd::random_vector(F, 94), bt);
  std::vector<double> gelu_ref(N * F), dh_ref(N * F), db_gelu = db0, swiglu_ref(N * H), dgu_ref(N * F), db_swiglu = db0;
  kernels::cpu::bias_gelu_forward(gelu_ref.data(), h.data(), bias.data(), N, F);
  kernels::cpu::bias_gelu_backward(dh_ref.data(), db_gelu.data(), dy.data(), h.data(), bias.data(), N, F);
  kernels::cpu::bias_swiglu_forward(swiglu_ref.data(), h.data(), bias.data(), N, H);
  kernels::cpu::bias_swiglu_backward(dgu_ref.data(), db_swiglu.data(), dy_half.data(), h.data(), bias.data(), N, H);
  Tensor Hh = up(h, {N, F}, "h"), DY = up(dy, {N, F}, "dy"), DYH = up(dy_half, {N, H}, "dy_half");
  Tensor B = up(bias, {F}, "bias", bt), DB1 = up(db0, {F}, "dbias_gelu", bt), DB2 = up(db0, {F}, "dbias_swiglu", bt);
  Tensor G = poisoned({N, F}, "gelu", dt), DH = poisoned({N, F}, "dh", dt);
  Tensor S = poisoned({N, H}, "swiglu", dt), DGU = poisoned({N, F}, "dgu", dt);
  kernels::bias_gelu_forward(ctx(), G, Hh, B);
  kernels::bias_gelu_backward(ctx(), DH, DB1, DY, Hh, B);
  kernels::bias_swiglu_forward(ctx(), S, Hh, B);
  kernels::bias_swiglu_backward(ctx(), DGU, DB2, DYH, Hh, B);
  const double tol = tolerance(dt);
  EXPECT_TRUE(fd::close(download(G), gelu_ref, tol)) << "bias + gelu";
  EXPECT_TRUE(fd::close(download(DH), dh_ref, tol)) << "bias + gelu backward";
  EXPECT_TRUE(fd::close(download(DB1), db_gelu, tol)) << "gelu dbias";
  EXPECT_TRUE(fd::close(download(S), swiglu_ref, tol)) << "bias + swiglu";
  EXPECT_TRUE(fd::close(download(DGU), dgu_ref, tol)) << "bias + swiglu backward";
  EXPECT_TRUE(fd::close(download(DB2), db_swiglu, tol)) << "swiglu dbias";
}

TEST_P(Backends, MoePermutationsMatchTheReference) {
  // 6 tokens x 2 slots, two slots dropped (-1); the 10 kept ones fill the permuted rows exactly.
  const DType dt = GetParam().dtype;
  const int64_t N = 6, K = 2, C = 300, M = 10;
  const std::vector<int32_t> pos = {3, 7, -1, 0, 9, 1, 4, -1, 2, 8, 6, 5};
  const std::vector<double> pos_d(pos.begin(), pos.end());
  const auto x = rounded(fd::random_vector(N * C, 100), dt), rows = rounded(fd::random_vector(M * C, 101), dt);
  const auto probs = rounded(fd::random_vector(N * K, 102, 0.1, 1.0), dt), dy = rounded(fd::random_vector(N * C, 103), dt);
  std::vector<double> out_ref(M * C), dx_ref(N * C), y_ref(N * C), drows_ref(M * C), dprobs_ref(N * K);
  kernels::cpu::moe_permute(out_ref.data(), x.data(), pos.data(), N, K, C);
  kernels::cpu::moe_permute_backward(dx_ref.data(), rows.data(), pos.data(), N, K, C);
  kernels::cpu::moe_unpermute(y_ref.data(), rows.data(), pos.data(), probs.data(), N, K, C);
  kernels::cpu::moe_unpermute_backward(drows_ref.data(), dprobs_ref.data(), dy.data(), rows.data(), pos.data(),
                                       probs.data(), N, K, C);
  Tensor POS = Tensor::empty({N, K}, DType::I32, MemCategory::Other, "pos");
  std::copy(pos.begin(), pos.end(), POS.data<int32_t>());
  POS = POS.to(GetParam().device);
  Tensor X = up(x, {N, C}, "x"), R = up(rows, {M, C}, "rows"), P = up(probs, {N, K}, "probs"), DY = up(dy, {N, C}, "dy");
  Tensor OUT = poisoned({M, C}, "out", dt), DX = poisoned({N, C}, "dx", dt), Y = poisoned({N, C}, "y", dt);
  Tensor DR = poisoned({M, C}, "drows", dt), DP = poisoned({N, K}, "dprobs", dt);
  kernels::moe_permute(ctx(), OUT, X, POS);
  kernels::moe_permute_backward(ctx(), DX, R, POS);
  kernels::moe_unpermute(ctx(), Y, R, POS, P);
  kernels::moe_unpermute_backward(ctx(), DR, DP, DY, R, POS, P);
  const double tol = tolerance(dt);
  EXPECT_TRUE(fd::close(download(OUT), out_ref, tol)) << "permute";
  EXPECT_TRUE(fd::close(download(DX), dx_ref, tol)) << "permute backward";
  EXPECT_TRUE(fd::close(download(Y), y_ref, tol)) << "unpermute";
  EXPECT_TRUE(fd::close(download(DR), drows_ref, tol)) << "unpermute backward rows";
  EXPECT_TRUE(fd::close(download(DP), dprobs_ref, tol)) << "unpermute backward probs";
  // A plan naming a row outside the permuted tensor is refused before any row moves.
  Tensor BAD = Tensor::empty({N, K}, DType::I32, MemCategory::Other, "bad_pos");
  std::fill_n(BAD.data<int32_t>(), N * K, 0);
  BAD.data<int32_t>()[5] = static_cast<int32_t>(M);
  EXPECT_ERROR_CONTAINS(kernels::moe_permute(ctx(), OUT, X, BAD.to(GetParam().device)), "'bad_pos' names row 10");
}

TEST_P(Backends, GroupedLinearMatchesTheReference) {
  // 3 experts over blocks of 5, 0 and 4 permuted rows (an empty expert included).
  const DType dt = GetParam().dtype, grad_dt = stat_dtype(dt);
  const int64_t in = 24, out = 19, E = 3, M = 9;
  const std::vector<int64_t> blocks = {5, 0, 4};
  const auto x = rounded(fd::random_vector(M * in, 110), dt), w = rounded(fd::random_vector(E * out * in, 111), dt);
  const auto dy = rounded(fd::random_vector(M * out, 112), dt), dw0 = rounded(fd::random_vector(E * out * in, 113), grad_dt);
  std::vector<double> y_ref(M * out), dx_ref(M * in), dw_ref = dw0;
  for (int64_t e = 0, r = 0; e < E; r += blocks[static_cast<size_t>(e)], ++e) {
    const int64_t n = blocks[static_cast<size_t>(e)];
    const double* we = w.data() + e * out * in;
    kernels::cpu::linear_forward(y_ref.data() + r * out, x.data() + r * in, we, static_cast<const double*>(nullptr), n, in, out);
    kernels::cpu::linear_backward_input(dx_ref.data() + r * in, dy.data() + r * out, we, n, in, out);
    kernels::cpu::linear_backward_weight(dw_ref.data() + e * out * in, static_cast<double*>(nullptr), dy.data() + r * out,
                                         x.data() + r * in, n, in, out);
  }
  Tensor X = up(x, {M, in}, "x"), W = up(w, {E * out, in}, "w"), DY = up(dy, {M, out}, "dy");
  Tensor DW = up(dw0, {E * out, in}, "dw", grad_dt);
  Tensor Y = poisoned({M, out}, "y", dt), DX = poisoned({M, in}, "dx", dt);
  kernels::grouped_linear_forward(ctx(), Y, X, W, blocks);
  kernels::grouped_linear_backward_input(ctx(), DX, DY, W, blocks);
  kernels::grouped_linear_backward_weight(ctx(), DW, DY, X, blocks);
  EXPECT_TRUE(fd::close(download(Y), y_ref, tolerance(dt))) << "forward";
  EXPECT_TRUE(fd::close(download(DX), dx_ref, tolerance(dt))) << "backward input";
  EXPECT_TRUE(fd::close(download(DW), dw_ref, tolerance(grad_dt) * (dt == DType::BF16 ? 1e4 : 1))) << "weight grad";
}

TEST_P(Backends, GeluForwardAndBackwardMatchTheReference) {
  const DType dt = GetParam().dtype;
  const int64_t n = 1001;
  const auto x = rounded(fd::random_vector(n, 11, -4.0, 4.0), dt), dy = rounded(fd::random_vector(n, 12), dt);
  std::vector<double> y_ref(n), dx_ref(n);
  kernels::cpu::gelu_forward(y_ref.data(), x.data(), n);
  kernels::cpu::gelu_backward(dx_ref.data(), dy.data(), x.data(), n);
  Tensor X = up(x, {n}, "x"), DY = up(dy, {n}, "dy");
  Tensor Y = Tensor::empty({n}, dt, MemCategory::Other, "y", GetParam().device);
  Tensor DX = Tensor::empty({n}, dt, MemCategory::Other, "dx", GetParam().device);
  kernels::gelu_forward(ctx(), Y, X);
  kernels::gelu_backward(ctx(), DX, DY, X);
  EXPECT_TRUE(fd::close(download(Y), y_ref, tolerance(dt))) << "forward";
  EXPECT_TRUE(fd::close(download(DX), dx_ref, tolerance(dt))) << "backward";
}

TEST_P(Backends, EmbeddingForwardAndBackwardMatchTheReference) {
  const DType dt = GetParam().dtype, grad_dt = stat_dtype(dt);  // weight grads are f32 (f64 in double)
  const int64_t B = 3, T = 13, C = 37, vocab = 101, rows = B * T;
  std::vector<int32_t> tokens(rows);
  std::mt19937 gen(21);
  for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % vocab);
  // Repeated tokens (the scatter-add must add every row of a token) and both ends of the table.
  tokens[5] = tokens[0], tokens[20] = tokens[0], tokens[38] = tokens[0], tokens[7] = 0, tokens[30] = vocab - 1;
  const auto wte = rounded(fd::random_vector(vocab * C, 22), dt), wpe = rounded(fd::random_vector(T * C, 23), dt);
  const auto dy = rounded(fd::random_vector(rows * C, 24), dt);
  const auto dwte0 = rounded(fd::random_vector(vocab * C, 25), grad_dt),
             dwpe0 = rounded(fd::random_vector(T * C, 26), grad_dt);
  std::vector<double> y_ref(rows * C), y_nopos_ref(rows * C), dwte_ref = dwte0, dwpe_ref = dwpe0,
                                                              dwte_nopos_ref = dwte0;
  kernels::cpu::embedding_forward(y_ref.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  kernels::cpu::embedding_forward(y_nopos_ref.data(), tokens.data(), wte.data(), static_cast<const double*>(nullptr), B,
                                  T, C);
  kernels::cpu::embedding_backward(dwte_ref.data(), dwpe_ref.data(), dy.data(), tokens.data(), B, T, C);
  kernels::cpu::embedding_backward(dwte_nopos_ref.data(), static_cast<double*>(nullptr), dy.data(), tokens.data(), B, T,
                                   C);

  Tensor TOK = ids(tokens, "tokens").view({B, T}), WTE = up(wte, {vocab, C}, "wte"), WPE = up(wpe, {T, C}, "wpe");
  Tensor DY = up(dy, {rows, C}, "dy");
  Tensor Y = poisoned({rows, C}, "y", dt), Y_NOPOS = poisoned({rows, C}, "y_nopos", dt);
  Tensor DWTE = up(dwte0, {vocab, C}, "dwte", grad_dt), DWPE = up(dwpe0, {T, C}, "dwpe", grad_dt);
  Tensor DWTE_NOPOS = up(dwte0, {vocab, C}, "dwte_nopos", grad_dt);
  kernels::embedding_forward(ctx(), Y, TOK, WTE, WPE);
  kernels::embedding_forward(ctx(), Y_NOPOS, TOK, WTE, Tensor());
  kernels::embedding_backward(ctx(), DWTE, DWPE, DY, TOK);
  kernels::embedding_backward(ctx(), DWTE_NOPOS, Tensor(), DY, TOK);
  EXPECT_TRUE(fd::close(download(Y), y_ref, tolerance(dt))) << "forward";
  EXPECT_TRUE(fd::close(download(Y_NOPOS), y_nopos_ref, tolerance(dt))) << "forward without positions";
  // The gradients sum a few exactly representable rows in f32: f32 rounding, whatever dout's dtype.
  EXPECT_TRUE(fd::close(download(DWTE), dwte_ref, tolerance(grad_dt))) << "token table grad";
  EXPECT_TRUE(fd::close(download(DWPE), dwpe_ref, tolerance(grad_dt))) << "position table grad";
  EXPECT_TRUE(fd::close(download(DWTE_NOPOS), dwte_nopos_ref, tolerance(grad_dt))) << "token grad without positions";
}

// The three forward kernels and the backward, unsplit (vocab_start 0) and as the shard of a
// larger vocabulary starting at entry 500 (targets below 500 then belong to another shard).
TEST_P(Backends, CrossEntropyKernelsMatchTheReference) {
  const DType dt = GetParam().dtype, st = stat_dtype(dt);  // statistics: f32 (f64 in double)
  const int64_t N = 37, V = 1001;
  std::vector<double> logits = fd::random_vector(N * V, 31, -8.0, 8.0);
  for (int64_t v = 0; v < V; ++v) logits[4 * V + v] += 100.0;  // exp(x) would overflow f32 without the max shift
  logits = rounded(logits, dt);
  std::vector<int32_t> targets(N);
  std::mt19937 gen(32);
  for (int32_t& t : targets) t = static_cast<int32_t>(gen() % V);
  targets[0] = 0, targets[1] = static_cast<int32_t>(V - 1);
  for (int64_t n : {3, 17, 36}) targets[n] = kernels::kIgnoreIndex;
  const double grad_scale = 0.37;
  for (int64_t start : {0, 500}) {
    SCOPED_TRACE("vocab_start " + std::to_string(start));
    std::vector<double> max_ref(N), se_ref(N), tl_ref(N), loss_ref(N), lse_ref(N), dx_ref(N * V);
    kernels::cpu::cross_entropy_row_max(max_ref.data(), logits.data(), N, V);
    kernels::cpu::cross_entropy_sum_exp(se_ref.data(), tl_ref.data(), logits.data(), max_ref.data(), targets.data(),
                                        start, N, V);
    kernels::cpu::cross_entropy_loss(loss_ref.data(), lse_ref.data(), max_ref.data(), se_ref.data(), tl_ref.data(),
                                     targets.data(), N);
    kernels::cpu::cross_entropy_backward(dx_ref.data(), logits.data(), lse_ref.data(), targets.data(), start,
                                         grad_scale, N, V);
    ASSERT_EQ(loss_ref[3], 0.0);  // the reference itself zeroes ignored rows

    Tensor X = up(logits, {N, V}, "logits"), TG = ids(targets, "targets");
    Tensor MAX = poisoned({N}, "row_max", st), SE = poisoned({N}, "sum_exp", st), TL = poisoned({N}, "target_logit", st);
    Tensor LOSS = poisoned({N}, "loss", st), LSE = poisoned({N}, "lse", st), DX = poisoned({N, V}, "dlogits", dt);
    kernels::cross_entropy_row_max(ctx(), MAX, X);
    kernels::cross_entropy_sum_exp(ctx(), SE, TL, X, MAX, TG, start);
    kernels::cross_entropy_loss(ctx(), LOSS, LSE, MAX, SE, TL, TG);
    kernels::cross_entropy_backward(ctx(), DX, X, LSE, TG, start, grad_scale);
    // Computed in f32 from the dtype's logits: the statistics' tolerance, whatever the logits' dtype.
    EXPECT_TRUE(fd::close(download(MAX), max_ref, tolerance(st))) << "row_max";
    EXPECT_TRUE(fd::close(download(SE), se_ref, tolerance(st))) << "sum_exp";
    const std::vector<double> tl = download(TL);  // exact copies of a logit, or 0 outside the shard
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(tl[n], tl_ref[n]) << "target_logit row " << n;
    EXPECT_TRUE(fd::close(download(LOSS), loss_ref, tolerance(st))) << "loss";
    EXPECT_TRUE(fd::close(download(LSE), lse_ref, tolerance(st))) << "lse";
    EXPECT_TRUE(fd::close(download(DX), dx_ref, tolerance(dt))) << "dlogits";
    const std::vector<double> dx = download(DX);
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(dx[17 * V + v], 0.0) << "ignored row 17, column " << v;
    // In place: dlogits is the logits tensor.
    kernels::cross_entropy_backward(ctx(), X, X, LSE, TG, start, grad_scale);
    EXPECT_TRUE(fd::close(download(X), dx_ref, tolerance(dt))) << "dlogits in place";
  }
}

TEST_P(Backends, ReductionsMatchTheReference) {
  const DType dt = GetParam().dtype;
  // Crosses the CPU and CUDA chunk boundaries (16384 elements) with a ragged last chunk.
  const int64_t n = 3 * 16384 + 77;
  const auto x = rounded(fd::random_vector(n, 41, 0.0, 1.0), dt);
  double want = 0;
  for (double v : x) want += v;
  // Every backend accumulates the dtype's exact values in double.
  EXPECT_NEAR(kernels::sum(ctx(), up(x, {n}, "x")), want, 1e-12 * want);
  EXPECT_NEAR(kernels::sum(ctx(), up(std::vector<double>(x.begin(), x.begin() + 5), {5}, "x5")),
              x[0] + x[1] + x[2] + x[3] + x[4], 1e-12);

  const int64_t limit = 50;
  std::vector<int32_t> id(static_cast<size_t>(n));
  std::mt19937 gen(42);
  for (int32_t& v : id) v = static_cast<int32_t>(gen() % limit);
  for (int64_t i = 0; i < n; i += 7) id[static_cast<size_t>(i)] = kernels::kIgnoreIndex;
  int64_t not_ignored = 0;
  for (int32_t v : id) not_ignored += v != kernels::kIgnoreIndex;
  EXPECT_EQ(kernels::count_not_equal(ctx(), ids(id, "targets"), kernels::kIgnoreIndex), not_ignored);
  EXPECT_EQ(kernels::count_not_equal(ctx(), ids(id, "targets"), 3),
            n - static_cast<int64_t>(std::count(id.begin(), id.end(), 3)));

  // Only ignored ids out of range: none with `ignore`, the first ignored one without.
  EXPECT_EQ(kernels::first_out_of_range(ctx(), ids(id, "targets"), limit, kernels::kIgnoreIndex), -1);
  EXPECT_EQ(kernels::first_out_of_range(ctx(), ids(id, "targets"), limit), 0);
  // Offenders in the second and third chunks: the earlier one is reported, whatever chunk ends first.
  id[40000] = static_cast<int32_t>(limit);
  id[20001] = -1;
  EXPECT_EQ(kernels::first_out_of_range(ctx(), ids(id, "targets"), limit, kernels::kIgnoreIndex), 20001);
  id[20001] = 0;
  EXPECT_EQ(kernels::first_out_of_range(ctx(), ids(id, "targets"), limit, kernels::kIgnoreIndex), 40000);
  EXPECT_EQ(kernels::first_out_of_range(ctx(), ids(id, "targets"), limit + 1, kernels::kIgnoreIndex), -1);
  id.back() = 1 << 30;
  EXPECT_EQ(kernels::first_out_of_range(ctx(), ids(id, "targets"), limit + 1, kernels::kIgnoreIndex), n - 1);
}

TEST_P(Backends, CopyRowsMatchesTheReference) {
  const DType dt = GetParam().dtype;
  const int64_t B = 3, dst_R = 11, dst_C = 17, src_R = 9, src_C = 13, rows = 5, cols = 7;
  const auto dst0 = rounded(fd::random_vector(B * dst_R * dst_C, 51), dt);
  const auto src = rounded(fd::random_vector(B * src_R * src_C, 52), dt);
  std::vector<double> want = dst0;  // elements outside the block keep their values
  kernels::cpu::copy_rows(want.data(), dst_R, dst_C, 6, 9, src.data(), src_R, src_C, 2, 4, B, rows, cols);
  Tensor DST = up(dst0, {B, dst_R, dst_C}, "dst"), SRC = up(src, {B, src_R, src_C}, "src");
  kernels::copy_rows(ctx(), {DST, 6, 9}, {SRC, 2, 4}, rows, cols);
  EXPECT_EQ(download(DST), want);  // a copy: bit for bit
  // The last position of every sequence into a [B, 1, C] tensor (generation's gather).
  Tensor LAST = poisoned({B, 1, src_C}, "last", dt);
  kernels::copy_rows(ctx(), {LAST, 0, 0}, {SRC, src_R - 1, 0}, 1, src_C);
  std::vector<double> last_ref(B * src_C);
  kernels::cpu::copy_rows(last_ref.data(), 1, src_C, 0, 0, src.data(), src_R, src_C, src_R - 1, 0, B, 1, src_C);
  EXPECT_EQ(download(LAST), last_ref);
}

TEST_P(Backends, AdamWStepMatchesTheReference) {
  // AdamW is fp32 whatever the activations: weights, grads and moments f32 on the backend's device.
  // Two parameters of odd sizes (two segments of one multi-tensor launch on CUDA), one decayed.
  const optim::AdamWConfig cfg{3e-4, 0.9, 0.95, 1e-8, 0.1};
  struct Ref {
    std::vector<double> w, m, v;
    bool decay;
  };
  const int64_t sizes[2] = {37 * 27, 5001};
  nn::Parameter a("a", {37, 27}, true), b("b", {5001}, false);
  nn::Parameter* params[2] = {&a, &b};
  std::vector<Ref> ref;
  for (int i = 0; i < 2; ++i) {
    const auto w0 = rounded(fd::random_vector(sizes[i], 61 + i), DType::F32);
    params[i]->value = up(w0, params[i]->value.shape(), params[i]->name, DType::F32);
    params[i]->grad =
        up(std::vector<double>(sizes[i], 0.0), params[i]->value.shape(), params[i]->name + ".grad", DType::F32);
    ref.push_back({w0, std::vector<double>(sizes[i], 0.0), std::vector<double>(sizes[i], 0.0), i == 0});
  }
  optim::AdamW opt({&a, &b}, cfg);
  const double lrs[3] = {1e-2, 2e-2, 5e-3}, scales[3] = {1.0, 0.5, 1.0};
  for (int step = 1; step <= 3; ++step) {
    const double lr = lrs[step - 1], gs = scales[step - 1];
    for (int i = 0; i < 2; ++i) {
      const auto g = rounded(fd::random_vector(sizes[i], 70 + 10 * step + i), DType::F32);
      params[i]->grad.copy_from(upload(g, params[i]->grad.shape(), DType::F32, Device::cpu(), "g"));
      Ref& r = ref[static_cast<size_t>(i)];
      for (size_t j = 0; j < g.size(); ++j) {  // the formula in optim/adamw.h, in double
        const double gj = g[j] * gs;
        if (r.decay) r.w[j] -= lr * cfg.weight_decay * r.w[j];
        r.m[j] = cfg.beta1 * r.m[j] + (1 - cfg.beta1) * gj;
        r.v[j] = cfg.beta2 * r.v[j] + (1 - cfg.beta2) * gj * gj;
        r.w[j] -= lr / (1 - std::pow(cfg.beta1, step)) * r.m[j] /
                  (std::sqrt(r.v[j]) / std::sqrt(1 - std::pow(cfg.beta2, step)) + cfg.eps);
      }
    }
    opt.step(lr, gs);
  }
  EXPECT_EQ(opt.steps(), 3);
  for (int i = 0; i < 2; ++i) {
    const Ref& r = ref[static_cast<size_t>(i)];
    // f32 arithmetic over three steps against double: a few f32 roundings of each quantity.
    EXPECT_TRUE(fd::close(download(params[i]->value), r.w, 1e-5)) << "weights of " << params[i]->name;
    EXPECT_TRUE(fd::close(download(opt.exp_avg(static_cast<size_t>(i))), r.m, 1e-5))
        << "exp_avg of " << params[i]->name;
    EXPECT_TRUE(fd::close(download(opt.exp_avg_sq(static_cast<size_t>(i))), r.v, 1e-5))
        << "exp_avg_sq of " << params[i]->name;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, Backends,
                         ::testing::Values(Backend{Device::cpu(), DType::F32}, Backend{Device::cpu(), DType::F64},
                                           Backend{Device::cuda(0), DType::F32}, Backend{Device::cuda(0), DType::BF16}),
                         backend_name);

TEST(KernelDispatch, ErrorsNameTheOpAndTheTensor) {
  const kernels::ExecContext cpu{};
  Tensor x = Tensor::zeros({4, 3}, DType::F32, MemCategory::Other, "x");
  Tensor w = Tensor::zeros({5, 3}, DType::F32, MemCategory::Other, "w");
  Tensor y = Tensor::zeros({4, 5}, DType::F32, MemCategory::Other, "y");
  Tensor w64 = Tensor::zeros({5, 3}, DType::F64, MemCategory::Other, "w64");
  Tensor y_bad = Tensor::zeros({4, 6}, DType::F32, MemCategory::Other, "y_bad");
  Tensor x_bad = Tensor::zeros({4, 2}, DType::F32, MemCategory::Other, "x_bad");
  Tensor x8 = Tensor::zeros({4, 3}, DType::F8E4M3, MemCategory::Other, "x8");
  EXPECT_NO_THROW(kernels::linear_forward(cpu, y, x, w, Tensor()));
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, x, w64, Tensor()), "'y' holds f32, expected f64");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y_bad, x, w, Tensor()), "'y_bad' has shape [4, 6]");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, x_bad, w, Tensor()), "input 'x_bad'");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, Tensor(), w, Tensor()), "undefined");
  EXPECT_ERROR_CONTAINS(kernels::gelu_forward(cpu, x8, x8), "gelu_forward on cpu does not support dtype f8e4m3");
  const kernels::ExecContext gpu{Device::cuda(0), nullptr};
  EXPECT_ERROR_CONTAINS(kernels::gelu_forward(gpu, x, x), "tensor 'x' is on cpu, the call runs on cuda:0");
  Tensor w_norm = Tensor::zeros({3}, DType::F32, MemCategory::Other, "w_norm");
  Tensor rstd_bad = Tensor::zeros({5}, DType::F32, MemCategory::Other, "rstd_bad");
  EXPECT_ERROR_CONTAINS(kernels::rmsnorm_forward(cpu, y, rstd_bad, x, w_norm, 1e-5), "'y' has shape");
  Tensor y_norm = Tensor::zeros({4, 3}, DType::F32, MemCategory::Other, "y_norm");
  EXPECT_ERROR_CONTAINS(kernels::rmsnorm_forward(cpu, y_norm, rstd_bad, x, w_norm, 1e-5), "'rstd_bad'");
}
