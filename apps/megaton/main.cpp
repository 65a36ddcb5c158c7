// megaton: train, evaluate, generate, preprocess and benchmark transformer language models.
#include <cstdio>
#include <string>
#include <utility>

#include "commands.h"
#include "megaton/core/error.h"
#include "megaton/parallel/communicator.h"

namespace {

// "train, eval, ..." : the subcommands of `app`, to list when the one asked for is not among them.
std::string subcommand_names(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

// The app whose subcommand is missing or unknown (the deepest one the arguments reached), with the word
// that named no subcommand ("" when none was given), for one line that lists the choices.
std::pair<const CLI::App*, std::string> missing_subcommand(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.starts_with("-")) break;
    const auto subs = at->get_subcommands([&](const CLI::App* s) { return s->get_name() == word; });
    if (subs.empty()) return {at, word};
    at = subs.front();
  }
  return {at, ""};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Megaton: training and serving transformer language models"};
  app.require_subcommand(1);
  megaton::app::add_train_command(app);
  megaton::app::add_eval_command(app);
  megaton::app::add_generate_command(app);
  megaton::app::add_serve_command(app);
  megaton::app::add_preprocess_command(app);
  megaton::app::add_bench_command(app);
  megaton::app::add_data_command(app);
  megaton::app::add_tokenizer_command(app);
  megaton::app::add_schedule_command(app);
  megaton::app::add_convert_command(app);
  megaton::app::add_model_command(app);
  megaton::app::add_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 says "A subcommand is required" for both a missing and an unknown one, and lists neither.
    if (dynamic_cast<const CLI::RequiredError*>(&e) || dynamic_cast<const CLI::ExtrasError*>(&e)) {
      const auto [at, word] = missing_subcommand(app, argc, argv);
      if (at->get_require_subcommand_min() > 0 && at->get_subcommands().empty()) {
        const std::string command = at == &app ? "megaton" : "megaton " + at->get_name();
        if (word.empty())
          std::fprintf(stderr, "error: %s needs a command: %s\n", command.c_str(), subcommand_names(*at).c_str());
        else
          std::fprintf(stderr, "error: unknown command '%s %s'; the commands are: %s\n", command.c_str(), word.c_str(),
                       subcommand_names(*at).c_str());
        return 1;
      }
    }
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
