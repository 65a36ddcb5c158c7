#include <cstdio>

#include "commands.h"
#include "megaton/core/threads.h"
#include "megaton/data/preprocess.h"

namespace megaton::app {

void add_preprocess_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("preprocess", "Tokenize text or JSON Lines into a Megatron .bin/.idx dataset");
  static data::PreprocessOptions opts;
  cmd->add_option("--input", opts.inputs, "Input files (.json/.jsonl: JSON Lines; otherwise plain text)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--output-prefix", opts.output_prefix, "Writes PREFIX.bin and PREFIX.idx")->required();
  cmd->add_option("--tokenizer", opts.tokenizer, "Tokenizer spec")->capture_default_str();
  cmd->add_option("--json-key", opts.json_key, "JSON Lines field holding the text")->capture_default_str();
  cmd->add_flag("--append-eod", opts.append_eod, "End every document with the end-of-document token");
  cmd->add_option("--doc-separator", opts.doc_separator,
                  "Plain text: a line equal to this separates documents (e.g. % for fortune files); default: one "
                  "document per file");
  cmd->add_option("--workers", opts.workers, "Tokenizing threads (default: all)");
  cmd->callback([] {
    auto s = data::preprocess(opts);
    std::printf("wrote %s.bin/.idx: %ld documents, %ld tokens from %.1f MB in %.2f s\n", opts.output_prefix.c_str(),
                s.documents, s.tokens, static_cast<double>(s.bytes) / 1e6, s.seconds);
  });
}

}  // namespace megaton::app
