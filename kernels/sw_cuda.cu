// CUDA engine for the soft Smith-Waterman recurrence (see GUIDE section 1). Plain CUDA: no torch
// headers here, so nvcc compiles this file in seconds; kernels/sw_cuda.cpp is the torch binding.
//
// Layout: one warp per pair. The target columns are cut into tiles of 32*R; in a tile, lane k owns
// the R columns [c0 + kR, c0 + kR + R) and keeps their H values of the previous row in registers.
// The warp sweeps the query rows as a wavefront: at step s, lane k computes row i = s - k, so the
// value it needs from the column left of its strip, H[i][c0 + kR - 1], is what lane k-1 computed at
// step s-1, passed on by one shuffle. Lane 31 writes its last column to a per-pair buffer that lane 0
// reads in the next tile, so neither M nor N has a cap.
//
// A soft cell is m + t ln2 * log2(1 + sum over the three non-maximal terms of 2^((x - m) log2(e) / t))
// with m the largest of the four terms (0, match, delete, insert): 3 ex2 + 1 lg2 on the special
// function units, the ceiling of this design. H stays in score units, as in the CPU engine and the
// reference, so a gap step adds exactly the same float. max.NaN / min.NaN carry a NaN in S to that
// pair's score and nowhere else.
//
// Dense float32 scores reach the lanes through a per-warp ring in shared memory, filled by
// cp.async a few rows ahead: the warp copies row s whole and coalesced, lane k reads it k steps later.
// Scores from codes are looked up in the substitution matrix, held in shared memory.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "sw_cuda.h"

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kPrefetchRows = 4;                  // rows the cp.async ring runs ahead of lane 0
constexpr int kRingRows = kWarp + kPrefetchRows;  // lane 31 reads 31 rows behind lane 0

// ---------------------------------------------------------------------------------------------------
// Arithmetic: float uses the special function units, double the accurate library calls.

