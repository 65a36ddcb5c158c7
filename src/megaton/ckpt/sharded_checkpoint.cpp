#include "megaton/ckpt/sharded_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "megaton/core/atomic_file.h"
#include "megaton/core/checked.h"
#include "megaton/core/error.h"
#include "megaton/core/json_integer.h"
#include "megaton/core/regular_file.h"

namespace megaton::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMetadataFormat = "megaton-sharded";
constexpr int kMetadataVersion = 1;

std::string numbered(const char* prefix, int rank, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%05d%s", prefix, rank, suffix);
  return buf;
}

void write_json(const std::string& path, const nlohmann::json& j) { write_file_atomically(path, j.dump(1) + "\n"); }

nlohmann::json read_json(const std::string& path, const char* what) {
  try {
    return nlohmann::json::parse(read_regular_file(path, what));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": ", e.what());
  }
}

// A piece's "start" or "length" along the split dimension: bounded so that summing the pieces of one
// tensor cannot overflow.
int64_t piece_extent(const nlohmann::json& piece, const char* key, const std::string& what) {
  return json_integer(piece.at(key), what + ": piece " + key, 0, int64_t{1} << 56);
}

// The dimension a tensor is split along; checked against the shape's rank by the caller.
int split_dim(const nlohmann::json& tensor, const std::string& what) {
  return static_cast<int>(json_integer(tensor.at("dim"), what + ": split dim", 0, 64));
}

// A global shape as JSON gives it, every extent positive and the element count representable.
Shape checked_shape(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array() || j.empty()) fail(what, ": shape must be a non-empty array");
  Shape s;
  int64_t numel = 1;
  for (const auto& e : j) {
    if (!e.is_number_integer() || (!e.is_number_unsigned() && e.get<int64_t>() < 1))
      fail(what, ": shape ", j.dump(), " has an extent below 1");
    s.push_back(json_integer(e, what + ": shape extent", 1, INT64_MAX));
    numel = checked_mul(what, numel, s.back());
  }
  return s;
}

// The shape of a piece: the global shape with `length` along `dim`.
Shape piece_shape(Shape global, int dim, int64_t length) {
  global[static_cast<size_t>(dim)] = length;
  return global;
}

// Copies the part of the global tensor that both src (a piece along sdim at sstart) and dst (a piece
// along ddim at dstart) hold; returns the number of elements copied. Both are contiguous, of one
// dtype, with the global shape apart from their own dim.
int64_t copy_overlap(const Tensor& src, int sdim, int64_t sstart, const Tensor& dst, int ddim, int64_t dstart) {
  const size_t n = src.shape().size();
  std::vector<int64_t> lo(n), hi(n), src_lo(n, 0), dst_lo(n, 0), sstride(n, 1), dstride(n, 1);
  src_lo[static_cast<size_t>(sdim)] = sstart;
  dst_lo[static_cast<size_t>(ddim)] = dstart;
  for (size_t a = 0; a < n; ++a) {
    lo[a] = std::max(src_lo[a], dst_lo[a]);
    hi[a] = std::min(src_lo[a] + src.shape()[a], dst_lo[a] + dst.shape()[a]);
    if (lo[a] >= hi[a]) return 0;
  }
  for (size_t a = n - 1; a > 0; --a) {
    sstride[a - 1] = sstride[a] * src.shape()[a];
    dstride[a - 1] = dstride[a] * dst.shape()[a];
  }
  const size_t es = dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.raw());
  auto* d = static_cast<char*>(dst.raw());
  const int64_t run = hi[n - 1] - lo[n - 1];
  std::vector<int64_t> idx(lo.begin(), lo.end());
  int64_t copied = 0;
  for (;;) {
    int64_t so = 0, dof = 0;
    for (size_t a = 0; a < n; ++a) {
      so += (idx[a] - src_lo[a]) * sstride[a];
      dof += (idx[a] - dst_lo[a]) * dstride[a];
    }
    std::memcpy(d + dof * static_cast<int64_t>(es), s + so * static_cast<int64_t>(es), static_cast<size_t>(run) * es);
    copied += run;
    // The next run: an odometer over every axis but the last.
    size_t a = n - 1;
    while (a > 0) {
      --a;
      if (++idx[a] < hi[a]) break;
      idx[a] = lo[a];
      if (a == 0) return copied;
    }
    if (n == 1) return copied;
  }
}

}  // namespace

std::string shard_file_name(int rank) { return numbered("shard_", rank, ".safetensors"); }
std::string shard_index_name(int rank) { return numbered("shard_", rank, ".json"); }

void ShardWriter::add(const std::string& name, const Shape& global_shape, int dim, int64_t start, const Tensor& data) {
  MEGATON_CHECK(dim >= 0 && static_cast<size_t>(dim) < global_shape.size() &&
                    data.shape() == piece_shape(global_shape, dim, data.size(dim)) && start >= 0 &&
                    start + data.size(dim) <= global_shape[static_cast<size_t>(dim)],
                "checkpoint piece of '", name, "': ", shape_str(data.shape()), " at ", start, " along dim ", dim,
                " is no piece of ", shape_str(global_shape));
  pieces_.push_back({name, global_shape, dim, start, data});
}

