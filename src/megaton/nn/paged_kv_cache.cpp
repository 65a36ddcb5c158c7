#include "megaton/nn/paged_kv_cache.h"

#include <algorithm>
#include <numeric>

#include "megaton/core/error.h"

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

}  // namespace megaton::nn
