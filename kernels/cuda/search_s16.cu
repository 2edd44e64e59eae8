// Exact Smith-Waterman scores of one query against many targets, for a search at t = 0 with an integer
// matrix and integer gaps: 16-bit integers, two targets at once in the halves of a 32-bit register, and
// Hopper's DPX instructions (__viaddmax_s16x2, __vimax3_s16x2_relu: an add and a max, or a three-way max
// with 0, in one instruction on both halves).
//
// A group of G lanes aligns the query against targets 2s and 2s + 1 (the low and the high half): lane g
// holds R columns of both targets in registers, and the group sweeps the query's rows as a wavefront
// (lane g on row k - g at step k), taking the left neighbour's last column by shuffle. A target longer
// than a tile (G R columns) is swept tile after tile by the same group, the tile's right edge (H and the
// gap moving along the target, per row) going to the next tile through a buffer in global memory that
// the next tile reads a row before it is written again (in place, as InPlace in sources.cuh). A launch
// takes G from its widest target, and each warp R from its own (warp_columns), so that a target pays a
// couple of columns a lane of padding rather than its block's widest tile.
//
// The substitution scores come from a table in shared memory indexed by the query letter and both
// targets' letters, (q, a, b) -> (S[q][a], S[q][b]): one 32-bit load a column for both targets. Letter
// K (past the matrix) pads the columns past a target's end with a score <= 0, so padding never raises
// the best cell and the cells inside the target never read it.
//
// With gap_open == gap_extend the cell is the linear one, H = max(0, H_diag + s, H_up + g, H_left + g):
// three DPX instructions for two cells. Otherwise Gotoh's (kernels/cpu/affine.h at t = 0):
//     H = max(0, H_diag + s, X, Y),  Xn = max(X + e, H + o),  Yn = max(Y + e, H + o)
// which is the engines' recurrence at t = 0 (a gap opened from X is never better than X extended, since
// o <= e). X and Y start at o (a border of -inf that a gap opens from H = 0 instead).
//
// The adds wrap around at 16 bits, so a pair whose scores could reach the int16 range is flagged: every
// H exceeds a predecessor by at most the matrix's largest score, so a true value past 32767 makes some
// cell pass through [limit, 32767], limit = 32767 - that score, and the best cell shows it. Such a pair
// gets the score -1 and is counted; the caller scores it again wider.
#include <algorithm>

#include "common.cuh"
#include "engine.h"

namespace swcli_cuda {
namespace {

inline constexpr int kSearchThreads = 256;

__device__ __forceinline__ unsigned pair16(int v) { return (unsigned(v) & 0xffffu) * 0x10001u; }

__device__ __forceinline__ unsigned add2(unsigned a, unsigned b) { return __vadd2(a, b); }
__device__ __forceinline__ unsigned addmax2(unsigned a, unsigned b, unsigned c) {  // max(a + b, c)
  return __viaddmax_s16x2(a, b, c);
}
__device__ __forceinline__ unsigned addmax2_relu(unsigned a, unsigned b, unsigned c) {  // max(a + b, c, 0)
  return __viaddmax_s16x2_relu(a, b, c);
}
__device__ __forceinline__ unsigned max3_relu(unsigned a, unsigned b, unsigned c) {  // max(a, b, c, 0)
  return __vimax3_s16x2_relu(a, b, c);
}

__device__ __forceinline__ unsigned load_shared_u32(unsigned address) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(address));
  return v;
}

// One group's two targets and what its sweep reads and writes.
struct GroupSweep {
  const uint8_t* query;
  int M;
  const uint8_t* qa;  // target a (the low halves) and b (the high halves), la and lb letters
  const uint8_t* qb;
  int la, lb;
  unsigned table_address;  // the table in shared memory
  int K, row_size;
  unsigned o2, e2;  // the gaps, in both halves
  uint2* edge;      // the group's tile edges (H, X per row), where its targets take several tiles
  int g;            // the lane in the group
};

