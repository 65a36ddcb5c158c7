// A linear's input that need not be written out: a norm's output (LayerNormLinear / RMSNormLinear;
// LayerNormMLP's fc2 input is made in fc1's GEMM epilogue instead, nn/mlp.h). A linear running its GEMMs in FP8
// quantises it straight from its producer (kernels/fp8_sources.h), as TransformerEngine's fused layers cast it, so the
// compute-dtype tensor never exists; any other linear, or one that must first gather the rows over its
// sequence-parallel group, asks for written(), the tensor as the unfused op makes it.
#pragma once
#include <functional>

#include "megaton/kernels/fp8_quantize.h"

namespace megaton::nn {

class FusedInput {
 public:
  using Write = std::function<Tensor()>;
  // Runs what the values depend on first (a norm's statistics), then returns the producer.
  using Produce = std::function<kernels::Fp8Source()>;
  FusedInput(DType dtype, Write write, Produce produce)
      : dtype_(dtype), write_(std::move(write)), produce_(std::move(produce)) {}
  // An ordinary tensor, read (and widened) by the quantiser as it is.
  static FusedInput of(const Tensor& x) {
    return {x.dtype(), [x] { return x; }, [x] { return kernels::fp8_source(x.view({x.numel() / x.size(-1), x.size(-1)})); }};
  }

  DType dtype() const { return dtype_; }  // the compute dtype the written tensor has
  // The tensor, made on the first call. An input is consumed one way: written, or produced.
  const Tensor& written() {
    MEGATON_CHECK(!produced_, "fused input: written() after source()");
    if (!written_.defined()) written_ = write_();
    return written_;
  }
  kernels::Fp8Source source() {
    MEGATON_CHECK(!produced_ && !written_.defined(), "fused input: source() after it was written or produced");
    produced_ = true;
    return produce_();
  }
  // The written tensor, undefined when the input was produced instead.
  const Tensor& output() const { return written_; }

 private:
  DType dtype_;
  Write write_;
  Produce produce_;
  Tensor written_;
  bool produced_ = false;
};

}  // namespace megaton::nn