__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ double max_nan(double a, double b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ double min_nan(double a, double b) { return (a != a || a < b) ? a : b; }

__device__ __forceinline__ float exp2_(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float log2_(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ double exp2_(double x) { return exp2(x); }
__device__ __forceinline__ double log2_(double x) { return log2(x); }

// The largest finite value: an infinite maximum is replaced by it before the differences, so that
// inf - inf never makes a NaN (the cell is then +inf, as torch.logsumexp gives).
__device__ __forceinline__ float finite_max(float) { return FLT_MAX; }
__device__ __forceinline__ double finite_max(double) { return DBL_MAX; }

template <typename A>
struct Consts {
  A gap;
  A c;   // log2(e) / t, capped at the largest finite value
  A tl;  // t * ln(2)
};

template <typename A, bool SOFT>
__device__ __forceinline__ A cell(A diag, A up, A left, const Consts<A>& k) {
  const A zero = A(0);
  const A p = max_nan(zero, diag), q = max_nan(up, left);
  const A m = max_nan(p, q);
  if (!SOFT) return m;
  const A lo1 = min_nan(zero, diag), lo2 = min_nan(up, left), lo3 = min_nan(p, q);
  const A mf = fmin(m, finite_max(m));  // fmin drops a NaN m; m itself carries it below
  const A e = exp2_((lo1 - mf) * k.c) + exp2_((lo2 - mf) * k.c) + exp2_((lo3 - mf) * k.c);
  return m + k.tl * log2_(A(1) + e);
}

// Rows of R values: one 16-byte access per lane where the row allows it (the DP table and the gradient
// are fresh allocations, so only N decides), else one access per value.
template <typename A, int R>
__device__ __forceinline__ void store_row(A* dst, const A (&v)[R], int valid, bool vec) {
  if constexpr (R == 4 && sizeof(A) == 4) {
    if (vec && valid == R) {
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < valid) dst[r] = v[r];
}

template <typename A, int R>
__device__ __forceinline__ void load_row_values(const A* src, A (&v)[R], int valid, bool vec) {
  if constexpr (R == 4 && sizeof(A) == 4) {
    if (vec && valid == R) {
      const float4 x = *reinterpret_cast<const float4*>(src);
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      return;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = r < valid ? src[r] : A(0);
}

// ---------------------------------------------------------------------------------------------------
// Score sources: give lane k the R scores of its row i = s - k at step s.

struct Pair {
  int64_t b;    // pair index
  int64_t qn;   // query length
  int64_t tn;   // target length
};

// Dense S (B, M, N), contiguous, read straight from global memory; the next row's loads are issued one
// step ahead. Used for float64 (the accuracy path, for gradcheck; float32 goes through the ring).
template <typename A, int R>
struct DenseDirect {
  const A* S;
  int64_t M, N;
  const A* row0;  // S[b, 0, c] for this lane's first column c
  A next[R];
  int lane;
  int64_t col;

  __device__ void begin_tile(const Pair& p, int lane_, int64_t col_) {
    lane = lane_;
    col = col_;
    row0 = S + p.b * M * N + col;
    load(p, 0, next);
  }
  __device__ __forceinline__ void load(const Pair& p, int s, A (&v)[R]) {
    const int64_t i = int64_t(s) - lane;
    const bool ok = i >= 0 && i < p.qn;
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = (ok && col + r < N) ? __ldg(row0 + i * N + r) : A(0);
  }
  __device__ __forceinline__ void row(const Pair& p, int s, A (&v)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = next[r];
    load(p, s + 1, next);
  }
};

// Dense float32 S through a per-warp ring of kRingRows x 32 lanes x R floats in shared memory, filled
// kPrefetchRows rows ahead of lane 0 by cp.async (no registers held, no stall until the data is used).
// Each lane copies and later reads only its own R floats per row, so cp.async.wait_group is the only
// synchronisation needed.
template <int R>
struct DenseRing {
  static_assert(R == 1 || R == 4, "R is 1 or 4");
  typedef typename std::conditional<R == 4, float4, float>::type Chunk;
  const float* S;
  int64_t M, N;
  Chunk* ring;  // this warp's ring: ring[row % kRingRows][lane]
  const float* row0;
  bool aligned;
  int lane;
  int64_t col;
  int write_slot, read_slot;

  __device__ __forceinline__ void issue(const Pair& p, int64_t i) {
    if (i < p.qn) {
      const float* src = row0 + i * N;
      const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(ring + write_slot * kWarp + lane));
      if (R == 4 && aligned) {
        const int bytes = col < N ? 16 : 0;  // zero-fill past the matrix
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(bytes ? src : S),
                     "r"(bytes));
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int bytes = col + r < N ? 4 : 0;
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d + 4 * r),
                       "l"(bytes ? src + r : S), "r"(bytes));
        }
      }
    }
    asm volatile("cp.async.commit_group;\n" ::);
    write_slot = write_slot + 1 == kRingRows ? 0 : write_slot + 1;
  }
  __device__ void begin_tile(const Pair& p, int lane_, int64_t col_) {
    lane = lane_;
    col = col_;
    row0 = S + p.b * M * N + col;
    aligned = (N % 4 == 0) && (reinterpret_cast<uintptr_t>(S) % 16 == 0);
    write_slot = 0;
    read_slot = (kRingRows - lane) % kRingRows;  // row -lane, which lane k reads at step 0
    __syncwarp();                                // the last tile's reads are done before refilling
    for (int i = 0; i < kPrefetchRows; ++i) issue(p, i);
  }
  __device__ __forceinline__ void row(const Pair& p, int s, float (&v)[R]) {
    issue(p, int64_t(s) + kPrefetchRows);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPrefetchRows));
    const float* x = reinterpret_cast<const float*>(ring + read_slot * kWarp + lane);
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = x[r];
    read_slot = read_slot + 1 == kRingRows ? 0 : read_slot + 1;
  }
};

// Scores looked up from uint8 codes in a K x K float32 matrix held in shared memory.
template <int R>
struct Codes {
  const uint8_t* query;   // (B, M)
  const uint8_t* target;  // (B, N)
  int64_t M, N;
  const float* matrix;  // shared memory, K x K
  int K;
  int offs[R];  // this lane's target codes
  const uint8_t* q;
  int next_row;  // K * (code of the next row)
  int lane;

  __device__ void begin_tile(const Pair& p, int lane_, int64_t col) {
    lane = lane_;
#pragma unroll
    for (int r = 0; r < R; ++r) offs[r] = col + r < N ? target[p.b * N + col + r] : 0;
    q = query + p.b * M;
    next_row = load(p, 0);
  }
  __device__ __forceinline__ int load(const Pair& p, int s) const {
    const int64_t i = int64_t(s) - lane;
    return (i >= 0 && i < p.qn) ? K * int(__ldg(q + i)) : 0;
  }
  __device__ __forceinline__ void row(const Pair& p, int s, float (&v)[R]) {
    const float* m = matrix + next_row;
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = m[offs[r]];
    next_row = load(p, s + 1);
  }
};

// ---------------------------------------------------------------------------------------------------
// The forward sweep of one warp over one pair.

template <typename A>
struct Outputs {
  A* scores;          // (B,)
  A* table;           // (B, M, N) H without its zero border, or null when no backward follows
  int64_t* best_at;   // (B,) row-major index i*N + j of the first maximal cell, -1 for the border
  A* boundary;        // (B, M) H of the last column of a tile, for the next tile; null if one tile
};

