// `megaton` subcommands: each registers its options on the CLI11 app and its run callback.
#pragma once
#include <CLI/CLI.hpp>

namespace megaton::app {

void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_preprocess_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_tokenizer_command(CLI::App& app);
void add_schedule_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_model_command(CLI::App& app);
void add_plan_command(CLI::App& app);

}  // namespace megaton::app
