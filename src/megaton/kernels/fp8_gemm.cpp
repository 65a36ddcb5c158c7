#include "megaton/kernels/fp8_gemm.h"

#include <algorithm>
#include <array>
#include <vector>

#include "megaton/kernels/cpu/element.h"
#include "megaton/kernels/cpu/gemm.h"
#ifdef MEGATON_WITH_CUDA
#include "megaton/kernels/cuda/fp8_gemm.h"
#endif

namespace megaton::kernels {

namespace {

// Columns [k0, k0 + kw) of rows [r0, r1) of m, widened into a row-major [r1 - r0, kw] panel of T;
// with fold_scales each value is multiplied by its (power-of-two, so exact) MX scale.
template <typename T>
void widen(const Fp8Matrix& m, int64_t r0, int64_t r1, int64_t k0, int64_t kw, bool fold_scales, T* panel) {
  std::array<float, 256> value;
  for (int c = 0; c < 256; ++c) value[static_cast<size_t>(c)] = fp8::decode(static_cast<uint8_t>(c), m.format());
  const int64_t cols = m.data.size(1);
  const auto* codes = static_cast<const uint8_t*>(m.data.raw());
  const int64_t tile_cols = m.tile().cols;
#pragma omp parallel for schedule(static)
  for (int64_t r = r0; r < r1; ++r) {
    float scale = 1.0f;  // the folded scale of the tile (k0 + k) lies in, looked up as a tile starts
    for (int64_t k = 0; k < kw; ++k) {
      if (fold_scales && (k == 0 || (k0 + k) % tile_cols == 0)) scale = m.scale_inv_at(r, k0 + k);
      panel[(r - r0) * kw + k] = cpu::store<T>(value[codes[r * cols + k0 + k]] * scale);
    }
  }
}

// widen into a panel tensor of the GEMM's operand dtype, at element `offset`.
void widen_into(const Tensor& panel, int64_t offset, const Fp8Matrix& m, int64_t r0, int64_t r1, int64_t k0, int64_t kw,
                bool fold_scales) {
  if (panel.dtype() == DType::BF16)
    widen(m, r0, r1, k0, kw, fold_scales, panel.data<BFloat16>() + offset);
  else
    widen(m, r0, r1, k0, kw, fold_scales, panel.data<float>() + offset);
}

// The K-group width: scales are constant over a group for both operands.
int64_t group_width(const Fp8Matrix& a, const Fp8Matrix& b, int64_t K) {
  return std::max<int64_t>(1, std::min({a.tile().cols, b.tile().cols, K}));
}

}  // namespace

void fp8_gemm(const ExecContext& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b, bool accumulate,
              const Tensor& bias, const Fp8RowsDone& rows_done) {
  expect_on_device(ctx, "fp8_gemm", {&out, &a.data, &b.data, &a.scale_inv, &b.scale_inv});
  MEGATON_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(1),
                "fp8_gemm: operands '", a.data.name(), "' ", shape_str(a.data.shape()), " and '", b.data.name(), "' ",
                shape_str(b.data.shape()), " must be [M, K] and [N, K]");
  const int64_t M = a.data.size(0), N = b.data.size(0), K = a.data.size(1);
  expect_matrix("fp8_gemm", out, M, N);
  MEGATON_CHECK(out.dtype() == DType::F32 || (out.dtype() == DType::BF16 && !accumulate),
                "fp8_gemm writes f32 (or bf16 without accumulate), output '", out.name(), "' is ", dtype_name(out.dtype()));
  const bool mx = a.granularity == Fp8Granularity::Mx1x32;
  MEGATON_CHECK(mx == (b.granularity == Fp8Granularity::Mx1x32), "fp8_gemm: MXFP8 operands pair with MXFP8 only, got ",
                granularity_name(a.granularity), " x ", granularity_name(b.granularity));
  if (bias.defined()) {
    expect_on_device(ctx, "fp8_gemm", {&bias});
    expect_matrix("fp8_gemm", bias, 1, N);
    MEGATON_CHECK(bias.dtype() == DType::F32 || bias.dtype() == DType::BF16, "fp8_gemm: bias '", bias.name(), "' is ",
                  dtype_name(bias.dtype()), ", expected f32 or bf16");
  }
  if (M == 0 || N == 0) return;
  if (ctx.device.is_cuda()) {
#ifdef MEGATON_WITH_CUDA
    cuda::fp8_gemm(ctx, out, a, b, accumulate, bias);
    if (rows_done) rows_done(0, M);  // one stripe: the device has no host epilogue
    return;
#else
    fail("fp8_gemm on ", ctx.device.str(), ": this build has no CUDA backend");
#endif
  }