// How a tile's last column reaches the next tile. One warp walking all the tiles of a pair keeps it
// in one buffer per pair, overwritten in place (lane 31 writes row i long after lane 0 read it).
template <typename A>
struct InPlace {
  A* bnd;  // (M,) for this pair, or null when the pair has one tile
  __device__ __forceinline__ const A* source(int64_t) const { return bnd; }
  __device__ __forceinline__ A* sink(int64_t) const { return bnd; }
  __device__ __forceinline__ void wait(int64_t, int64_t) const {}
  __device__ __forceinline__ void publish(int64_t, int64_t) const {}
};

// The W warps of a block taking turns over the tiles of one long pair (warp w: tiles w, w + W, ...):
// tile t writes its column into buffer t % (W + 1), tile t + 1 reads it. Buffer t % (W + 1) is written
// again by tile t + W + 1, which its warp starts only after finishing tile t + 1 itself (the reader),
// so W + 1 buffers are enough. done[w] counts the rows warp w has published over all its tiles; it only
// grows, so a reader never sees a count that was reset. Warps of one block are resident together, so
// waiting on another cannot deadlock.
template <typename A, int W>
struct Relay {
  A* base;  // (W + 1, M) for this block
  int64_t M, qn;
  volatile int* done;  // shared memory, W counters
  __device__ __forceinline__ const A* source(int64_t tile) const { return base + ((tile - 1) % (W + 1)) * M; }
  __device__ __forceinline__ A* sink(int64_t tile) const { return base + (tile % (W + 1)) * M; }
  // Until tile - 1 has published `rows` rows of its column (all lanes wait).
  __device__ __forceinline__ void wait(int64_t tile, int64_t rows) const {
    const int64_t producer = (tile - 1) % W, target = ((tile - 1) / W) * qn + rows;
    while (done[producer] < target) __nanosleep(32);
    __threadfence_block();  // the column's rows are read only after the count that covers them
  }
  // Called by lane 31 of the warp that runs `tile`, after writing `rows` rows of its column.
  __device__ __forceinline__ void publish(int64_t tile, int64_t rows) const {
    __threadfence_block();
    done[tile % W] = int((tile / W) * qn + rows);
  }
};

