#include "megaton/nn/paged_kv_cache.h"

#include <algorithm>
#include <numeric>

#include "megaton/core/error.h"
#include "megaton/kernels/copy.h"
#include "megaton/nn/linear.h"

namespace megaton::nn {

PagedKVCache::PagedKVCache(const std::vector<PagedLayerSpec>& specs, int64_t num_pages, int64_t page_size, DType dtype)
    : num_pages_(num_pages), page_size_(page_size), dtype_(dtype) {
  if (page_size < 1 || page_size > (1 << 20)) fail("KV cache page size ", page_size, " outside 1 .. 2^20 tokens");
  if (num_pages < 1 || num_pages > INT32_MAX) fail("KV cache of ", num_pages, " pages outside 1 .. 2^31 - 1");
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F8E4M3)
    fail("KV cache dtype ", dtype_name(dtype), " is not supported (f32, bf16 or f8e4m3)");
  const bool fp8 = dtype == DType::F8E4M3;
  for (const PagedLayerSpec& spec : specs) {
    if (spec.cols < 1) fail("KV cache layer of ", spec.cols, " columns");
    if (fp8 && (spec.head_dim < 1 || spec.cols % spec.head_dim != 0))
      fail("FP8 KV cache: head_dim ", spec.head_dim, " does not divide a layer's ", spec.cols, " columns");
    const Shape shape{num_pages, page_size, spec.cols};
    Layer l;
    l.k = Tensor::zeros(shape, dtype, MemCategory::Activations, "paged_kv.k");
    if (!spec.keys_only) l.v = Tensor::zeros(shape, dtype, MemCategory::Activations, "paged_kv.v");
    if (fp8) {
      const Shape scales{num_pages, page_size, spec.cols / spec.head_dim};
      l.k_scale = Tensor::zeros(scales, DType::F32, MemCategory::Activations, "paged_kv.k_scale");
      if (!spec.keys_only) l.v_scale = Tensor::zeros(scales, DType::F32, MemCategory::Activations, "paged_kv.v_scale");
    }
    layers_.push_back(std::move(l));
  }
  free_.resize(static_cast<size_t>(num_pages));
  // Popped from the back: page 0 first.
  std::iota(free_.rbegin(), free_.rend(), 0);
}

bool PagedKVCache::reserve(PagedSequence& seq, int64_t tokens) {
  const int64_t need = pages_for(tokens) - static_cast<int64_t>(seq.pages.size());
  if (need <= 0) return true;
  if (need > free_pages()) return false;
  for (int64_t i = 0; i < need; ++i) {
    seq.pages.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void PagedKVCache::release(PagedSequence& seq) {
  free_.insert(free_.end(), seq.pages.rbegin(), seq.pages.rend());
  seq.pages.clear();
  seq.len = 0;
}

PagedBatch::PagedBatch(std::vector<PagedSequence*> s, int64_t t, int64_t page_size) : seqs(std::move(s)), tokens(t) {
  if (seqs.empty() || tokens < 1) fail("a paged step needs at least one sequence and one token, got ", seqs.size(),
                                       " and ", tokens);
  const auto S = static_cast<int64_t>(seqs.size());
  int64_t max_pages = 1;
  for (const PagedSequence* q : seqs) {
    if (static_cast<int64_t>(q->pages.size()) * page_size < q->len + tokens)
      fail("paged step: a sequence of ", q->len, " tokens has ", q->pages.size(), " pages of ", page_size,
           ", too few for ", tokens, " more (reserve them first)");
    max_pages = std::max<int64_t>(max_pages, static_cast<int64_t>(q->pages.size()));
  }
  page_table = Tensor::zeros({S, max_pages}, DType::I32, MemCategory::Activations, "page_table");
  lens = Tensor::empty({S}, DType::I64, MemCategory::Activations, "lens");
  for (int64_t i = 0; i < S; ++i) {
    const PagedSequence& q = *seqs[static_cast<size_t>(i)];
    std::copy(q.pages.begin(), q.pages.end(), page_table.data<int32_t>() + i * max_pages);
    lens.data<int64_t>()[i] = q.len + tokens;
  }
}

namespace {

// One layer's pages (and their FP8 scales) viewed one unit per row: [1, num_pages * page_size * units, width].
struct UnitRows {
  UnitRows(const Tensor& pages, const Tensor& scales, int64_t units) : fp8(pages.dtype() == DType::F8E4M3) {
    if (units < 1 || pages.size(2) % units != 0)
      fail("paged KV: ", units, " units per token do not divide a page row of ", pages.size(2), " columns");
    const int64_t pool = pages.size(0) * pages.size(1) * units;
    width = pages.size(2) / units;
    rows = pages.view({1, pool, width});
    if (fp8) unit_scales = scales.view({1, pool, 1});
  }
  bool fp8;
  int64_t width = 0;
  Tensor rows, unit_scales;
};

}  // namespace

void write_pages(const kernels::ExecContext& on, const PagedBatch& batch, const Tensor& pages, const Tensor& scales,
                 int64_t units, const Tensor& src, int64_t col) {
  const UnitRows dst(pages, scales, units);
  const int64_t T = batch.tokens, P = pages.size(1);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const PagedSequence& seq = *batch.seqs[s];
    for (int64_t t = 0; t < T;) {
      const int64_t pos = seq.len + t, slot = pos % P, run = std::min(T - t, P - slot);
      const int64_t at = (seq.pages.at(static_cast<size_t>(pos / P)) * P + slot) * units;
      const int64_t from = (static_cast<int64_t>(s) * T + t) * units;
      if (dst.fp8)
        kernels::encode_fp8_rows(on, dst.rows, dst.unit_scales, at, {src, from, col}, run * units);
      else
        kernels::copy_rows(on, {dst.rows, at, 0}, {src, from, col}, run * units, dst.width);
      t += run;
    }
  }
}

Tensor gather_pages(const kernels::ExecContext& on, const PagedSequence& seq, int64_t tokens, const Tensor& pages,
                    const Tensor& scales, int64_t units, const std::string& name) {
  const UnitRows from(pages, scales, units);
  const int64_t P = pages.size(1);
  Tensor out = new_activation({tokens, pages.size(2)}, name, from.fp8 ? DType::F32 : pages.dtype());
  const Tensor out_rows = out.view({1, tokens * units, from.width});
  for (int64_t t = 0; t < tokens; t += P) {
    const int64_t n = std::min(P, tokens - t), at = seq.pages.at(static_cast<size_t>(t / P)) * P * units;
    if (from.fp8)
      kernels::decode_fp8_rows(on, {out_rows, t * units, 0}, from.rows, from.unit_scales, at, n * units);
    else
      kernels::copy_rows(on, {out_rows, t * units, 0}, {from.rows, at, 0}, n * units, from.width);
  }
  return out;
}

}  // namespace megaton::nn
