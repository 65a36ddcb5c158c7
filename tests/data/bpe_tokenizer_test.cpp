#include "megaton/data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "../support/temp_dir.h"
#include "megaton/data/tokenizer.h"

using namespace megaton::data;
using megaton::testing::TempDir;
using megaton::testing::write_bytes;

namespace {

// GPT-2's bytes_to_unicode, restated: printable Latin-1 bytes spell themselves, the rest take U+0100...
std::string gpt2_spelling(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int cp = b, next = 256;
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!printable)
      for (int c = 0; c <= b; ++c)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) cp = next++;
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

// A GPT-2 vocabulary: the 256 bytes (id = byte), then one token per new merge result (in merge order), then
// <|endoftext|> unless `with_eod` is false. Merges are (left bytes, right bytes).
void write_gpt2(const TempDir& dir, const std::vector<std::pair<std::string, std::string>>& merges,
                bool with_eod = true) {
  std::string vocab = "{", text = "#version: 0.2\n";
  int id = 0;
  for (int b = 0; b < 256; ++b)
    vocab += json_string(gpt2_spelling(std::string(1, static_cast<char>(b)))) + ": " + std::to_string(id++) + ", ";
  std::set<std::string> made;
  for (const auto& [l, r] : merges) {
    if (made.insert(l + r).second) vocab += json_string(gpt2_spelling(l + r)) + ": " + std::to_string(id++) + ", ";
    text += gpt2_spelling(l) + " " + gpt2_spelling(r) + "\n";
  }
  if (with_eod) vocab += "\"<|endoftext|>\": " + std::to_string(id) + ", ";
  vocab.resize(vocab.size() - 2);
  write_bytes(dir.file("vocab.json"), vocab + "}");
  write_bytes(dir.file("merges.txt"), text);
}