void ShardWriter::write(const std::string& dir, int rank) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  nlohmann::json pieces = nlohmann::json::array();
  for (const Piece& p : pieces_) {
    const std::string key = p.name + "@" + std::to_string(p.start);
    tensors.emplace_back(key, p.data);
    pieces.push_back({{"tensor", p.name},
                      {"key", key},
                      {"shape", p.global_shape},
                      {"dtype", dtype_name(p.data.dtype())},
                      {"dim", p.dim},
                      {"start", p.start},
                      {"length", p.data.size(p.dim)}});
  }
  const std::string file = (fs::path(dir) / shard_file_name(rank)).string();
  save_safetensors(file, tensors, {{"format", kMetadataFormat}, {"rank", std::to_string(rank)}});
  const FileDigest d = digest_file(file);
  write_json((fs::path(dir) / shard_index_name(rank)).string(),
             {{"rank", rank}, {"file", d.name}, {"bytes", d.bytes}, {"xxh3_64", d.xxh3}, {"pieces", pieces}});
}

std::vector<FileDigest> merge_shard_indexes(const std::string& dir, int world_size, double timeout_s) {
  struct SavedPiece {
    std::string file, key;
    int64_t start, length;
  };
  struct SavedTensor {
    nlohmann::json shape;
    std::string dtype;
    int dim;
    std::vector<SavedPiece> pieces;
  };
  std::map<std::string, SavedTensor> tensors;
  std::vector<FileDigest> digests;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int r = 0; r < world_size; ++r) {
    const std::string path = (fs::path(dir) / shard_index_name(r)).string();
    while (!fs::exists(path)) {
      if (std::chrono::steady_clock::now() > deadline)
        fail("checkpoint ", dir, ": rank ", r, " did not write its shards (no ", shard_index_name(r), ") within ",
             timeout_s, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const nlohmann::json index = read_json(path, "checkpoint shard index");
    try {
      digests.push_back({index.at("file").get<std::string>(), json_uint64(index.at("bytes"), path + ": bytes"),
                         json_uint64(index.at("xxh3_64"), path + ": xxh3_64")});
      for (const auto& p : index.at("pieces")) {
        const auto name = p.at("tensor").get<std::string>();
        const std::string what = path + ": tensor '" + name + "'";
        SavedTensor t{p.at("shape"), p.at("dtype").get<std::string>(), split_dim(p, what), {}};
        auto [it, fresh] = tensors.emplace(name, t);
        if (!fresh && (it->second.shape != t.shape || it->second.dtype != t.dtype || it->second.dim != t.dim))
          fail(path, ": tensor '", name, "' is saved as ", t.dtype, " ", t.shape.dump(), " split along dim ", t.dim,
               ", a lower rank saved it as ", it->second.dtype, " ", it->second.shape.dump(), " along dim ",
               it->second.dim);
        it->second.pieces.push_back({digests.back().name, p.at("key").get<std::string>(),
                                     piece_extent(p, "start", what), piece_extent(p, "length", what)});
      }
    } catch (const nlohmann::json::exception& e) {
      fail(path, ": corrupt shard index: ", e.what());
    }
  }
  nlohmann::json out = nlohmann::json::object();
  for (auto& [name, t] : tensors) {
    // Lowest rank first among copies of one piece (stable sort over pieces appended in rank order).
    std::stable_sort(t.pieces.begin(), t.pieces.end(), [](const SavedPiece& a, const SavedPiece& b) { return a.start < b.start; });
    nlohmann::json pieces = nlohmann::json::array();
    int64_t covered = 0;
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      const SavedPiece& p = t.pieces[i];
      if (i > 0 && p.start == t.pieces[i - 1].start && p.length == t.pieces[i - 1].length) continue;  // a copy
      if (p.start != covered)
        fail("checkpoint ", dir, ": tensor '", name, "' has ", p.start < covered ? "overlapping pieces" : "a gap",
             " at ", std::min(p.start, covered), " along dim ", t.dim);
      covered += p.length;
      pieces.push_back({{"file", p.file}, {"key", p.key}, {"start", p.start}, {"length", p.length}});
    }
    if (covered != json_integer(t.shape.at(static_cast<size_t>(t.dim)),
                                "checkpoint " + dir + ": tensor '" + name + "' shape", 0, INT64_MAX))
      fail("checkpoint ", dir, ": tensor '", name, "' is saved up to ", covered, " of ", t.shape.dump(), " along dim ",
           t.dim);
    out[name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"dim", t.dim}, {"pieces", pieces}};
  }
  write_json((fs::path(dir) / kShardMetadataName).string(),
             {{"format", kMetadataFormat}, {"version", kMetadataVersion}, {"world_size", world_size}, {"tensors", out}});
  return digests;
}

