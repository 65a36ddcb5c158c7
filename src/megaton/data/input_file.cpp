#include "megaton/data/input_file.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "megaton/core/error.h"
#include "megaton/core/regular_file.h"

namespace megaton::data {

namespace {
constexpr size_t kChunkBytes = 1 << 20;
constexpr std::array<unsigned char, 2> kGzipMagic{0x1f, 0x8b};
constexpr std::array<unsigned char, 4> kZstdMagic{0x28, 0xb5, 0x2f, 0xfd};
}  // namespace

// Pulls compressed bytes from the file through InputFile::read_raw and hands out decompressed ones.
class InputFile::Decoder {
 public:
  explicit Decoder(InputFile& file) : file_(file), in_(kChunkBytes) {}
  virtual ~Decoder() = default;
  virtual size_t decode(char* out, size_t n) = 0;

 protected:
  // Refills the input buffer once it is used up; false at the end of the file.
  bool refill() {
    if (in_pos_ < in_len_) return true;
    in_len_ = file_.read_raw(in_.data(), in_.size());
    in_pos_ = 0;
    return in_len_ > 0;
  }
  const std::string& path() const { return file_.path(); }

  InputFile& file_;
  std::vector<char> in_;
  size_t in_pos_ = 0, in_len_ = 0;
};

namespace {

class GzipDecoder final : public InputFile::Decoder {
 public:
  explicit GzipDecoder(InputFile& file) : Decoder(file) {
    // 15 + 32: the largest window, with the gzip / zlib header detected automatically.
    if (inflateInit2(&z_, 15 + 32) != Z_OK) fail(path(), ": cannot initialise the gzip decoder");
  }
  ~GzipDecoder() override { inflateEnd(&z_); }

  size_t decode(char* out, size_t n) override {
    auto* const start = reinterpret_cast<Bytef*>(out);
    z_.next_out = start;
    z_.avail_out = static_cast<uInt>(std::min<size_t>(n, UINT32_MAX));
    while (z_.next_out == start) {
      if (!refill()) {
        if (!at_member_end_) fail(path(), ": truncated gzip stream (the file ends inside a compressed member)");
        break;
      }
      if (at_member_end_) {
        // gzip allows several members back to back (`cat a.gz b.gz`); each decodes in turn.
        inflateReset(&z_);
        at_member_end_ = false;
      }
      z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
      z_.avail_in = static_cast<uInt>(in_len_ - in_pos_);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      in_pos_ = in_len_ - z_.avail_in;
      if (rc == Z_STREAM_END)
        at_member_end_ = true;
      else if (rc != Z_OK && rc != Z_BUF_ERROR)
        fail(path(), ": corrupt gzip data (zlib: ", z_.msg ? z_.msg : "error " + std::to_string(rc), ")");
    }
    return static_cast<size_t>(z_.next_out - start);
  }

 private:
  z_stream z_{};
  bool at_member_end_ = false;
};

class ZstdDecoder final : public InputFile::Decoder {
 public:
  explicit ZstdDecoder(InputFile& file) : Decoder(file), ctx_(ZSTD_createDCtx()) {
    if (!ctx_) fail(path(), ": cannot initialise the zstd decoder");
  }
  ~ZstdDecoder() override { ZSTD_freeDCtx(ctx_); }

  size_t decode(char* out, size_t n) override {
    ZSTD_outBuffer o{out, n, 0};
    while (o.pos == 0) {
      if (!refill()) {
        // The last call's return value is 0 exactly when a frame was completed and flushed.
        if (pending_ != 0) fail(path(), ": truncated zstd stream (the file ends inside a frame)");
        break;
      }
      ZSTD_inBuffer i{in_.data(), in_len_, in_pos_};
      pending_ = ZSTD_decompressStream(ctx_, &o, &i);
      if (ZSTD_isError(pending_)) fail(path(), ": corrupt zstd data (", ZSTD_getErrorName(pending_), ")");
      in_pos_ = i.pos;
    }
    return o.pos;
  }

 private:
  ZSTD_DCtx* ctx_;
  size_t pending_ = 0;
};

}  // namespace

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  file_ = fopen_regular_file(path_, "input");
  std::array<unsigned char, 4> magic{};
  const size_t got = std::fread(magic.data(), 1, magic.size(), file_);
  std::rewind(file_);
  if (got >= kGzipMagic.size() && std::equal(kGzipMagic.begin(), kGzipMagic.end(), magic.begin())) {
    compression_ = Compression::kGzip;
    decoder_ = std::make_unique<GzipDecoder>(*this);
  } else if (got >= kZstdMagic.size() && magic == kZstdMagic) {
    compression_ = Compression::kZstd;
    decoder_ = std::make_unique<ZstdDecoder>(*this);
  }
}

InputFile::~InputFile() {
  decoder_.reset();
  if (file_) std::fclose(file_);
}

size_t InputFile::read_raw(char* buf, size_t n) {
  const size_t got = std::fread(buf, 1, n, file_);
  if (got < n && std::ferror(file_)) fail("error reading ", path_, ": ", std::strerror(errno));
  disk_bytes_ += got;
  return got;
}

size_t InputFile::read(char* buf, size_t n) { return decoder_ ? decoder_->decode(buf, n) : read_raw(buf, n); }

std::string name_without_compression_suffix(const std::string& path) {
  std::filesystem::path p(path);
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".gz" || ext == ".zst" ? p.replace_extension().string() : path;
}

}  // namespace megaton::data
