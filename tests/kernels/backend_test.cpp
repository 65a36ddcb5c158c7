// The tensor-level kernel API on every backend this build has: linear, RMSNorm and GeLU forward and
// backward against the CPU reference kernels run in double on the same (dtype-rounded) inputs, and
// the dispatcher's errors. On a machine without a CUDA device the CUDA cases report
// "skipped: no CUDA device" (or "built without CUDA").
#include <gtest/gtest.h>


#include "../support/temp_dir.h"
#include "finite_diff.h"
#include "megaton/kernels/activation.h"
#include "megaton/kernels/cpu/activation.h"
#include "megaton/kernels/cpu/linear.h"
#include "megaton/kernels/cpu/norm.h"
#include "megaton/kernels/linear.h"
#include "megaton/kernels/norm.h"
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

INSTANTIATE_TEST_SUITE_P(Kernels, Backends,
                         ::testing::Values(Backend{Device::cpu(), DType::F32}, Backend{Device::cpu(), DType::F64},
                                           Backend{Device::cuda(0), DType::F32},
                                           Backend{Device::cuda(0), DType::BF16}),
                         backend_name);

TEST(KernelDispatch, ErrorsNameTheOpAndTheTensor) {
  const kernels::ExecContext cpu{};
  Tensor x = Tensor::zeros({4, 3}, DType::F32, MemCategory::Other, "x");
  Tensor w = Tensor::zeros({5, 3}, DType::F32, MemCategory::Other, "w");
  Tensor y = Tensor::zeros({4, 5}, DType::F32, MemCategory::Other, "y");
  Tensor w64 = Tensor::zeros({5, 3}, DType::F64, MemCategory::Other, "w64");
  Tensor y_bad = Tensor::zeros({4, 6}, DType::F32, MemCategory::Other, "y_bad");
  Tensor x_bad = Tensor::zeros({4, 2}, DType::F32, MemCategory::Other, "x_bad");
  Tensor x16 = Tensor::zeros({4, 3}, DType::F16, MemCategory::Other, "x16");
  EXPECT_NO_THROW(kernels::linear_forward(cpu, y, x, w, Tensor()));
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, x, w64, Tensor()), "'y' holds f32, expected f64");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y_bad, x, w, Tensor()), "'y_bad' has shape [4, 6]");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, x_bad, w, Tensor()), "input 'x_bad'");
  EXPECT_ERROR_CONTAINS(kernels::linear_forward(cpu, y, Tensor(), w, Tensor()), "undefined");
  EXPECT_ERROR_CONTAINS(kernels::gelu_forward(cpu, x16, x16), "gelu_forward on cpu does not support dtype f16");
  const kernels::ExecContext gpu{Device::cuda(0), nullptr};
  EXPECT_ERROR_CONTAINS(kernels::gelu_forward(gpu, x, x), "tensor 'x' is on cpu, the call runs on cuda:0");
  Tensor w_norm = Tensor::zeros({3}, DType::F32, MemCategory::Other, "w_norm");
  Tensor rstd_bad = Tensor::zeros({5}, DType::F32, MemCategory::Other, "rstd_bad");
  EXPECT_ERROR_CONTAINS(kernels::rmsnorm_forward(cpu, y, rstd_bad, x, w_norm, 1e-5), "'y' has shape");
  Tensor y_norm = Tensor::zeros({4, 3}, DType::F32, MemCategory::Other, "y_norm");
  EXPECT_ERROR_CONTAINS(kernels::rmsnorm_forward(cpu, y_norm, rstd_bad, x, w_norm, 1e-5), "'rstd_bad'");
}
