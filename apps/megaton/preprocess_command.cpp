#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "megaton/data/preprocess.h"

namespace megaton::app {

void add_preprocess_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("preprocess", "Tokenize text or JSON Lines into a Megatron .bin/.idx dataset");
  static data::PreprocessOptions opts;
  cmd->add_option("--input", opts.inputs,
                  "Input files (.json/.jsonl: JSON Lines; otherwise plain text; gzip or zstd compressed accepted)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--output-prefix", opts.output_prefix, "Writes PREFIX.bin and PREFIX.idx")->required();
  cmd->add_option("--tokenizer", opts.tokenizer, "Tokenizer spec")->capture_default_str();
  cmd->add_option("--json-key", opts.json_key, "JSON Lines field holding the text")->capture_default_str();
  cmd->add_flag("--append-eod", opts.append_eod, "End every document with the end-of-document token");
  cmd->add_option("--doc-separator", opts.doc_separator,
                  "Plain text: a line equal to this separates documents (e.g. % for fortune files); default: one "
                  "document per file");
  cmd->add_flag("--skip-bad-lines", opts.skip_bad_lines,
                "JSON Lines: count and skip malformed lines instead of stopping at the first one");
  cmd->add_option("--workers", opts.workers, "Tokenizing threads (default: all)");
  cmd->add_flag("!--no-progress", opts.progress, "No progress line on stderr");
  cmd->callback([] {
    auto s = data::preprocess(opts);
    const double mb = static_cast<double>(s.bytes) / 1e6, secs = std::max(s.seconds, 1e-9);
    const std::string_view dtype = dtype_name(s.dtype);
    std::printf("wrote %s.bin/.idx (%.*s): %ld documents, %ld tokens from %.1f MB in %.2f s (%.1f MB/s, %.0f docs/s)\n",
                opts.output_prefix.c_str(), static_cast<int>(dtype.size()), dtype.data(), s.documents, s.tokens, mb,
                s.seconds, mb / secs, s.documents / secs);
    if (s.skipped_lines)
      std::printf("skipped %ld malformed lines; the first: %s\n", s.skipped_lines, s.first_skipped.c_str());
  });
}

}  // namespace megaton::app
