// libFuzzer harness: a `megaton train --config` TOML file, parsed, checked against the schema and
// resolved as the train command does before it opens any data.
#include "fuzz_input.h"
#include "megaton/train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = megaton::fuzz::write_scratch("run.toml", megaton::fuzz::as_text(data, size));
  megaton::fuzz::parse_or_reject([&] {
    auto config = megaton::train::load_train_config(path, {});
    megaton::train::resolve_parallel_layout(config, 1);
    // The resolved config is written to the run directory and must load again as it was.
    const std::string resolved = megaton::train::to_toml(config);
    megaton::fuzz::require(megaton::train::to_toml(megaton::train::load_train_config(
                               megaton::fuzz::write_scratch("resolved.toml", resolved), {})) == resolved);
  });
  return 0;
}