// The sweep of one warp over tiles first_tile, first_tile + stride, ... of one pair. Returns, in every
// lane, the best cell value and (with STORE) its row-major position, -1 for the zero border.
template <typename A, int R, bool SOFT, bool STORE, class Source, class Handoff>
__device__ void forward_tiles(const Pair& p, Source& src, const Consts<A>& k, const Outputs<A>& out, int64_t M,
                              int64_t N, const Handoff& handoff, int64_t first_tile, int64_t stride, A& best_out,
                              int64_t& best_at_out) {
  const int lane = threadIdx.x % kWarp;
  constexpr int kTileCols = kWarp * R;
  A best = A(0);
  int64_t best_at = -1;
  const int64_t tiles = (p.tn + kTileCols - 1) / kTileCols;
  for (int64_t tile = first_tile; tile < tiles; tile += stride) {
    const int64_t c0 = tile * kTileCols, col = c0 + int64_t(lane) * R;
    const int64_t width = p.tn - c0 < kTileCols ? p.tn - c0 : kTileCols;
    const int lanes = int((width + R - 1) / R);
    const int valid = p.tn - col >= R ? R : (p.tn - col > 0 ? int(p.tn - col) : 0);
    const bool has_next = tile + 1 < tiles;
    src.begin_tile(p, lane, col);
    A up[R];
#pragma unroll
    for (int r = 0; r < R; ++r) up[r] = A(0);
    A left_above = A(0);  // H[i-1][col-1]
    A last = A(0);        // H[i][col+R-1], handed to lane+1
    // Lane 0 needs bnd[s] at step s. The warp loads the buffer 32 rows at a time, a chunk ahead (lane
    // k holds row chunk + k), and lane 0 takes its value by shuffle: no load latency on the wavefront.
    // Lane 31 overwrites row s - 31 at step s, long after it was read.
    const A* const bnd_in = tile > 0 ? handoff.source(tile) : nullptr;
    A* const bnd_out = has_next ? handoff.sink(tile) : nullptr;
    A chunk = A(0), chunk_next = A(0);
    if (tile > 0) {
      handoff.wait(tile, p.qn < 2 * kWarp ? p.qn : 2 * kWarp);
      chunk = lane < p.qn ? bnd_in[lane] : A(0);
      chunk_next = kWarp + lane < p.qn ? bnd_in[kWarp + lane] : A(0);
    }
    const int steps = int(p.qn) + lanes - 1;
    for (int s = 0; s < steps; ++s) {
      const int64_t i = int64_t(s) - lane;
      A left = __shfl_up_sync(kFull, last, 1);
      if (tile > 0) {  // the same for the whole warp
        if (s % kWarp == 0 && s > 0) {
          chunk = chunk_next;
          const int64_t ahead = int64_t(s) + kWarp + lane;
          handoff.wait(tile, p.qn < int64_t(s) + 2 * kWarp ? p.qn : int64_t(s) + 2 * kWarp);
          chunk_next = ahead < p.qn ? bnd_in[ahead] : A(0);
        }
        const A from_buffer = __shfl_sync(kFull, chunk, s % kWarp);
        if (lane == 0) left = from_buffer;
      } else if (lane == 0) {
        left = A(0);
      }
      A v[R];
      src.row(p, s, v);
      if (i >= 0 && i < p.qn && lane < lanes) {
        A diag = left_above, h = left;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const A above = up[r];
          h = cell<A, SOFT>(diag + v[r], above + k.gap, h + k.gap, k);
          up[r] = h;
          diag = above;
          if (r < valid) {
            if (STORE) {
              // Tiles run one after another, so compare positions: the first in row-major wins.
              const int64_t at = i * N + col + r;
              const bool take = h != h ? (best == best || at < best_at)
                                       : (h > best || (h == best && best_at >= 0 && at < best_at));
              if (take) best = h, best_at = at;
            } else {
              best = max_nan(best, h);
            }
          }
        }
        if (STORE) store_row<A, R>(out.table + (p.b * M + i) * N + col, up, valid, N % 4 == 0);
        left_above = left;
        if (has_next && lane == kWarp - 1) {
          bnd_out[i] = up[R - 1];
          if ((i + 1) % kWarp == 0 || i + 1 == p.qn) handoff.publish(tile, i + 1);
        }
      }
      last = up[R - 1];
    }
    __syncwarp();  // lane 31's boundary writes are visible to lane 0 in the next tile
  }
  // Reduce over the lanes: the largest value; for the backward, among equals the first in row-major.
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const A other = __shfl_xor_sync(kFull, best, off);
    if (STORE) {
      const int64_t other_at = __shfl_xor_sync(kFull, best_at, off);
      const bool other_nan = other != other, mine_nan = best != best;
      bool take;
      if (other_nan || mine_nan)
        take = other_nan && (!mine_nan || (other_at >= 0 && (best_at < 0 || other_at < best_at)));
      else
        take = other > best || (other == best && other_at >= 0 && (best_at < 0 || other_at < best_at));
      if (take) best = other, best_at = other_at;
    } else {
      best = max_nan(best, other);
    }
  }
  best_out = best;
  best_at_out = best_at;
}

// One warp, all the tiles of one pair.
template <typename A, int R, bool SOFT, bool STORE, class Source>
__device__ void forward_pair(const Pair& p, Source& src, const Consts<A>& k, const Outputs<A>& out,
                             int64_t M, int64_t N) {
  A best;
  int64_t best_at;
  const InPlace<A> handoff{out.boundary ? out.boundary + p.b * M : nullptr};
  forward_tiles<A, R, SOFT, STORE>(p, src, k, out, M, N, handoff, 0, 1, best, best_at);
  if (threadIdx.x % kWarp == 0) {
    out.scores[p.b] = best;
    if (STORE) out.best_at[p.b] = best_at;
  }
}

template <typename A, int R, bool SOFT, bool STORE, class Source>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    forward_kernel(Source src, Consts<A> k, Outputs<A> out, const int64_t* qlen, const int64_t* tlen,
                   const int64_t* order, int64_t B, int64_t M, int64_t N) {
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;  // a whole warp leaves together
  const int64_t b = order ? order[slot] : slot;
  const Pair p{b, qlen ? qlen[b] : M, tlen ? tlen[b] : N};
  forward_pair<A, R, SOFT, STORE>(p, src, k, out, M, N);
}

// The codes kernel first stages the matrix in shared memory (all warps of the block share it).
template <int R, bool SOFT>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    forward_codes_kernel(Codes<R> src, const float* matrix, Consts<float> k, Outputs<float> out,
                         const int64_t* qlen, const int64_t* tlen, const int64_t* order, int64_t B) {
  extern __shared__ float shared_matrix[];
  for (int x = threadIdx.x; x < src.K * src.K; x += blockDim.x) shared_matrix[x] = matrix[x];
  __syncthreads();
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  src.matrix = shared_matrix;
  const Pair p{b, qlen ? qlen[b] : src.M, tlen ? tlen[b] : src.N};
  forward_pair<float, R, SOFT, false>(p, src, k, out, src.M, src.N);
}