// The group sweeps `tiles` tiles of G R columns and returns the lane's best cells (both halves).
template <int G, int R, bool AFFINE>
__device__ __forceinline__ unsigned sweep(const GroupSweep& w, int tiles) {
  static_assert(R % 2 == 0, "columns in pairs: the best cell takes two a step");
  const int g = w.g, M = w.M, K = w.K, KP = K + 1;
  const unsigned o2 = w.o2, e2 = w.e2;
  uint2* const edge = w.edge;
  unsigned best = 0;
  for (int tile = 0; tile < tiles; ++tile) {
    // Byte offsets of (a, b) in a query letter's row of the table: a column's lookup is one add to the
    // row's shared-memory address and one load (from an index and a generic pointer the compiler made a
    // multiply-add and a shift-add of each).
    unsigned subject[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int c = tile * G * R + g * R + r;
      const int ca = c < w.la ? w.qa[c] : K, cb = c < w.lb ? w.qb[c] : K;
      subject[r] = unsigned(sizeof(unsigned)) * unsigned(ca + KP * cb);
    }
    unsigned H[R], Y[R];  // H of the row above (the border: 0) and Y of this row's cells (the border: o)
#pragma unroll
    for (int r = 0; r < R; ++r) H[r] = 0u, Y[r] = o2;
    unsigned last_h = 0u, last_x = o2;  // H of this lane's last column and X entering the next lane's first
    unsigned diag_in = 0u;              // H[i-1][first column - 1]: the left neighbour's H a step ago
    const bool reads_edge = tile > 0 && g == 0, writes_edge = tile + 1 < tiles && g == G - 1;
    const int steps = M + G - 1;
    // The query letter and the left edge of the next step are loaded a step ahead: the step's lookups
    // wait for neither.
    int letter_next = unsigned(-g) < unsigned(M) ? w.query[-g] : 0;
    uint2 edge_next = reads_edge ? edge[0] : make_uint2(0u, o2);
    for (int k = 0; k < steps; ++k) {
      const int i = k - g;
      const int letter = letter_next;
      const uint2 edge_here = edge_next;
      letter_next = unsigned(i + 1) < unsigned(M) ? w.query[i + 1] : 0;
      if (reads_edge) edge_next = i + 1 < M ? edge[i + 1] : make_uint2(0u, o2);
      unsigned left_h = __shfl_up_sync(kFull, last_h, 1, G);
      unsigned x = __shfl_up_sync(kFull, last_x, 1, G);
      if (g == 0) left_h = edge_here.x, x = edge_here.y;
      const unsigned diag_next = left_h;
      if (unsigned(i) < unsigned(M)) {
        const unsigned row = w.table_address + unsigned(letter * w.row_size) * unsigned(sizeof(unsigned));
        unsigned diag = diag_in;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const unsigned s = load_shared_u32(row + subject[r]);
          const unsigned up = H[r];
          unsigned h;
          if constexpr (AFFINE) {
            h = max3_relu(add2(diag, s), x, Y[r]);
            const unsigned open = add2(h, o2);
            x = addmax2(x, e2, open);
            Y[r] = addmax2(Y[r], e2, open);
          } else {
            h = addmax2_relu(left_h, o2, addmax2(up, o2, add2(diag, s)));
            left_h = h;
          }
          diag = up;
          H[r] = h;
        }
#pragma unroll
        for (int r = 0; r < R; r += 2) best = max3_relu(best, H[r], H[r + 1]);
        last_h = H[R - 1];
        last_x = AFFINE ? x : 0u;
        if (writes_edge) edge[i] = make_uint2(last_h, last_x);
      }
      diag_in = diag_next;
    }
    __syncwarp();  // the last lane's edge writes are visible to the first lane in the next tile
  }
  return best;
}

// Columns a lane, by warp (warp_columns in common.cuh): 8 to 32 by 2. With affine gaps a lane holds at
// most 28 columns: past that, H, Y and the table offsets no longer fit in the registers of two blocks an
// SM, and the step reloads spilled values.
inline constexpr int kMinColumns = 8, kColumnStep = 2;

template <bool AFFINE>
inline constexpr int kMaxColumns = AFFINE ? 28 : 32;

