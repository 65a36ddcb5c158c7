// megaton: train, evaluate, generate, preprocess and benchmark transformer language models.
#include <cstdio>

#include "commands.h"
#include "megaton/core/error.h"
#include "megaton/parallel/communicator.h"

int main(int argc, char** argv) {
  CLI::App app{"Megaton: training and serving transformer language models"};
  app.require_subcommand(1);
  megaton::app::add_train_command(app);
  megaton::app::add_eval_command(app);
  megaton::app::add_generate_command(app);
  megaton::app::add_preprocess_command(app);
  megaton::app::add_bench_command(app);
  megaton::app::add_data_command(app);
  megaton::app::add_tokenizer_command(app);
  megaton::app::add_schedule_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (megaton::parallel::launched_distributed()) {
      // One rank's error ends the job: the other ranks may be waiting for this one in a collective.
      std::fprintf(stderr, "[rank %d] error: %s\n", megaton::parallel::launched_rank(), e.what());
      megaton::parallel::abort_job(1);
    }
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