// Codes, 4 columns per lane, in blocks of kRelayWarps warps. The first `coop` blocks each take one of
// the longest pairs (they come first in `order`) and share its tiles through a Relay, so that a long
// pair no longer sets the time of the whole batch; the other blocks give one warp to each pair.
constexpr int kRelayWarps = 8;

template <bool SOFT>
__global__ void __launch_bounds__(kWarp* kRelayWarps)
    forward_codes_relay_kernel(Codes<4> src, const float* matrix, Consts<float> k, Outputs<float> out,
                               float* relay, const int64_t* qlen, const int64_t* tlen, const int64_t* order,
                               int64_t B, const int64_t* coop_count) {
  extern __shared__ float shared_matrix[];
  __shared__ int done[kRelayWarps];
  __shared__ float warp_best[kRelayWarps];
  for (int x = threadIdx.x; x < src.K * src.K; x += blockDim.x) shared_matrix[x] = matrix[x];
  if (threadIdx.x < kRelayWarps) done[threadIdx.x] = 0;
  __syncthreads();
  src.matrix = shared_matrix;
  const int warp = threadIdx.x / kWarp;
  const int64_t coop = *coop_count;
  float best;
  int64_t unused;
  if (blockIdx.x < coop) {  // the same for the whole block
    const int64_t b = order[blockIdx.x];
    const Pair p{b, qlen[b], tlen[b]};
    const Relay<float, kRelayWarps> handoff{relay + int64_t(blockIdx.x) * (kRelayWarps + 1) * src.M, src.M, p.qn,
                                            done};
    forward_tiles<float, 4, SOFT, false>(p, src, k, out, src.M, src.N, handoff, warp, kRelayWarps, best, unused);
    if (threadIdx.x % kWarp == 0) warp_best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kRelayWarps; ++w) best = max_nan(best, warp_best[w]);
      out.scores[b] = best;
    }
    return;
  }
  const int64_t slot = coop + (int64_t(blockIdx.x) - coop) * kRelayWarps + warp;
  if (slot >= B) return;
  const int64_t b = order[slot];
  const Pair p{b, qlen[b], tlen[b]};
  const InPlace<float> handoff{out.boundary ? out.boundary + b * src.M : nullptr};
  forward_tiles<float, 4, SOFT, false>(p, src, k, out, src.M, src.N, handoff, 0, 1, best, unused);
  if (threadIdx.x % kWarp == 0) out.scores[b] = best;
}

template <int R, bool SOFT, bool STORE>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    forward_ring_kernel(DenseRing<R> src, Consts<float> k, Outputs<float> out, const int64_t* qlen,
                        const int64_t* tlen, const int64_t* order, int64_t B) {
  extern __shared__ float4 ring_memory[];
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  src.ring = reinterpret_cast<typename DenseRing<R>::Chunk*>(ring_memory) + (threadIdx.x / kWarp) * kRingRows * kWarp;
  const Pair p{b, qlen ? qlen[b] : src.M, tlen ? tlen[b] : src.N};
  forward_pair<float, R, SOFT, STORE>(p, src, k, out, src.M, src.N);
  asm volatile("cp.async.wait_all;\n" ::);
}

// ---------------------------------------------------------------------------------------------------
// Backward: a reverse wavefront over the stored H. E = d score / d H; each cell passes E on to the
// three cells it was computed from, weighted by the softmax of its terms (t > 0) or by the first
// maximal term in the reference's order zero, match, delete, insert (t = 0). Lane k owns the same
// columns as in the forward; the rightmost lane starts at the last row, and the flow into the column
// left of a lane's strip goes to lane k-1 by shuffle, or across tiles through the per-pair buffer.

