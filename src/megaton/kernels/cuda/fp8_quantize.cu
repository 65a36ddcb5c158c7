#include "megaton/kernels/cuda/fp8_quantize.h"

#include "megaton/core/fp8_format.h"
#include "megaton/kernels/cuda/elementwise.cuh"
#include "megaton/kernels/fp8_scale.h"

namespace megaton::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kAmaxChunk = int64_t{1} << 16;  // elements per block of the amax pass
constexpr int kTile = 128;                        // the extent of a 1x128 tile and a 128x128 block
constexpr int kColumnChunk = 32;                  // source columns per block of the transposing kernel

// How a code's scale is found: one per tensor (state[1]), one per 1x128 tile of the layout (from
// the tile's own amax), or one per 128x128 block of the source (block_scale, computed first).
enum class Mode : int { Tensor, Tile, Block };

// NaN-propagating max (fmaxf drops NaNs; the CPU quantiser's amax keeps them).
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The block's max of every thread's v, valid in every thread.
__device__ float block_max(float v, float* shared) {
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = warp_max(lane < kWarps ? shared[lane] : 0.0f);
  __syncthreads();  // shared may be reused after return
  return v;
}

// partial[block] = max |x| over the block's chunk.
template <typename T>
__global__ void amax_partials_kernel(float* partial, const T* x, int64_t n) {
  __shared__ float shared[kWarps];
  const int64_t begin = blockIdx.x * kAmaxChunk, end = begin + kAmaxChunk < n ? begin + kAmaxChunk : n;
  float m = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) m = nan_max(m, fabsf(detail::load(x, i)));
  m = block_max(m, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

// One block: state[0] = the tensor's amax from the partials; with per-tensor scaling state[1] = the
// scale (the given one, or TE's from the amax) and scale_inv[0] = 1 / scale, as the CPU stores it.
__global__ void finish_tensor_kernel(float* state, float* scale_inv, const float* partial, int64_t parts,
                                     float given_scale, float fp8_max, bool pow2) {
  __shared__ float shared[kWarps];
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) m = nan_max(m, partial[i]);
  m = block_max(m, shared);
  if (threadIdx.x == 0) {
    state[0] = m;
    if (scale_inv) {
      const float scale = given_scale > 0.0f ? given_scale : fp8_scale_from_amax(m, fp8_max, pow2);
      state[1] = scale;
      scale_inv[0] = 1.0f / scale;
    }
  }
}

// One block per 128x128 block of the source: block_scale[block] = its scale, and its scale_inv at
// the block's place in the layout's grid (the grid transposes with the layout).
template <typename T>
__global__ void block_scales_kernel(float* block_scale, float* scale_inv, const T* x, int64_t rows, int64_t cols,
                                    int64_t block_rows, int64_t block_cols, bool transposed, float fp8_max, bool pow2) {
  __shared__ float shared[kWarps];
  const int64_t br = blockIdx.x / block_cols, bc = blockIdx.x % block_cols;
  const int64_t r0 = br * kTile, c = bc * kTile + threadIdx.x % kTile;
  const int64_t r1 = r0 + kTile < rows ? r0 + kTile : rows;
  float m = 0.0f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.x / kTile; r < r1; r += kThreads / kTile)
      m = nan_max(m, fabsf(detail::load(x, r * cols + c)));
  m = block_max(m, shared);
  if (threadIdx.x == 0) {
    const float scale = fp8_scale_from_amax(m, fp8_max, pow2);
    block_scale[blockIdx.x] = scale;
    scale_inv[transposed ? bc * block_rows + br : blockIdx.x] = 1.0f / scale;
  }
}

