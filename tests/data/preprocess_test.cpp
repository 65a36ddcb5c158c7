#include "megaton/data/preprocess.h"

#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include "../support/run_command.h"
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

namespace {

std::string gzip(const std::string& data) {
  z_stream z{};
  deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: gzip header
  std::string out(deflateBound(&z, data.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& data) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3));
  return out;
}

std::string json_lines(int first, int count) {
  std::string s;
  for (int i = first; i < first + count; ++i) s += "{\"text\": \"document " + std::to_string(i) + "\"}\n";
  return s;
}

}  // namespace

TEST(Preprocess, CompressedInputsDecodeLikePlainOnes) {
  TempDir dir;
  // Large enough that decoding spans several 1 MiB reads; concatenated members / frames (`cat a.gz b.gz`)
  // decode as one stream, and .gz / .zst suffixes do not hide the .jsonl extension.
  const std::string a = json_lines(0, 40000), b = json_lines(40000, 7);
  write_bytes(dir.file("plain.jsonl"), a + b);
  write_bytes(dir.file("c.jsonl.gz"), gzip(a) + gzip(b));
  write_bytes(dir.file("c.jsonl.zst"), zstd(a) + zstd(b));
  write_bytes(dir.file("text.zst"), zstd("one\n%\ntwo\n"));

  auto plain = options({dir.file("plain.jsonl")}, dir.file("plain"));
  const auto plain_stats = preprocess(plain);
  for (const char* name : {"c.jsonl.gz", "c.jsonl.zst"}) {
    auto o = options({dir.file(name)}, dir.file(std::string("out_") + name));
    const auto stats = preprocess(o);
    EXPECT_EQ(read_documents(o.output_prefix), read_documents(plain.output_prefix)) << name;
    EXPECT_EQ(stats.bytes, plain_stats.bytes) << name << ": bytes count the decompressed text";
  }
  auto text = options({dir.file("text.zst")}, dir.file("text"));
  text.doc_separator = "%";
  preprocess(text);
  EXPECT_EQ(read_documents(text.output_prefix),
            (std::vector<std::vector<int32_t>>{byte_ids("one\n", false), byte_ids("two\n", false)}));
}

TEST(Preprocess, TruncatedCompressedInputIsAnErrorNamingTheFile) {
  TempDir dir;
  const std::string data = json_lines(0, 2000);
  const std::string gz = gzip(data), zs = zstd(data);
  write_bytes(dir.file("cut.jsonl.gz"), gz.substr(0, gz.size() / 2));
  write_bytes(dir.file("cut.jsonl.zst"), zs.substr(0, zs.size() / 2));
  write_bytes(dir.file("bad.jsonl.gz"), gz.substr(0, 10) + std::string(200, 'x'));
  auto listing = dir.entries();
  EXPECT_ERROR_CONTAINS(preprocess(options({dir.file("cut.jsonl.gz")}, dir.file("o"))), "cut.jsonl.gz", "truncated");
  EXPECT_ERROR_CONTAINS(preprocess(options({dir.file("cut.jsonl.zst")}, dir.file("o"))), "cut.jsonl.zst", "truncated");
  EXPECT_ERROR_CONTAINS(preprocess(options({dir.file("bad.jsonl.gz")}, dir.file("o"))), "bad.jsonl.gz", "corrupt");
  EXPECT_EQ(dir.entries(), listing);
}

TEST(Preprocess, SkipBadLinesCountsAndDropsThem) {
  TempDir dir;
  std::string input = dir.file("mixed.jsonl");
  write_bytes(
      input,
      "{\"text\": \"a\"}\n{\"text\": broken}\n{\"body\": \"no text\"}\n[1, 2]\n{\"text\": 5}\n{\"text\": \"b\"}\n");
  auto o = options({input}, dir.file("out"));
  o.skip_bad_lines = true;
  const auto stats = preprocess(o);
  EXPECT_EQ(read_documents(o.output_prefix),
            (std::vector<std::vector<int32_t>>{byte_ids("a", false), byte_ids("b", false)}));
  EXPECT_EQ(stats.documents, 2);
  EXPECT_EQ(stats.skipped_lines, 4);
  EXPECT_NE(stats.first_skipped.find(input + ":2: malformed JSON"), std::string::npos) << stats.first_skipped;
}

TEST(Preprocess, CommandLineSummaryAndSkipFlag) {
  TempDir dir;
  std::string input = dir.file("c.jsonl");
  write_bytes(input, "{\"text\": \"hello\"}\nnot json\n");
  const std::string base = std::string(MEGATON_BINARY) + " preprocess --no-progress --input " + input +
                           " --output-prefix " + dir.file("out");
  auto r = megaton::testing::run_command(base);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(input + ":2:"), std::string::npos) << r.output;
  r = megaton::testing::run_command(base + " --skip-bad-lines");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 documents, 5 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("skipped 1 malformed lines; the first: " + input + ":2:"), std::string::npos) << r.output;
}
