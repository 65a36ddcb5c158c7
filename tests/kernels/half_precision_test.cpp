// bf16 and fp16 on the CPU backend: every 16-bit kernel (linear on each CPU GEMM library, RMSNorm,
// LayerNorm, GeLU, SwiGLU, the residual add) against the f64 instantiation run on the same rounded
// inputs, within TransformerEngine's tolerances (bf16 rtol 1.6e-2, fp16 rtol 1e-3, atol 1e-5), at odd
// sizes. Also the f32 linear forced onto oneDNN (the path `megaton bench --cpu-gemm onednn`
// measures), and the errors for dtype combinations the CPU does not take.
#include <gtest/gtest.h>

#include <optional>

#include "../support/temp_dir.h"
#include "finite_diff.h"
#include "megaton/core/cpu_info.h"
#include "megaton/kernels/activation.h"
#include "megaton/kernels/cpu/gemm.h"
#include "megaton/kernels/cpu/onednn_matmul.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/norm.h"

using namespace megaton;
using kernels::cpu::GemmLibrary;

namespace {

const kernels::ExecContext cpu;
constexpr int64_t kRows = 37, kIn = 53, kOut = 29;  // odd sizes: no kernel may assume a multiple of a vector
constexpr double kBf16Rtol = 1.6e-2, kF16Rtol = 1e-3, kAtol = 1e-5;  // TransformerEngine's tolerances
constexpr double kF32Rtol = 1.3e-6;  // torch.testing's (and TransformerEngine's) for f32

double rtol(DType dtype) { return dtype == DType::BF16 ? kBf16Rtol : dtype == DType::F16 ? kF16Rtol : kF32Rtol; }

// Uniform values in [-1, 1) stored as `dtype`: bf16 tensors hold them rounded, and the reference
// below reads those rounded values, so the comparison measures the kernel, not the input rounding.
Tensor random(Shape shape, DType dtype, uint64_t seed, const std::string& name) {
  Tensor t = Tensor::empty(std::move(shape), DType::F64, MemCategory::Other, name);
  const std::vector<double> v = fd::random_vector(static_cast<size_t>(t.numel()), seed);
  std::copy(v.begin(), v.end(), t.data<double>());
  Tensor out = t.to(dtype);
  out.set_name(name);
  return out;
}

Tensor empty(Shape shape, DType dtype, const std::string& name) {
  return Tensor::empty(std::move(shape), dtype, MemCategory::Other, name);
}

// An f64 copy (the reference's input, or a result to compare), or an undefined tensor for one.
Tensor f64(const Tensor& t) {
  if (!t.defined()) return {};
  Tensor d = t.to(DType::F64);
  d.set_name(t.name());
  return d;
}

std::vector<double> values(const Tensor& t) {
  const Tensor d = t.to(DType::F64);
  return {d.data<double>(), d.data<double>() + d.numel()};
}

// got (computed in `dtype`) against the f64 reference.
::testing::AssertionResult close_in(DType dtype, const Tensor& got, const Tensor& want) {
  return fd::close_elementwise(values(got), values(want), rtol(dtype), kAtol);
}

// A zero f64 gradient shaped like g. The references accumulate into it and the test adds g's
// starting values itself: the reference shares its GEMM and templates with the kernel under test,
// so a kernel that overwrote instead of accumulating would otherwise be matched by one that did too.
Tensor zero_f64_like(const Tensor& g) { return Tensor::zeros(g.shape(), DType::F64, MemCategory::Other, g.name()); }

// start + increment, elementwise: what an accumulated gradient must hold.
Tensor plus(const Tensor& start, const Tensor& increment) {
  Tensor sum = f64(start);
  const Tensor inc = f64(increment);
  for (int64_t i = 0; i < sum.numel(); ++i) sum.data<double>()[i] += inc.data<double>()[i];
  return sum;
}

// Linear on one CPU GEMM library and operand dtype: bf16 and fp16 on the OpenBLAS fallback, bf16 on
// oneDNN (where oneDNN has it; an AVX2-only CPU does not) and f32 on oneDNN.
struct GemmCase {
  DType dtype;
  GemmLibrary library;
};

class LinearOnCpuGemm : public ::testing::TestWithParam<GemmCase> {
 protected:
  void SetUp() override {
    const GemmCase c = GetParam();
    if (c.library == GemmLibrary::OneDnn &&
        !(kernels::cpu::onednn_has_matmul(c.dtype, c.dtype) && kernels::cpu::onednn_has_matmul(c.dtype, DType::F32)))
      GTEST_SKIP() << "oneDNN has no " << dtype_name(c.dtype) << " matmul on this CPU (" << describe(cpu_info())
                   << ")";
    kernels::cpu::force_gemm_library(c.library);
  }
  void TearDown() override { kernels::cpu::force_gemm_library(std::nullopt); }

