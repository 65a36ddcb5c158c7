// The vocabulary of a byte-level BPE tokenizer and its two on-disk formats: GPT-2's vocab.json +
// merges.txt and tiktoken's rank file. Both describe tokens as byte strings; they differ in how a pair of
// adjacent tokens is ranked for merging (see BpeVocabulary::merges).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megaton/data/pretokenizer.h"

namespace megaton::data {

struct BpeVocabulary {
  struct Merge {
    int32_t rank;    // lower merges first
    int32_t merged;  // id of the joined token
  };

  // Token bytes by id, special tokens included; "" for ids that name no token. Every single byte is a
  // token, which is what makes any byte string encodable.
  std::vector<std::string> tokens;
  // GPT-2 ranks a pair by its line in merges.txt: `merges`, keyed by pair_key(left id, right id).
  // tiktoken ranks a pair by the id of its concatenation, if that is a token (its ids are its ranks), and
  // takes a whole piece that is a token as is; `merges` is then unused.
  bool ranks_pairs = false;
  std::unordered_map<uint64_t, Merge> merges;
  // Special tokens (text, id): never produced by encoding text (their text encodes as ordinary text).
  std::vector<std::pair<std::string, int32_t>> specials;
  int32_t eod = -1;
  PretokenPattern pattern = PretokenPattern::kGpt2;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
};

// DIR/vocab.json ({"token": id} with tokens in GPT-2's printable byte alphabet) and DIR/merges.txt (one
// "left right" pair per line in merge order, an optional "#version" first line). eod is <|endoftext|>,
// appended after the largest id if vocab.json lacks it. Pattern: GPT-2's.
BpeVocabulary load_gpt2_vocabulary(const std::string& dir);

// A .tiktoken file: one "BASE64_TOKEN RANK" per line; a token's id is its rank. The file carries no
// pattern or special tokens, so they come from the known files, recognized by their token count:
//   50256 (r50k_base / gpt2), 50280 (p50k_base): GPT-2 pattern, <|endoftext|> = 50256 / 50280
//   100256 (cl100k_base): cl100k pattern, <|endoftext|> 100257, <|fim_prefix|> 100258, <|fim_middle|>
//     100259, <|fim_suffix|> 100260, <|endofprompt|> 100276
//   199998 (o200k_base): o200k pattern, <|endoftext|> 199999, <|endofprompt|> 200018
//   128000 (Llama 3): cl100k pattern, Llama 3's 256 special tokens from 128000, eod <|end_of_text|> 128001
// Any other file: cl100k pattern and one special token, <|endoftext|> (the eod), after the largest rank.
BpeVocabulary load_tiktoken_vocabulary(const std::string& file);

}  // namespace megaton::data
