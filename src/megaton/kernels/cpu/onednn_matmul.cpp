#include "megaton/kernels/cpu/onednn_matmul.h"

#include <omp.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "megaton/core/cpu_info.h"
#include "megaton/core/error.h"

namespace megaton::kernels::cpu {

namespace {

using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dt onednn_type(DType t) {
  switch (t) {
    case DType::F32: return dt::f32;
    case DType::BF16: return dt::bf16;
    default: fail("oneDNN matmul: dtype ", dtype_name(t), " is not supported (f32 or bf16)");
  }
}

// Everything a matmul primitive is specialised on, including the threads it will run on: oneDNN
// splits the work for the threads it sees when the primitive is made, and a GEMM called inside an
// OpenMP parallel region (cpu/attention_bf16.cpp's tasks) runs on its caller's thread alone.
struct Key {
  int64_t M, N, K;
  DType in, c, bias;
  bool ta, tb, accumulate, has_bias;
  int threads;
  auto operator<=>(const Key&) const = default;
};

int gemm_threads() { return omp_in_parallel() ? 1 : omp_get_max_threads(); }

Key key_of(const Gemm& g) {
  return {g.M,
          g.N,
          g.K,
          g.in,
          g.c_dtype,
          g.bias ? g.bias_dtype : DType::F32,
          g.a.transposed,
          g.b.transposed,
          g.accumulate,
          g.bias != nullptr,
          gemm_threads()};
}

// A [rows, cols] matrix stored row-major, or, transposed, stored as its [cols, rows] transpose.
dnnl::memory::desc matrix(int64_t rows, int64_t cols, DType t, bool transposed) {
  return dnnl::memory::desc({rows, cols}, onednn_type(t),
                            transposed ? dnnl::memory::dims{1, rows} : dnnl::memory::dims{cols, 1});
}

// Scratchpad in user mode: each call passes its own, so one primitive may run on several threads at
// once (oneDNN's library-owned scratchpad is shared by all users of a primitive unless oneDNN is
// built for concurrent execution, which Debian's is not known to be).
dnnl::matmul::primitive_desc make_primitive_desc(const Key& k) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // dst = matmul + 1 * dst: the beta = 1 of a GEMM
    attr.set_post_ops(ops);
  }
  const dnnl::memory::desc bias = k.has_bias ? matrix(1, k.N, k.bias, false) : dnnl::memory::desc();
  const dnnl::matmul::desc desc(matrix(k.M, k.K, k.in, k.ta), matrix(k.K, k.N, k.in, k.tb), bias,
                                matrix(k.M, k.N, k.c, false));
  return dnnl::matmul::primitive_desc(desc, attr, engine());  // throws dnnl::error if unimplemented
}

struct Entry {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
};

// Creating a primitive (choosing and JIT-compiling a kernel) costs far more than a small GEMM, so
// primitives are kept per shape. A model has a few dozen GEMM shapes; the cap only stops a caller
// with ever-new shapes (generation with growing row counts) from growing the cache without bound.
// Returned by value (oneDNN objects are reference-counted handles): a later clear cannot pull a
// primitive from under a caller.
Entry cached_primitive(const Key& k) {
  constexpr size_t kCapacity = 512;
  static std::mutex mu;
  static std::map<Key, Entry> cache;
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(k); it != cache.end()) return it->second;
  if (cache.size() >= kCapacity) cache.clear();
  dnnl::matmul::primitive_desc pd = make_primitive_desc(k);
  dnnl::matmul primitive(pd);
  return cache.emplace(k, Entry{std::move(pd), std::move(primitive)}).first->second;
}

}  // namespace

bool onednn_has_matmul(DType in, DType c) {
  try {
    (void)make_primitive_desc({64, 64, 64, in, c, DType::F32, false, false, false, false, gemm_threads()});
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

void onednn_matmul(const Gemm& g) {
  Entry e;
  try {
    e = cached_primitive(key_of(g));
  } catch (const dnnl::error& err) {
    fail("oneDNN has no matmul for ", dtype_name(g.in), " operands and a ", dtype_name(g.c_dtype),
         " result on this CPU (", describe(cpu_info()), "): ", err.what());
  }
  const dnnl::matmul::primitive_desc& pd = e.pd;
  thread_local std::vector<char> scratch;
  scratch.resize(pd.scratchpad_desc().get_size());
  dnnl::engine& eng = engine();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(pd.src_desc(), eng, const_cast<void*>(g.a.data))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(pd.weights_desc(), eng, const_cast<void*>(g.b.data))},
      {DNNL_ARG_DST, dnnl::memory(pd.dst_desc(), eng, g.c)},
      {DNNL_ARG_SCRATCHPAD, dnnl::memory(pd.scratchpad_desc(), eng, scratch.data())}};
  if (g.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(pd.bias_desc(), eng, const_cast<void*>(g.bias)));
  thread_local dnnl::stream stream(eng);
  e.primitive.execute(stream, args);
  stream.wait();
}

}  // namespace megaton::kernels::cpu
