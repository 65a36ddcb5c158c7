#include "megaton/train/train_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "megaton/core/error.h"

#include "../support/config_fields.h"
#include "../support/temp_dir.h"

using namespace megaton;

TEST(TrainConfig, ExampleConfigParses) {
  auto c = train::load_train_config(std::string(MEGATON_SOURCE_DIR) + "/configs/example.toml", {});
  EXPECT_EQ(c.grad_accum_steps(), 2);
  EXPECT_EQ(c.lr_decay_iters, c.train_iters);  // 0 resolves to train_iters
  EXPECT_EQ(c.model.name, "gpt-tiny");
}

TEST(TrainConfig, OverridesWinAndModelKeysApplyOnTopOfThePreset) {
  auto c = train::load_train_config("", {"model.preset=llama-tiny", "model.num_layers=3", "optimizer.lr=0.5",
                                         "data.shuffle=false", "sample.prompt=Hello"});
  EXPECT_EQ(c.model.num_layers, 3);
  EXPECT_EQ(c.model.normalization, models::Normalization::RMSNorm);  // from the preset
  EXPECT_EQ(c.lr, 0.5);
  EXPECT_FALSE(c.shuffle);
  EXPECT_EQ(c.sample_prompt, "Hello");
}

// Every model key set away from the preset, so that a key to_toml drops or the loader ignores
// shows up in the field-by-field comparison (comparing the two TOML texts alone cannot see a key
// that is missing from both).
TEST(TrainConfig, ResolvedTomlLoadsBackToTheSameConfig) {
  megaton::testing::TempDir dir;
  auto c = train::load_train_config("", {"model.preset=llama-tiny",
                                         "model.num_layers=3",
                                         "model.hidden_size=96",
                                         "model.num_attention_heads=4",
                                         "model.num_query_groups=1",
                                         "model.kv_channels=32",
                                         "model.ffn_hidden_size=200",
                                         "model.vocab_size=300",
                                         "model.max_position_embeddings=200",
                                         "model.normalization=\"LayerNorm\"",
                                         "model.activation=\"gelu\"",
                                         "model.position_embedding_type=\"learned_absolute\"",
                                         "model.rope_layout=\"interleaved\"",
                                         "model.rotary_base=12345.5",
                                         "model.add_bias_linear=true",
                                         "model.tie_embeddings=true",
                                         "model.norm_epsilon=3e-7",
                                         "model.init_method_std=0.0123",
                                         "training.seed=9",
                                         "optimizer.min_lr=1e-5",
                                         "logging.run_dir=\"x y\""});
  const std::string path = dir.file("resolved.toml");
  std::ofstream(path) << train::to_toml(c);
  auto back = train::load_train_config(path, {});
  EXPECT_EQ(train::to_toml(back), train::to_toml(c));
  EXPECT_TRUE(megaton::testing::same_config(back.model, c.model));
  EXPECT_EQ(back.model.hidden_size, 96);
  EXPECT_EQ(back.model.rotary_base, 12345.5);
  EXPECT_EQ(back.min_lr, 1e-5);
  EXPECT_EQ(back.run_dir, "x y");
}

TEST(TrainConfig, ErrorsNameTheKey) {
  auto message = [](std::vector<std::string> sets) {
    return megaton::testing::error_message([&] { train::load_train_config("", sets); });
  };
  EXPECT_NE(message({"optimizer.lr_warmup_iter=3"}).find("optimizer.lr_warmup_iters"), std::string::npos);
  EXPECT_NE(message({"training.seq_length=4096"}).find("max_position_embeddings"), std::string::npos);
  EXPECT_NE(message({"optimizer.adam_beta2=1.5"}).find("optimizer.adam_beta2"), std::string::npos);
  EXPECT_NE(message({"training.train_iters=5", "optimizer.lr_warmup_iters=10"}).find("optimizer.lr_decay_iters"),
            std::string::npos);
  EXPECT_NE(message({"optimizer.lr_decay_style=\"exp\""}).find("exp"), std::string::npos);
  EXPECT_NE(message({"model.preset=gpt5"}).find("gpt5"), std::string::npos);
  EXPECT_NE(message({"training.micro_batch_size=1.5"}).find("training.micro_batch_size"), std::string::npos);
  EXPECT_NE(message({"checkpoint.keep_lst=2"}).find("checkpoint.keep_last"), std::string::npos);
  EXPECT_NE(message({"rewind.zscore=-1"}).find("rewind.zscore"), std::string::npos);
  EXPECT_NE(message({"rewind.lr_factor=2"}).find("rewind.lr_factor"), std::string::npos);
}

