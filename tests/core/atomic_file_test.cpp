// AtomicFile: a file appears complete or not at all, and processes writing the same path at once
// (the ranks of a distributed run caching the same sample index) do not trip over each other.
#include "megaton/core/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "../support/temp_dir.h"

using namespace megaton;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST(AtomicFile, UncommittedWritesLeaveNothing) {
  megaton::testing::TempDir dir;
  {
    AtomicFile f(dir.file("x.bin"));
    f.write("abc", 3);
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(AtomicFile, TwoProcessesWritingOnePathBothCommitAWholeFile) {
  megaton::testing::TempDir dir;
  const std::string path = dir.file("index.npy");
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  // Both open before either commits: the child opens, tells the parent, waits for the parent's
  // open, then both write and commit.
  const bool is_child = child == 0;
  char token = 'x';
  int rc = 0;
  try {
    if (is_child) {
      AtomicFile f(path);
      (void)!write(to_parent[1], &token, 1);
      (void)!read(to_child[0], &token, 1);
      const std::string text(1000, 'c');
      f.write(text.data(), text.size());
      f.commit();
    } else {
      (void)!read(to_parent[0], &token, 1);
      AtomicFile f(path);
      (void)!write(to_child[1], &token, 1);
      const std::string text(1000, 'p');
      f.write(text.data(), text.size());
      f.commit();
    }
  } catch (const std::exception& e) {
    if (is_child) _exit(1);
    ADD_FAILURE() << e.what();
  }
  if (is_child) _exit(0);
  ASSERT_EQ(waitpid(child, &rc, 0), child);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "the child's write failed";
  const std::string got = read_all(path);
  EXPECT_TRUE(got == std::string(1000, 'c') || got == std::string(1000, 'p')) << got.size() << " bytes";
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"index.npy"});
}
