// GPT-2's vocab.json + merges.txt (OpenAI's encoder.py format, also Hugging Face's GPT2Tokenizer files).
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "megaton/core/error.h"
#include "megaton/data/bpe_vocabulary.h"
#include "megaton/data/mapped_file.h"
#include "megaton/data/text_lines.h"

namespace megaton::data {

namespace {

constexpr const char* kEndOfText = "<|endoftext|>";

// encoder.py's bytes_to_unicode: the files spell each byte as one printable character so that tokens
// are readable text. Printable Latin-1 bytes stand for themselves; the other 68 bytes, in order, take
// the code points from U+0100 on. Returns the byte of each code point, or -1.
const std::array<int, 324>& byte_of_code_point() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t;
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[printable ? b : next++] = b;
    }
    return t;
  }();
  return table;
}

// The bytes a vocabulary entry stands for; empty if it uses characters outside the byte alphabet.
std::string token_bytes(std::string_view spelled) {
  std::string bytes;
  for (size_t i = 0; i < spelled.size();) {
    size_t len = utf8_char_length(spelled.substr(i));
    if (len == 0 || len > 2) return {};  // the alphabet's code points are all below U+0800
    auto c = static_cast<unsigned char>(spelled[i]);
    int cp = len == 1 ? c : ((c & 0x1F) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3F);
    if (cp >= static_cast<int>(byte_of_code_point().size()) || byte_of_code_point()[cp] < 0) return {};
    bytes.push_back(static_cast<char>(byte_of_code_point()[cp]));
    i += len;
  }
  return bytes;
}

void load_vocab_json(const std::string& path, BpeVocabulary& vocab,
                     std::unordered_map<std::string, int32_t>& id_of_spelling) {
  MappedFile file(path, "GPT-2 vocabulary");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(reinterpret_cast<const char*>(file.data()),
                              reinterpret_cast<const char*>(file.data()) + file.size());
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number too large
    fail(path, ": malformed JSON: ", e.what());
  }
  if (!j.is_object()) fail(path, ": expected a JSON object {\"token\": id, ...}");
  for (const auto& [spelled, value] : j.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX)
      fail(path, ": token \"", spelled, "\": id ", value.dump(), " is not an integer in [0, 2^31)");
    auto id = value.get<int32_t>();
    // Ids number the tokens from 0: a larger one would size the vocabulary far beyond the file.
    if (static_cast<size_t>(id) >= j.size())
      fail(path, ": token \"", spelled, "\": id ", id, " is out of range: the file's ", j.size(),
           " tokens take ids below ", j.size());
    std::string bytes = token_bytes(spelled);
    if (bytes.empty())
      fail(path, ": token \"", spelled, "\" (id ", id, ") is empty or has characters outside GPT-2's byte alphabet");
    if (id >= static_cast<int32_t>(vocab.tokens.size())) vocab.tokens.resize(id + 1);
    if (!vocab.tokens[id].empty()) fail(path, ": id ", id, " is given to two tokens");
    if (spelled == kEndOfText) {
      vocab.specials.emplace_back(spelled, id);
      vocab.eod = id;
    }
    vocab.tokens[id] = std::move(bytes);
    id_of_spelling.emplace(spelled, id);
  }
}

void load_merges_txt(const std::string& path, BpeVocabulary& vocab,
                     const std::unordered_map<std::string, int32_t>& id_of_spelling) {
  MappedFile file(path, "GPT-2 merges");
  std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
  auto id_of = [&](std::string_view spelled, size_t line) {
    auto it = id_of_spelling.find(std::string(spelled));
    if (it == id_of_spelling.end()) fail(path, ":", line, ": \"", spelled, "\" is not a token of vocab.json");
    return it->second;
  };
  int32_t rank = 0;
  for_each_line(text, [&](size_t line, std::string_view row) {
    if (row.empty() || (line == 1 && row.starts_with("#version"))) return;
    size_t space = row.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == row.size() ||
        row.find(' ', space + 1) != std::string_view::npos)
      fail(path, ":", line, ": expected two tokens separated by one space, got \"", row, "\"");
    std::string_view left = row.substr(0, space), right = row.substr(space + 1);
    int32_t left_id = id_of(left, line), right_id = id_of(right, line);
    int32_t merged = id_of(std::string(left) + std::string(right), line);
    // A repeated pair keeps its last rank, as the dict built by encoder.py does.
    vocab.merges.insert_or_assign(BpeVocabulary::pair_key(left_id, right_id), BpeVocabulary::Merge{rank++, merged});
  });
}

}  // namespace

BpeVocabulary load_gpt2_vocabulary(const std::string& dir) {
  BpeVocabulary vocab;
  std::unordered_map<std::string, int32_t> id_of_spelling;
  load_vocab_json((std::filesystem::path(dir) / "vocab.json").string(), vocab, id_of_spelling);
  load_merges_txt((std::filesystem::path(dir) / "merges.txt").string(), vocab, id_of_spelling);
  if (vocab.eod < 0) {
    vocab.eod = static_cast<int32_t>(vocab.tokens.size());
    vocab.tokens.push_back(kEndOfText);
    vocab.specials.emplace_back(kEndOfText, vocab.eod);
  }
  vocab.pattern = PretokenPattern::kGpt2;
  vocab.ranks_pairs = true;
  return vocab;
}

}  // namespace megaton::data