template <typename A, int R, bool SOFT>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    backward_kernel(const A* grad_scores, const A* S, const A* table, const int64_t* best_at,
                    const int64_t* qlen, const int64_t* tlen, const int64_t* order, A* grad_S,
                    A* boundary, Consts<A> k, int64_t B, int64_t M, int64_t N) {
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = order ? order[slot] : slot;
  const int64_t qn = qlen ? qlen[b] : M, tn = tlen ? tlen[b] : N;
  const int64_t arg = best_at[b];
  const A grad = grad_scores[b];
  if (arg < 0 || qn == 0 || tn == 0) return;  // the score is the zero border: no gradient
  const int64_t arg_i = arg / N, arg_j = arg % N;
  constexpr int kTileCols = kWarp * R;
  const A* Hb = table + b * M * N;
  const A* Sb = S + b * M * N;
  A* Gb = grad_S + b * M * N;
  A* bnd = boundary ? boundary + b * M : nullptr;
  // Nothing flows right of the best cell's column or below its row.
  const int64_t last_tile = arg_j / kTileCols;
  for (int64_t tile = last_tile; tile >= 0; --tile) {
    const int64_t c0 = tile * kTileCols, col = c0 + int64_t(lane) * R;
    const int64_t width = tn - c0 < kTileCols ? tn - c0 : kTileCols;
    const int lanes = int((width + R - 1) / R);
    const int valid = tn - col >= R ? R : (tn - col > 0 ? int(tn - col) : 0);
    const int rank = lanes - 1 - lane;  // 0 for the rightmost lane, which leads
    const bool from_right = tile < last_tile;
    const int arg_r = (arg_j >= col && arg_j < col + R) ? int(arg_j - col) : -1;
    A carry_up[R], carry_diag[R];  // E(i+1, c) w_up(i+1, c) and E(i+1, c) w_diag(i+1, c)
#pragma unroll
    for (int r = 0; r < R; ++r) carry_up[r] = carry_diag[r] = A(0);
    A flow_out = A(0);  // flow into (i, col-1), handed to lane-1
    const int64_t rows = arg_i + 1;
    // H of row i with the column left of the strip: h[r] = H[i][col - 1 + r], zero on the border.
    const bool vec = N % 4 == 0;
    auto load_row = [&](int64_t i, A (&h)[R + 1]) {
      A v[R];
      if (i >= 0 && i < rows) {
        h[0] = col > 0 ? Hb[i * N + col - 1] : A(0);
        load_row_values<A, R>(Hb + i * N + col, v, valid, vec);
      } else {
        h[0] = A(0);
#pragma unroll
        for (int r = 0; r < R; ++r) v[r] = A(0);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) h[r + 1] = v[r];
    };
    auto load_scores = [&](int64_t i, A (&v)[R]) {
#pragma unroll
      for (int r = 0; r < R; ++r) v[r] = (!SOFT && i >= 0 && i < rows && r < valid) ? Sb[i * N + col + r] : A(0);
    };
    // Rows come two steps ahead of their use (cur: row i, above: row i-1, then i-2 and i-3 in flight).
    const int64_t first = rows - 1;  // this lane's first row, at step `rank`
    A cur[R + 1], above[R + 1], ahead1[R + 1], ahead2[R + 1], s_cur[R], s_ahead1[R], s_ahead2[R];
    load_row(first, cur);
    load_row(first - 1, above);
    load_row(first - 2, ahead1);
    load_row(first - 3, ahead2);
    load_scores(first, s_cur);
    load_scores(first - 1, s_ahead1);
    load_scores(first - 2, s_ahead2);
    // The rightmost lane takes the flow from the tile to its right out of bnd, 32 rows per load.
    A chunk = A(0), chunk_next = A(0);
    if (from_right) {
      chunk = rows - 1 - lane >= 0 ? bnd[rows - 1 - lane] : A(0);
      chunk_next = rows - 1 - kWarp - lane >= 0 ? bnd[rows - 1 - kWarp - lane] : A(0);
    }
    const int steps = int(rows) + lanes - 1;
    for (int s = 0; s < steps; ++s) {
      const int64_t i = rows - 1 - (int64_t(s) - rank);
      A right = __shfl_down_sync(kFull, flow_out, 1);
      if (from_right) {
        if (s % kWarp == 0 && s > 0) {
          chunk = chunk_next;
          const int64_t ahead = rows - 1 - (int64_t(s) + kWarp + lane);
          chunk_next = ahead >= 0 ? bnd[ahead] : A(0);
        }
        const A from_buffer = __shfl_sync(kFull, chunk, s % kWarp);
        if (lane == lanes - 1) right = from_buffer;
      } else if (lane == lanes - 1) {
        right = A(0);
      }
      if (rank >= 0 && i >= 0 && i < rows) {
        A g[R];
#pragma unroll
        for (int r = R - 1; r >= 0; --r) {
          if (r < valid) {
            A e = right + carry_up[r];
            if (i == arg_i && r == arg_r) e += A(1);
            const A h = cur[r + 1];
            const A xu = above[r + 1] + k.gap, xl = cur[r] + k.gap;
            A wd, wu, wl;
            if (SOFT) {
              // The four softmax weights sum to 1: the match weight is what the others leave, so the
              // backward reads H only (S would be one more read per cell).
              wu = exp2_((xu - h) * k.c);
              wl = exp2_((xl - h) * k.c);
              wd = A(1) - wu - wl - exp2_(-h * k.c);
              wd = wd < A(0) ? A(0) : wd;  // rounding; a NaN stays a NaN
            } else {
              const A xd = above[r] + s_cur[r];
              const bool t1 = h != A(0) && xd == h;
              const bool t2 = h != A(0) && !t1 && xu == h;
              const bool t3 = h != A(0) && !t1 && !t2 && xl == h;
              wd = t1, wu = t2, wl = t3;
            }
            g[r] = grad * e * wd;
            right = e * wl + carry_diag[r];
            carry_diag[r] = e * wd;
            carry_up[r] = e * wu;
          } else {
            right = A(0);
            g[r] = A(0);
          }
        }
        store_row<A, R>(Gb + i * N + col, g, valid, vec);
        flow_out = right;
        if (lane == 0 && tile > 0) bnd[i] = right;
#pragma unroll
        for (int r = 0; r <= R; ++r) cur[r] = above[r], above[r] = ahead1[r], ahead1[r] = ahead2[r];
#pragma unroll
        for (int r = 0; r < R; ++r) s_cur[r] = s_ahead1[r], s_ahead1[r] = s_ahead2[r];
        load_row(i - 4, ahead2);
        load_scores(i - 3, s_ahead2);
      }
    }
    __syncwarp();
  }
}

