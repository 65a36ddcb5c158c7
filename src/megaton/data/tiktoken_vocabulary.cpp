// tiktoken's .tiktoken rank files (tiktoken/load.py: load_tiktoken_bpe), also used by Llama 3.
#include <algorithm>
#include <charconv>
#include <optional>
#include <unordered_set>

#include "megaton/core/error.h"
#include "megaton/data/bpe_vocabulary.h"
#include "megaton/data/mapped_file.h"
#include "megaton/data/text_lines.h"

namespace megaton::data {

namespace {

// Standard base64 (RFC 4648 alphabet, '=' padding to a multiple of four); nullopt if malformed.
std::optional<std::string> decode_base64(std::string_view s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  size_t pad = s.ends_with("==") ? 2 : s.ends_with('=') ? 1 : 0;
  std::string out;
  uint32_t bits = 0;
  int nbits = 0;
  for (char c : s.substr(0, s.size() - pad)) {
    int v = value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    nbits += 6;
    if (nbits >= 8) {
      nbits -= 8;
      out.push_back(static_cast<char>((bits >> nbits) & 0xFF));
    }
  }
  return out;
}

struct KnownFile {
  size_t ranks;
  PretokenPattern pattern;
  std::vector<std::pair<std::string, int32_t>> specials;
  std::string eod;
};

// Llama 3's special tokens (Meta's llama3 tokenizer.py): 256 ids from 128000, mostly reserved.
std::vector<std::pair<std::string, int32_t>> llama3_specials() {
  std::vector<std::string> names{"<|begin_of_text|>",
                                 "<|end_of_text|>",
                                 "<|reserved_special_token_0|>",
                                 "<|reserved_special_token_1|>",
                                 "<|reserved_special_token_2|>",
                                 "<|reserved_special_token_3|>",
                                 "<|start_header_id|>",
                                 "<|end_header_id|>",
                                 "<|reserved_special_token_4|>",
                                 "<|eot_id|>"};
  for (int i = 5; i < 251; ++i) names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  std::vector<std::pair<std::string, int32_t>> specials;
  for (size_t i = 0; i < names.size(); ++i) specials.emplace_back(names[i], 128000 + static_cast<int32_t>(i));
  return specials;
}

const std::vector<KnownFile>& known_files() {
  static const std::vector<KnownFile> files{
      {50256, PretokenPattern::kGpt2, {{"<|endoftext|>", 50256}}, "<|endoftext|>"},
      {50280, PretokenPattern::kGpt2, {{"<|endoftext|>", 50280}}, "<|endoftext|>"},
      {100256,
       PretokenPattern::kCl100k,
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}},
       "<|endoftext|>"},
      {199998, PretokenPattern::kO200k, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}, "<|endoftext|>"},
      {128000, PretokenPattern::kCl100k, llama3_specials(), "<|end_of_text|>"},
  };
  return files;
}

}  // namespace

BpeVocabulary load_tiktoken_vocabulary(const std::string& path) {
  MappedFile file(path, "tiktoken file");
  std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
  BpeVocabulary vocab;
  std::unordered_set<std::string> seen;
  size_t count = 0;
  // Ranks count the tokens from 0, so each is below the number of lines: a larger one (up to 2^31 - 1)
  // would size the vocabulary far beyond the file.
  const auto lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  for_each_line(text, [&](size_t line, std::string_view row) {
    if (row.empty()) return;
    size_t space = row.find(' ');
    std::optional<std::string> bytes;
    int32_t rank = -1;
    if (space != std::string_view::npos) {
      bytes = decode_base64(row.substr(0, space));
      std::string_view r = row.substr(space + 1);
      auto [p, ec] = std::from_chars(r.data(), r.data() + r.size(), rank);
      if (ec != std::errc() || p != r.data() + r.size()) rank = -1;
    }
    if (!bytes || rank < 0) fail(path, ":", line, ": expected \"BASE64_TOKEN RANK\", got \"", row, "\"");
    if (static_cast<size_t>(rank) >= lines)
      fail(path, ":", line, ": rank ", rank, " is out of range: the file's ", lines, " lines hold ranks below ", lines);
    if (rank >= static_cast<int32_t>(vocab.tokens.size())) vocab.tokens.resize(rank + 1);
    if (!vocab.tokens[rank].empty()) fail(path, ":", line, ": rank ", rank, " is given to two tokens");
    if (!seen.insert(*bytes).second) fail(path, ":", line, ": token ", row.substr(0, space), " repeats");
    vocab.tokens[rank] = std::move(*bytes);
    ++count;
  });

  KnownFile setup{
      0, PretokenPattern::kCl100k, {{"<|endoftext|>", static_cast<int32_t>(vocab.tokens.size())}}, "<|endoftext|>"};
  for (const auto& known : known_files())
    if (known.ranks == count) setup = known;
  vocab.pattern = setup.pattern;
  vocab.specials = setup.specials;
  for (const auto& [name, id] : vocab.specials) {
    if (id >= static_cast<int32_t>(vocab.tokens.size())) vocab.tokens.resize(id + 1);
    if (!vocab.tokens[id].empty()) fail(path, ": special token ", name, " would take id ", id, ", which is a rank");
    vocab.tokens[id] = name;
    if (name == setup.eod) vocab.eod = id;
  }
  return vocab;
}

}  // namespace megaton::data