  const DType panel_dtype = cpu::gemm_library(DType::BF16) == cpu::GemmLibrary::OneDnn ? DType::BF16 : DType::F32;
  const int64_t group = mx ? K : group_width(a, b, K);
  const int64_t groups = K == 0 ? 1 : (K + group - 1) / group;
  // Rows go through in stripes when an epilogue waits for them, else all at once. Only on oneDNN:
  // OpenBLAS's sums depend on how many rows a call has (a stripe's values would differ in the last
  // bits from the whole GEMM's; oneDNN's do not, tests/kernels/fp8_gemm_test.cpp), so there the
  // GEMM runs whole and the epilogue walks its stripes afterwards.
  const int64_t stripe = rows_done && panel_dtype == DType::BF16 ? std::min(M, kFp8GemmStripeRows) : M;
  const bool striped = stripe < M;
  // The fp32 sum over groups: `out` itself when it is f32, else a stripe's workspace rounded to bf16.
  const bool f32_out = out.dtype() == DType::F32;
  Tensor acc = f32_out ? out : Tensor::empty({stripe, N}, DType::F32, MemCategory::Workspace, "fp8_gemm_acc");
  Tensor partial = Tensor::empty({stripe, N}, DType::F32, MemCategory::Workspace, "fp8_gemm_partial");
  Tensor pa =
      Tensor::empty({stripe, std::max<int64_t>(group, 1)}, panel_dtype, MemCategory::Workspace, "fp8_gemm_a_panel");
  // b's panels: widened group by group as they are used, or, when several stripes use them, all of
  // them once up front (group g's [N, kw] panel at element N * k0).
  Tensor pb = Tensor::empty({N, std::max<int64_t>(striped ? K : group, 1)}, panel_dtype, MemCategory::Workspace,
                            "fp8_gemm_b_panel");
  if (striped)
    for (int64_t k0 = 0; k0 < K; k0 += group) widen_into(pb, N * k0, b, 0, N, k0, std::min(group, K - k0), mx);
  const auto panel_at = [&](const Tensor& t, int64_t offset) {
    return static_cast<const char*>(t.raw()) + offset * static_cast<int64_t>(dtype_size(panel_dtype));
  };
  std::vector<float> sa(static_cast<size_t>(stripe)), sb(static_cast<size_t>(N)), bias_row;
  if (bias.defined()) {
    bias_row.resize(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n)
      bias_row[static_cast<size_t>(n)] =
          bias.dtype() == DType::F32 ? bias.data<float>()[n] : cpu::load(bias.data<BFloat16>()[n]);
  }
  for (int64_t m0 = 0; m0 < M; m0 += stripe) {
    const int64_t mt = std::min(stripe, M - m0);
    float* C = acc.data<float>() + (f32_out ? m0 * N : 0);
    if (!accumulate) std::fill(C, C + mt * N, 0.0f);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t k0 = g * group, kw = std::min(group, K - k0);
      widen_into(pa, 0, a, m0, m0 + mt, k0, kw, mx);
      if (!striped) widen_into(pb, 0, b, 0, N, k0, kw, mx);
      cpu::gemm({.M = mt,
                 .N = N,
                 .K = kw,
                 .in = panel_dtype,
                 .a = {pa.raw(), false},
                 .b = {panel_at(pb, striped ? N * k0 : 0), true},
                 .c = partial.raw(),
                 .c_dtype = DType::F32});
      for (int64_t m = 0; m < mt; ++m) sa[static_cast<size_t>(m)] = mx ? 1.0f : a.scale_inv_at(m0 + m, k0);
      for (int64_t n = 0; n < N; ++n) sb[static_cast<size_t>(n)] = mx ? 1.0f : b.scale_inv_at(n, k0);
      const float* P = partial.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t m = 0; m < mt; ++m)
        for (int64_t n = 0; n < N; ++n)
          C[m * N + n] += P[m * N + n] * sa[static_cast<size_t>(m)] * sb[static_cast<size_t>(n)];
    }
    if (bias.defined()) {
#pragma omp parallel for schedule(static)
      for (int64_t m = 0; m < mt; ++m)
        for (int64_t n = 0; n < N; ++n) C[m * N + n] += bias_row[static_cast<size_t>(n)];
    }
    if (!f32_out) {
      auto* dst = out.data<BFloat16>() + m0 * N;
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < mt * N; ++i) dst[i] = cpu::store<BFloat16>(C[i]);
    }
    if (rows_done)
      for (int64_t r0 = m0; r0 < m0 + mt; r0 += kFp8StripeRows) rows_done(r0, std::min(m0 + mt, r0 + kFp8StripeRows));
  }
}

}  // namespace megaton::kernels