  DType dtype() const { return GetParam().dtype; }
  ::testing::AssertionResult close(const Tensor& got, const Tensor& want) const {
    return close_in(dtype(), got, want);
  }
};

TEST_P(LinearOnCpuGemm, ForwardMatchesTheF64ReferenceWithoutAndWithEachBiasDtype) {
  const Tensor x = random({kRows, kIn}, dtype(), 1, "x"), w = random({kOut, kIn}, dtype(), 2, "w");
  for (const DType bias_dtype : {DType::F64, DType::F32, dtype()}) {  // F64 stands for "no bias"
    const Tensor b = bias_dtype == DType::F64 ? Tensor() : random({kOut}, bias_dtype, 3, "b");
    SCOPED_TRACE(b.defined() ? "bias " + std::string(dtype_name(bias_dtype)) : "no bias");
    const Tensor y = empty({kRows, kOut}, dtype(), "y"), y_ref = empty({kRows, kOut}, DType::F64, "y_ref");
    kernels::linear_forward(cpu, y, x, w, b);
    kernels::linear_forward(cpu, y_ref, f64(x), f64(w), f64(b));
    EXPECT_TRUE(close(y, y_ref));
  }
}

TEST_P(LinearOnCpuGemm, BackwardInputMatchesTheF64Reference) {
  const Tensor dy = random({kRows, kOut}, dtype(), 4, "dy"), w = random({kOut, kIn}, dtype(), 2, "w");
  const Tensor dx = empty({kRows, kIn}, dtype(), "dx"), dx_ref = empty({kRows, kIn}, DType::F64, "dx_ref");
  kernels::linear_backward_input(cpu, dx, dy, w);
  kernels::linear_backward_input(cpu, dx_ref, f64(dy), f64(w));
  EXPECT_TRUE(close(dx, dx_ref));
}

// dw and dbias start from values like a previous micro-batch's: they must be added to, not overwritten.
TEST_P(LinearOnCpuGemm, BackwardWeightAccumulatesIntoAnF32Gradient) {
  const Tensor dy = random({kRows, kOut}, dtype(), 4, "dy"), x = random({kRows, kIn}, dtype(), 1, "x");
  const Tensor dw = random({kOut, kIn}, DType::F32, 5, "dw"), db = random({kOut}, DType::F32, 6, "db");
  const Tensor dw_start = f64(dw), db_start = f64(db), dw_inc = zero_f64_like(dw), db_inc = zero_f64_like(db);
  kernels::linear_backward_weight(cpu, dw, db, dy, x);
  kernels::linear_backward_weight(cpu, dw_inc, db_inc, f64(dy), f64(x));
  EXPECT_TRUE(close(dw, plus(dw_start, dw_inc)));
  EXPECT_TRUE(close(db, plus(db_start, db_inc)));
}

INSTANTIATE_TEST_SUITE_P(Paths, LinearOnCpuGemm,
                         ::testing::Values(GemmCase{DType::BF16, GemmLibrary::OpenBlas},
                                           GemmCase{DType::F16, GemmLibrary::OpenBlas},
                                           GemmCase{DType::BF16, GemmLibrary::OneDnn},
                                           GemmCase{DType::F32, GemmLibrary::OneDnn}),
                         [](const ::testing::TestParamInfo<GemmCase>& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_" +
                                  kernels::cpu::gemm_library_name(info.param.library);
                         });

TEST(HalfLinear, UnsupportedDtypeCombinationsAreErrorsNamingTheOpAndTensor) {
  const Tensor x = random({kRows, kIn}, DType::BF16, 1, "x"), w = random({kOut, kIn}, DType::BF16, 2, "w");
  const Tensor y = empty({kRows, kOut}, DType::BF16, "y"), dy = random({kRows, kOut}, DType::BF16, 4, "dy");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, x, w, random({kOut}, DType::F64, 3, "b")), "linear_forward",
                        "'b' holds f64", "expected f32 or bf16");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, random({kRows, kIn}, DType::F32, 1, "x32"), w, Tensor()),
                        "linear_forward", "'x32' holds f32, expected bf16");
  EXPECT_ERROR_CONTAINS(kernels::linear_backward_weight(cpu, empty({kOut, kIn}, DType::BF16, "dw"), Tensor(), dy, x),
                        "linear_backward_weight", "'dw' holds bf16, expected f32");
  EXPECT_ERROR_CONTAINS(kernels::linear_backward_weight(cpu, empty({kOut, kIn}, DType::F32, "dw"),
                                                        empty({kOut}, DType::BF16, "db"), dy, x),
                        "linear_backward_weight", "'db' holds bf16, expected f32");
  const Tensor h = random({kRows, kIn}, DType::F16, 1, "h"), wh = random({kOut, kIn}, DType::F16, 2, "wh");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, empty({kRows, kOut}, DType::F16, "yh"), h, wh,
                                                random({kOut}, DType::BF16, 3, "bh")),
                        "linear_forward", "'bh' holds bf16", "expected f32 or f16 next to f16 activations");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, empty({kRows, kOut}, DType::F16, "yh"), h, w, Tensor()),
                        "linear_forward", "'yh' holds f16, expected bf16");
}

