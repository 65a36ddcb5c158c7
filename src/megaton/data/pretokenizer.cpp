#include "megaton/data/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <string>

#include "megaton/core/error.h"

namespace megaton::data {

namespace {

// The patterns as their tokenizers publish them, with one change: `\s` is written [\s\x{85}]. The
// originals run on Python's `regex` and Rust's `regex`/`fancy-regex`, where \s is Unicode White_Space;
// PCRE2's Unicode \s is "separator or \t\n\v\f\r", which lacks U+0085 (NEXT LINE), the only difference.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\x{85}\p{L}\p{N}]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";

constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\x{85}\p{L}\p{N}]+[\r\n]*)"
    R"(|[\s\x{85}]*[\r\n]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";

constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\x{85}\p{L}\p{N}]+[\r\n/]*|[\s\x{85}]*[\r\n]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";

const char* pattern_text(PretokenPattern p) {
  switch (p) {
    case PretokenPattern::kGpt2:
      return kGpt2Pattern;
    case PretokenPattern::kCl100k:
      return kCl100kPattern;
    case PretokenPattern::kO200k:
      return kO200kPattern;
  }
  fail("unknown pre-tokenizer pattern ", static_cast<int>(p));
}

// Match data is per thread (PCRE2 requires it for concurrent matching); the patterns have no capture
// groups, so one ovector pair serves every pattern.
pcre2_match_data* thread_match_data() {
  struct Deleter {
    void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
  };
  thread_local std::unique_ptr<pcre2_match_data, Deleter> data(pcre2_match_data_create(1, nullptr));
  return data.get();
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

size_t utf8_char_length(std::string_view s) {
  if (s.empty()) return 0;
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c = b(0);
  if (c < 0x80) return 1;
  // Second-byte bounds per lead byte exclude overlong forms (E0, F0), surrogates (ED) and > U+10FFFF (F4).
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < len || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < len; ++i)
    if (!is_continuation(b(i))) return 0;
  return len;
}

Pretokenizer::Pretokenizer(PretokenPattern pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  const char* text = pattern_text(pattern);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(text), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("pre-tokenizer pattern does not compile at offset ", offset, ": ", reinterpret_cast<char*>(msg));
  }
  // Anchored: each match starts where the previous ended, so the pieces tile the text (and PCRE2 does not
  // scan ahead for a later start). JIT is several times faster than the interpreter; where it is not
  // available (an unsupported CPU), matching still works without it.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Pretokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    for (size_t n; i < text.size() && (n = utf8_char_length(text.substr(i))) > 0;) i += n;
    if (i > start) split_valid(text.substr(start, i - start), pieces);
    start = i;
    while (i < text.size() && utf8_char_length(text.substr(i)) == 0) ++i;
    if (i > start) pieces.push_back(text.substr(start, i - start));
  }
}

void Pretokenizer::split_valid(std::string_view text, std::vector<std::string_view>& pieces) const {
  auto* code = static_cast<const pcre2_code*>(code_);
  pcre2_match_data* md = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    // The caller validated the UTF-8, so PCRE2's own check (a pass over the whole subject per call) is skipped.
    int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("pre-tokenizer: regex match failed at byte ", pos, ": ", reinterpret_cast<char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    MEGATON_CHECK(ov[1] > pos, "pre-tokenizer: empty match at byte ", pos);
    pieces.push_back(text.substr(pos, ov[1] - pos));
    pos = ov[1];
  }
  // Every character starts a match of some alternative of these patterns; the check keeps the round-trip
  // guarantee independent of that reasoning.
  MEGATON_CHECK(pos == text.size(), "pre-tokenizer: no pattern matches at byte ", pos);
}

}  // namespace megaton::data
