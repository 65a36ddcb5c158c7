#include "megaton/data/preprocess.h"

#include <gtest/gtest.h>

#include "../support/temp_dir.h"
#include "megaton/data/indexed_dataset.h"

using namespace megaton;
using namespace megaton::data;
using megaton::testing::TempDir;
using megaton::testing::write_bytes;

namespace {

// Byte-tokenizer ids of a text, optionally followed by end-of-document.
std::vector<int32_t> byte_ids(std::string_view text, bool eod) {
  std::vector<int32_t> ids(text.begin(), text.end());
  for (auto& id : ids) id = static_cast<unsigned char>(id);
  if (eod) ids.push_back(256);
  return ids;
}

// Every document of a dataset as one token list (documents hold one sequence each here).
std::vector<std::vector<int32_t>> read_documents(const std::string& prefix) {
  auto ds = IndexedDataset::open(prefix);
  EXPECT_EQ(ds.num_sequences(), ds.num_documents());
  std::vector<std::vector<int32_t>> docs;
  for (size_t i = 0; i < ds.num_sequences(); ++i) docs.push_back(ds.get(i));
  return docs;
}

PreprocessOptions options(std::vector<std::string> inputs, std::string prefix) {
  PreprocessOptions o;
  o.inputs = std::move(inputs);
  o.output_prefix = std::move(prefix);
  o.workers = 2;
  o.progress = false;
  return o;
}

}  // namespace

TEST(Preprocess, JsonLinesOneDocumentPerLine) {
  TempDir dir;
  std::string input = dir.file("corpus.jsonl");
  write_bytes(input,
              "{\"text\": \"hello\", \"id\": 1}\n"
              "\n"                                         // blank lines are skipped
              "{\"text\": \"caf\\u00e9 \\\"q\\\"\\n\"}\n"  // JSON escapes decode to UTF-8
              "{\"text\": \"\"}\n"                         // empty documents are skipped
              "{\"text\": \"last\"}");                     // no final newline
  auto o = options({input}, dir.file("out"));
  o.append_eod = true;
  auto stats = preprocess(o);

  std::vector<std::vector<int32_t>> expected{byte_ids("hello", true), byte_ids("caf\xc3\xa9 \"q\"\n", true),
                                             byte_ids("last", true)};
  EXPECT_EQ(read_documents(o.output_prefix), expected);
  EXPECT_EQ(IndexedDataset::open(o.output_prefix).dtype(), DType::U16);  // vocab 257, as Megatron picks
  EXPECT_EQ(stats.documents, 3);
  EXPECT_EQ(stats.tokens, 6 + 11 + 5);
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(std::filesystem::file_size(input)));
}

TEST(Preprocess, JsonKeySelectsTheField) {
  TempDir dir;
  std::string input = dir.file("c.json");
  write_bytes(input, "{\"text\": \"no\", \"content\": \"yes\"}\n");
  auto o = options({input}, dir.file("out"));
  o.json_key = "content";
  preprocess(o);
  EXPECT_EQ(read_documents(o.output_prefix), std::vector<std::vector<int32_t>>{byte_ids("yes", false)});
}

TEST(Preprocess, TextWithSeparatorLines) {
  TempDir dir;
  std::string fortunes = dir.file("fortunes");
  write_bytes(fortunes, "A stitch in time\n  saves nine.\n%\n%\nLook before\r\n%\r\nyou leap.\n%\n");
  std::string whole = dir.file("whole.txt");
  write_bytes(whole, "one file,\n%\none document");
  auto o = options({fortunes}, dir.file("out"));
  o.doc_separator = "%";
  o.append_eod = true;
  preprocess(o);
  std::vector<std::vector<int32_t>> expected{byte_ids("A stitch in time\n  saves nine.\n", true),
                                             byte_ids("Look before\r\n", true), byte_ids("you leap.\n", true)};
  EXPECT_EQ(read_documents(o.output_prefix), expected);

  // Without a separator each file is one document, in input order.
  auto o2 = options({whole, fortunes}, dir.file("out2"));
  preprocess(o2);
  auto docs = read_documents(o2.output_prefix);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], byte_ids("one file,\n%\none document", false));
  EXPECT_EQ(docs[1].size(), std::filesystem::file_size(fortunes));
}

TEST(Preprocess, ParallelTokenizingKeepsDocumentOrder) {
  TempDir dir;
  std::string input = dir.file("many.jsonl");
  std::string lines;
  for (int i = 0; i < 5000; ++i) lines += "{\"text\": \"doc " + std::to_string(i) + std::string(i % 97, 'x') + "\"}\n";
  write_bytes(input, lines);
  auto o = options({input}, dir.file("out"));
  o.workers = 4;
  auto stats = preprocess(o);
  EXPECT_EQ(stats.documents, 5000);
  auto ds = IndexedDataset::open(o.output_prefix);
  for (int i : {0, 1, 2500, 4999})
    EXPECT_EQ(ds.get(i), byte_ids("doc " + std::to_string(i) + std::string(i % 97, 'x'), false));
}

TEST(Preprocess, MalformedLineNamesFileAndLineAndLeavesNoOutput) {
  TempDir dir;
  std::string input = dir.file("bad.jsonl");
  write_bytes(input, "{\"text\": \"fine\"}\n{\"text\": \"fine too\"}\n{\"text\": broken}\n{\"text\": \"after\"}\n");
  std::string missing = dir.file("missing_key.jsonl");
  write_bytes(missing, "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  auto listing = dir.entries();

  EXPECT_ERROR_CONTAINS(preprocess(options({input}, dir.file("out"))), input + ":3:", "malformed JSON");
  EXPECT_ERROR_CONTAINS(preprocess(options({missing}, dir.file("out"))), missing + ":2:", "\"text\"");
  EXPECT_ERROR_CONTAINS(preprocess(options({dir.file("absent.txt")}, dir.file("out"))), "absent.txt");
  EXPECT_EQ(dir.entries(), listing);  // neither out.bin/.idx nor temporaries
}