// Forcing oneDNN where it has no bf16 matmul (an AVX2-only CPU) is an error naming the CPU, not a
// silent fallback or a crash.
TEST(HalfLinear, ForcedOneDnnWithoutItsBf16MatmulIsAnErrorNamingTheCpu) {
  if (kernels::cpu::onednn_has_matmul(DType::BF16, DType::BF16))
    GTEST_SKIP() << "oneDNN has a bf16 matmul on this CPU (" << describe(cpu_info()) << ")";
  kernels::cpu::force_gemm_library(GemmLibrary::OneDnn);
  const Tensor x = random({kRows, kIn}, DType::BF16, 1, "x"), w = random({kOut, kIn}, DType::BF16, 2, "w");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, empty({kRows, kOut}, DType::BF16, "y"), x, w, Tensor()),
                        "oneDNN has no matmul for bf16 operands", describe(cpu_info()));
  kernels::cpu::force_gemm_library(std::nullopt);
}

// The norms with 16-bit activations and f32 or same-typed parameters (the test's parameter).
struct NormCase {
  DType activations, weights;
};
class HalfNorm : public ::testing::TestWithParam<NormCase> {};

// Forward, input gradient and (accumulated) weight gradient of RMSNorm; rstd is f32.
TEST_P(HalfNorm, RmsNormMatchesTheF64Reference) {
  const DType ad = GetParam().activations, pd = GetParam().weights;
  const Tensor x = random({kRows, kIn}, ad, 1, "x"), w = random({kIn}, pd, 2, "w");
  const Tensor dy = random({kRows, kIn}, ad, 3, "dy"), dw = random({kIn}, pd, 4, "dw");
  const Tensor y = empty({kRows, kIn}, ad, "y"), rstd = empty({kRows}, DType::F32, "rstd");
  const Tensor dx = empty({kRows, kIn}, ad, "dx");
  const Tensor y_ref = empty({kRows, kIn}, DType::F64, "y"), rstd_ref = empty({kRows}, DType::F64, "rstd");
  const Tensor dx_ref = empty({kRows, kIn}, DType::F64, "dx"), dw_start = f64(dw), dw_inc = zero_f64_like(dw);
  kernels::rmsnorm_forward(cpu, y, rstd, x, w, 1e-5);
  kernels::rmsnorm_backward_input(cpu, dx, dy, x, w, rstd);
  kernels::rmsnorm_backward_weight(cpu, dw, dy, x, rstd);
  kernels::rmsnorm_forward(cpu, y_ref, rstd_ref, f64(x), f64(w), 1e-5);
  kernels::rmsnorm_backward_input(cpu, dx_ref, f64(dy), f64(x), f64(w), rstd_ref);
  kernels::rmsnorm_backward_weight(cpu, dw_inc, f64(dy), f64(x), rstd_ref);
  EXPECT_TRUE(close_in(ad, y, y_ref));
  EXPECT_TRUE(close_in(ad, rstd, rstd_ref));
  EXPECT_TRUE(close_in(ad, dx, dx_ref));
  EXPECT_TRUE(close_in(ad, dw, plus(dw_start, dw_inc)));
}

