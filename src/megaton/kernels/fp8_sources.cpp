#include "megaton/kernels/fp8_sources.h"

#include "megaton/kernels/cpu/activation.h"
#include "megaton/kernels/cpu/norm.h"

#include <type_traits>

namespace megaton::kernels {

namespace {

// Runs f(T{}) for f32 or bf16 activations on the host; the fused producers have no other forms.
template <typename F>
void on_fp8_activation(std::string_view op, const Tensor& x, F&& f) {
  if (!x.device().is_cpu()) fail("kernel ", op, ": '", x.name(), "' is on ", x.device().str(), "; it runs on the cpu only");
  if (x.dtype() == DType::F32) return f(float{});
  if (x.dtype() == DType::BF16) return f(BFloat16{});
  fail("kernel ", op, ": '", x.name(), "' holds ", dtype_name(x.dtype()), "; the fused FP8 forms take f32 or bf16");
}

void expect_rows(std::string_view op, const Tensor& t, int64_t N) {
  if (t.defined()) expect_matrix(op, t, 1, N);
}

}  // namespace

void norm_statistics(const ExecContext& ctx, const Tensor& sum, const Tensor& mean, const Tensor& rstd,
                     const Tensor& x, const Tensor& residual, double eps) {
  constexpr std::string_view op = "norm_statistics";
  expect_on_device(ctx, op, {&x, &rstd});
  if (!ctx.device.is_cpu()) fail_no_backend(ctx, op);
  MEGATON_CHECK(x.dim() >= 1 && x.numel() > 0, "kernel ", op, ": empty input '", x.name(), "'");
  const int64_t C = x.size(-1), N = x.numel() / C;
  expect_rows(op, rstd, N);
  expect_rows(op, mean, N);
  if (residual.defined()) {
    expect_matrix(op, residual, N, C);
    expect_matrix(op, sum, N, C);
    expect_dtype(x.dtype(), op, {&residual, &sum});
  }
  expect_dtype(DType::F32, op, {&rstd});
  if (mean.defined()) expect_dtype(DType::F32, op, {&mean});
  on_fp8_activation(op, x, [&]<typename T>(T) {
    cpu::norm_statistics(data_or_null<T>(sum), data_or_null<float>(mean), rstd.data<float>(), x.data<T>(),
                         data_or_null<T>(residual), N, C, eps);
  });
}

Fp8Source norm_fp8_source(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight,
                          const Tensor& bias, const std::string& name) {
  constexpr std::string_view op = "norm_fp8_source";
  const int64_t C = weight.numel();
  if (x.dim() == 0 || x.size(-1) != C)
    fail("kernel ", op, ": input '", x.name(), "' has shape ", shape_str(x.shape()), ", expected [..., ", C, "]");
  const int64_t N = x.numel() / C;
  expect_rows(op, rstd, N);
  expect_rows(op, mean, N);
  if (bias.defined()) expect_dtype(weight.dtype(), op, {&bias});
  Fp8Source src{N, C, name, {}};
  on_fp8_activation(op, x, [&]<typename T>(T) {
    const auto make = [&]<typename W>(W) {
      src.fill = [x, mean, rstd, weight, bias, C](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out, int64_t ld) {
        cpu::normalize_block_f32(out, ld, x.data<T>(), data_or_null<float>(mean), rstd.data<float>(), weight.data<W>(),
                                 data_or_null<W>(bias), C, r0, r1, c0, c1);
      };
    };
    if (weight.dtype() == DType::F32) return make(float{});
    if constexpr (std::is_same_v<T, BFloat16>)
      if (weight.dtype() == DType::BF16) return make(BFloat16{});
    fail("kernel ", op, ": weight '", weight.name(), "' holds ", dtype_name(weight.dtype()), " beside ",
         dtype_name(x.dtype()), " activations");
  });
  return src;
}

Fp8Source activation_fp8_source(const Tensor& h, const Tensor& bias, bool swiglu, const std::string& name) {
  constexpr std::string_view op = "activation_fp8_source";
  MEGATON_CHECK(h.dim() >= 1 && h.numel() > 0, "kernel ", op, ": empty input '", h.name(), "'");
  const int64_t width = h.size(-1), N = h.numel() / width;
  if (swiglu && width % 2 != 0)
    fail("kernel ", op, ": input '", h.name(), "' has shape ", shape_str(h.shape()), ", expected [..., 2H] ([gate | up])");
  const int64_t F = swiglu ? width / 2 : width;
  if (bias.defined()) {
    expect_matrix(op, bias, 1, width);
    expect_dtype(DType::F32, op, {&bias});
  }
  Fp8Source src{N, F, name, {}};
  on_fp8_activation(op, h, [&]<typename T>(T) {
    src.fill = [h, bias, swiglu, F](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out, int64_t ld) {
      cpu::activation_block_f32(out, ld, h.data<T>(), data_or_null<float>(bias), swiglu, F, r0, r1, c0, c1);
    };
  });
  return src;
}

}  // namespace megaton::kernels