__global__ void empty_kernel() {}

int blocks_for(int64_t B) { return int((B + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <typename A>
Consts<A> consts(double gap, double temperature) {
  Consts<A> k;
  k.gap = A(gap);
  const double c = temperature > 0 ? 1.4426950408889634 / temperature : 0.0;
  const double cap = sizeof(A) == 4 ? double(FLT_MAX) : DBL_MAX;
  k.c = A(c < cap ? c : cap);
  k.tl = A(temperature * 0.6931471805599453);
  return k;
}

template <typename A, int R, bool STORE>
cudaError_t launch_dense(const Problem& pr, const A* S, A* scores, A* table, int64_t* best_at,
                         A* boundary, double gap, double t, cudaStream_t stream) {
  const Consts<A> k = consts<A>(gap, t);
  const Outputs<A> out{scores, table, best_at, boundary};
  DenseDirect<A, R> src{};
  src.S = S, src.M = pr.M, src.N = pr.N;
  if (t > 0)
    forward_kernel<A, R, true, STORE><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, stream>>>(
        src, k, out, pr.qlen, pr.tlen, pr.order, pr.B, pr.M, pr.N);
  else
    forward_kernel<A, R, false, STORE><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, stream>>>(
        src, k, out, pr.qlen, pr.tlen, pr.order, pr.B, pr.M, pr.N);
  return cudaGetLastError();
}

template <int R, bool SOFT, bool STORE>
cudaError_t launch_ring(const Problem& pr, const float* S, const Outputs<float>& out, const Consts<float>& k,
                        cudaStream_t stream) {
  const size_t smem = sizeof(float) * R * kRingRows * kWarp * kWarpsPerBlock;
  auto kernel = forward_ring_kernel<R, SOFT, STORE>;
  static const cudaError_t set = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      int(smem));  // once per kernel and process
  if (set != cudaSuccess) return set;
  DenseRing<R> src{};
  src.S = S, src.M = pr.M, src.N = pr.N;
  kernel<<<blocks_for(pr.B), kWarp * kWarpsPerBlock, smem, stream>>>(src, k, out, pr.qlen, pr.tlen,
                                                                      pr.order, pr.B);
  return cudaGetLastError();
}

}  // namespace

int sw_cuda_tile_columns(int lane_columns) { return kWarp * lane_columns; }

cudaError_t sw_cuda_forward_f32(const Problem& pr, const float* S, float* scores, float* table,
                                int64_t* best_at, float* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  const Consts<float> k = consts<float>(gap, t);
  const Outputs<float> out{scores, table, best_at, boundary};
#define SWCLI_RING(R)                                                                                  \
  if (t > 0)                                                                                           \
    return table ? launch_ring<R, true, true>(pr, S, out, k, stream)                                  \
                 : launch_ring<R, true, false>(pr, S, out, k, stream);                                \
  return table ? launch_ring<R, false, true>(pr, S, out, k, stream) : launch_ring<R, false, false>(pr, S, out, k, stream)
  if (lane_columns == 1) {
    SWCLI_RING(1);
  }
  SWCLI_RING(4);
#undef SWCLI_RING
}

cudaError_t sw_cuda_forward_f64(const Problem& pr, const double* S, double* scores, double* table,
                                int64_t* best_at, double* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  if (lane_columns == 1)
    return table ? launch_dense<double, 1, true>(pr, S, scores, table, best_at, boundary, gap, t, stream)
                 : launch_dense<double, 1, false>(pr, S, scores, table, best_at, boundary, gap, t, stream);
  return table ? launch_dense<double, 4, true>(pr, S, scores, table, best_at, boundary, gap, t, stream)
               : launch_dense<double, 4, false>(pr, S, scores, table, best_at, boundary, gap, t, stream);
}

int sw_cuda_relay_warps() { return kRelayWarps; }

cudaError_t sw_cuda_forward_codes(const Problem& pr, const uint8_t* query, const uint8_t* target,
                                  const float* matrix, int K, float* scores, float* boundary, double gap,
                                  double t, int lane_columns, cudaStream_t stream, const Relaying* relaying) {
  if (pr.B == 0) return cudaSuccess;
  const Consts<float> k = consts<float>(gap, t);
  const Outputs<float> out{scores, nullptr, nullptr, boundary};
  const size_t smem = sizeof(float) * K * K;
  const int blocks = blocks_for(pr.B), threads = kWarp * kWarpsPerBlock;
  auto go = [&](auto kernel, auto src) {
    if (smem > 48 * 1024) {  // past the default limit: ask for more (rare: K > 110)
      cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (err != cudaSuccess) return err;
    }
    src.query = query, src.target = target, src.M = pr.M, src.N = pr.N, src.K = K;
    kernel<<<blocks, threads, smem, stream>>>(src, matrix, k, out, pr.qlen, pr.tlen, pr.order, pr.B);
    return cudaGetLastError();
  };
  if (lane_columns == 1)
    return t > 0 ? go(forward_codes_kernel<1, true>, Codes<1>{}) : go(forward_codes_kernel<1, false>, Codes<1>{});
  if (relaying) {
    auto relay = [&](auto kernel) {
      if (smem > 48 * 1024 - 64) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        if (err != cudaSuccess) return err;
      }
      Codes<4> src{};
      src.query = query, src.target = target, src.M = pr.M, src.N = pr.N, src.K = K;
      // at most max_coop blocks relay; the rest hold kRelayWarps pairs each
      const int64_t grid = relaying->max_coop + (pr.B + kRelayWarps - 1) / kRelayWarps;
      kernel<<<unsigned(grid), kWarp * kRelayWarps, smem, stream>>>(
          src, matrix, k, out, relaying->relay, pr.qlen, pr.tlen, pr.order, pr.B, relaying->coop_count);
      return cudaGetLastError();
    };
    return t > 0 ? relay(forward_codes_relay_kernel<true>) : relay(forward_codes_relay_kernel<false>);
  }
  return t > 0 ? go(forward_codes_kernel<4, true>, Codes<4>{}) : go(forward_codes_kernel<4, false>, Codes<4>{});
}