template <int G, bool AFFINE>
__global__ void __launch_bounds__(kSearchThreads, 2)
    search_s16_kernel(const uint8_t* __restrict__ query, int M, const uint8_t* __restrict__ target, int64_t N,
                      const int64_t* __restrict__ tlen, int64_t B, const unsigned* __restrict__ table, int K,
                      int gap_open, int gap_extend, int limit, int* __restrict__ scores,
                      uint2* __restrict__ boundary, int* __restrict__ overflows) {
  extern __shared__ unsigned shared_table[];
  const int KP = K + 1, row_size = KP * KP;
  for (int e = threadIdx.x; e < K * row_size; e += kSearchThreads) shared_table[e] = table[e];
  __syncthreads();
  const int lane = int(threadIdx.x % kWarp), g = lane % G;
  const int64_t group = (int64_t(blockIdx.x) * kSearchThreads + threadIdx.x) / G;
  const int64_t first_of_warp = (int64_t(blockIdx.x) * kSearchThreads + (threadIdx.x / kWarp) * kWarp) / G;
  if (2 * first_of_warp >= B) return;  // a whole warp leaves together
  // Groups past the batch in a live warp sweep the last target again and write nothing.
  const bool writes = 2 * group < B;
  const int64_t ta = writes ? 2 * group : B - 1, tb = writes && 2 * group + 1 < B ? 2 * group + 1 : ta;
  GroupSweep w;
  w.query = query, w.M = M, w.qa = target + ta * N, w.qb = target + tb * N;
  w.la = int(tlen[ta]), w.lb = int(tlen[tb]);
  w.table_address = unsigned(__cvta_generic_to_shared(shared_table));
  w.K = K, w.row_size = row_size;
  w.o2 = pair16(gap_open), w.e2 = pair16(gap_extend);
  w.edge = boundary ? boundary + group * int64_t(M) : nullptr;
  w.g = g;
  const int widest = __reduce_max_sync(kFull, max(w.la, w.lb));
  const int columns = warp_columns(G, widest, kMaxColumns<AFFINE>, kColumnStep);
  const int tiles = (widest + G * columns - 1) / (G * columns);  // 0 where every target is empty
  unsigned best = sweep_by_columns<kMinColumns, kMaxColumns<AFFINE>, kColumnStep>(
      columns, [&](auto R) { return sweep<G, decltype(R)::value, AFFINE>(w, tiles); });
#pragma unroll
  for (int off = G / 2; off > 0; off /= 2) best = __vmaxs2(best, __shfl_xor_sync(kFull, best, off, G));
  if (writes && g == 0) {
    const int low = int(short(best & 0xffffu)), high = int(short(best >> 16));
    const bool low_over = low >= limit, high_over = high >= limit;
    scores[ta] = low_over ? -1 : low;
    if (tb != ta) scores[tb] = high_over ? -1 : high;
    const int over = int(low_over) + int(tb != ta && high_over);
    if (over) atomicAdd(overflows, over);
  }
}

template <int G, bool AFFINE>
cudaError_t launch_search(const SearchS16Call& call, cudaStream_t stream) {
  const int64_t groups = (call.B + 1) / 2;
  const int64_t blocks = (groups * G + kSearchThreads - 1) / kSearchThreads;
  const size_t shared = size_t(call.K) * (call.K + 1) * (call.K + 1) * sizeof(unsigned);
  cudaError_t err = cudaFuncSetAttribute(search_s16_kernel<G, AFFINE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(shared));
  if (err != cudaSuccess) return err;
  search_s16_kernel<G, AFFINE><<<unsigned(blocks), kSearchThreads, shared, stream>>>(
      call.query, call.M, call.target, call.N, call.tlen, call.B, call.table, call.K, call.gap_open, call.gap_extend,
      call.limit, call.scores, reinterpret_cast<uint2*>(call.boundary), call.overflows);
  return cudaGetLastError();
}

template <bool AFFINE>
cudaError_t search_any(const SearchS16Call& call, cudaStream_t stream) {
  return launch_by_lanes(call.N, kMaxColumns<AFFINE>,
                         [&](auto G) { return launch_search<decltype(G)::value, AFFINE>(call, stream); });
}

}  // namespace
}  // namespace swcli_cuda

int64_t sw_cuda_search_s16_edge_bytes(int64_t B, int64_t M, int64_t N, bool affine) {
  using namespace swcli_cuda;
  const int most = affine ? kMaxColumns<true> : kMaxColumns<false>;
  if (N <= int64_t(launch_lanes(N, most)) * most) return 0;  // one tile
  return (B + 1) / 2 * M * int64_t(sizeof(uint2));  // an (H, X) pair a row for each group of two targets
}

cudaError_t sw_cuda_search_s16(const SearchS16Call& call, cudaStream_t stream) {
  using namespace swcli_cuda;
  if (call.B == 0) return cudaSuccess;
  return call.gap_open == call.gap_extend ? search_any<false>(call, stream) : search_any<true>(call, stream);
}
