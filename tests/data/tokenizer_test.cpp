#include "megaton/data/tokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "../support/temp_dir.h"
#include "megaton/data/byte_tokenizer.h"

using namespace megaton::data;

TEST(Tokenizer, ByteTokenizerRoundTripsArbitraryBytes) {
  auto tok = make_tokenizer("byte");
  EXPECT_EQ(tok->spec(), "byte");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eod(), 256);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  std::string text(4096, '\0');
  for (auto& c : text) c = static_cast<char>(byte(rng));
  // Invalid UTF-8 on purpose: a lone continuation byte, a truncated sequence, an overlong NUL, a NUL.
  text += std::string("\x80\xe2\x82\xc0\x80\0end", 9);

  auto ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(Tokenizer, ByteTokenizerDecodeSkipsEodAndRejectsUnknownIds) {
  ByteTokenizer tok;
  std::vector<int32_t> ids{'h', 'i', 256, '!', 256};
  EXPECT_EQ(tok.decode(ids), "hi!");
  EXPECT_ERROR_CONTAINS(tok.decode(std::vector<int32_t>{'a', 257}), "id 257", "position 1");
  EXPECT_ERROR_CONTAINS(tok.decode(std::vector<int32_t>{-1}), "id -1");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(Tokenizer, UnknownSpecsListTheKnownOnes) {
  EXPECT_ERROR_CONTAINS(make_tokenizer("bpe"), "unknown tokenizer 'bpe'", "byte", "gpt2:DIR", "tiktoken:FILE",
                        "sentencepiece:FILE.model");
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:"), "gpt2:PATH");
}

TEST(Tokenizer, MissingFilesAreNamed) {
  EXPECT_ERROR_CONTAINS(make_tokenizer("gpt2:/no/such/dir"), "/no/such/dir/vocab.json");
  EXPECT_ERROR_CONTAINS(make_tokenizer("tiktoken:/no/such.tiktoken"), "/no/such.tiktoken");
  EXPECT_ERROR_CONTAINS(make_tokenizer("sentencepiece:/no/such.model"), "/no/such.model");
}
