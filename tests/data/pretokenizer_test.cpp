#include "megaton/data/pretokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

using namespace megaton::data;

namespace {

std::vector<std::string> split(PretokenPattern pattern, std::string_view text) {
  Pretokenizer pre(pattern);
  std::vector<std::string_view> pieces;
  pre.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

using Pieces = std::vector<std::string>;

}  // namespace

// Expected splits worked out by hand from the published patterns (and checked against Python's `regex`
// by tests/python/test_bpe_reference.py on a larger text).
TEST(Pretokenizer, Gpt2Pattern) {
  EXPECT_EQ(split(PretokenPattern::kGpt2, "Hello world's 12345  x\n\n"),
            (Pieces{"Hello", " world", "'s", " 12345", " ", " x", "\n\n"}));
  EXPECT_EQ(split(PretokenPattern::kGpt2, "DON'T stop!!"), (Pieces{"DON", "'", "T", " stop", "!!"}));
  EXPECT_EQ(split(PretokenPattern::kGpt2, "naïve 東京"), (Pieces{"naïve", " 東京"}));
}

TEST(Pretokenizer, Cl100kPattern) {
  EXPECT_EQ(split(PretokenPattern::kCl100k, "Hello world's 12345  x\n\n"),
            (Pieces{"Hello", " world", "'s", " ", "123", "45", " ", " x", "\n\n"}));
  EXPECT_EQ(split(PretokenPattern::kCl100k, "DON'T stop!!\n"), (Pieces{"DON", "'T", " stop", "!!\n"}));
  EXPECT_EQ(split(PretokenPattern::kCl100k, "(hello)"), (Pieces{"(hello", ")"}));
}

TEST(Pretokenizer, O200kPattern) {
  EXPECT_EQ(split(PretokenPattern::kO200k, "HelloWorld's DON'T a/b//\n"),
            (Pieces{"Hello", "World's", " DON'T", " a", "/b", "//\n"}));
}

// U+0085 (NEXT LINE) is White_Space in the tokenizers' own regex engines but not in PCRE2's \s.
TEST(Pretokenizer, NextLineIsWhitespace) {
  EXPECT_EQ(split(PretokenPattern::kGpt2, "!\u0085x"), (Pieces{"!", "\u0085", "x"}));
  // cl100k lets any non-letter lead a word, whitespace included.
  EXPECT_EQ(split(PretokenPattern::kCl100k, "!\u0085x"), (Pieces{"!", "\u0085x"}));
}

TEST(Pretokenizer, InvalidUtf8RunsArePiecesOfTheirOwn) {
  EXPECT_EQ(split(PretokenPattern::kGpt2,
                  "ab\xff\xfe"
                  "cd"),
            (Pieces{"ab", "\xff\xfe", "cd"}));
  // A truncated character: its bytes are invalid, the 'A' after them is not.
  EXPECT_EQ(split(PretokenPattern::kGpt2,
                  "a \xe2\x82"
                  "A"),
            (Pieces{"a", " ", "\xe2\x82", "A"}));
  // NUL is valid UTF-8 and, as a non-letter, may lead a cl100k word.
  EXPECT_EQ(split(PretokenPattern::kCl100k, std::string("x\0y", 3)), (Pieces{"x", std::string("\0y", 2)}));
}

TEST(Pretokenizer, Utf8CharLengthFollowsTheUnicodeTable) {
  EXPECT_EQ(utf8_char_length("a"), 1u);
  EXPECT_EQ(utf8_char_length("\xc3\xa9"), 2u);          // é
  EXPECT_EQ(utf8_char_length("\xe2\x82\xac"), 3u);      // €
  EXPECT_EQ(utf8_char_length("\xf0\x9f\x99\x82"), 4u);  // 🙂
  EXPECT_EQ(utf8_char_length("\xf4\x8f\xbf\xbf"), 4u);  // U+10FFFF
  for (std::string_view bad : {"\x80", "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xed\xa0\x80", "\xf0\x80\x80\x80",
                               "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff", "\xe2\x82", "\xc3"})
    EXPECT_EQ(utf8_char_length(bad), 0u) << "bytes of length " << bad.size();
}

TEST(Pretokenizer, PiecesTileRandomBytes) {
  std::mt19937 rng(3);
  for (auto pattern : {PretokenPattern::kGpt2, PretokenPattern::kCl100k, PretokenPattern::kO200k}) {
    std::string text(20000, '\0');
    for (auto& c : text) c = static_cast<char>(rng() % 4 ? rng() % 128 : rng() % 256);
    std::string joined;
    for (const auto& p : split(pattern, text)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, text);
  }
}

// A long run of one character class is one piece and must not exhaust PCRE2's JIT stack.
TEST(Pretokenizer, LongRunsSplitInLinearTime) {
  std::string spaces(4 << 20, ' ');
  EXPECT_EQ(split(PretokenPattern::kGpt2, spaces + "x"), (Pieces{spaces.substr(1), " x"}));
  std::string letters(4 << 20, 'a');
  EXPECT_EQ(split(PretokenPattern::kCl100k, letters), (Pieces{letters}));
}