// The same for LayerNorm with a bias; inputs are offset from zero so that the mean matters.
TEST_P(HalfNorm, LayerNormMatchesTheF64Reference) {
  const DType ad = GetParam().activations, pd = GetParam().weights;
  Tensor x64 = f64(random({kRows, kIn}, DType::F64, 1, "x"));
  for (int64_t i = 0; i < x64.numel(); ++i) x64.data<double>()[i] += 0.75;
  const Tensor x = x64.to(ad), w = random({kIn}, pd, 2, "w"), b = random({kIn}, pd, 3, "b");
  const Tensor dy = random({kRows, kIn}, ad, 4, "dy");
  const Tensor dw = random({kIn}, pd, 5, "dw"), db = random({kIn}, pd, 6, "db");
  const Tensor y = empty({kRows, kIn}, ad, "y"), dx = empty({kRows, kIn}, ad, "dx");
  const Tensor mean = empty({kRows}, DType::F32, "mean"), rstd = empty({kRows}, DType::F32, "rstd");
  const Tensor y_ref = empty({kRows, kIn}, DType::F64, "y"), dx_ref = empty({kRows, kIn}, DType::F64, "dx");
  const Tensor mean_ref = empty({kRows}, DType::F64, "mean"), rstd_ref = empty({kRows}, DType::F64, "rstd");
  const Tensor dw_start = f64(dw), db_start = f64(db), dw_inc = zero_f64_like(dw), db_inc = zero_f64_like(db);
  kernels::layernorm_forward(cpu, y, mean, rstd, x, w, b, 1e-5);
  kernels::layernorm_backward_input(cpu, dx, dy, x, w, mean, rstd);
  kernels::layernorm_backward_weight(cpu, dw, db, dy, x, mean, rstd);
  kernels::layernorm_forward(cpu, y_ref, mean_ref, rstd_ref, f64(x), f64(w), f64(b), 1e-5);
  kernels::layernorm_backward_input(cpu, dx_ref, f64(dy), f64(x), f64(w), mean_ref, rstd_ref);
  kernels::layernorm_backward_weight(cpu, dw_inc, db_inc, f64(dy), f64(x), mean_ref, rstd_ref);
  EXPECT_TRUE(close_in(ad, y, y_ref));
  EXPECT_TRUE(close_in(ad, mean, mean_ref));
  EXPECT_TRUE(close_in(ad, rstd, rstd_ref));
  EXPECT_TRUE(close_in(ad, dx, dx_ref));
  EXPECT_TRUE(close_in(ad, dw, plus(dw_start, dw_inc)));
  EXPECT_TRUE(close_in(ad, db, plus(db_start, db_inc)));
}

INSTANTIATE_TEST_SUITE_P(Params, HalfNorm,
                         ::testing::Values(NormCase{DType::BF16, DType::F32}, NormCase{DType::BF16, DType::BF16},
                                           NormCase{DType::F16, DType::F32}, NormCase{DType::F16, DType::F16}),
                         [](const ::testing::TestParamInfo<NormCase>& info) {
                           return std::string(dtype_name(info.param.activations)) + "_" +
                                  std::string(dtype_name(info.param.weights)) + "_weights";
                         });