ShardedReader::ShardedReader(std::string dir) : dir_(std::move(dir)) {
  const std::string path = (fs::path(dir_) / kShardMetadataName).string();
  const nlohmann::json meta = read_json(path, "sharded checkpoint metadata");
  try {
    if (meta.at("format") != kMetadataFormat || meta.at("version") != kMetadataVersion)
      fail(path, ": format ", meta.at("format").dump(), " version ", meta.at("version").dump(), ", this build reads ",
           kMetadataFormat, " version ", kMetadataVersion);
    for (const auto& [name, t] : meta.at("tensors").items()) {
      const std::string what = path + ": tensor '" + name + "'";
      Entry e{checked_shape(t.at("shape"), what),
              dtype_from_name(t.at("dtype").get<std::string>()),
              split_dim(t, what),
              {}};
      if (static_cast<size_t>(e.dim) >= e.shape.size()) fail(what, ": split dim ", e.dim, " out of range");
      int64_t covered = 0;
      for (const auto& p : t.at("pieces")) {
        Piece piece{p.at("file").get<std::string>(), p.at("key").get<std::string>(), piece_extent(p, "start", what),
                    piece_extent(p, "length", what)};
        if (piece.file.empty() || piece.file.find('/') != std::string::npos || piece.file.starts_with("."))
          fail(what, ": piece file '", piece.file, "' is not a file name inside the checkpoint directory");
        if (piece.start != covered || piece.length < 1) fail(what, ": pieces are not consecutive at ", covered);
        covered += piece.length;
        e.pieces.push_back(std::move(piece));
      }
      if (covered != e.shape[static_cast<size_t>(e.dim)])
        fail(what, ": pieces cover ", covered, " of ", e.shape[static_cast<size_t>(e.dim)], " along dim ", e.dim);
      entries_.emplace(name, std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": ", e.what());
  }
}

ShardedReader::~ShardedReader() = default;

bool ShardedReader::has(const std::string& name) const { return entries_.count(name) > 0; }

const ShardedReader::Entry& ShardedReader::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail(dir_, ": the checkpoint holds no tensor '", name, "'");
  return it->second;
}

const Shape& ShardedReader::global_shape(const std::string& name) const { return entry(name).shape; }

std::vector<std::string> ShardedReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

Tensor ShardedReader::piece_data(const std::string& name, const Piece& piece) {
  auto file = files_.find(piece.file);
  if (file == files_.end())
    file = files_.emplace(piece.file, std::make_unique<SafetensorsReader>((fs::path(dir_) / piece.file).string())).first;
  const SafetensorsReader& f = *file->second;
  const Entry& e = entry(name);
  if (!f.has(piece.key)) fail(f.path(), ": no tensor '", piece.key, "' (a piece of '", name, "')");
  if (f.dtype(piece.key) != e.dtype || f.shape(piece.key) != piece_shape(e.shape, e.dim, piece.length))
    fail(f.path(), ": '", piece.key, "' is ", dtype_name(f.dtype(piece.key)), " ", shape_str(f.shape(piece.key)),
         ", the metadata says ", dtype_name(e.dtype), " ", shape_str(piece_shape(e.shape, e.dim, piece.length)));
  return f.read(piece.key, MemCategory::Workspace);
}

void ShardedReader::read(const std::string& name, int dim, int64_t start, const Tensor& dst) {
  const Entry& e = entry(name);
  if (dim < 0 || static_cast<size_t>(dim) >= e.shape.size() || start < 0 ||
      dst.shape() != piece_shape(e.shape, dim, dst.size(dim)) || start + dst.size(dim) > e.shape[static_cast<size_t>(dim)])
    fail(dir_, ": tensor '", name, "' is ", shape_str(e.shape), "; its region at ", start, " along dim ", dim,
         " cannot fill ", shape_str(dst.shape()), " (a model of another shape?)");
  if (dst.dtype() != e.dtype)
    fail(dir_, ": tensor '", name, "' is saved as ", dtype_name(e.dtype), ", read as ", dtype_name(dst.dtype()));
  int64_t copied = 0;
  for (const Piece& p : e.pieces) {
    const int64_t end = start + dst.size(dim);
    if (e.dim == dim && (p.start >= end || p.start + p.length <= start)) continue;  // cannot overlap: not loaded
    copied += copy_overlap(piece_data(name, p), e.dim, p.start, dst, dim, start);
  }
  MEGATON_CHECK(copied == dst.numel(), dir_, ": tensor '", name, "': ", copied, " of ", dst.numel(),
                " elements found in its pieces");
}

Tensor ShardedReader::read_whole(const std::string& name, MemCategory cat) {
  const Entry& e = entry(name);
  Tensor out = Tensor::empty(e.shape, e.dtype, cat, name);
  read(name, 0, 0, out);
  return out;
}

}  // namespace megaton::ckpt