// The rowwise layout: one warp per 1x128 run of a row (tiles_per_row = ceil(cols / 128)), each lane
// four columns 32 apart, so every load and store of the warp is contiguous.
template <typename T, fp8::Format F>
__global__ void encode_rows_kernel(uint8_t* codes, float* scale_inv, const T* x, int64_t rows, int64_t cols,
                                   int64_t tiles_per_row, Mode mode, const float* state, const float* block_scale,
                                   float fp8_max, bool pow2) {
  const int lane = threadIdx.x % 32;
  const int64_t unit = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (unit >= rows * tiles_per_row) return;  // the whole warp leaves together
  const int64_t r = unit / tiles_per_row, t = unit % tiles_per_row, c0 = t * kTile;
  float v[4], m = 0.0f;
  for (int i = 0; i < 4; ++i) {
    const int64_t c = c0 + lane + 32 * i;
    v[i] = c < cols ? detail::load(x, r * cols + c) : 0.0f;
    m = nan_max(m, fabsf(v[i]));
  }
  float scale;
  if (mode == Mode::Tile) {
    scale = fp8_scale_from_amax(warp_max(m), fp8_max, pow2);
    if (lane == 0) scale_inv[unit] = 1.0f / scale;  // the grid is [rows, tiles_per_row]
  } else {
    scale = mode == Mode::Block ? block_scale[(r / kTile) * tiles_per_row + t] : state[1];
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t c = c0 + lane + 32 * i;
    if (c < cols) codes[r * cols + c] = fp8::encode_inline<F>(v[i] * scale);
  }
}

