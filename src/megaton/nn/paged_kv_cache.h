// A paged KV cache, vLLM's PagedAttention layout: each layer's keys and values live in one pool of
// fixed-size pages, [num_pages, page_size, kv columns], and a sequence holds the ids of its pages
// in token order (its page table), taken from a shared free list as it is admitted and given back
// when it ends. Sequences of any length then share one allocation without fragmentation, and a
// batch of them decodes in one step whatever their lengths (kernels::paged_decode_attention).
#pragma once
#include <cstdint>
#include <vector>

#include "megaton/core/tensor.h"
#include "megaton/kernels/exec_context.h"

namespace megaton::nn {

// One sequence's share of the cache: its pages, and how many tokens they hold so far.
struct PagedSequence {
  std::vector<int32_t> pages;
  int64_t len = 0;
};

// What one layer keeps per token in its pages: `cols` columns of keys (and of values unless
// keys_only: MLA caches the latent [c | k_rope] alone, its values being the first columns), with one
// FP8 scale per head_dim columns in an FP8 cache.
struct PagedLayerSpec {
  PagedLayerSpec(int64_t kv_cols, int64_t head = 0, bool only_keys = false)  // NOLINT: a width alone is a spec
      : cols(kv_cols), head_dim(head), keys_only(only_keys) {}
  int64_t cols, head_dim;
  bool keys_only;
};

class PagedKVCache {
 public:
  struct Layer {
    Tensor k, v;  // [num_pages, page_size, cols], f32, bf16 or f8e4m3; v undefined for keys-only layers
    // FP8 pages only: each token's per-head scale, F32 [num_pages, page_size, cols / head_dim].
    Tensor k_scale, v_scale;
  };
  // One spec per layer (a model's layers may differ); every count range-checked. dtype: f32; bf16
  // (half the bytes per token: keys and values rounded to nearest even as they are written); or
  // f8e4m3 (a quarter, plus a 4-byte scale per head_dim values: each token's head encoded with its
  // own scale, cpu/kv_fp8.h; head_dim must divide the layer's cols). The attention's math stays f32.
  PagedKVCache(const std::vector<PagedLayerSpec>& layers, int64_t num_pages, int64_t page_size,
               DType dtype = DType::F32);

  Layer& layer(size_t i) { return layers_.at(i); }
  size_t num_layers() const { return layers_.size(); }
  int64_t page_size() const { return page_size_; }
  DType dtype() const { return dtype_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_pages() const { return num_pages_ - free_pages(); }
  // Pages for `tokens` tokens in all.
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }

  // Gives `seq` pages until they hold `tokens` tokens in all; false, taking none, when the free list
  // is short.
  bool reserve(PagedSequence& seq, int64_t tokens);
  // Its pages back to the free list; the sequence is empty again.
  void release(PagedSequence& seq);

 private:
  std::vector<Layer> layers_;
  int64_t num_pages_, page_size_;
  DType dtype_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first
};

// The sequences of one model step, each with `tokens` new tokens (1: a decode step; more: a
// prefill chunk), and their page tables as the attention kernels read them.
struct PagedBatch {
  std::vector<PagedSequence*> seqs;
  int64_t tokens = 1;
  Tensor page_table;  // I32 [S, max pages]
  Tensor lens;        // I64 [S]: each sequence's length once this step's tokens are in
  // Built from `seqs` whose pages already hold len + tokens tokens.
  PagedBatch(std::vector<PagedSequence*> seqs, int64_t tokens, int64_t page_size);
};

// What attention layers move between their rows and one layer's pages (k or v, with its FP8 scales;
// scales undefined for f32 / bf16 pages). Each token is `units` rows of width = cols / units: a
// self-attention layer's kv heads (one FP8 scale per head), or MLA's one latent row.
//
// write_pages: the batch's new tokens into their pages, token t of sequence s being rows
// (s * T + t) * units ... of `src` ([1, S * T * units, *], f32 for FP8 pages, else the pages'
// dtype) from column `col`, one copy per run of tokens inside one page.
void write_pages(const kernels::ExecContext& on, const PagedBatch& batch, const Tensor& pages, const Tensor& scales,
                 int64_t units, const Tensor& src, int64_t col);
// The first `tokens` tokens of `seq` out of its pages, as a new [tokens, cols] tensor: the pages'
// dtype, or f32 decoded from FP8 pages.
Tensor gather_pages(const kernels::ExecContext& on, const PagedSequence& seq, int64_t tokens, const Tensor& pages,
                    const Tensor& scales, int64_t units, const std::string& name);

}  // namespace megaton::nn
