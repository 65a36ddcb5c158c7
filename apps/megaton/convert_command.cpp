// `megaton convert`: a training checkpoint, written by any parallel layout, as an HF model folder
// that eval, generate, serve and transformers load.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "megaton/ckpt/checkpoint_dir.h"
#include "megaton/core/error.h"
#include "megaton/models/hf_format.h"
#include "megaton/train/state_snapshot.h"

namespace megaton::app {

namespace fs = std::filesystem;

void add_convert_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert", "Write a training checkpoint (any tp / pp / dp layout) as an HF model folder");
  static std::string input, output, weights_dtype = "f32";
  cmd->add_option("--input", input,
                  "Checkpoint directory (RUN/checkpoints/step_N), or a checkpoints directory (its newest valid one)")
      ->required();
  cmd->add_option("--output", output, "HF model folder to create (config.json + model.safetensors)")->required();
  cmd->add_option("--weights-dtype", weights_dtype,
                  "f32, or bf16 (half the bytes; `generate/serve --precision bf16` then reads the same values)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([] {
    // Never into a folder that holds something: it may be another model.
    if (fs::exists(output) && !(fs::is_directory(output) && fs::is_empty(output)))
      fail("--output ", output, " already exists and is not an empty directory; choose a new path");
    const auto dir = ckpt::find_valid_checkpoint(input, [](const std::string& rejected, const std::string& why) {
      std::fprintf(stderr, "warning: checkpoint %s rejected: %s; trying an older one\n", rejected.c_str(), why.c_str());
    });
    if (!dir) fail("--input ", input, ": no valid checkpoint there");
    auto model = train::load_checkpoint_model(*dir);
    models::save_hf_model(*model, output, dtype_from_name(weights_dtype));
    std::printf("wrote %s from %s\n", output.c_str(), dir->c_str());
  });
}

}  // namespace megaton::app
