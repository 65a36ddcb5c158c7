// Checkpoint directories: manifest verification (truncation, a flipped byte, a missing file, no
// manifest), fallback to the newest valid checkpoint, `latest`, retention and torn-save cleanup.
#include "megaton/ckpt/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "../support/temp_dir.h"
#include "megaton/ckpt/manifest.h"

using namespace megaton;
using megaton::testing::read_bytes;
using megaton::testing::TempDir;
using megaton::testing::write_bytes;
namespace fs = std::filesystem;

namespace {

// A checkpoint of two small files whose contents depend on the step.
void save(const std::string& root, int64_t step, int64_t keep_last = 0) {
  ckpt::commit_checkpoint(
      root, step,
      [&](const std::string& dir) {
        write_bytes(dir + "/a.bin", std::string(1000, static_cast<char>('a' + step)));
        write_bytes(dir + "/b.json", "{\"step\": " + std::to_string(step) + "}");
      },
      keep_last);
}

std::vector<std::string> rejections(const std::string& root, std::optional<std::string>& chosen) {
  std::vector<std::string> why;
  chosen = ckpt::find_valid_checkpoint(root, [&](const std::string& dir, const std::string& r) {
    EXPECT_NE(r.find(dir), std::string::npos) << r;  // the reason names the rejected checkpoint
    why.push_back(r);
  });
  return why;
}

}  // namespace

TEST(CheckpointDir, CorruptionIsNamedAndTheNewestValidCheckpointChosen) {
  TempDir dir;
  const std::string root = dir.file("ckpts");
  for (int64_t s : {10, 20, 30}) save(root, s);
  EXPECT_EQ(read_bytes(root + "/latest"), "step_000030\n");
  std::optional<std::string> chosen;
  EXPECT_TRUE(rejections(root, chosen).empty());
  EXPECT_EQ(chosen, root + "/step_000030");

  fs::resize_file(root + "/step_000030/a.bin", 999);
  std::string b = read_bytes(root + "/step_000020/a.bin");
  b[500] ^= 1;
  write_bytes(root + "/step_000020/a.bin", b);
  auto why = rejections(root, chosen);
  ASSERT_EQ(why.size(), 2u);
  EXPECT_NE(why[0].find(root + "/step_000030/a.bin: 999 bytes, the manifest says 1000"), std::string::npos) << why[0];
  EXPECT_NE(why[1].find(root + "/step_000020/a.bin: checksum mismatch"), std::string::npos) << why[1];
  EXPECT_EQ(chosen, root + "/step_000010");

  fs::remove(root + "/step_000010/b.json");
  EXPECT_EQ(rejections(root, chosen).size(), 3u);
  EXPECT_FALSE(chosen.has_value());
  EXPECT_ERROR_CONTAINS(ckpt::verify_manifest(root + "/step_000010"), "b.json", "missing");
  fs::remove(root + "/step_000010/manifest.json");
  EXPECT_ERROR_CONTAINS(ckpt::verify_manifest(root + "/step_000010"), "step_000010", "no manifest.json");
  // A named checkpoint is verified too; an error instead of a fallback.
  EXPECT_ERROR_CONTAINS(
      ckpt::find_valid_checkpoint(root + "/step_000020", [](const std::string&, const std::string&) {}), "checksum");
  // A file where a checkpoint directory belongs, and a path that is not there.
  write_bytes(dir.file("file"), "x");
  EXPECT_ERROR_CONTAINS(ckpt::find_valid_checkpoint(dir.file("file"), [](const std::string&, const std::string&) {}),
                        dir.file("file"), "is a file");
  EXPECT_ERROR_CONTAINS(ckpt::find_valid_checkpoint(dir.file("none"), [](const std::string&, const std::string&) {}),
                        dir.file("none"), "does not exist");
}

// A rejected checkpoint moved aside keeps every byte, and neither retention nor a later save of
// the same step touches it (issue 8: never destroy what could be recovered).
TEST(CheckpointDir, MovedAsideCheckpointsSurviveRetentionAndLaterSaves) {
  TempDir dir;
  const std::string root = dir.file("ckpts");
  for (int64_t s : {10, 20}) save(root, s);
  const std::string bytes = read_bytes(root + "/step_000020/a.bin");
  EXPECT_EQ(ckpt::move_aside(root + "/step_000020"), root + "/step_000020.corrupt");
  save(root, 20);
  EXPECT_EQ(ckpt::move_aside(root + "/step_000020"), root + "/step_000020.corrupt.2");
  EXPECT_EQ(ckpt::list_moved_aside(root),
            (std::vector<std::string>{root + "/step_000020.corrupt", root + "/step_000020.corrupt.2"}));
  EXPECT_EQ(ckpt::list_checkpoints(root), std::vector<std::string>{root + "/step_000010"});
  for (int64_t s : {20, 30, 40}) save(root, s, 1);  // keep one: every other step_N goes
  EXPECT_EQ(ckpt::list_checkpoints(root), std::vector<std::string>{root + "/step_000040"});
  EXPECT_EQ(read_bytes(root + "/step_000020.corrupt/a.bin"), bytes);
  EXPECT_TRUE(fs::exists(root + "/step_000020.corrupt.2/manifest.json"));
  EXPECT_TRUE(ckpt::remove_torn_checkpoints(root).empty());
}

TEST(CheckpointDir, RetentionLatestAndTornSaves) {
  TempDir dir;
  const std::string root = dir.file("ckpts");
  for (int64_t s : {5, 10, 15, 20}) save(root, s, 2);
  EXPECT_EQ(ckpt::list_checkpoints(root), (std::vector<std::string>{root + "/step_000020", root + "/step_000015"}));

  // A save that throws halfway leaves only its .tmp directory; the next run removes it.
  EXPECT_ERROR_CONTAINS(ckpt::commit_checkpoint(
                            root, 25, [](const std::string& d) { write_bytes(d + "/a.bin", "x"), fail("disk full"); }, 2),
                        "disk full");
  EXPECT_TRUE(fs::exists(root + "/step_000025.tmp"));
  EXPECT_EQ(ckpt::list_checkpoints(root).size(), 2u);
  EXPECT_EQ(read_bytes(root + "/latest"), "step_000020\n");
  // A process killed while replacing `latest` leaves latest.<its pid>.tmp: removed once that
  // process is gone (pid 2^31-1 is beyond any pid_max), kept while it lives (it may still commit).
  const std::string dead = root + "/latest.2147483647.tmp", live = root + "/latest." + std::to_string(::getpid()) + ".tmp";
  write_bytes(dead, "step_0000"), write_bytes(live, "step_0000");
  EXPECT_EQ(ckpt::remove_torn_checkpoints(root), (std::vector<std::string>{root + "/step_000025.tmp", dead}));
  EXPECT_FALSE(fs::exists(root + "/step_000025.tmp"));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  fs::remove(live);

  // Saving a step again (a resumed run after a fallback) replaces the older directory, and
  // `latest` wins over higher steps when listing.
  save(root, 15, 0);
  EXPECT_EQ(read_bytes(root + "/latest"), "step_000015\n");
  EXPECT_EQ(ckpt::list_checkpoints(root), (std::vector<std::string>{root + "/step_000015", root + "/step_000020"}));
}