template <typename A>
static cudaError_t backward_any(const Problem& pr, const A* grad_scores, const A* S, const A* table,
                                const int64_t* best_at, A* grad_S, A* boundary, double gap, double t,
                                int lane_columns, cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  const Consts<A> k = consts<A>(gap, t);
  const int blocks = blocks_for(pr.B), threads = kWarp * kWarpsPerBlock;
#define SWCLI_BACKWARD(R, SOFT)                                                                        \
  backward_kernel<A, R, SOFT><<<blocks, threads, 0, stream>>>(grad_scores, S, table, best_at, pr.qlen, \
                                                              pr.tlen, pr.order, grad_S, boundary, k,  \
                                                              pr.B, pr.M, pr.N)
  if (lane_columns == 1) {
    if (t > 0) SWCLI_BACKWARD(1, true); else SWCLI_BACKWARD(1, false);
  } else {
    if (t > 0) SWCLI_BACKWARD(4, true); else SWCLI_BACKWARD(4, false);
  }
#undef SWCLI_BACKWARD
  return cudaGetLastError();
}

cudaError_t sw_cuda_backward_f32(const Problem& pr, const float* grad_scores, const float* S, const float* table,
                                 const int64_t* best_at, float* grad_S, float* boundary, double gap, double t,
                                 int lane_columns, cudaStream_t stream) {
  return backward_any<float>(pr, grad_scores, S, table, best_at, grad_S, boundary, gap, t, lane_columns, stream);
}

cudaError_t sw_cuda_backward_f64(const Problem& pr, const double* grad_scores, const double* S,
                                 const double* table, const int64_t* best_at, double* grad_S, double* boundary,
                                 double gap, double t, int lane_columns, cudaStream_t stream) {
  return backward_any<double>(pr, grad_scores, S, table, best_at, grad_S, boundary, gap, t, lane_columns, stream);
}

cudaError_t sw_cuda_empty(cudaStream_t stream) {
  empty_kernel<<<1, kWarp, 0, stream>>>();
  return cudaGetLastError();
}