// The transposed layout [cols, rows]: a block stages 128 source rows x 32 source columns in shared
// memory (coalesced reads), then each warp writes whole output rows: one source column's 128 values,
// which are one 1x128 tile of the transposed layout (128 consecutive codes, a coalesced store).
template <typename T, fp8::Format F>
__global__ void encode_columns_kernel(uint8_t* codes, float* scale_inv, const T* x, int64_t rows, int64_t cols,
                                      int64_t column_chunks, int64_t row_tiles, int64_t block_cols, Mode mode,
                                      const float* state, const float* block_scale, float fp8_max, bool pow2) {
  __shared__ float tile[kTile][kColumnChunk + 1];  // +1: a column read hits 32 different banks
  const int64_t rt = blockIdx.x / column_chunks, r0 = rt * kTile, c0 = blockIdx.x % column_chunks * kColumnChunk;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = warp; i < kTile; i += kWarps) {
    const int64_t r = r0 + i, c = c0 + lane;
    tile[i][lane] = r < rows && c < cols ? detail::load(x, r * cols + c) : 0.0f;
  }
  __syncthreads();
  for (int j = warp; j < kColumnChunk && c0 + j < cols; j += kWarps) {
    const int64_t c = c0 + j;
    float v[4], m = 0.0f;
    for (int i = 0; i < 4; ++i) {
      v[i] = tile[lane + 32 * i][j];
      m = nan_max(m, fabsf(v[i]));
    }
    float scale;
    if (mode == Mode::Tile) {
      scale = fp8_scale_from_amax(warp_max(m), fp8_max, pow2);
      if (lane == 0) scale_inv[c * row_tiles + rt] = 1.0f / scale;  // the grid is [cols, row_tiles]
    } else {
      scale = mode == Mode::Block ? block_scale[rt * block_cols + c / kTile] : state[1];
    }
    for (int i = 0; i < 4; ++i) {
      const int64_t r = r0 + lane + 32 * i;
      if (r < rows) codes[c * rows + r] = fp8::encode_inline<F>(v[i] * scale);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Fp8Matrix fp8_quantize(const Tensor& x, const Fp8QuantizeOptions& o, const std::string& name) {
  MEGATON_CHECK(x.dim() == 2, "FP8 quantisation of '", x.name(), "' takes a 2-D matrix, got ", shape_str(x.shape()));
  MEGATON_CHECK(
      o.granularity != Fp8Granularity::Mx1x32, "FP8 quantisation of '", x.name(), "' on ", x.device().str(),
      ": MXFP8 is CPU only here (cuBLASLt's MX GEMMs need Blackwell); use per-tensor, 1x128 or 128x128 scales");
  check_fp8_quantize_options(x.name(), o);
  const Device device = x.device();
  MEGATON_CUDA_CHECK(cudaSetDevice(device.index));
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t lr = o.transpose ? cols : rows, lc = o.transpose ? rows : cols;  // the layout's shape
  const Fp8TileShape t = fp8_tile_shape(o.granularity, lr, lc);
  Fp8Matrix q;
  q.granularity = o.granularity;
  q.data = Tensor::empty({lr, lc}, fp8::dtype_of_format(o.format), o.category, name, device);
  q.scale_inv =
      Tensor::empty({ceil_div(lr, t.rows), ceil_div(lc, t.cols)}, DType::F32, o.category, name + "_scale_inv", device);
  if (x.numel() == 0) return q;

  constexpr std::string_view op = "fp8_quantize";
  const cudaStream_t stream = nullptr;  // the device's default stream, like the other kernels here
  const float fp8_max = fp8::info(o.format).max;
  const bool per_tensor = o.granularity == Fp8Granularity::Tensor;
  const Mode mode = per_tensor ? Mode::Tensor : o.granularity == Fp8Granularity::Tile1x128 ? Mode::Tile : Mode::Block;
  Tensor state = Tensor::empty({2}, DType::F32, MemCategory::Workspace, "fp8_quantize_state", device);
  const int64_t parts = ceil_div(x.numel(), kAmaxChunk);
  Tensor partial = Tensor::empty({parts}, DType::F32, MemCategory::Workspace, "fp8_quantize_amax", device);
  const int64_t block_rows = ceil_div(rows, kTile), block_cols = ceil_div(cols, kTile);
  Tensor block_scale = mode == Mode::Block ? Tensor::empty({block_rows * block_cols}, DType::F32,
                                                           MemCategory::Workspace, "fp8_quantize_block_scales", device)
                                           : Tensor();
  auto* scale_inv = static_cast<float*>(q.scale_inv.raw());
  auto* codes = static_cast<uint8_t*>(q.data.raw());
  auto* st = static_cast<float*>(state.raw());
  const float* bs = mode == Mode::Block ? static_cast<const float*>(block_scale.raw()) : nullptr;
  detail::dispatch_io("fp8_quantize", x, {}, [&]<typename T>(T) {
    const auto* in = static_cast<const T*>(x.raw());
    amax_partials_kernel<<<detail::grid_blocks(parts, op), kThreads, 0, stream>>>(static_cast<float*>(partial.raw()),
                                                                                  in, x.numel());
    MEGATON_CUDA_LAUNCH_CHECK();
    finish_tensor_kernel<<<1, kThreads, 0, stream>>>(st, per_tensor ? scale_inv : nullptr,
                                                     static_cast<const float*>(partial.raw()), parts,
                                                     o.scale.value_or(0.0f), fp8_max, o.pow2_scales);
    MEGATON_CUDA_LAUNCH_CHECK();
    if (mode == Mode::Block) {
      block_scales_kernel<<<detail::grid_blocks(block_rows * block_cols, op), kThreads, 0, stream>>>(
          static_cast<float*>(block_scale.raw()), scale_inv, in, rows, cols, block_rows, block_cols, o.transpose,
          fp8_max, o.pow2_scales);
      MEGATON_CUDA_LAUNCH_CHECK();
    }
    const auto encode = [&]<fp8::Format F>() {
      if (o.transpose) {
        const int64_t column_chunks = ceil_div(cols, kColumnChunk);
        encode_columns_kernel<T, F><<<detail::grid_blocks(block_rows * column_chunks, op), kThreads, 0, stream>>>(
            codes, scale_inv, in, rows, cols, column_chunks, block_rows, block_cols, mode, st, bs, fp8_max,
            o.pow2_scales);
      } else {
        encode_rows_kernel<T, F><<<detail::grid_blocks(ceil_div(rows * block_cols, kWarps), op), kThreads, 0, stream>>>(
            codes, scale_inv, in, rows, cols, block_cols, mode, st, bs, fp8_max, o.pow2_scales);
      }
      MEGATON_CUDA_LAUNCH_CHECK();
    };
    if (o.format == fp8::Format::E4M3)
      encode.template operator()<fp8::Format::E4M3>();
    else
      encode.template operator()<fp8::Format::E5M2>();
  });
  // The amax goes to the host (what delayed scaling records): this waits for the kernels.
  MEGATON_CUDA_CHECK(cudaMemcpyAsync(&q.amax, st, sizeof(float), cudaMemcpyDeviceToHost, stream));
  MEGATON_CUDA_CHECK(cudaStreamSynchronize(stream));
  return q;
}

}  // namespace megaton::kernels::cuda