std::string base64(std::string_view bytes) {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = 0;
    size_t n = std::min<size_t>(3, bytes.size() - i);
    for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? alphabet[(v >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

// A .tiktoken file: the 256 bytes (rank = byte), then `tokens` from rank 256.
std::string write_tiktoken(const TempDir& dir, const std::vector<std::string>& tokens) {
  std::string text;
  int rank = 0;
  for (int b = 0; b < 256; ++b)
    text += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  for (const auto& t : tokens) text += base64(t) + " " + std::to_string(rank++) + "\n";
  write_bytes(dir.file("vocab.tiktoken"), text);
  return dir.file("vocab.tiktoken");
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  // Mostly ASCII text-like bytes with high bytes mixed in: valid multi-byte characters and invalid ones.
  for (auto& c : s) c = static_cast<char>(rng() % 3 ? 32 + rng() % 95 : rng() % 256);
  return s + "\xe2\x82 \xc0\x80\xed\xa0\x80\xf4\x90\x80\x80 caf\xc3\xa9 \xf0\x9f\x99\x82";
}

using Ids = std::vector<int32_t>;

}  // namespace

TEST(BpeTokenizer, Gpt2MergesLowestRankFirst) {
  TempDir dir;
  // ids: 256 "ll", 257 "he", 258 "hell", 259 "hello", 260 " hello", 261 "el"
  write_gpt2(dir, {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {" ", "hello"}, {"e", "l"}});
  auto tok = make_tokenizer("gpt2:" + dir.file(""));
  EXPECT_EQ(tok->vocab_size(), 263);
  EXPECT_EQ(tok->eod(), 262);
  EXPECT_EQ(tok->encode("hello hello"), (Ids{259, 260}));
  // "he" (rank 1) beats "el" (rank 5); "hel" has no merge with "l" left over.
  EXPECT_EQ(tok->encode("hel"), (Ids{257, 'l'}));
  EXPECT_EQ(tok->decode(Ids{259, 260, 262}), "hello hello<|endoftext|>");
}

// encoder.py merges every occurrence of its best pair before ranking the pairs those merges create. That
// matters when a repeated line gives a merge a later rank than a merge using its result.
TEST(BpeTokenizer, Gpt2MergesEveryOccurrenceOfTheBestPairFirst) {
  TempDir dir;
  write_gpt2(dir, {{"a", "b"}, {"ab", "a"}, {"a", "b"}});  // 256 "ab", 257 "aba"; ("a", "b") now ranks 2
  auto tok = make_tokenizer("gpt2:" + dir.file(""));
  EXPECT_EQ(tok->encode("abab"), (Ids{256, 256}));  // one merge at a time would give "aba" "b"
  EXPECT_EQ(tok->encode("ababa"), (Ids{256, 257}));
}

// Among equal ranks the leftmost pair merges first: encoder.py merges the occurrences of its best pair left
// to right, and tiktoken keeps the first of equal ranks. In "aaa" the pair ("a", "a") occurs twice,
// overlapping, so only one of them can merge; which one decides the tokens.
TEST(BpeTokenizer, EqualRanksMergeLeftmostFirst) {
  TempDir dir;
  write_gpt2(dir, {{"a", "a"}, {"aa", "b"}});  // 256 "aa", 257 "aab"
  const std::string tiktoken = write_tiktoken(dir, {"aa", "aab"});
  for (const std::string& spec : {"gpt2:" + dir.file(""), "tiktoken:" + tiktoken}) {
    auto tok = make_tokenizer(spec);
    EXPECT_EQ(tok->encode("aaa"), (Ids{256, 'a'})) << spec;  // not "a" "aa"
    EXPECT_EQ(tok->encode("aaaaa"), (Ids{256, 256, 'a'})) << spec;
    // The left merge leaves "a" "b", no pair; the right one would leave "aa" "b" to make "aab".
    EXPECT_EQ(tok->encode("aaab"), (Ids{256, 'a', 'b'})) << spec;
  }
}

// GPT-2 ranks pairs by merges.txt; tiktoken ranks a pair by the token it makes and takes a whole piece
// that is a token as is. The same token set therefore encodes "abc" differently.
TEST(BpeTokenizer, PairRanksVersusTokenRanks) {
  TempDir dir;
  write_gpt2(dir, {{"a", "b"}, {"b", "c"}, {"a", "bc"}});  // 256 ab, 257 bc, 258 abc
  auto gpt2 = make_tokenizer("gpt2:" + dir.file(""));
  EXPECT_EQ(gpt2->encode("abc"), (Ids{256, 'c'}));  // "ab" first; ("ab", "c") is no merge
  EXPECT_EQ(gpt2->encode("abcd"), (Ids{256, 'c', 'd'}));
  auto tiktoken = make_tokenizer("tiktoken:" + write_tiktoken(dir, {"ab", "bc", "abc"}));
  EXPECT_EQ(tiktoken->encode("abc"), (Ids{258}));
  EXPECT_EQ(tiktoken->encode("abcd"), (Ids{258, 'd'}));  // "ab" first, then "ab" + "c" is the token "abc"
}

TEST(BpeTokenizer, SpecialTokenTextEncodesAsText) {
  TempDir dir;
  write_gpt2(dir, {});
  auto tok = make_tokenizer("gpt2:" + dir.file(""));
  auto ids = tok->encode("a<|endoftext|>b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->eod()), 0);
  EXPECT_EQ(tok->decode(ids), "a<|endoftext|>b");
}

TEST(BpeTokenizer, EodIsAppendedWhenTheVocabularyLacksIt) {
  TempDir dir;
  write_gpt2(dir, {{"a", "b"}}, /*with_eod=*/false);
  auto tok = make_tokenizer("gpt2:" + dir.file(""));
  EXPECT_EQ(tok->vocab_size(), 258);
  EXPECT_EQ(tok->eod(), 257);
  EXPECT_EQ(tok->decode(Ids{257}), "<|endoftext|>");
}

TEST(BpeTokenizer, RoundTripsArbitraryBytes) {
  TempDir dir;
  write_gpt2(dir, {{"e", " "}, {" ", "t"}, {"\xc3", "\xa9"}, {"\xe2", "\x82"}, {"\x80", "\x80"}});
  std::string tiktoken = write_tiktoken(dir, {"e ", " t", "\xc3\xa9", "\xe2\x82", "\x80\x80"});
  for (const std::string& spec : {"gpt2:" + dir.file(""), "tiktoken:" + tiktoken}) {
    auto tok = make_tokenizer(spec);
    for (uint32_t seed = 0; seed < 5; ++seed) {
      std::string text = random_bytes(5000, seed);
      auto ids = tok->encode(text);
      EXPECT_LT(ids.size(), text.size()) << spec;  // some merges happened
      EXPECT_EQ(tok->decode(ids), text) << spec << " seed " << seed;
    }
    EXPECT_TRUE(tok->encode("").empty());
    EXPECT_EQ(tok->decode(tok->encode(std::string(1 << 20, '\x80'))), std::string(1 << 20, '\x80'));
  }
}

TEST(BpeTokenizer, EncodeFromManyThreadsMatchesOneThread) {
  TempDir dir;
  write_gpt2(dir, {{"e", " "}, {" ", "t"}, {"t", "h"}, {" t", "h"}, {" th", "e "}});
  auto tok = make_tokenizer("gpt2:" + dir.file(""));
  std::vector<std::string> texts;
  for (uint32_t i = 0; i < 8; ++i) texts.push_back(random_bytes(20000, i) + " the the the");
  std::vector<Ids> expected;
  for (const auto& t : texts) expected.push_back(tok->encode(t));
  std::vector<Ids> got(texts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < texts.size(); ++i)
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 3; ++rep) got[i] = tok->encode(texts[(i + rep) % texts.size()]);
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(got[i], expected[(i + 2) % texts.size()]);
}

TEST(BpeTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  TempDir dir;
  write_gpt2(dir, {});
  auto tok = make_tokenizer("gpt2:" + dir.file(""));
  EXPECT_ERROR_CONTAINS(tok->decode(Ids{'a', 257}), "id 257", "position 1", "257 ids");
  EXPECT_ERROR_CONTAINS(tok->decode(Ids{-3}), "id -3", "position 0");
}

TEST(BpeTokenizer, Gpt2FileErrorsNameFileAndLine) {
  TempDir dir;
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), "cannot open", dir.file("vocab.json"));
  write_gpt2(dir, {{"a", "b"}});
  write_bytes(dir.file("merges.txt"), "#version: 0.2\na b\nab\n");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), dir.file("merges.txt") + ":3", "two tokens");
  write_bytes(dir.file("merges.txt"), "a b\nb zz\n");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), dir.file("merges.txt") + ":2", "\"zz\"", "not a token");
  write_bytes(dir.file("vocab.json"), "{\"a\": 0,");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), dir.file("vocab.json"), "malformed JSON");
  write_bytes(dir.file("vocab.json"), "{\"a\": 0, \"b\": 0}");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), dir.file("vocab.json"), "id 0", "two tokens");
  write_bytes(dir.file("vocab.json"), "{\"a\": \"x\"}");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), dir.file("vocab.json"), "\"a\"", "not an integer");
  write_bytes(dir.file("vocab.json"), "{\"a b\": 0}");  // a raw space is outside the byte alphabet
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), "\"a b\"", "byte alphabet");
  write_bytes(dir.file("vocab.json"), "{\"a\": 0, \"b\": 1}");
  write_bytes(dir.file("merges.txt"), "a b\n");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), dir.file("merges.txt") + ":1", "\"ab\"");
  write_bytes(dir.file("merges.txt"), "");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:" + dir.file("")), "no token for byte 0x00", "all 256 bytes");
}

