#include <charconv>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "option_range.h"
#include "megaton/core/error.h"
#include "megaton/core/threads.h"
#include "megaton/data/sentencepiece_tokenizer.h"
#include "megaton/data/tokenizer.h"

namespace megaton::app {

namespace {

// Input per parallel round: enough lines to keep every thread busy, little enough to stream large inputs.
constexpr size_t kBlockBytes = 4 << 20;

// Calls `block(lines, number of the first)` for consecutive blocks of stdin's lines, without their '\n'.
// A last line without '\n' is still a line; empty input has none.
void for_each_line_block(const std::function<void(const std::vector<std::string_view>&, size_t)>& block) {
  std::string buffer;  // a partial line left from the previous read, then the new input
  std::vector<std::string_view> lines;
  size_t line_number = 1;
  for (bool eof = false; !eof;) {
    size_t old = buffer.size();
    buffer.resize(old + kBlockBytes);
    size_t n = std::fread(buffer.data() + old, 1, kBlockBytes, stdin);
    buffer.resize(old + n);
    eof = n == 0;
    lines.clear();
    size_t pos = 0;
    // The partial line has no '\n', so the search resumes at the new input.
    for (size_t from = old, nl; (nl = buffer.find('\n', from)) != std::string::npos; pos = from = nl + 1)
      lines.emplace_back(buffer.data() + pos, nl - pos);
    if (eof && pos < buffer.size()) {
      lines.emplace_back(buffer.data() + pos, buffer.size() - pos);
      pos = buffer.size();
    }
    if (!lines.empty()) block(lines, line_number);
    line_number += lines.size();
    buffer.erase(0, pos);
  }
}

std::string read_all_stdin() {
  std::string text;
  std::vector<char> chunk(kBlockBytes);
  for (size_t n; (n = std::fread(chunk.data(), 1, chunk.size(), stdin)) > 0;) text.append(chunk.data(), n);
  return text;
}

void write(std::string_view s) { std::fwrite(s.data(), 1, s.size(), stdout); }

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
  char buf[16];
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(' ');
    out.append(buf, std::to_chars(buf, buf + sizeof buf, ids[i]).ptr);
  }
  out.push_back('\n');
}

// Space- or tab-separated ids of one input line, appended to `ids`.
void parse_ids(std::string_view line, size_t line_number, std::vector<int32_t>& ids) {
  for (size_t pos = 0; pos < line.size();) {
    if (line[pos] == ' ' || line[pos] == '\t' || line[pos] == '\r') {
      ++pos;
      continue;
    }
    size_t end = std::min(line.find_first_of(" \t\r", pos), line.size());
    int32_t id;
    auto [p, ec] = std::from_chars(line.data() + pos, line.data() + end, id);
    if (ec != std::errc() || p != line.data() + end)
      fail("stdin:", line_number, ": '", line.substr(pos, end - pos), "' is not a token id");
    ids.push_back(id);
    pos = end;
  }
}

void encode(const data::Tokenizer& tok, bool whole) {
  if (whole) {
    std::string out;
    append_ids(out, tok.encode(read_all_stdin()));
    write(out);
    return;
  }
  for_each_line_block([&](const std::vector<std::string_view>& lines, size_t) {
    std::vector<std::string> out(lines.size());
    const auto n = static_cast<int64_t>(lines.size());
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i) append_ids(out[i], tok.encode(lines[i]));
    for (const auto& s : out) write(s);
  });
}

void decode(const data::Tokenizer& tok, bool whole) {
  std::vector<int32_t> all;
  for_each_line_block([&](const std::vector<std::string_view>& lines, size_t first_line) {
    if (whole) {
      for (size_t i = 0; i < lines.size(); ++i) parse_ids(lines[i], first_line + i, all);
      return;
    }
    std::vector<std::string> out(lines.size());
    std::vector<std::string> errors(lines.size());
    const auto n = static_cast<int64_t>(lines.size());
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; ++i) {
      try {
        std::vector<int32_t> ids;
        parse_ids(lines[i], first_line + i, ids);
        out[i] = tok.decode(ids) + "\n";
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      if (!errors[i].empty()) fail(errors[i]);
      write(out[i]);
    }
  });
  if (whole) write(tok.decode(all));
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenizer", "Train a SentencePiece model; encode or decode text with any tokenizer");
  cmd->require_subcommand(1);

  auto* train = cmd->add_subcommand("train", "Train a SentencePiece model (writes PREFIX.model and PREFIX.vocab)");
  static data::SentencePieceTrainOptions train_opts;
  train->add_option("--input", train_opts.inputs, "Plain text files, one sentence per line")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("--vocab-size", train_opts.vocab_size, "Pieces in the model")
      ->capture_default_str()
      ->check(in_range(1, 1 << 24));
  train->add_option("--type", train_opts.type, "Model type")
      ->capture_default_str()
      ->check(CLI::IsMember({"bpe", "unigram"}));
  train->add_option("--output-prefix", train_opts.output_prefix, "Writes PREFIX.model and PREFIX.vocab")->required();
  train->add_option("--trainer-arg", train_opts.trainer_args,
                    "Extra SentencePieceTrainer flag as KEY=VALUE (spm_train's names), e.g. character_coverage=1.0; "
                    "repeatable. Defaults: normalization_rule_name=identity remove_extra_whitespaces=false "
                    "byte_fallback=true (lossless for UTF-8)");
  train->add_option("--threads", train_opts.threads, "Trainer threads (default: all)")->check(in_range(0, 4096));
  train->callback([] {
    data::train_sentencepiece(train_opts);
    auto tok = data::make_tokenizer("sentencepiece:" + train_opts.output_prefix + ".model");
    std::printf("wrote %s.model and %s.vocab: %ld pieces\n", train_opts.output_prefix.c_str(),
                train_opts.output_prefix.c_str(), static_cast<long>(tok->vocab_size()));
  });

  static std::string spec = "byte";
  static bool whole = false;
  static int threads = 0;
  auto* enc = cmd->add_subcommand("encode", "stdin UTF-8 text -> one line of space-separated ids per input line");
  auto* dec = cmd->add_subcommand("decode", "stdin lines of space-separated ids -> one line of text per input line");
  for (auto* sub : {enc, dec}) {
    sub->add_option("--tokenizer", spec, "byte, gpt2:DIR, tiktoken:FILE or sentencepiece:FILE.model")
        ->capture_default_str();
    sub->add_option("--threads", threads, "Threads (default: all)")->check(in_range(0, 4096));
  }
  enc->add_flag("--whole", whole, "Encode all of stdin as one document: one output line");
  dec->add_flag("--whole", whole,
                "Decode all ids on stdin as one sequence, written without a line break (inverts encode --whole)");
  enc->callback([] {
    set_num_threads(threads);
    encode(*data::make_tokenizer(spec), whole);
  });
  dec->callback([] {
    set_num_threads(threads);
    decode(*data::make_tokenizer(spec), whole);
  });
}

}  // namespace megaton::app
