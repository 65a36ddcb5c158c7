// The regex split that byte-level BPE tokenizers apply before merging: merges never cross a piece
// boundary, so "dog" and " dog" stay separate tokens from "dog." and numbers do not fuse with words.
// Matching is PCRE2 (JIT, UTF + Unicode properties).
#pragma once
#include <string_view>
#include <vector>

namespace megaton::data {

enum class PretokenPattern {
  kGpt2,    // GPT-2's encoder.py (and tiktoken's r50k/p50k)
  kCl100k,  // tiktoken's cl100k_base; Llama 3 uses the same pattern
  kO200k,   // tiktoken's o200k_base (case-aware words, contractions attached)
};

class Pretokenizer {
 public:
  explicit Pretokenizer(PretokenPattern pattern);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Appends the pieces of `text` to `pieces`; they concatenate back to `text` exactly. The patterns are
  // defined on characters, so bytes that are not part of well-formed UTF-8 cannot match: each maximal run
  // of them is a piece of its own, and the regex runs on the valid stretches between (a match never
  // crosses an invalid byte, as with PCRE2_MATCH_INVALID_UTF). Safe to call from several threads at once.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  void split_valid(std::string_view text, std::vector<std::string_view>& pieces) const;

  void* code_;  // pcre2_code_8*, kept out of the header so that users need no PCRE2 include
};

// Length of the well-formed UTF-8 character at the start of `s` (Unicode Table 3-7: no overlong forms,
// no surrogates, nothing above U+10FFFF), or 0 if `s` does not start with one.
size_t utf8_char_length(std::string_view s);

}  // namespace megaton::data
