// `megaton convert`: a training checkpoint, written by any parallel layout, or an HF folder, as an HF
// model folder that eval, generate, serve and transformers load, in f32, bf16 or 8-bit weights.
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
                  "Checkpoint directory (RUN/checkpoints/step_N), a checkpoints directory (its newest valid one), or "
                  "an HF model folder (to store its weights in another dtype)")
      ->required();
  cmd->add_option("--output", output, "HF model folder to create (config.json + model.safetensors)")->required();
  cmd->add_option("--weights-dtype", weights_dtype,
                  "f32; bf16 (half the bytes; `generate/serve --precision bf16` then reads the same values); or "
                  "8-bit layer weights with fp32 scales beside each (`<name>_scale_inv`), the other tensors in "
                  "bf16: fp8-block (E4M3, 128 x 128 blocks, DeepSeek-V3's format) or int8 (one scale per output row)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "fp8-block", "int8"}));
  cmd->callback([] {
    // Never into a folder that holds something: it may be another model.
    if (fs::exists(output) && !(fs::is_directory(output) && fs::is_empty(output)))
      fail("--output ", output, " already exists and is not an empty directory; choose a new path");
    std::unique_ptr<models::TransformerModel> model;
    std::string from = input;
    if (fs::exists(fs::path(input) / "model.safetensors")) {  // an HF folder: re-store its weights
      model = models::load_hf_model(input);
    } else {
      const auto dir = ckpt::find_valid_checkpoint(input, [](const std::string& rejected, const std::string& why) {
        std::fprintf(stderr, "warning: checkpoint %s rejected: %s; trying an older one\n", rejected.c_str(),
                     why.c_str());
      });
      if (!dir) fail("--input ", input, ": no valid checkpoint there");
      model = train::load_checkpoint_model(*dir);
      from = *dir;
    }
    const bool quantized = weights_dtype == "fp8-block" || weights_dtype == "int8";
    models::save_hf_model(*model, output, quantized ? DType::BF16 : dtype_from_name(weights_dtype),
                          quantized ? std::optional(kernels::weight_quant_from_name(weights_dtype)) : std::nullopt);
    std::printf("wrote %s from %s\n", output.c_str(), from.c_str());
  });
}

}  // namespace megaton::app