TEST(TrainConfig, ParallelSizesTakeShortAliasesAndResolveAgainstTheWorld) {
  auto c = train::load_train_config("", {"tp=1", "pp=1", "dp=2", "training.micro_batch_size=2",
                                         "training.global_batch_size=8"});
  EXPECT_EQ(c.data_parallel_size, 2);
  EXPECT_EQ(c.grad_accum_steps(), 2);  // 8 samples = 2 ranks x 2 micro-batches of 2
  auto message = [](std::vector<std::string> sets) {
    return megaton::testing::error_message([&] { train::load_train_config("", sets); });
  };
  EXPECT_NE(message({"tp=0"}).find("parallel.tensor_model_parallel_size"), std::string::npos);
  EXPECT_EQ(train::load_train_config("", {"tp=2"}).tensor_model_parallel_size, 2);
  EXPECT_NE(message({"cp=2"}).find("2 is not supported yet"), std::string::npos);
  EXPECT_EQ(train::load_train_config("", {"pp=2", "model.num_layers=4"}).pipeline_model_parallel_size, 2);
  EXPECT_NE(message({"pp=2", "model.num_layers=3"}).find("3 layers do not split evenly into 2 pipeline model chunks"),
            std::string::npos);
  EXPECT_NE(message({"pp=2", "model.num_layers=4", "parallel.pipeline_schedule=\"zbv\"", "model.num_layers=6"})
                .find("6 layers do not split evenly into 4 pipeline model chunks (pipeline_model_parallel_size 2 x 2 "
                      "chunks per rank for 'zbv')"),
            std::string::npos);
  // Uneven first / last stages (Megatron's keys): the other ranks split the rest evenly.
  const auto stages = [](std::vector<std::string> sets) {
    return train::pipeline_stage_layers(train::load_train_config("", sets));
  };
  EXPECT_EQ(stages({"pp=2", "model.num_layers=4", "parallel.decoder_first_pipeline_num_layers=1"}),
            (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(stages({"pp=3", "model.num_layers=4", "parallel.decoder_last_pipeline_num_layers=2"}),
            (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(stages({"pp=4", "model.num_layers=8", "parallel.decoder_first_pipeline_num_layers=1",
                    "parallel.decoder_last_pipeline_num_layers=3"}),
            (std::vector<int64_t>{1, 2, 2, 3}));
  EXPECT_EQ(stages({"pp=2", "model.num_layers=4"}), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(stages({"model.num_layers=4"}), (std::vector<int64_t>{4}));
  EXPECT_NE(message({"pp=2", "model.num_layers=4", "parallel.decoder_first_pipeline_num_layers=5"})
                .find("config key 'parallel.decoder_first_pipeline_num_layers': must be in [0, model.num_layers 4] "
                      "(0: not set), got 5"),
            std::string::npos);
  EXPECT_NE(message({"pp=2", "model.num_layers=4", "parallel.decoder_last_pipeline_num_layers=-1"})
                .find("config key 'parallel.decoder_last_pipeline_num_layers': must be in [0, model.num_layers 4]"),
            std::string::npos);
  EXPECT_NE(message({"model.num_layers=4", "parallel.decoder_last_pipeline_num_layers=2"})
                .find("'parallel.decoder_last_pipeline_num_layers': 2 needs parallel.pipeline_model_parallel_size > 1"),
            std::string::npos);
  EXPECT_NE(message({"pp=2", "model.num_layers=4", "parallel.decoder_first_pipeline_num_layers=3",
                     "parallel.decoder_last_pipeline_num_layers=2"})
                .find("decoder_first_pipeline_num_layers 3 + decoder_last_pipeline_num_layers 2 exceed "
                      "model.num_layers 4"),
            std::string::npos);
  EXPECT_NE(message({"pp=2", "model.num_layers=4", "parallel.decoder_first_pipeline_num_layers=1",
                     "parallel.decoder_last_pipeline_num_layers=2"})
                .find("leave 1 of model.num_layers 4 layers but no other pipeline rank (pipeline_model_parallel_size 2)"),
            std::string::npos);
  EXPECT_NE(message({"pp=3", "model.num_layers=4", "parallel.decoder_first_pipeline_num_layers=1"})
                .find("'parallel.decoder_first_pipeline_num_layers': decoder_first_pipeline_num_layers 1 leave 3 of "
                      "model.num_layers 4 layers, which do not split evenly into the other 2 pipeline ranks"),
            std::string::npos);
  EXPECT_NE(message({"pp=2", "model.num_layers=4", "parallel.decoder_first_pipeline_num_layers=4"})
                .find("decoder_first_pipeline_num_layers 4 leave no layers of model.num_layers 4 for the other 1 pipeline "
                      "ranks (each needs at least one)"),
            std::string::npos);
  EXPECT_NE(message({"pp=2", "model.num_layers=6", "parallel.pipeline_schedule=\"zbv\"",
                     "parallel.decoder_first_pipeline_num_layers=1"})
                .find("pipeline rank 0's 1 layers do not split evenly into 2 chunks per rank for 'zbv'"),
            std::string::npos);
  EXPECT_NE(message({"tp=2", "parallel.sequence_parallel=true", "training.seq_length=33"})
                .find("needs training.seq_length 33 divisible by tensor_model_parallel_size 2"),
            std::string::npos);
  EXPECT_NE(message({"pp=0"}).find("parallel.pipeline_model_parallel_size"), std::string::npos);
  EXPECT_NE(message({"parallel.sequence_parallel=true"}).find("needs parallel.tensor_model_parallel_size > 1"),
            std::string::npos);
  EXPECT_NE(message({"dp=3", "training.micro_batch_size=2", "training.global_batch_size=8"})
                .find("not a multiple of micro_batch_size x data_parallel_size (2 x 3)"),
            std::string::npos);

  auto world = [](train::TrainConfig cfg, int64_t size) {
    return megaton::testing::error_message([&] { train::resolve_parallel_layout(cfg, size); });
  };
  train::TrainConfig d = train::load_train_config("", {"training.micro_batch_size=2", "training.global_batch_size=8"});
  EXPECT_NE(world(d, 8).find("not a multiple of micro_batch_size x data-parallel size (2 x 8)"), std::string::npos);
  EXPECT_NE(world(c, 4).find("2 does not match the world: 4 processes"), std::string::npos);
  train::resolve_parallel_layout(d, 4);
  EXPECT_EQ(d.data_parallel_size, 4);
  EXPECT_EQ(d.grad_accum_steps(), 1);
}