TEST(HalfNorm, StatisticsAndParametersOfAnotherDtypeAreErrorsNamingTheTensor) {
  const Tensor x = random({kRows, kIn}, DType::BF16, 1, "x"), y = empty({kRows, kIn}, DType::BF16, "y");
  EXPECT_ERROR_CONTAINS(kernels::rmsnorm_forward(cpu, y, empty({kRows}, DType::BF16, "rstd"), x,
                                                 random({kIn}, DType::F32, 2, "w"), 1e-5),
                        "rmsnorm_forward", "'rstd' holds bf16, expected f32");
  EXPECT_ERROR_CONTAINS(kernels::rmsnorm_forward(cpu, y, empty({kRows}, DType::F32, "rstd"), x,
                                                 random({kIn}, DType::F64, 2, "w"), 1e-5),
                        "rmsnorm_forward", "'w' holds f64, expected f32 or bf16");
  EXPECT_ERROR_CONTAINS(kernels::layernorm_forward(cpu, y, empty({kRows}, DType::F32, "mean"),
                                                   empty({kRows}, DType::F32, "rstd"), x,
                                                   random({kIn}, DType::F32, 2, "w"),
                                                   random({kIn}, DType::BF16, 3, "b"), 1e-5),
                        "layernorm_forward", "'b' holds bf16, expected f32");
}

TEST(HalfActivation, GeluSwigluAndResidualMatchTheF64Reference) {
  for (const DType ad : {DType::BF16, DType::F16}) {
  SCOPED_TRACE(dtype_name(ad));
  const Tensor x = random({kRows, kIn}, ad, 1, "x"), dy = random({kRows, kIn}, ad, 2, "dy");
  const Tensor y = empty({kRows, kIn}, ad, "y"), dx = empty({kRows, kIn}, ad, "dx");
  const Tensor y_ref = empty({kRows, kIn}, DType::F64, "y"), dx_ref = empty({kRows, kIn}, DType::F64, "dx");
  kernels::gelu_forward(cpu, y, x);
  kernels::gelu_backward(cpu, dx, dy, x);
  kernels::gelu_forward(cpu, y_ref, f64(x));
  kernels::gelu_backward(cpu, dx_ref, f64(dy), f64(x));
  EXPECT_TRUE(close_in(ad, y, y_ref));
  EXPECT_TRUE(close_in(ad, dx, dx_ref));

  // SwiGLU on [gate | up] of width 2 * kOut, gates spread over [-4, 4) so the sigmoid bends.
  Tensor gu64 = f64(random({kRows, 2 * kOut}, DType::F64, 3, "gu"));
  for (int64_t i = 0; i < gu64.numel(); ++i) gu64.data<double>()[i] *= 4.0;
  const Tensor gu = gu64.to(ad), dh = random({kRows, kOut}, ad, 4, "dh");
  const Tensor h = empty({kRows, kOut}, ad, "h"), dgu = empty({kRows, 2 * kOut}, ad, "dgu");
  const Tensor h_ref = empty({kRows, kOut}, DType::F64, "h"), dgu_ref = empty({kRows, 2 * kOut}, DType::F64, "dgu");
  kernels::swiglu_forward(cpu, h, gu);
  kernels::swiglu_backward(cpu, dgu, dh, gu);
  kernels::swiglu_forward(cpu, h_ref, f64(gu));
  kernels::swiglu_backward(cpu, dgu_ref, f64(dh), f64(gu));
  EXPECT_TRUE(close_in(ad, h, h_ref));
  EXPECT_TRUE(close_in(ad, dgu, dgu_ref));

  const Tensor sum = empty({kRows, kIn}, ad, "sum"), sum_ref = empty({kRows, kIn}, DType::F64, "sum");
  kernels::residual_forward(cpu, sum, x, dy);
  kernels::residual_forward(cpu, sum_ref, f64(x), f64(dy));
  EXPECT_TRUE(close_in(ad, sum, sum_ref));
  }
}

}  // namespace
