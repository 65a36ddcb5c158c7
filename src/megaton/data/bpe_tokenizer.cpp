#include "megaton/data/bpe_tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>
#include <unordered_set>

#include "megaton/core/error.h"

namespace megaton::data {

namespace {

// Pieces up to this length are cached per thread; natural text repeats its words, so most pieces are hits.
// Longer pieces (runs of spaces or symbols) rarely repeat and would crowd the cache.
constexpr size_t kMaxCachedPieceBytes = 64;
constexpr size_t kMaxCachedPieces = 1 << 16;  // per thread; the cache starts over when full

// A mergeable pair of adjacent symbols, identified by the byte offsets where they start. It is stale
// once either side has changed, which `len` (the joined length when it was queued) detects.
struct Candidate {
  int32_t rank;
  int32_t merged;
  uint32_t left, right, len;
};

// Heap order: lowest rank first, ties to the leftmost pair (GPT-2 merges every occurrence of its best
// pair left to right; tiktoken takes the leftmost of equal ranks).
bool after(const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.left > b.left; }

// Linked list of the symbols of one piece, indexed by start offset; reused across calls on a thread.
struct MergeScratch {
  std::vector<int32_t> id;
  std::vector<uint32_t> next, prev, len;  // len 0: absorbed into its left neighbour
  std::vector<Candidate> heap, pending;
};

struct PieceCache {
  uint64_t owner = 0;  // the tokenizer whose pieces these are; another one on the same thread resets it
  std::unordered_map<std::string, std::vector<int32_t>, TransparentStringHash, std::equal_to<>> ids;
};

std::atomic<uint64_t> next_cache_owner{1};

}  // namespace

BpeTokenizer::BpeTokenizer(BpeVocabulary vocab, std::string spec)
    : vocab_(std::move(vocab)),
      spec_(std::move(spec)),
      pretokenizer_(vocab_.pattern),
      cache_owner_(next_cache_owner++) {
  std::unordered_set<int32_t> special_ids;
  for (const auto& [text, id] : vocab_.specials) special_ids.insert(id);
  for (size_t id = 0; id < vocab_.tokens.size(); ++id)
    if (!vocab_.tokens[id].empty() && !special_ids.contains(static_cast<int32_t>(id)))
      ids_.emplace(vocab_.tokens[id], static_cast<int32_t>(id));
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(std::string(1, static_cast<char>(b)));
    if (it == ids_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      fail("tokenizer ", spec_, ": no token for byte ", hex, "; byte-level BPE needs all 256 bytes as tokens");
    }
    byte_ids_[b] = it->second;
  }
  MEGATON_CHECK(vocab_.eod >= 0 && vocab_.eod < vocab_size(), "tokenizer ", spec_, ": no end-of-document token");
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  pretokenizer_.split(text, pieces);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for (std::string_view piece : pieces) encode_piece(piece, ids);
  return ids;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (!vocab_.ranks_pairs) {
    if (auto it = ids_.find(piece); it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local PieceCache cache;
  if (cache.owner != cache_owner_) {
    cache.ids.clear();
    cache.owner = cache_owner_;
  }
  if (auto it = cache.ids.find(piece); it != cache.ids.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  size_t first = out.size();
  merge(piece, out);
  if (piece.size() <= kMaxCachedPieceBytes) {
    if (cache.ids.size() >= kMaxCachedPieces) cache.ids.clear();
    cache.ids.emplace(piece, std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

// O(n log n) in the piece length: a heap of candidate merges instead of rescanning every pair per merge,
// so that long pieces (a megabyte of one symbol) cost no more per byte than short ones.
void BpeTokenizer::merge(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local MergeScratch s;
  const auto n = static_cast<uint32_t>(piece.size());
  s.id.resize(n);
  s.next.resize(n);
  s.prev.resize(n);
  s.len.assign(n, 1);
  s.heap.clear();
  s.pending.clear();
  for (uint32_t i = 0; i < n; ++i) {
    s.id[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
    s.next[i] = i + 1;
    s.prev[i] = i - 1;  // wraps for i = 0; never read for the first symbol
  }
  auto candidate = [&](uint32_t left) -> std::optional<Candidate> {
    uint32_t right = s.next[left];
    if (right >= n) return std::nullopt;
    uint32_t len = s.len[left] + s.len[right];
    if (vocab_.ranks_pairs) {
      auto it = vocab_.merges.find(BpeVocabulary::pair_key(s.id[left], s.id[right]));
      if (it == vocab_.merges.end()) return std::nullopt;
      return Candidate{it->second.rank, it->second.merged, left, right, len};
    }
    auto it = ids_.find(piece.substr(left, len));
    if (it == ids_.end()) return std::nullopt;
    return Candidate{it->second, it->second, left, right, len};
  };
  auto push = [&](const Candidate& c) {
    s.heap.push_back(c);
    std::push_heap(s.heap.begin(), s.heap.end(), after);
  };
  for (uint32_t i = 0; i + 1 < n; ++i)
    if (auto c = candidate(i)) s.heap.push_back(*c);
  std::make_heap(s.heap.begin(), s.heap.end(), after);

  // GPT-2 merges every occurrence of the best pair before it ranks the pairs those merges create (they
  // wait in `pending` until the round of that rank is over); tiktoken re-ranks after each merge. The two
  // differ only for merges.txt files that rank a merge before a merge making one of its parts.
  int32_t round_rank = -1;
  while (true) {
    if (!s.pending.empty() && (s.heap.empty() || s.heap.front().rank != round_rank)) {
      for (const auto& c : s.pending) push(c);
      s.pending.clear();
    }
    if (s.heap.empty()) break;
    std::pop_heap(s.heap.begin(), s.heap.end(), after);
    Candidate c = s.heap.back();
    s.heap.pop_back();
    if (s.len[c.left] == 0 || s.next[c.left] != c.right || s.len[c.left] + s.len[c.right] != c.len) continue;
    round_rank = c.rank;
    s.id[c.left] = c.merged;
    s.len[c.left] = c.len;
    s.len[c.right] = 0;
    s.next[c.left] = s.next[c.right];
    if (s.next[c.left] < n) s.prev[s.next[c.left]] = c.left;
    for (auto created : {c.left > 0 ? candidate(s.prev[c.left]) : std::nullopt, candidate(c.left)}) {
      if (!created) continue;
      if (vocab_.ranks_pairs)
        s.pending.push_back(*created);
      else
        push(*created);
    }
  }
  for (uint32_t i = 0; i < n; i = s.next[i]) out.push_back(s.id[i]);
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || vocab_.tokens[id].empty())
      fail("tokenizer ", spec_, ": id ", id, " at position ", i, " is not in the vocabulary (", vocab_size(), " ids)");
    text += vocab_.tokens[id];
  }
  return text;
}

}  // namespace megaton::data