TEST(BpeTokenizer, TiktokenFileErrorsNameFileAndLine) {
  TempDir dir;
  std::string path = write_tiktoken(dir, {"ab"});
  std::string good = megaton::testing::read_bytes(path);
  write_bytes(path, good + "YWJj\n");
  EXPECT_ERROR_CONTAINS(make_tokenizer("tiktoken:" + path), path + ":258", "BASE64_TOKEN RANK");
  write_bytes(path, good + "Y!Jj 300\n");
  EXPECT_ERROR_CONTAINS(make_tokenizer("tiktoken:" + path), path + ":258", "BASE64_TOKEN RANK");
  write_bytes(path, good + "YWJj 5\n");
  EXPECT_ERROR_CONTAINS(make_tokenizer("tiktoken:" + path), path + ":258", "rank 5", "two tokens");
  write_bytes(path, good + "YWI= 258\n");  // ranks are below the line count (a rank far past it is an error)
  EXPECT_ERROR_CONTAINS(make_tokenizer("tiktoken:" + path), path + ":258", "YWI=", "repeats");
  write_bytes(path, "YQ== 0\n");
  EXPECT_ERROR_CONTAINS(make_tokenizer("tiktoken:" + path), "no token for byte 0x00");
}

// An unknown rank file gets the cl100k pattern and <|endoftext|> after its last rank.
TEST(BpeTokenizer, TiktokenDefaultsForAnUnknownFile) {
  TempDir dir;
  auto tok = make_tokenizer("tiktoken:" + write_tiktoken(dir, {"12", "123"}));
  EXPECT_EQ(tok->vocab_size(), 259);
  EXPECT_EQ(tok->eod(), 258);
  EXPECT_EQ(tok->decode(Ids{258}), "<|endoftext|>");
  EXPECT_EQ(tok->encode("12345"), (Ids{257, '4', '5'}));  // cl100k: digits in groups of three
}

// A rank file is recognized by its rank count and gets that file's special tokens, the end-of-document
// token among them: r50k_base / gpt2, p50k_base, cl100k_base, o200k_base and Llama 3 (vocabulary sizes as
// tiktoken reports them).
TEST(BpeTokenizer, TiktokenKnownFilesByRankCount) {
  struct Known {
    size_t ranks;
    int64_t vocab_size;
    Ids specials;  // the eod first
    std::string text;
  };
  const std::vector<Known> files{
      {50256, 50257, {50256}, "<|endoftext|>"},
      {50280, 50281, {50280}, "<|endoftext|>"},
      {100256, 100277, {100257, 100258, 100276}, "<|endoftext|><|fim_prefix|><|endofprompt|>"},
      {199998, 200019, {199999, 200018}, "<|endoftext|><|endofprompt|>"},
      {128000,
       128256,
       {128001, 128000, 128009, 128255},
       "<|end_of_text|><|begin_of_text|><|eot_id|><|reserved_special_token_250|>"}};
  for (const Known& known : files) {
    SCOPED_TRACE(::testing::Message() << known.ranks << " ranks");
    TempDir dir;
    std::vector<std::string> tokens;
    for (int i = 0; tokens.size() < known.ranks - 256; ++i) {
      std::string token(1, static_cast<char>('a' + i % 26));
      token += std::to_string(i);
      tokens.push_back(std::move(token));
    }
    auto tok = make_tokenizer("tiktoken:" + write_tiktoken(dir, tokens));
    EXPECT_EQ(tok->vocab_size(), known.vocab_size);
    EXPECT_EQ(tok->eod(), known.specials.front());
    EXPECT_EQ(tok->decode(known.specials), known.text);
  }
}
