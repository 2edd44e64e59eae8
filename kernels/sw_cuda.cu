// CUDA engine for the soft Smith-Waterman recurrence (see GUIDE section 1). Plain CUDA: no torch
// headers here, so nvcc compiles this file in seconds; kernels/sw_cuda.cpp is the torch binding.
//
// Layout: one warp per pair. The target columns are cut into tiles of 32*R; in a tile, lane k owns
// the R columns [c0 + kR, c0 + kR + R) and keeps their H values of the previous row in registers.
// The warp sweeps the query rows as a wavefront: at step s, lane k computes row i = s - k, so the
// value it needs from the column left of its strip, H[i][c0 + kR - 1], is what lane k-1 computed at
// step s-1, passed on by one shuffle. Lane 31 writes its last column to a per-pair buffer that lane 0
// reads in the next tile, so neither M nor N has a cap. Pairs of codes take the orientation of fewer
// steps (oriented): the rows may be the target.
//
// A soft cell is m + t ln2 * log2(1 + sum over the three non-maximal terms of 2^((x - m) log2(e) / t))
// with m the largest of the four terms (0, match, delete, insert): 3 ex2 + 1 lg2 on the special
// function units. H stays in score units, as in the CPU engine and the reference, so a gap step adds
// exactly the same float. max.NaN / min.NaN carry a NaN in S to that pair's score and nowhere else.
// Float 1-column lanes (few pairs: latency-bound) take the same terms relative to the cell above
// instead (cell_from_up: 30 instead of 40 instructions a step), and a pair it cannot hold takes cell().
// Float scores at t > 0 with 4 columns per lane (8 for scores from codes, where kWideLimit allows),
// without the DP table, take the scaled sweep instead
// (below: H as 2^(H log2(e) / t), scaled per lane, 3 fused multiply-adds per cell), and a pair it
// cannot hold goes through the log-space one. Dense pairs of one tile in 1-column lanes (the seed)
// take a scaled sweep with one scale per warp (forward_one_scale).
//
// Dense scores are loaded by each lane for its own row into registers ahead of use: 16-byte float rows
// in groups of 4 or 8 steps, a group ahead (DenseGroups); other rows kDepth steps ahead, into registers
// that stay fixed across the unrolled steps; float 1-column lanes (few pairs, latency-bound) 32 rows at
// a time, a block of steps ahead, with a step without branches. Scores from codes are looked up in
// the substitution matrix, held in shared memory. With a gradient to come, the forward also stores H
// in wavefront order (Skewed), so that each step's stores and each backward step's loads are one
// contiguous row.
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "sw_cuda.h"

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFull = 0xffffffffu;

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
  A G;   // 2^(gap c) (t > 0), rounded once
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

// The soft cell of a float 1-column lane, whose step is one cell and whose time is the length of the
// warp's instruction stream through it: every term is taken relative to the cell above (up),
//
//     H = up + t ln2 log2(2^(-up c) + 2^((diag - up) c) + G (1 + 2^((left - up) c))),   G = 2^(gap c),
//
// 3 ex2 and 1 lg2 as in cell(), but no maximum, no clamp and no differences taken with the gap: each
// exponent is a difference of neighbours times c, and G comes rounded once from the host. The first form
// of this cell took the terms relative to the delete term up + gap, whose rounding (at the magnitude of
// the gap) went into every cell: 7.9e-6 relative off at gap -30 (tools/fuzz_scaled.py cuda, H200), 6.2e-6
// in a float32 simulation with exact ex2 and lg2, against 3.3e-7 for this form and 2.6e-7 for cell().
// A term past 2^128 overflows to +inf, and the pair's best cell with it (inf or NaN); a sum that
// underflows to 0 (G below the float range, the others far below up) makes the cell -inf and the cell
// below it NaN. Either way the caller scores the pair again with cell() (forward_pair).
__device__ __forceinline__ float cell_from_up(float diag, float up, float left, const Consts<float>& k) {
  const float rest = k.G + exp2_(-up * k.c) + exp2_((diag - up) * k.c);  // off the shuffle's path
  return fmaf(k.tl, log2_(fmaf(k.G, exp2_((left - up) * k.c), rest)), up);
}

// Rows of R values: one 16-byte access per lane where the row allows it (the DP table and the gradient
// are fresh allocations, so only N decides for the gradient; a lane's slots in the table are always
// aligned), else one access per value. The 16-byte accesses go through the __stcg / __ldcg intrinsics:
// with a plain float4 store the compiler merged both branches into four 4-byte stores.
template <typename A, int R>
__device__ __forceinline__ void store_row(A* dst, const A (&v)[R], int valid, bool vec) {
  if constexpr (R == 4 && sizeof(A) == 4) {
    if (vec && valid == R) {
      __stcg(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
      return;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < valid) dst[r] = v[r];
}

template <typename A, int R>
__device__ __forceinline__ void load_row_values(const A* src, A (&v)[R], int valid) {
  if constexpr (R == 4 && sizeof(A) == 4) {
    if (valid == R) {
      const float4 x = __ldcg(reinterpret_cast<const float4*>(src));
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      return;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = r < valid ? src[r] : A(0);
}

// ---------------------------------------------------------------------------------------------------
// Score sources: give lane k the R scores of its row i = s - k at step s. A source keeps kDepth rows
// in flight in registers: fetch(d, i) starts the loads of row i into slot d, take(d, v) hands over
// what that slot holds. The sweep unrolls its steps by kDepth and step s uses slot s % kDepth, so a
// row is fetched kDepth steps before it is used and the slots are compile-time register indices.
// start_block() is called at the start of each block of 32 steps (DenseBlocks loads there), and
// start_group() at the start of each group of kDepth steps (DenseGroups loads there).

// 4 rows ahead keep the issue-bound wide lanes fed. The 1-column sources that load per step (double,
// codes) look 8 rows ahead: with float rows, 4, 8 and 16 gave 151, 141 and 138 ns per step on the H200
// (DenseBlocks, which float now uses, gave 103). A forward that stores H shares the memory with its
// stores and looks 8 rows ahead too (dense 8192 x 256 x 256 on the H200: 1.67 instead of 1.78 ms).
// Dense float rows load in groups instead (DenseGroups, below).
__host__ __device__ constexpr int source_depth(int R, bool store = false) { return R == 1 || store ? 8 : 4; }
constexpr int kBackGroup = 4;  // rows per group of the backward's loads (BackwardRows, below)
constexpr int kDelay = 8;      // lanes whose gradient rows the backward writes together (below)
static_assert((kDelay & (kDelay - 1)) == 0 && kWarp % kDelay == 0, "kDelay: a power of 2 dividing the warp");

struct Pair {
  int64_t b;  // pair index
  int qn;     // rows of the sweep: the query's length, or the target's in a transposed pair
  int tn;     // columns of the sweep: the target's length, or the query's
  bool transposed = false;  // codes only: rows from the target, columns from the query (see oriented)
};

// Wavefront steps of one warp over a pair of `rows` x `cols` in tiles of 32 R columns: each tile takes
// its rows plus its lanes less one, and a step costs the same whether its lanes hold 1 column or R.
__device__ __forceinline__ int64_t sweep_steps(int64_t rows, int64_t cols, int R) {
  return (cols + kWarp * R - 1) / (kWarp * R) * (rows - 1) + (cols + R - 1) / R;
}

// A pair of codes, oriented to take fewer steps with R columns per lane. A target just past a tile
// boundary costs a whole tile of steps for its last few columns: 10,000 pairs of real protein lengths
// take 32% more lane steps than cells with 8 columns per lane, 22% oriented by this rule (20% by the
// better of the two orientations everywhere). On the H200 the op took 2,869 and 3,052 us on them at
// t = 1 before, 2,491 and 2,545 us after (two rounds, one machine). The score is the same either way:
// the recurrence is symmetric in its two gap terms, so the transposed DP holds the same cells, and the
// log-space cell of R >= 4 columns (cell) computes them from the same floats, bit for bit; the scaled
// sweeps round differently. A pair is transposed only if its target is not longer than its query: the
// choice is then the pair's own, whatever the batch, and its rows fit the boundary buffers' M. 1-column
// lanes keep the pair as given: their cell (cell_from_up) is not symmetric, and they are the
// latency-bound small batches. The host orders the pairs by the same rule (pair_work_kernel).
__device__ __forceinline__ bool transposes(int64_t qn, int64_t tn, int R) {
  return R >= 4 && tn <= qn && sweep_steps(tn, qn, R) < sweep_steps(qn, tn, R);
}
__device__ __forceinline__ Pair oriented(int64_t b, int qn, int tn, int R) {
  return transposes(qn, tn, R) ? Pair{b, tn, qn, true} : Pair{b, qn, tn};
}

// Dense S (B, M, N), contiguous, read straight from global memory, one value at a time: lane k reads
// row i = s - k. For double, and for float rows that are not 16-byte aligned.
template <typename A, int R, int DEPTH = source_depth(R)>
struct DenseDirect {
  const A* S;
  int64_t M, N;
  const A* next;  // this lane's columns in the row of the next fetch (before the pair's rows: not read)
  int qn;         // rows to read: the query length
  int cols;       // this lane's columns inside the matrix: loads past N are skipped
  static constexpr int kDepth = DEPTH;
  A slot[kDepth][R];

  __device__ void begin_tile(const Pair& p, int lane, int64_t col) {
    const int64_t left = N - col;
    cols = left >= R ? R : (left > 0 ? int(left) : 0);
    qn = p.qn;
    next = S + p.b * M * N + col - int64_t(lane) * N;  // row -lane, fetched at step 0
  }
  __device__ __forceinline__ void fetch(int d, int i) {
    const bool ok = unsigned(i) < unsigned(qn);
#pragma unroll
    for (int r = 0; r < R; ++r) slot[d][r] = ok && r < cols ? __ldg(next + r) : A(0);
    next += N;
  }
  __device__ __forceinline__ void take(int d, A (&v)[R]) const {
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = slot[d][r];
  }
  __device__ __forceinline__ void start_block() {}
  __device__ __forceinline__ void start_group() {}
};

// Where a lane's rows of dense S are read from in a tile (DenseBlocks and DenseGroups): the lane starts
// `lane` rows above the pair, and reads nothing past its query or the matrix.
template <typename T>
struct DenseRows {
  const T* S;
  int64_t M, N;
  const T* next;  // this lane's first column in the first row of the next rows to load
  int row;        // that row of the pair (negative before its first row: nothing is read)
  int qn;         // rows to read: the query length, or 0 when this lane is past the matrix

  __device__ __forceinline__ void start_rows(const Pair& p, int lane, int64_t col) {
    qn = col < N ? p.qn : 0;
    next = S + p.b * M * N + col - int64_t(lane) * N;  // row -lane: lane k's row at step 0
    row = -lane;
  }
};

// Dense float S for 1-column lanes, 32 rows at a time. Such a lane's sweep is one chain of dependent
// cells (the latency-bound small batches), and loads issued one per step share the warp's few
// scoreboards, so that a step could wait for the load issued just before it (the profile of the seed:
// 30% of the time). Here the 32 loads of the next block of steps all start at the start of a block
// and are used a block (32 steps) later.
template <typename A>
struct DenseBlocks : DenseRows<A> {
  using DenseRows<A>::N, DenseRows<A>::next, DenseRows<A>::row, DenseRows<A>::qn;
  static constexpr int kDepth = kWarp;
  A cur[kWarp], ahead[kWarp];

  __device__ void begin_tile(const Pair& p, int lane, int64_t col) {
    this->start_rows(p, lane, col);
    load_ahead();
  }
  __device__ __forceinline__ void load_ahead() {
#pragma unroll
    for (int m = 0; m < kWarp; ++m) ahead[m] = unsigned(row + m) < unsigned(qn) ? __ldg(next + m * N) : A(0);
    next += kWarp * N;
    row += kWarp;
  }
  // At the start of each block of 32 steps: the rows loaded a block ago become current.
  __device__ __forceinline__ void start_block() {
#pragma unroll
    for (int m = 0; m < kWarp; ++m) cur[m] = ahead[m];
    load_ahead();
  }
  __device__ __forceinline__ void start_group() {}
  __device__ __forceinline__ void fetch(int, int) {}  // all loads are in start_block
  __device__ __forceinline__ void take(int d, A (&v)[1]) const { v[0] = cur[d]; }
};

// Dense float S for 4-column lanes, rows 16-byte aligned, in groups of G rows: at the start of each
// group of G steps the rows loaded a group ago become current, and the next group's G loads start
// together, one 16-byte load per lane and row (the neighbouring lane reads the other half of the
// sector a step later, from L1). A rolling prefetch, one slot refilled per step, waited in the compiled
// code for the load issued a step before: the loads share the warp's few scoreboards (with the stores
// of H, in the forward that keeps them). Dense 8192 x 256 x 256 on the H200, rolling 4 or 8 rows ahead
// against groups: t = 1 0.935 ms, groups of 4 0.914; t = 0 0.858, groups of 8 0.682; keeping H
// 1.64 ms, groups of 8 1.43 (groups of 4: 1.65). DenseBlocks is the same scheme for 1-column lanes
// (groups of 32, started with the block, rows off the pair zeroed); the two share DenseRows, and one
// template for both loads would change the code of those latency-bound kernels, not measured.
template <int G>
struct DenseGroups : DenseRows<float> {
  static constexpr int kDepth = G;
  float4 cur[G], ahead[G];

  __device__ void begin_tile(const Pair& p, int lane, int64_t col) {
    start_rows(p, lane, col);
    load_ahead();
  }
  __device__ __forceinline__ void load_ahead() {
#pragma unroll
    for (int m = 0; m < G; ++m)
      if (unsigned(row + m) < unsigned(qn)) ahead[m] = __ldg(reinterpret_cast<const float4*>(next + m * N));
    next += G * N;
    row += G;
  }
  __device__ __forceinline__ void start_group() {
#pragma unroll
    for (int m = 0; m < G; ++m) cur[m] = ahead[m];
    load_ahead();
  }
  __device__ __forceinline__ void start_block() {}
  __device__ __forceinline__ void fetch(int, int) {}  // all loads are in start_group
  __device__ __forceinline__ void take(int d, float (&v)[4]) const {
    v[0] = cur[d].x, v[1] = cur[d].y, v[2] = cur[d].z, v[3] = cur[d].w;
  }
};

// Scores looked up from uint8 codes in a K x K float32 matrix held in shared memory: the row codes
// are fetched ahead, the lookups happen at the step that uses them. They address the shared memory
// directly (ld.shared, 32-bit addresses): through a generic pointer the compiler rebuilt the shared
// window's base at every step. A transposed pair (see oriented) takes its rows from the target and its
// columns from the query, and reads the matrix transposed: entry [column code][row code], the same
// score as the pair as given.
template <int R>
struct Codes {
  const uint8_t* query;   // (B, M)
  const uint8_t* target;  // (B, N)
  int64_t M, N;
  const float* matrix;  // shared memory, K x K
  int K;
  unsigned offs[R];     // shared-space addresses of this lane's column codes' entries for row code 0
  unsigned row_bytes;   // bytes per row code: 4 K, or 4 in a transposed pair
  const uint8_t* next;  // the row code of the next fetch (before the pair's codes: not read)
  int qn;
  static constexpr int kDepth = source_depth(R);
  unsigned row[kDepth];  // byte offsets of the fetched rows: row_bytes * (row code)

  __device__ void begin_tile(const Pair& p, int lane, int64_t col) {
    qn = p.qn;
    const unsigned base = unsigned(__cvta_generic_to_shared(matrix));
    const uint8_t* const rows = p.transposed ? target + p.b * N : query + p.b * M;
    const uint8_t* const cols = p.transposed ? query + p.b * M : target + p.b * N;
    const int64_t width = p.transposed ? M : N;  // of the columns' codes (past the pair: padding)
    row_bytes = p.transposed ? 4u : 4u * unsigned(K);
    const unsigned col_bytes = p.transposed ? 4u * unsigned(K) : 4u;
#pragma unroll
    for (int r = 0; r < R; ++r) offs[r] = base + col_bytes * (col + r < width ? cols[col + r] : 0u);
    next = rows - lane;
  }

  __device__ __forceinline__ void fetch(int d, int i) {
    row[d] = unsigned(i) < unsigned(qn) ? row_bytes * __ldg(next) : 0u;
    ++next;
  }
  __device__ __forceinline__ void take(int d, float (&v)[R]) const {
#pragma unroll
    for (int r = 0; r < R; ++r) asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v[r]) : "r"(offs[r] + row[d]));
  }
  __device__ __forceinline__ void start_block() {}
  __device__ __forceinline__ void start_group() {}
  // The same codes and matrix, read by lanes of R2 columns (begin_tile sets the rest).
  template <int R2>
  __device__ __forceinline__ Codes<R2> columns() const {
    Codes<R2> c{};
    c.query = query, c.target = target, c.M = M, c.N = N, c.matrix = matrix, c.K = K;
    return c;
  }
};

// ---------------------------------------------------------------------------------------------------
// The forward sweep of one warp over one pair.

// The DP table the forward keeps for the backward, in wavefront order. In each column tile, the R
// values of lane k in row i sit in row (i + k) mod M of the tile: the 32 lanes of a forward step (rows
// s - k) write one contiguous row of the tile, and so do the backward's lanes read one. A tile holds M
// rows of its width (32 R columns, the last one what is left of N rounded up to R), so a pair takes
// M x (N rounded up to R) values: one per DP cell, plus at most R - 1 columns.
__host__ __device__ inline int64_t table_columns(int64_t N, int R) { return (N + R - 1) / R * R; }

template <typename A, int R>
struct Skewed {
  A* pair;  // this pair's table
  int M;
  int64_t cols;
  static constexpr int kTileCols = kWarp * R;
  __device__ __forceinline__ int width(int tile) const {
    const int64_t c0 = int64_t(tile) * kTileCols;
    return cols - c0 < kTileCols ? int(cols - c0) : kTileCols;
  }
  // Lane `lane`'s R values in row u of the tile's storage.
  __device__ __forceinline__ A* slot(int tile, int u, int lane) const {
    return pair + M * (int64_t(tile) * kTileCols) + int64_t(u) * width(tile) + lane * R;
  }
  // Lane `lane`'s R values in row `row` (in [0, M)) of the tile.
  __device__ __forceinline__ A* at(int tile, int row, int lane) const {
    int u = row + lane;
    while (u >= M) u -= M;  // once at most, unless M < 32
    return slot(tile, u, lane);
  }
  // A lane's walk through consecutive rows of a tile, up (step -1) or down (+1), wrapping around.
  struct Cursor {
    A* at;
    A* first;  // row 0's
    A* last;   // row M - 1's
    int64_t stride;  // one row
    __device__ __forceinline__ void step(int direction) {
      if (direction > 0)
        at = at == last ? first : at + stride;
      else
        at = at == first ? last : at - stride;
    }
  };
  // Starting at storage row 0 (where a forward step's rows go at step 0).
  __device__ __forceinline__ Cursor cursor(int tile, int lane) const {
    A* const first = slot(tile, 0, lane);
    return Cursor{first, first, first + int64_t(M - 1) * width(tile), width(tile)};
  }
  // Starting at the pair's row `row`.
  __device__ __forceinline__ Cursor cursor(int tile, int row, int lane) const {
    Cursor c = cursor(tile, lane);
    c.at = at(tile, row, lane);
    return c;
  }
};

template <typename A>
struct Outputs {
  A* scores;          // (B,)
  A* table;           // (B, M, table_columns(N, R)) H in wavefront order (Skewed), or null
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
// waiting on another cannot deadlock. The counters are read and written only by atomics, fenced on
// both sides: the protocol is then visible as such to compute-sanitizer's racecheck, which reported
// the plain volatile accesses as hazards.
template <typename A, int W>
struct Relay {
  A* base;  // (W + 1, M) for this block
  int64_t M, qn;
  int* done;  // shared memory, W counters
  __device__ __forceinline__ const A* source(int64_t tile) const { return base + ((tile - 1) % (W + 1)) * M; }
  __device__ __forceinline__ A* sink(int64_t tile) const { return base + (tile % (W + 1)) * M; }
  // Until tile - 1 has published `rows` rows of its column (the whole warp calls it; lane 0 polls, so
  // that a poll is one atomic and not 32 on one address).
  __device__ __forceinline__ void wait(int64_t tile, int64_t rows) const {
    const int64_t producer = (tile - 1) % W, target = ((tile - 1) / W) * qn + rows;
    if (threadIdx.x % kWarp == 0)
      while (atomicAdd(done + producer, 0) < target) __nanosleep(32);
    __syncwarp();
    __threadfence_block();  // the column's rows are read only after the count that covers them
  }
  // Called by lane 31 of the warp that runs `tile`, after writing `rows` rows of its column.
  __device__ __forceinline__ void publish(int64_t tile, int64_t rows) const {
    __threadfence_block();
    atomicExch(done + tile % W, int((tile / W) * qn + rows));
  }
};

// Where lane `lane` stands in column tile `tile` of a pair (both sweeps): the tile's first column of the
// lane, the tile's width inside the target, its lanes that hold columns, and how many of this lane's R
// columns lie inside the target.
template <int R>
struct TileLanes {
  int col, width, lanes, valid;
  bool active, has_next;
  __device__ __forceinline__ TileLanes(const Pair& p, int tile, int tiles, int lane) {
    constexpr int kTileCols = kWarp * R;
    const int c0 = tile * kTileCols;
    col = c0 + lane * R;
    width = p.tn - c0 < kTileCols ? p.tn - c0 : kTileCols;
    lanes = (width + R - 1) / R;
    valid = p.tn - col >= R ? R : (p.tn - col > 0 ? p.tn - col : 0);
    active = lane < lanes;
    has_next = tile + 1 < tiles;
  }
};

// The same, with the score source started on the tile: its first kDepth rows fetched.
template <int R, class Source>
__device__ __forceinline__ TileLanes<R> start_tile(const Pair& p, Source& src, int tile, int tiles, int lane) {
  const TileLanes<R> at(p, tile, tiles, lane);
  src.begin_tile(p, lane, at.col);
#pragma unroll
  for (int d = 0; d < Source::kDepth; ++d) src.fetch(d, d - lane);
  return at;
}

// The sweep of one warp over tiles first_tile, first_tile + stride, ... of one pair. Returns, in every
// lane, the best cell value and (with STORE) its row-major position, -1 for the zero border.
//
// Each lane keeps, for its R columns, H of the previous row and H + gap: a cell's H + gap is both the
// insert term of its right neighbour and the delete term of the cell below, added once. Steps run in
// blocks of 32: at the start of a block the warp loads the next 32 rows of the tile's left boundary
// (lane j: row s0 + 32 + j), and lane 0 takes its value of step s by shuffle, so no load latency lies
// on the wavefront. In the first tile the boundary is the zero border.
template <typename A, int R, bool SOFT, bool STORE, class Source, class Handoff, bool FROM_UP = false,
          bool TABLE = STORE>
__device__ void forward_tiles(const Pair& p, Source& src, const Consts<A>& k, const Outputs<A>& out, int64_t M,
                              int64_t N, const Handoff& handoff, int first_tile, int stride, A& best_out,
                              int64_t& best_at_out) {
  constexpr int kDepth = Source::kDepth;
  static_assert(kWarp % kDepth == 0, "a block of 32 steps holds whole groups of kDepth steps");
  const int lane = threadIdx.x % kWarp;
  constexpr int kTileCols = kWarp * R;
  A best = A(0);
  int64_t best_at = -1;
  // Each of a lane's R columns keeps its own maximum over a tile, folded into `best` after the tile, so
  // that a step tests no column against the target's end. With STORE, the column also keeps the row of
  // its first maximum (rows come in order, so only a strictly larger value, or a first NaN, replaces
  // it), and the fold compares row-major positions. TABLE: STORE also writes the DP table (without it,
  // the best cell's position alone: the fallback of rows_forward_kernel).
  A lane_best[R];
  int lane_best_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) lane_best[r] = A(0), lane_best_row[r] = -1;
  const int tiles = (p.tn + kTileCols - 1) / kTileCols;
  const int64_t cols = table_columns(N, R);
  const Skewed<A, R> table{TABLE ? out.table + p.b * M * cols : nullptr, int(M), cols};
  for (int tile = first_tile; tile < tiles; tile += stride) {
    const TileLanes<R> at = start_tile<R>(p, src, tile, tiles, lane);
    const int col = at.col, width = at.width, lanes = at.lanes, valid = at.valid;
    const bool active = at.active, has_next = at.has_next;
    // With STORE, where this lane's row of step s goes: row s mod M of the tile (row s - lane of the
    // pair), the same row of the tile for the whole warp. It moves one row down per step.
    typename Skewed<A, R>::Cursor row_out{};
    if (TABLE) row_out = table.cursor(tile, lane);
    A up[R], up_gap[R];  // H[i-1][col + r], and that + gap
#pragma unroll
    for (int r = 0; r < R; ++r) up[r] = A(0), up_gap[r] = k.gap;
    A left_above = A(0);  // H[i-1][col-1]
    A last = A(0);        // H[i][col+R-1], handed to lane+1
    const A* const bnd_in = tile > 0 ? handoff.source(tile) : nullptr;
    A* const bnd_out = has_next ? handoff.sink(tile) : nullptr;
    A chunk = A(0), chunk_next = A(0);
    if (tile > 0) {
      handoff.wait(tile, p.qn < kWarp ? p.qn : kWarp);
      chunk_next = lane < p.qn ? bnd_in[lane] : A(0);
    }
    const int steps = p.qn + lanes - 1;
    for (int s0 = 0; s0 < steps; s0 += kWarp) {
      src.start_block();
      if (tile > 0) {  // the same for the whole warp
        chunk = chunk_next;
        const int ahead = s0 + kWarp + lane;
        handoff.wait(tile, p.qn < s0 + 2 * kWarp ? p.qn : s0 + 2 * kWarp);
        chunk_next = ahead < p.qn ? bnd_in[ahead] : A(0);
      }
      // Steps past `steps` (at most kDepth - 1; a block source leaves the block at `steps`) compute
      // nothing: every active lane is past its rows.
      for (int j = 0; j < kWarp && s0 + j < steps; j += kDepth) {
        src.start_group();
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          if (kDepth == kWarp && s0 + d >= steps) break;  // a block source: the last block's tail
          const int i = s0 + j + d - lane;
          A left = __shfl_up_sync(kFull, last, 1);
          const A from_boundary = __shfl_sync(kFull, chunk, j + d);
          if (lane == 0) left = from_boundary;
          A v[R];
          src.take(d, v);
          const bool on = active && unsigned(i) < unsigned(p.qn);
          auto track_best = [&](A h, int r) {
            if (!STORE) {
              lane_best[r] = max_nan(lane_best[r], h);
            } else if (lane_best[r] == lane_best[r] && !(h <= lane_best[r])) {  // larger, or the first NaN
              lane_best[r] = h, lane_best_row[r] = i;
            }
          };
          if constexpr (R == 1) {
            // Latency-bound: the cell is computed in every lane, so that no branch lies between it and
            // the next step's shuffle. A lane off its rows sends a value nobody uses: its right
            // neighbour is then off the same row.
            A h;
            if constexpr (FROM_UP)
              h = cell_from_up(left_above + v[0], up[0], left, k);
            else
              h = cell<A, SOFT>(left_above + v[0], up_gap[0], left + k.gap, k);
            last = h;
            up[0] = on ? h : up[0];
            up_gap[0] = on ? h + k.gap : up_gap[0];
            left_above = on ? left : left_above;
            if (on) {
              track_best(h, 0);
              if (TABLE) store_row<A, R>(row_out.at, up, valid, true);
            }
          } else {
            if (on) {
              A diag = left_above, left_gap = left + k.gap;
#pragma unroll
              for (int r = 0; r < R; ++r) {
                const A h = cell<A, SOFT>(diag + v[r], up_gap[r], left_gap, k);
                diag = up[r];
                up[r] = h;
                left_gap = h + k.gap;
                up_gap[r] = left_gap;
                track_best(h, r);
              }
              // All R values, 16-byte aligned: the table's rows are whole lanes wide, and the backward
              // reads no column past the target.
              if (TABLE) store_row<A, R>(row_out.at, up, R, true);
              left_above = left;
            }
            last = up[R - 1];
          }
          // Outside the branch above: inside it, the compiler copied the step's registers once per path.
          if (on && has_next && lane == kWarp - 1) {
            bnd_out[i] = up[R - 1];
            if ((i + 1) % kWarp == 0 || i + 1 == p.qn) handoff.publish(tile, i + 1);
          }
          if (TABLE) row_out.step(+1);
          // Refill the slot only now that its values are used: the load can then land in the same
          // registers, and the loop carries no copy of a value still in flight.
          src.fetch(d, i + kDepth);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {  // columns past the target are left out
      if (!STORE) {
        if (r < valid) best = max_nan(best, lane_best[r]);
      } else if (r < valid && lane_best_row[r] >= 0) {  // a column that never passed 0 keeps the border
        // Tiles run one after another, so compare positions: the first in row-major wins.
        const A h = lane_best[r];
        const int64_t at = int64_t(lane_best_row[r]) * N + col + r;
        const bool take = h != h ? (best == best || at < best_at)
                                 : (h > best || (h == best && best_at >= 0 && at < best_at));
        if (take) best = h, best_at = at;
      }
      lane_best[r] = A(0), lane_best_row[r] = -1;
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

// ---------------------------------------------------------------------------------------------------
// The scaled sweep: float at t > 0 with 4 columns per lane (or 8: below), the forward without the DP
// table. With E = 2^(H c), c = log2(e) / t, the recurrence is a sum of products:
//
//     E[i][j] = 1 + E[i-1][j-1] P[i][j] + (E[i-1][j] + E[i][j-1]) G,   P = 2^(S c), G = 2^(gap c)
//
// so a cell is 3 fused multiply-adds and one ex2 for P (dense scores), or none: scores from codes
// take P from a second table in shared memory, 2^(m c) of each entry m of the substitution matrix (the
// log-space cell takes 3 ex2 and 1 lg2). E overflows a float within a few dozen cells of a good
// alignment, so each lane keeps its values scaled: E = stored * 2^sigma, and after each step it moves
// the exponent of its largest value into sigma (an integer), which leaves the largest stored value in
// [2^top, 2^(top+1)), top = kScaledTop: 2^77 of room above, for one step's growth (P up to 2^60, G <= 1)
// and for a left neighbour larger than the lane's own cells, and 2^150 below (kScaledFloor). The left
// neighbour's value comes as a mantissa and an exponent and is rescaled by a power of 2. H in score
// units is t ln2 (sigma + log2 stored): at the tile boundary (one lg2 per row) and for the best cell
// (once per lane, at the end). Scores from codes on the H200: 1.48x the log-space sweep's speed (10,000
// protein pairs at t = 1); dense float scores 1.45x (8192 x 256 x 256), before the fix below.
//
// The sums have no cancellation, so this is at least as accurate as the log-space cell. What it
// cannot hold is a spread of more than about 2^(top+100) between the 4 cells of a lane's row, or a
// value past the float range. Each lane checks every step that its smallest cell is at least
// kScaledFloor, before and after rescaling, and that nothing overflowed or became NaN; a pair that fails
// anywhere is scored again by the log-space sweep (forward_tiles), whose result it then is. A NaN in
// the scores fails the check, so it reaches the score through that sweep as everywhere else.
//
// Scores from codes take 8 columns per lane where kWideLimit allows: a step's overhead (the shuffles,
// the renormalisation, the checks, the loop) is then shared by 8 cells, and the lane renormalises every
// other step only (RENORM = 2: a step in between keeps the scale, and its largest and smallest cells
// wait for the next renormalisation's checks and best cell). 120 SASS instructions a step for 8 cells
// against 99 for 4; 10,000 real pairs at t = 1 on the H200, in one process: 851 against 674 GCUPS.
//
// A factor must not flush to 0 where its product would matter. The diagonal term of a lane's first
// column takes E[i-1][col-1] from the left neighbour, whose scale may be far from this lane's: below
// 2^-126 here, it may still be the cell's largest term times P. So it is kept with extra range (times
// 2^bias, or in two factors: above_left in forward_tiles_scaled). Before this, the fuzz
// (tools/fuzz_scaled.py cuda) found scores off by up to 0.23 relative on dense scores of large |S| / t,
// and 3.4e-4 from codes at t = 0.27.
struct Scaled {
  double c;      // log2(e) / t, for the P table
  float gap_bits;  // -gap c = log2(1 / G), G = Consts::G
  bool allowed;  // the caller's switch and gap <= 0 (false: every pair in log space)
};
// top = 100 - log2(largest P), which left less room above, sent 68 of 1103 protein pairs (gap -11, t = 1)
// to log space: their left neighbours passed the float range. With 50, none.
constexpr int kScaledTop = 50;
// With 8 columns per lane (see kWideLimit) top is 60 (2^67 of room above, 2^160 below): there the
// failures are mostly below, as a lane's 8 cells spread further. Measured with 8 columns forced on
// BLOSUM62 at t = 1, gap -6: top 50 sent 6 of 10,000 real pairs and 598 of 1,000 related ones to log
// space, top 60 none and 54 (and 80 of 200 self-alignments); top 40 and 30 sent more, and top 70 more
// where P is large (t = 0.8).
constexpr int kScaledTopWide = 60;
// Scores from codes take 8 columns per lane in the scaled sweep, renormalised every other step, where
// log2(largest P) is at most kWideBias and log2(largest P) + 2 log2(1 / G) at most kWideLimit; else 4
// columns, renormalised every step. A lane's 8 cells spread further than 4 (the gap's share), and two
// steps grow further than one (P's), so more pairs fail their checks, and a failed pair costs a second
// sweep, in log space: for a long relayed pair, the batch's time with it. The limits are measured with 8
// columns forced (BLOSUM62, t 0.8 to 1.5, gap -2 to -11, top 60; docs/benchmarks/h200.md): within them
// no pair of 10,000 real ones and 1,000 related ones failed, and at most 7 of 200 self-alignments;
// past them, from 32.2 up, up to 998 related pairs, and from 34.4 up real ones too: up to 554, which
// made the batch 1.75x as slow as with 4 columns. (t < 0.8, where P > 2^20, was measured with top 50
// only: 0 to 4,693 real pairs failed.)
constexpr int kWideBias = 20;
constexpr float kWideLimit = 32.0f;

// 2^k for an integer k in [-127, 128]: 0 at -127 (flushed), +inf at 128.
__device__ __forceinline__ float pow2_int(int k) { return __int_as_float((k + 127) << 23); }

// x 2^k in two factors that are normal floats: 2^k alone flushes to 0 past 2^-126, while x 2^k may still
// be a normal float (and, times a large P later, a cell's largest term). 0 or +inf past [-252, 254].
__device__ __forceinline__ float times_pow2(float x, int k) {
  k = min(max(k, -252), 254);
  const int half = k >> 1;
  return x * pow2_int(half) * pow2_int(k - half);
}

// E = value 2^sigma (value > 0) as one integer that orders as E: (sigma << 23) + the bits of value, as
// the bits of a positive float order as the float and adding sigma to its exponent field keeps that order
// across scales. The exponent of E is (key >> 23) - 127.
__device__ __forceinline__ long long scaled_key(int sigma, float value) {
  return (static_cast<long long>(sigma) << 23) + __float_as_uint(value);
}

// The mantissa in [1, 2) of a float's (or a scaled_key's low) bits.
__device__ __forceinline__ float mantissa_of(unsigned bits) {
  return __uint_as_float((bits & 0x007fffffu) | 0x3f800000u);
}

// The smallest value a lane may hold in the scaled sweep: a term that flushed to 0 (below 2^-126, as the
// zero term 2^-sigma does once sigma > 126, or a left neighbour far below this lane's scale) is then
// under 2^-26 of every cell.
constexpr float kScaledFloor = 0x1p-100f;

template <bool POWERS, int R, int RENORM, class Source, class Handoff>
__device__ bool forward_tiles_scaled(const Pair& p, Source& src, int bias, const Consts<float>& k,
                                     const Handoff& handoff, int first_tile, int stride, float& best_out) {
  const float G = k.G, tl = k.tl, c = k.c;
  constexpr int kDepth = Source::kDepth, top = R == 8 ? kScaledTopWide : kScaledTop;
  static_assert(kWarp % kDepth == 0, "a block of 32 steps holds whole groups of kDepth steps");
  static_assert((RENORM == 1 || RENORM == 2) && kDepth % RENORM == 0, "renormalise every step or every other");
  const int lane = threadIdx.x % kWarp;
  constexpr int kTileCols = kWarp * R;
  const float scale = pow2_int(top);                // E = 1 at sigma -top
  const unsigned rescale_base = unsigned(254 + top) << 23;  // minus an exponent's bits: 2^(top - exponent)
  long long best_key = scaled_key(0, 1.0f);  // the best cell (E = 1: the zero border)
  bool ok = true;
  const int tiles = (p.tn + kTileCols - 1) / kTileCols;
  for (int tile = first_tile; tile < tiles; tile += stride) {
    const TileLanes<R> at = start_tile<R>(p, src, tile, tiles, lane);
    if constexpr (POWERS) src.offs[0] += 4u * unsigned(src.K * src.K);  // the first column's P 2^-bias
    const int width = at.width, lanes = at.lanes, valid = at.valid;
    const bool active = at.active, has_next = at.has_next;
    // Row 0 is the zero border: E = 1.
    float up[R];  // stored E of the previous row, this lane's columns
#pragma unroll
    for (int r = 0; r < R; ++r) up[r] = scale;
    int sig = -top;
    float one = scale;         // 2^-sigma: the zero term
    // E[i-1][col-1], the diagonal term's factor in the lane's first column. Its product with P may be
    // the cell's largest term while the value alone, in this lane's scale, is below the float range. So
    // with scores from codes it is kept times 2^bias, against P 2^-bias from the third table (see
    // stage_matrix); with dense scores it is kept as the left neighbour handed it, with its sigma, and
    // takes this lane's scale after the product with P (times_pow2).
    float above_left = POWERS ? pow2_int(top + bias) : 1.0f;
    int above_left_sig = 0;
    // E[i][col+R-1], handed to lane+1 as a mantissa in [1, 2) and an exponent (last_sig): its rescaling
    // by a power of 2 then flushes only values below 2^-125 of the neighbour's scale, which are
    // negligible (see kScaledFloor).
    float last = 1.0f;
    int last_sig = 0;
    // Renormalisation every other step (d odd): a step in between keeps the scale, and its largest and
    // smallest cells wait here for the next renormalisation's checks and best cell.
    float hi_pending = 0.0f, lo_pending = FLT_MAX;
    const float* const bnd_in = tile > 0 ? handoff.source(tile) : nullptr;
    float* const bnd_out = has_next ? handoff.sink(tile) : nullptr;
    // The boundary's H of the block's rows (lane j: row s0 + j), as stored E and sigma: its integer
    // part of H c goes to sigma. In the first tile the zero border, E = 1 at sigma 0.
    float chunk_e = 1.0f, chunk_next = 0.0f;
    int chunk_sig = 0;
    if (tile > 0) {
      handoff.wait(tile, p.qn < kWarp ? p.qn : kWarp);
      chunk_next = lane < p.qn ? bnd_in[lane] : 0.0f;
    }
    const int steps = p.qn + lanes - 1;
    // The steps, in two versions: where the tile's width is not a multiple of R (the last tile of a
    // pair, mostly), the last lane's columns past the target copy their left neighbour, so that they
    // count neither for the lane's scale nor for the best cell.
    auto sweep = [&](auto masked) {
      for (int s0 = 0; s0 < steps; s0 += kWarp) {
        src.start_block();
        if (tile > 0) {
          const float x = chunk_next * c, whole = floorf(x);
          chunk_e = exp2_(x - whole);
          chunk_sig = int(whole);
          const int ahead = s0 + kWarp + lane;
          handoff.wait(tile, p.qn < s0 + 2 * kWarp ? p.qn : s0 + 2 * kWarp);
          chunk_next = ahead < p.qn ? bnd_in[ahead] : 0.0f;
        }
        for (int j = 0; j < kWarp && s0 + j < steps; j += kDepth) {
          src.start_group();
#pragma unroll
          for (int d = 0; d < kDepth; ++d) {
            const int i = s0 + j + d - lane;
            float left = __shfl_up_sync(kFull, last, 1);
            int left_sig = __shfl_up_sync(kFull, last_sig, 1);
            const float boundary_e = __shfl_sync(kFull, chunk_e, j + d);
            const int boundary_sig = __shfl_sync(kFull, chunk_sig, j + d);
            if (lane == 0) left = boundary_e, left_sig = boundary_sig;
            float v[R];
            src.take(d, v);
            const bool on = active && unsigned(i) < unsigned(p.qn);
            if (on) {
              const float lv = left * pow2_int(min(max(left_sig - sig, -127), 128));  // left in [1, 2)
              float e[R];
              float prev = lv;
#pragma unroll
              for (int r = 0; r < R; ++r) {
                const float power = POWERS ? v[r] : exp2_(v[r] * c);
                float x;
                if (r > 0)
                  x = fmaf(up[r - 1], power, one);
                else if (POWERS)
                  x = fmaf(above_left, power, one);
                else
                  x = times_pow2(above_left * power, above_left_sig - sig) + one;
                x = fmaf(up[r], G, x);
                x = fmaf(prev, G, x);
                if (decltype(masked)::value) x = r < valid ? x : prev;
                e[r] = x;
                prev = x;
              }
              float hi = e[0], lo = e[0];
#pragma unroll
              for (int r = 1; r < R; ++r) hi = max_nan(hi, e[r]), lo = min_nan(lo, e[r]);
              if (RENORM == 2 && d % 2 == 0) {  // keep the scale
                hi_pending = max_nan(hi_pending, hi);
                lo_pending = min_nan(lo_pending, lo);
#pragma unroll
                for (int r = 0; r < R; ++r) up[r] = e[r];
              } else {
                const float top_cell = RENORM == 2 ? max_nan(hi, hi_pending) : hi;
                const float low_cell = RENORM == 2 ? min_nan(lo, lo_pending) : lo;
                const long long key = scaled_key(sig, top_cell);
                best_key = key > best_key ? key : best_key;
                const unsigned exponent = __float_as_uint(hi) & 0x7f800000u;
                const float f = __uint_as_float(rescale_base - exponent);  // 2^(top - exponent of hi)
                sig += int(exponent >> 23) - (127 + top);
                // false for a NaN
                ok = ok && low_cell >= kScaledFloor && lo * f >= kScaledFloor && top_cell <= FLT_MAX;
#pragma unroll
                for (int r = 0; r < R; ++r) up[r] = e[r] * f;
                one = __int_as_float(max(127 - sig, 0) << 23);
                hi_pending = 0.0f, lo_pending = FLT_MAX;
              }
              if (POWERS)
                above_left = left * pow2_int(min(max(left_sig - sig + bias, -127), 128));
              else
                above_left = left, above_left_sig = left_sig;
            }
            const unsigned last_bits = __float_as_uint(up[R - 1]);
            last = mantissa_of(last_bits);
            last_sig = sig + int(last_bits >> 23) - 127;
            if (on && has_next && lane == kWarp - 1) {
              bnd_out[i] = tl * (float(last_sig) + log2_(last));  // see best, below
              if ((i + 1) % kWarp == 0 || i + 1 == p.qn) handoff.publish(tile, i + 1);
            }
            src.fetch(d, i + kDepth);
          }
        }
      }
    };
    if (width % R != 0)
      sweep(std::true_type{});
    else
      sweep(std::false_type{});
    if (RENORM == 2) {  // a lane whose last row kept the scale: its cells' checks and best cell
      ok = ok && lo_pending >= kScaledFloor && hi_pending <= FLT_MAX;
      const long long key = scaled_key(sig, hi_pending);
      best_key = hi_pending > 0.0f && key > best_key ? key : best_key;  // 0: nothing pending
    }
    __syncwarp();  // lane 31's boundary writes are visible to lane 0 in the next tile
  }
  // H of the best cell, from its exponent (an integer) and the lg2 of a mantissa in [1, 2): sigma +
  // lg2(stored) cancelled where H is small (sigma near -top, lg2 near top), which left errors of up to
  // 1e-5 relative at t = 10 (tools/fuzz_scaled.py cuda).
  const int best_exponent = int(best_key >> 23) - 127;
  float best = tl * (float(best_exponent) + log2_(mantissa_of(unsigned(best_key))));
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) best = fmaxf(best, __shfl_xor_sync(kFull, best, off));
  best_out = best;
  return ok;
}

// The scaled sweep of a float pair of one column tile in 1-column lanes (the latency-bound small batches,
// dense scores: the seed), whose time is the length of the step's dependent chain. One scale 2^sigma for
// the whole warp instead of one per lane, and no boundary: the chain is the left neighbour's shuffle,
// lane 0's select of the border and one fused multiply-add (cell_from_up's: 2 ex2, 1 lg2 and the adds
// between them); P = 2^(S c) of a step is computed a step ahead.
//
// A stored value past 2^kOneScaleTop in any lane turns every lane's values (and the zero term 2^-sigma)
// down by 2^kOneScaleStep at the next step, decided by a vote taken with that step's shuffle: values grow
// by at most P + 2G a step, which leaves 2^27 of room for P. Every stored value is at least the zero
// term, which stays a normal float while sigma <= 126, so no term that matters is lost. Past that (a
// best E past about 2^196: H above about 136 t), at an overflow or at a NaN, the sweep gives up, in every
// lane as soon as it knows, and the caller scores the pair in log space. One scale cannot serve a wider
// pair: its lanes' values spread further apart (by up to 2^300 within a warp at 256 x 256, t = 1).
constexpr float kOneScaleTop = 0x1p100f;
constexpr int kOneScaleStep = 32;

__device__ bool forward_one_scale(const Pair& p, DenseBlocks<float>& src, const Consts<float>& k, float& best_out) {
  const float G = k.G, tl = k.tl, c = k.c;
  const int lane = threadIdx.x % kWarp;
  const TileLanes<1> at = start_tile<1>(p, src, 0, 1, lane);
  const bool active = at.active;
  const float down = pow2_int(-kOneScaleStep);
  int sig = 0;
  float one = 1.0f;        // 2^-sigma: the zero term, and E = 1 of the borders
  float lane_best = 1.0f;  // the best cell of this lane's column (E = 1: the zero border)
  float up = 1.0f, diag = 1.0f, last = 1.0f;  // E[i-1][lane], E[i-1][lane-1], E[i][lane] (to lane + 1)
  bool big = false;        // this lane's value of the previous step is past kOneScaleTop, or NaN
  // Before a step uses its values, where a lane's previous value was big: the rescaling, applied to
  // everything this lane holds in the scale. False where the sweep gives up.
  auto settle = [&](int i, float& left, float& rest) {
    const bool was_on = active && unsigned(i - 1) < unsigned(p.qn);
    if (__any_sync(kFull, was_on && !(last <= FLT_MAX)) || sig + kOneScaleStep > 126) return false;
    up *= down, diag *= down, left *= down, rest *= down, lane_best *= down, one *= down;
    sig += kOneScaleStep;
    return true;
  };
  const int steps = p.qn + at.lanes - 1;
  for (int s0 = 0; s0 < steps; s0 += kWarp) {
    src.start_block();
    float v[1];
    src.take(0, v);
    float power_next = exp2_(v[0] * c);
#pragma unroll
    for (int d = 0; d < kWarp; ++d) {
      if (d % 8 == 0 && s0 + d >= steps) break;  // the last block's tail, up to 7 idle steps
      const int i = s0 + d - lane;
      const float power = power_next;
      float left = __shfl_up_sync(kFull, last, 1);
      if (d + 1 < kWarp) {  // the next step's P, while the shuffle is in flight
        src.take(d + 1, v);
        power_next = exp2_(v[0] * c);
      }
      float rest = fmaf(diag, power, fmaf(up, G, one));
      if (lane == 0) left = one;
      if (__any_sync(kFull, big) && !settle(i, left, rest)) return false;  // the previous step's vote
      const float x = fmaf(left, G, rest);
      const bool on = active && unsigned(i) < unsigned(p.qn);
      last = x;
      up = on ? x : up;
      diag = on ? left : diag;
      lane_best = on ? max_nan(lane_best, x) : lane_best;
      big = on && !(x <= kOneScaleTop);  // also a NaN
    }
  }
  float unused = 0.0f, unused_rest = 0.0f;
  if (__any_sync(kFull, big) && !settle(steps, unused, unused_rest)) return false;  // the last step's values
  float best = lane_best;
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) best = max_nan(best, __shfl_xor_sync(kFull, best, off));
  const unsigned bits = __float_as_uint(best);
  best_out = tl * (float(sig + int(bits >> 23) - 127) + log2_(mantissa_of(bits)));
  return best <= FLT_MAX;  // false for a NaN
}

// One warp, all the tiles of one pair.
template <typename A, int R, bool SOFT, bool STORE, class Source>
__device__ void forward_pair(const Pair& p, Source& src, const Consts<A>& k, const Outputs<A>& out,
                             int64_t M, int64_t N) {
  A best;
  int64_t best_at;
  const InPlace<A> handoff{out.boundary ? out.boundary + p.b * M : nullptr};
  bool scored = false;
  if constexpr (std::is_same<A, float>::value && R == 1 && SOFT) {  // see cell_from_up
    forward_tiles<A, R, SOFT, STORE, Source, InPlace<A>, true>(p, src, k, out, M, N, handoff, 0, 1, best, best_at);
    scored = isfinite(best);  // the same in every lane
  }
  if (!scored) forward_tiles<A, R, SOFT, STORE>(p, src, k, out, M, N, handoff, 0, 1, best, best_at);
  if (threadIdx.x % kWarp == 0) {
    out.scores[p.b] = best;
    if (STORE) out.best_at[p.b] = best_at;
  }
}

// The scaled sweep of scores from codes: the source reads the tables of powers (P, then P 2^-bias: see
// stage_matrix) during the sweep, and the matrix again after it, for a log-space sweep of the pair.
template <int R, class Source, class Handoff>
__device__ bool codes_tiles_scaled(const Pair& p, Source& src, const float* powers, int bias,
                                   const Consts<float>& k, const Handoff& handoff, int first_tile, int stride,
                                   float& best) {
  const float* const matrix = src.matrix;
  src.matrix = powers;
  const bool ok = forward_tiles_scaled<true, R, R == 8 ? 2 : 1>(p, src, bias, k, handoff, first_tile, stride, best);
  src.matrix = matrix;
  return ok;
}

// One warp, all the tiles of one pair, float at t > 0 with R = 4 or 8 columns per lane: the scaled sweep (if
// bias >= 0), and the log-space sweep where it is not taken or where the pair fails its check (counted in
// *log_pairs). POWERS: the source is Codes, whose matrix pointer the scaled sweep points at `powers`
// (P, then P 2^-bias: see stage_matrix).
template <bool POWERS, int R, class Source>
__device__ void scaled_pair(const Pair& p, Source& src, const float* powers, int bias, const Consts<float>& k,
                            const Outputs<float>& out, int64_t M, int64_t N, int* log_pairs) {
  const InPlace<float> handoff{out.boundary ? out.boundary + p.b * M : nullptr};
  float best;
  bool done = false;
  if (bias >= 0) {
    if constexpr (POWERS)
      done = codes_tiles_scaled<R>(p, src, powers, bias, k, handoff, 0, 1, best);
    else
      done = forward_tiles_scaled<false, R, 1>(p, src, 0, k, handoff, 0, 1, best);
    done = __all_sync(kFull, done);
  }
  if (!done) {
    int64_t unused;
    if constexpr (R == 4) {
      forward_tiles<float, 4, true, false>(p, src, k, out, M, N, handoff, 0, 1, best, unused);
    } else {  // 4 columns per lane in log space
      Codes<4> narrow = src.template columns<4>();
      forward_tiles<float, 4, true, false>(p, narrow, k, out, M, N, handoff, 0, 1, best, unused);
    }
    if (log_pairs && threadIdx.x % kWarp == 0) atomicAdd(log_pairs, 1);
  }
  if (threadIdx.x % kWarp == 0) out.scores[p.b] = best;
}

// One warp, all the tiles of one pair, float at t > 0 with 1-column lanes and no DP table: the sweep with
// one scale per warp where allowed and the pair has one column tile, else or where it gives up the
// log-space one (each counted in *log_pairs).
__device__ void one_scale_pair(const Pair& p, DenseBlocks<float>& src, const Scaled& sc, const Consts<float>& k,
                               const Outputs<float>& out, int64_t M, int64_t N, int* log_pairs) {
  float best;
  if (sc.allowed && p.tn <= kWarp && forward_one_scale(p, src, k, best)) {
    if (threadIdx.x % kWarp == 0) out.scores[p.b] = best;
    return;
  }
  if (log_pairs && threadIdx.x % kWarp == 0) atomicAdd(log_pairs, 1);
  forward_pair<float, 1, true, false>(p, src, k, out, M, N);
}

template <typename A, int R, bool SOFT, bool STORE, class Source>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    forward_kernel(Source src, Consts<A> k, Outputs<A> out, const int64_t* qlen, const int64_t* tlen,
                   const int64_t* order, int64_t B, int64_t M, int64_t N, Scaled sc, int* log_pairs) {
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;  // a whole warp leaves together
  const int64_t b = order ? order[slot] : slot;
  const Pair p{b, int(qlen ? qlen[b] : M), int(tlen ? tlen[b] : N)};
  if constexpr (std::is_same<A, float>::value && R == 4 && SOFT && !STORE)
    scaled_pair<false, R>(p, src, nullptr, sc.allowed ? 0 : -1, k, out, M, N, log_pairs);
  else if constexpr (std::is_same<A, float>::value && R == 1 && SOFT && !STORE)
    one_scale_pair(p, src, sc, k, out, M, N, log_pairs);
  else
    forward_pair<A, R, SOFT, STORE>(p, src, k, out, M, N);
}

// The codes kernels first stage the matrix in shared memory (all warps of the block share it), and for
// the scaled sweep (soft, 4 or 8 columns per lane) two tables behind it: P = 2^(m c) of each entry m, and P
// 2^-bias, where 2^bias is the power of 2 above the largest P. The second is for the lanes' first column,
// whose diagonal factor is kept times 2^bias (forward_tiles_scaled). A block scales only if every P is
// at most 2^60 and every P 2^-bias a normal float (the same test in every block: it depends on the
// matrix and t alone); otherwise, or where the caller disallows it, every pair takes the log-space
// sweep. Returns the bias, or -1 for the log-space sweep.
template <bool SCALED>
__device__ int stage_matrix(float* shared, const float* matrix, int K, const Scaled& sc) {
  const bool scaling = SCALED && sc.allowed;  // else the shared memory holds the matrix alone
  __shared__ unsigned largest;  // the bits of the largest P (positive floats order as their bits)
  if (scaling) {
    if (threadIdx.x == 0) largest = 0;
    __syncthreads();
  }
  bool in_range = scaling;
  unsigned mine = 0;
  for (int x = threadIdx.x; x < K * K; x += blockDim.x) {
    const float m = matrix[x];
    shared[x] = m;
    if (scaling) {
      const float p = float(exp2(double(m) * sc.c));  // rounded once
      shared[K * K + x] = p;
      in_range = in_range && p <= 0x1p60f;  // false for a NaN
      mine = max(mine, __float_as_uint(p));
    }
  }
  if (scaling) atomicMax(&largest, mine);
  if (!__syncthreads_and(in_range)) return -1;
  const int bias = max(int(largest >> 23) - 127 + 1, 0);
  const float down = pow2_int(-bias);
  for (int x = threadIdx.x; x < K * K; x += blockDim.x) {
    const float p = shared[K * K + x] * down;
    shared[2 * K * K + x] = p;
    in_range = in_range && p >= 0x1p-126f;
  }
  return __syncthreads_and(in_range) ? bias : -1;
}

// Whether a block of the codes kernels with 8 columns per lane scales with them (see kWideLimit); else
// it takes 4 columns per lane at t > 0. The same in every block: it depends on the matrix, t and gap.
__device__ __forceinline__ bool wide_scaled(int bias, const Scaled& sc) {
  return bias >= 0 && bias <= kWideBias && float(bias) + 2.0f * sc.gap_bits <= kWideLimit;
}

// The columns per lane of the sweep a pair of a codes kernel of R columns per lane starts with: 4 at t > 0
// where the scaled sweep cannot hold 8 (see codes_pair).
template <int R, bool SOFT>
__device__ __forceinline__ int sweep_columns(int bias, const Scaled& sc) {
  return R == 8 && SOFT && !wide_scaled(bias, sc) ? 4 : R;
}

// The codes of one pair, one warp.
template <int R, bool SOFT>
__device__ void codes_pair(const Pair& p, Codes<R>& src, const float* shared_p, const Consts<float>& k,
                           const Outputs<float>& out, const Scaled& sc, int bias, int* log_pairs) {
  if constexpr (R == 8 && SOFT) {
    if (wide_scaled(bias, sc)) {
      scaled_pair<true, 8>(p, src, shared_p, bias, k, out, src.M, src.N, log_pairs);
    } else {
      Codes<4> narrow = src.template columns<4>();
      scaled_pair<true, 4>(p, narrow, shared_p, bias, k, out, src.M, src.N, log_pairs);
    }
  } else if constexpr (R == 4 && SOFT) {
    scaled_pair<true, 4>(p, src, shared_p, bias, k, out, src.M, src.N, log_pairs);
  } else {
    forward_pair<float, R, SOFT, false>(p, src, k, out, src.M, src.N);
  }
}

// The bounds of the codes kernels name a minimum of blocks per SM: without one, ptxas held them to 64
// registers and spilled in the scaled sweep. 10,000 real pairs at t = 1 on the H200: 3.75 ms with these
// bounds, 3.91 without.
template <int R, bool SOFT>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock, 4)
    forward_codes_kernel(Codes<R> src, const float* matrix, Consts<float> k, Outputs<float> out,
                         const int64_t* qlen, const int64_t* tlen, const int64_t* order, int64_t B, Scaled sc,
                         int* log_pairs) {
  extern __shared__ float shared_matrix[];
  const int bias = stage_matrix<R >= 4 && SOFT>(shared_matrix, matrix, src.K, sc);
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  src.matrix = shared_matrix;
  const Pair p =
      oriented(b, int(qlen ? qlen[b] : src.M), int(tlen ? tlen[b] : src.N), sweep_columns<R, SOFT>(bias, sc));
  codes_pair<R, SOFT>(p, src, shared_matrix + src.K * src.K, k, out, sc, bias, log_pairs);
}

// Codes, 4 or 8 columns per lane, in blocks of kRelayWarps warps. The first `coop` blocks each take one of
// the longest pairs (they come first in `order`) and share its tiles through a Relay, so that a long
// pair no longer sets the time of the whole batch; the other blocks give one warp to each pair.
constexpr int kRelayWarps = 16;

template <int R, bool SOFT>
__global__ void __launch_bounds__(kWarp* kRelayWarps, 1)  // see forward_codes_kernel
    forward_codes_relay_kernel(Codes<R> src, const float* matrix, Consts<float> k, Outputs<float> out,
                               float* relay, const int64_t* qlen, const int64_t* tlen, const int64_t* order,
                               int64_t B, const int64_t* coop_count, Scaled sc, int* log_pairs) {
  extern __shared__ float shared_matrix[];
  __shared__ int done[kRelayWarps];
  __shared__ float warp_best[kRelayWarps];
  if (threadIdx.x < kRelayWarps) done[threadIdx.x] = 0;
  const int bias = stage_matrix<SOFT>(shared_matrix, matrix, src.K, sc);  // also the barrier for done
  src.matrix = shared_matrix;
  const float* const shared_p = shared_matrix + src.K * src.K;
  const int warp = threadIdx.x / kWarp;
  const int64_t coop = *coop_count;
  float best;
  int64_t unused;
  if (blockIdx.x < coop) {  // the same for the whole block
    const int64_t b = order[blockIdx.x];
    const Pair p = oriented(b, int(qlen[b]), int(tlen[b]), sweep_columns<R, SOFT>(bias, sc));
    const Relay<float, kRelayWarps> handoff{relay + int64_t(blockIdx.x) * (kRelayWarps + 1) * src.M, src.M, p.qn,
                                            done};
    bool scored = false;
    Codes<4> narrow = src.template columns<4>();  // t > 0: log space, and scaled where not wide
    if (SOFT && bias >= 0) {
      const bool ok = R == 8 && wide_scaled(bias, sc)
                          ? codes_tiles_scaled<R>(p, src, shared_p, bias, k, handoff, warp, kRelayWarps, best)
                          : codes_tiles_scaled<4>(p, narrow, shared_p, bias, k, handoff, warp, kRelayWarps, best);
      scored = __syncthreads_and(ok);  // every warp is past the pair: the relay counts can start again
      if (!scored) {
        if (threadIdx.x < kRelayWarps) done[threadIdx.x] = 0;
        __syncthreads();
      }
    }
    if (!scored) {
      if (SOFT) {
        forward_tiles<float, 4, true, false>(p, narrow, k, out, src.M, src.N, handoff, warp, kRelayWarps, best,
                                             unused);
        if (log_pairs && threadIdx.x == 0) atomicAdd(log_pairs, 1);
      } else {
        forward_tiles<float, R, false, false>(p, src, k, out, src.M, src.N, handoff, warp, kRelayWarps, best,
                                              unused);
      }
    }
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
  const Pair p = oriented(b, int(qlen[b]), int(tlen[b]), sweep_columns<R, SOFT>(bias, sc));
  codes_pair<R, SOFT>(p, src, shared_p, k, out, sc, bias, log_pairs);
}

// ---------------------------------------------------------------------------------------------------
// Backward: a reverse wavefront over the stored H. E = d score / d H; each cell passes E on to the
// three cells it was computed from, weighted by the softmax of its terms (t > 0) or by the first
// maximal term in the reference's order zero, match, delete, insert (t = 0). Lane k owns the same
// columns as in the forward; the rightmost lane starts at the last row, and the flow into the column
// left of a lane's strip goes to lane k-1 by shuffle, or across tiles through the per-pair buffer.

// The rows a lane of the backward reads, in groups of kBackGroup steps: at the start of each group the
// rows loaded a group ago become current, and the next group's loads start together. The step that
// handles row i takes H[i-1][col .. col+R-1] (zero outside rows [0, rows), and in columns past the
// target) as its row above, the previous step's row above as its own row, and, at t = 0,
// S[i][col .. col+R-1]. H comes from the wavefront-ordered table, where the lanes of a step read one
// contiguous row. The column left of the strip needs no load: it is the left neighbour's own row
// above, one row ahead (see the sweep). A load per step into a ring of slots waited, in the compiled
// code, for the load issued a step before (all the loads share one scoreboard): the profile's largest
// stall. Dense 8192 x 256 x 256 on the H200: a ring of 8 rows 1.49 ms; groups of 4 1.34 ms; groups of 8
// 1.46 ms (159 registers: 12 warps per SM instead of 16); groups of 4 with L2 prefetches of the rows
// 4 or 8 further up 1.36 and 1.42 ms; H copied by cp.async into a ring in shared memory 1.31 ms (left
// out: a second source of rows, with its own PTX, for 2%).
template <typename A, int R, bool SOFT>
struct BackwardRows {
  static constexpr int G = kBackGroup;
  static_assert(kWarp % G == 0, "a block of 32 steps holds whole groups");
  Skewed<const A, R> H;
  const A* S;  // this pair's scores (t = 0 only)
  int64_t N;
  int rows, col, valid;
  typename Skewed<const A, R>::Cursor mine;  // this lane's R values in the row of the next load
  int next;  // the row of the step whose values the next load fetches

  // h[0]: the row above of the step before the group; h[1 + d]: step d's row above. s[d]: step d's S.
  A h[G + 1][R], s[G][R];
  A h_ahead[G][R], s_ahead[G][R];  // the next group's, in flight

  // A tile's rows: step -1 handles `first_row`, and each step one row up.
  __device__ void begin_tile(int tile, int lane, int first_row) {
    const int above = first_row - 1 < 0 ? 0 : first_row - 1;  // below row 0 nothing is read
    mine = H.cursor(tile, above, lane);
    if (first_row - 1 < 0) mine.step(-1);
    next = first_row;
    A unused[R];
    load(h[G], unused);  // step -1's row above: the first group's h[0]
#pragma unroll
    for (int m = 0; m < G; ++m) load(h_ahead[m], s_ahead[m]);
  }
  __device__ __forceinline__ void start_group() {
#pragma unroll
    for (int r = 0; r < R; ++r) h[0][r] = h[G][r];
#pragma unroll
    for (int m = 0; m < G; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) h[1 + m][r] = h_ahead[m][r], s[m][r] = s_ahead[m][r];
#pragma unroll
    for (int m = 0; m < G; ++m) load(h_ahead[m], s_ahead[m]);
  }
  // The row above of the step after step d (t = 0 compares the match term from it).
  __device__ __forceinline__ const A (&above_next(int d) const)[R] { return d + 1 < G ? h[d + 2] : h_ahead[0]; }

 private:
  __device__ __forceinline__ void load(A (&hv)[R], A (&sv)[R]) {
    const int i = next--;
    if (unsigned(i - 1) < unsigned(rows)) {
      load_row_values<A, R>(mine.at, hv, valid);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) hv[r] = A(0);
    }
    if (!SOFT) {
      const bool ok = unsigned(i) < unsigned(rows);
#pragma unroll
      for (int r = 0; r < R; ++r) sv[r] = ok && r < valid ? __ldg(S + int64_t(i) * N + col + r) : A(0);
    }
    mine.step(-1);
  }
};

template <typename A, int R, bool SOFT>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    backward_kernel(const A* grad_scores, const A* S, const A* table, const int64_t* best_at,
                    const int64_t* qlen, const int64_t* tlen, const int64_t* order, A* grad_S,
                    A* boundary, Consts<A> k, int64_t B, int64_t M, int64_t N) {
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = order ? order[slot] : slot;
  const int qn = int(qlen ? qlen[b] : M), tn = int(tlen ? tlen[b] : N);
  const int64_t arg = best_at[b];
  const A grad = grad_scores[b];
  constexpr int kTileCols = kWarp * R;
  A* Gb = grad_S + b * M * N;
  // grad_S comes uninitialised: first zero what the sweep below does not write, rows past the best
  // cell's and columns past its tile (all of the pair when the score is the zero border).
  const bool border = arg < 0 || qn == 0 || tn == 0;
  const int rows_swept = border ? 0 : int(arg / N) + 1;
  const int cols_swept = border ? 0 : min(tn, int(arg % N) / kTileCols * kTileCols + kTileCols);
  for (int i = 0; i < M; ++i)
    for (int j = (i < rows_swept ? cols_swept : 0) + lane; j < N; j += kWarp) Gb[int64_t(i) * N + j] = A(0);
  if (border) return;  // the score is the zero border: no gradient
  const int arg_i = int(arg / N), arg_j = int(arg % N);
  A* bnd = boundary ? boundary + b * M : nullptr;
  BackwardRows<A, R, SOFT> src;
  // Each lane's gradient rows wait in shared memory (kDelay slots, by row) until the other lanes of its
  // group of kDelay have computed the same row (see the sweep): lane-to-lane rows a step apart would
  // write every 32-byte sector in two halves, at different times.
  __shared__ __align__(16) unsigned char delay_bytes[kWarpsPerBlock * kDelay * kWarp * R * sizeof(A)];
  A* const delay = reinterpret_cast<A*>(delay_bytes) + (int(threadIdx.x / kWarp) * kDelay * kWarp + lane) * R;
  const int64_t cols = table_columns(N, R);
  src.H = Skewed<const A, R>{table + b * M * cols, int(M), cols};
  src.S = S + b * M * N, src.N = N;
  // Nothing flows right of the best cell's column or below its row.
  const int last_tile = arg_j / kTileCols, rows = arg_i + 1;
  src.rows = rows;
  for (int tile = last_tile; tile >= 0; --tile) {
    const int c0 = tile * kTileCols, col = c0 + lane * R;
    const int width = tn - c0 < kTileCols ? tn - c0 : kTileCols;
    const int lanes = (width + R - 1) / R;
    const int valid = tn - col >= R ? R : (tn - col > 0 ? tn - col : 0);
    const int rank = lanes - 1 - lane;  // 0 for the rightmost lane, which leads; < 0: no columns here
    const bool from_right = tile < last_tile;
    src.col = col, src.valid = valid;
    // Lane k handles row i = rows - 1 - (s - rank) at step s.
    src.begin_tile(tile, lane, rows + rank);  // the row of step -1
    // E(i+1, c) w_up(i+1, c) and E(i+1, c) w_diag(i+1, c). The best cell's own E = 1 enters as the flow
    // from below into its lane's first row, which is the best cell's row.
    A carry_up[R], carry_diag[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      carry_up[r] = tile == last_tile && col + r == arg_j ? A(1) : A(0);
      carry_diag[r] = A(0);
    }
    A flow_out = A(0);  // flow into (i, col-1), handed to lane-1
    // Blocks of 32 rows, loaded one block ahead (lane j: the row of step s0 + 32 + j), for the two
    // values a step takes from outside the tile: the flow from the tile to the right (out of bnd, for
    // the rightmost lane) and H of the column left of the tile (from the table, for lane 0).
    A flow_chunk = A(0), flow_next = A(0), left_chunk = A(0), left_next = A(0);
    auto load_blocks = [&](int s) {  // the rows of steps s .. s + 31, one per lane
      const int right_row = rows - 1 - (s + lane), left_row = rows - 1 - (s + lane - (lanes - 1));
      flow_next = from_right && right_row >= 0 ? bnd[right_row] : A(0);
      left_next = tile > 0 && unsigned(left_row) < unsigned(rows) ? src.H.at(tile - 1, left_row, kWarp - 1)[R - 1]
                                                                  : A(0);
    };
    load_blocks(0);
    const int steps = rows + lanes - 1;
    for (int s0 = 0; s0 < steps; s0 += kWarp) {
      flow_chunk = flow_next, left_chunk = left_next;
      for (int j = 0; j < kWarp && s0 + j < steps; j += kBackGroup) {
        src.start_group();
        if (j == 0) load_blocks(s0 + kWarp);  // after the group's start, which waits for all loads in flight
#pragma unroll
        for (int d = 0; d < kBackGroup; ++d) {
          const int i = rows - 1 - (s0 + j + d - rank);
          const A(&above)[R] = src.h[d + 1];
          const A(&cur)[R] = src.h[d];
          // The flow from the right neighbour's last step; H[i][col-1]: lane k-1, a row below this lane,
          // holds row i as its row above in this step's slot.
          A right = __shfl_down_sync(kFull, flow_out, 1);
          A left = __shfl_up_sync(kFull, above[R - 1], 1);
          const A right_in = __shfl_sync(kFull, flow_chunk, j + d), left_in = __shfl_sync(kFull, left_chunk, j + d);
          if (lane == lanes - 1) right = right_in;  // zero in the last tile
          if (lane == 0) left = left_in;            // zero in the first tile (the border)
          // t = 0 also compares the match term, from H[i-1][col-1]: lane k-1's row above in the next
          // step's slot; for lane 0 the next step's value of the block.
          A diag_left = A(0);
          if (!SOFT) {
            diag_left = __shfl_up_sync(kFull, src.above_next(d)[R - 1], 1);
            const A in_block = __shfl_sync(kFull, left_chunk, (j + d + 1) % kWarp);
            const A in_next = __shfl_sync(kFull, left_next, 0);
            if (lane == 0) diag_left = j + d + 1 < kWarp ? in_block : in_next;
          }
          if (rank >= 0 && unsigned(i) < unsigned(rows)) {
            A g[R];
#pragma unroll
            for (int r = R - 1; r >= 0; --r) {
              // Columns past the target take no flow, so they pass none on (whatever their weights:
              // the padding of S is arbitrary, NaN included).
              A e = right + carry_up[r];
              e = r < valid ? e : A(0);
              const A h = cur[r];
              const A xu = above[r] + k.gap, xl = (r > 0 ? cur[r - 1] : left) + k.gap;
              A wd, wu, wl;
              if (SOFT) {
                // The four softmax weights sum to 1: the match weight is what the others leave, so the
                // backward reads H only (S would be one more read per cell).
                wu = exp2_((xu - h) * k.c);
                wl = exp2_((xl - h) * k.c);
                wd = A(1) - wu - wl - exp2_(-h * k.c);
                wd = max_nan(wd, A(0));  // rounding; a NaN stays a NaN
              } else {
                const A xd = (r > 0 ? above[r - 1] : diag_left) + src.s[d][r];
                const bool t1 = h != A(0) && xd == h;
                const bool t2 = h != A(0) && !t1 && xu == h;
                const bool t3 = h != A(0) && !t1 && !t2 && xl == h;
                wd = t1, wu = t2, wl = t3;
              }
              const A diag_flow = e * wd;
              g[r] = grad * diag_flow;
              right = e * wl + carry_diag[r];
              carry_diag[r] = diag_flow;
              carry_up[r] = e * wu;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) delay[(i & (kDelay - 1)) * kWarp * R + r] = g[r];
            flow_out = right;
            if (lane == 0 && tile > 0) bnd[i] = right;
          }
          // The gradient of row i + lane % kDelay, which this lane computed lane % kDelay steps ago: the
          // kDelay lanes of a group write one row in the same step, whole 128-byte lines.
          const int out_row = i + (lane & (kDelay - 1));
          if (valid > 0 && unsigned(out_row) < unsigned(rows)) {
            A g[R];
#pragma unroll
            for (int r = 0; r < R; ++r) g[r] = delay[(out_row & (kDelay - 1)) * kWarp * R + r];
            store_row<A, R>(Gb + int64_t(out_row) * N + col, g, valid, N % 4 == 0);
          }
        }
      }
    }
    __syncwarp();
  }
}

// ---------------------------------------------------------------------------------------------------
// The gradient of float scores at t > 0 by rows (N <= kRowsWidth): instead of keeping the DP table, the
// forward keeps every kBandRows-th row of the DP, and the backward computes each band of kBandRows rows
// again from the row above it, then runs the adjoint over the band from the bottom up. Both sweeps go a
// whole row at a time: lane k holds columns 8k .. 8k + 7, so S and the gradient move in whole rows
// (coalesced), where the wavefront kernels above read S one row per lane (on the H200 that skewed read of
// 2.15 GB takes 0.76 ms, against 0.49 ms for torch's sum; tools/gradient_floor.py).
//
// A row from the row above is a linear recurrence along the row in scaled space (E = 2^(H c) 2^-sigma,
// sigma per lane and row, as in forward_tiles_scaled):
//     E[i][j] = a[j] + G E[i][j-1],   a[j] = P[i][j] E[i-1][j-1] + G E[i-1][j] + 1,   P = 2^(S c),
// solved by each lane over its 8 columns and across lanes by a scan (5 shuffle rounds), each lane's
// values in its own scale. The adjoint is the same recurrence, right to left: with A the derivative of
// the score by H (times the score's gradient g) and Ahat = A / E (in the lane's scale),
//     Ahat[i][j] = w[i+1][j+1] / E[i][j] + G 2^(sigma_i - sigma_i+1) Ahat[i+1][j] + G Ahat[i][j+1],
// seeded with g / E at the best cell, where w[i][j] = Ahat[i][j] Q[i][j] is the gradient of S[i][j] and
// Q = P[i][j] E[i-1][j-1] = E[i][j] - 1 - G E[i][j-1] - G E[i-1][j] is the match term, taken from E so
// that the backward reads no S beyond the band's recomputation. Every term is positive, so nothing cancels
// except Q's remainder, whose rounding is about 2^-24 E: 2^-24 A in the gradient.
//
// MASKED: per-pair lengths, or N not a multiple of 8, so that a lane may hold columns past the target
// (their S is arbitrary: they are held at 0). Without it, lanes past N (N < 256) run on S = 0, an
// extension of the matrix that no column inside it depends on, left out of the best cell. ALIGNED: rows of
// S and of the gradient in 16-byte accesses (N a multiple of 4, S 16-byte aligned); without it (always
// MASKED: three cases, not four) they move through a staging row in shared memory (Staging, below).
constexpr int kRowCols = 8;                   // columns per lane
constexpr int kRowsWidth = kWarp * kRowCols;  // the widest N this path takes
// Measured on the H200 (the backward alone, 8192 x 256 x 256, t = 1): bands of 16 rows 1.65 ms (10 warps
// per SM, for shared memory), 12 rows 1.45 ms, 8 rows 1.39 ms, and 1.30 ms once the next band's first loads
// ran under the adjoint; 2 rows ahead instead of 4 took 96 registers (20 warps per SM) but 1.54 ms.
constexpr int kBandRows = 8;                  // rows per band (one kept row each)
constexpr int kRowsAhead = 4;                 // rows of S loaded ahead
constexpr int kRowsWarps = 4;                 // warps per block of the backward (shared memory: BandRows)
static_assert(kBandRows % kRowsAhead == 0, "a band holds whole groups of rows loaded ahead");
// A lane's largest value of a row at 2^kRowsTop: 8 columns spread further than 4 (see kScaledTopWide).
constexpr int kRowsTop = kScaledTopWide;

// A kept row in global memory: the lanes' E in two halves of 4 (whole 512-byte lines), then their sigma.
constexpr int kKeptRowFloats = kWarp * kRowCols + kWarp;

struct RowConsts {
  float G, c, tl;
  float g1, g8;          // log2(1 / G) and 8 log2(1 / G): G and the scan's G^8 per lane, as powers of 2
  float Gpow[kRowCols];  // G^1 .. G^8
};

__device__ __forceinline__ float rcp_(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ RowConsts row_consts(const Consts<float>& k) {
  RowConsts rc;
  rc.G = k.G, rc.c = k.c, rc.tl = k.tl;
  rc.g1 = k.G > 0.0f ? -log2f(k.G) : 1e30f;
  rc.g8 = 8.0f * rc.g1;
  float g = 1.0f;
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) g *= k.G, rc.Gpow[r] = g;
  return rc;
}

// A warp's staging row for rows of S and of the gradient that are not 16-byte aligned: the warp moves such
// a row in coalesced pieces of 128 bytes, lane k holding columns k, k + 32, ..., and the staging row turns
// that into lane k's 8 adjacent columns, or back. (Each lane reading and writing its own 8 floats one at a
// time, each access 32 sectors for 128 bytes, took the backward from 1.30 to 4.8 ms at N = 250 on the H200.)
struct Staging {
  float4 v[2 * kWarp];  // a row of 256 floats
};

// A lane's 8 columns of S in row i (0 for columns past N, and past the row count), as two 16-byte loads
// that leave L2 early (S is read once here). Not ALIGNED: columns lane, lane + 32, ... (arrange_row then
// gives the lane its own).
template <bool ALIGNED>
__device__ __forceinline__ void load_score_row(const float* Sb, int i, int rows, int N, int col, float (&v)[kRowCols]) {
  if constexpr (ALIGNED) {
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (i < rows) {
      const float* at = Sb + int64_t(i) * N + col;
      if (col < N) a = __ldcs(reinterpret_cast<const float4*>(at));
      if (col + 4 < N) b = __ldcs(reinterpret_cast<const float4*>(at + 4));
    }
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const float* row = Sb + int64_t(i) * N;
    const int lane = col / kRowCols;
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) {
      const int c = r * kWarp + lane;
      v[r] = i < rows && c < N ? __ldcs(row + c) : 0.0f;
    }
  }
}

// Not ALIGNED: a row as load_score_row loads it (columns lane, lane + 32, ...) becomes the lane's own 8.
template <bool ALIGNED>
__device__ __forceinline__ void arrange_row(float (&v)[kRowCols], Staging& st, int lane) {
  if constexpr (!ALIGNED) {
    float* f = reinterpret_cast<float*>(st.v);
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) f[r * kWarp + lane] = v[r];
    __syncwarp();
    const float4 a = st.v[2 * lane], b = st.v[2 * lane + 1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    __syncwarp();  // read by every lane before the next row overwrites it
  }
}

// A scan factor: G^(8d) 2^(s - sigma) for a lane d away whose scale is s, as one power of 2 (either
// factor alone may leave the float range while the product does not). fsig: float(sigma). MASKED caps it:
// lanes past the target hold values in no scale that matters, and inf times their 0 would be a NaN.
template <bool MASKED>
__device__ __forceinline__ float scan_factor(float fs, float fsig, int d, const RowConsts& k) {
  const float x = fmaf(-float(d), k.g8, fs - fsig);
  return exp2_(MASKED ? fminf(x, 126.0f) : x);
}

// Row i of the DP from row i-1 (U, this lane's stored values, scale 2^sig), in place: U becomes row i,
// sig its scale and hi its largest stored value (of the columns inside the target). valid: this lane's
// columns inside the target (MASKED: their E is 0 past it). ok turns false where the scale cannot hold
// the row (a value past the float range, or one so small that a flushed term could have mattered); the
// caller then takes the DP table's path.
template <bool MASKED>
__device__ __forceinline__ void row_step(float (&U)[kRowCols], int& sig, float& hi_out, const float (&v)[kRowCols],
                                         int valid, int lane, const RowConsts& k, bool& ok) {
  constexpr int top = kRowsTop;
  const float G = k.G;
  const float one = __int_as_float(max(127 - sig, 0) << 23);  // 2^-sigma: the zero term (and the borders)
  const float fsig = float(sig);
  // E[i-1][8 lane - 1] from the lane to the left (the border, E = 1, for lane 0), times P first: the
  // product may matter while the value alone is below this lane's float range (see times_pow2).
  const float left_up = __shfl_up_sync(kFull, U[kRowCols - 1], 1);
  const int left_up_sig = __shfl_up_sync(kFull, sig, 1);
  float x[kRowCols];
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    const float p = exp2_((MASKED && r >= valid ? 0.0f : v[r]) * k.c);
    float a;
    if (r > 0)
      a = fmaf(U[r - 1], p, one);
    else
      a = lane == 0 ? fmaf(one, p, one) : times_pow2(left_up * p, left_up_sig - sig) + one;
    a = fmaf(U[r], G, a);
    x[r] = r > 0 ? fmaf(x[r - 1], G, a) : a;  // the lane's own scan, with nothing coming from the left
  }
  // Across lanes: Y = sum over m >= 0 of G^(8m) x[7] of lane - m (lane 0's with the border), each in this
  // lane's scale; it is E[i][8 lane + 7], which comes into the next lane's first column.
  float Y = lane == 0 ? fmaf(k.Gpow[kRowCols - 1], one, x[kRowCols - 1]) : x[kRowCols - 1];
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const float y = __shfl_up_sync(kFull, Y, d);
    const float fs = __shfl_up_sync(kFull, fsig, d);
    const float f = scan_factor<MASKED>(fs, fsig, d, k);
    if (lane >= d) Y = fmaf(y, f, Y);
  }
  const float y_left = __shfl_up_sync(kFull, Y, 1);
  const int s_left = __shfl_up_sync(kFull, sig, 1);
  const float carry = lane == 0 ? one : times_pow2(y_left, s_left - sig);  // E[i][8 lane - 1]
  float hi = 0.0f, lo = FLT_MAX;
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    const float e = fmaf(k.Gpow[r], carry, x[r]);
    if (MASKED) {
      x[r] = r < valid ? e : 0.0f;
      if (r < valid) hi = max_nan(hi, e), lo = min_nan(lo, e);
    } else {
      x[r] = e;
      hi = max_nan(hi, e), lo = min_nan(lo, e);
    }
  }
  if (!MASKED || valid > 0) {  // renormalise: the row's largest value to 2^top
    const unsigned exponent = __float_as_uint(hi) & 0x7f800000u;
    const float f = __uint_as_float((unsigned(254 + top) << 23) - exponent);  // 2^(top - exponent of hi)
    sig += int(exponent >> 23) - (127 + top);
    ok = ok && lo >= kScaledFloor && lo * f >= kScaledFloor && hi <= FLT_MAX;  // false for a NaN
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) U[r] = x[r] * f;
    hi_out = hi * f;
  } else {  // a lane past the target keeps its 0s
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) U[r] = 0.0f;
    hi_out = 0.0f;
  }
}

__device__ __forceinline__ void store_kept_row(float* kept, const float (&U)[kRowCols], int sig, int lane) {
  float4* at = reinterpret_cast<float4*>(kept);
  __stcg(at + lane, make_float4(U[0], U[1], U[2], U[3]));
  __stcg(at + kWarp + lane, make_float4(U[4], U[5], U[6], U[7]));
  __stcg(reinterpret_cast<int*>(kept) + kWarp * kRowCols + lane, sig);
}

__device__ __forceinline__ void load_kept_row(const float* kept, float (&U)[kRowCols], int& sig, int lane) {
  const float4* at = reinterpret_cast<const float4*>(kept);
  const float4 a = __ldcg(at + lane), b = __ldcg(at + kWarp + lane);
  U[0] = a.x, U[1] = a.y, U[2] = a.z, U[3] = a.w, U[4] = b.x, U[5] = b.y, U[6] = b.z, U[7] = b.w;
  sig = __ldcg(reinterpret_cast<const int*>(kept) + kWarp * kRowCols + lane);
}

// Where a lane of the rows kernels stands in its pair: the pair's rows and columns, the lane's first
// column, and how many of its 8 lie inside the target.
struct RowsLane {
  int qn, tn, lane, col, valid;
  __device__ __forceinline__ RowsLane(int64_t b, const int64_t* qlen, const int64_t* tlen, int M, int N)
      : qn(int(qlen ? qlen[b] : M)), tn(int(tlen ? tlen[b] : N)), lane(int(threadIdx.x % kWarp)), col(lane * kRowCols),
        valid(min(max(tn - col, 0), kRowCols)) {}
};

// Kept rows per pair: the row above each band but the first.
__host__ __device__ __forceinline__ int64_t kept_rows(int64_t M) {
  return M > 0 ? (M + kBandRows - 1) / kBandRows - 1 : 0;
}

// The row above the first: the border, E = 1 (0 past the target with MASKED).
template <bool MASKED>
__device__ __forceinline__ void border_row(float (&U)[kRowCols], int& sig, int valid) {
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) U[r] = !MASKED || r < valid ? pow2_int(kRowsTop) : 0.0f;
  sig = -kRowsTop;
}

// The forward for the gradient by rows: scores, the first best cell (row-major, as the reference's max:
// a strictly larger scaled key wins, and keys order as E does, across scales), and the kept rows. A pair
// the scaled rows cannot hold is scored in log space instead and counted in *failed (the caller then
// takes the DP table's path).
template <bool MASKED, bool ALIGNED>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    rows_forward_kernel(const float* S, const int64_t* qlen, const int64_t* tlen, const int64_t* order,
                        float* scores, int64_t* best_row, float* kept, float* boundary, int* failed, Consts<float> k,
                        int64_t B, int M, int N) {
  __shared__ Staging staging_rows[ALIGNED ? 1 : kWarpsPerBlock];  // ALIGNED: unused
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  Staging& staging = staging_rows[ALIGNED ? 0 : threadIdx.x / kWarp];
  const RowsLane where(b, qlen, tlen, M, N);
  const int lane = where.lane, qn = where.qn, tn = where.tn, col = where.col, valid = where.valid;
  const RowConsts rc = row_consts(k);
  const float* Sb = S + b * int64_t(M) * N;
  float* kept_b = kept + b * kept_rows(M) * kKeptRowFloats;
  float U[kRowCols];
  int sig;
  border_row<MASKED>(U, sig, valid);
  bool ok = true;
  long long best_key = scaled_key(0, 1.0f);  // the border
  int best_i = -1;  // the first row that holds best_key (its column: best_column, in the backward)
  const int rows = tn > 0 ? qn : 0;
  float ring[kRowsAhead][kRowCols];
#pragma unroll
  for (int u = 0; u < kRowsAhead; ++u) load_score_row<ALIGNED>(Sb, u, rows, N, col, ring[u]);
  for (int i0 = 0; i0 < rows; i0 += kRowsAhead) {
#pragma unroll
    for (int u = 0; u < kRowsAhead; ++u) {
      const int i = i0 + u;
      if (i >= rows) break;  // the same for the whole warp
      float hi;
      arrange_row<ALIGNED>(ring[u], staging, lane);
      row_step<MASKED>(U, sig, hi, ring[u], valid, lane, rc, ok);
      load_score_row<ALIGNED>(Sb, i + kRowsAhead, rows, N, col, ring[u]);  // after its use: no copy of the slot
      const long long key = scaled_key(sig, hi);
      if (valid > 0 && key > best_key) best_key = key, best_i = i;
      if ((i + 1) % kBandRows == 0 && i + 1 < rows)
        store_kept_row(kept_b + int64_t((i + 1) / kBandRows - 1) * kKeptRowFloats, U, sig, lane);
    }
  }
  // The first row of the best cell over the lanes: the largest key, then the first row.
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const long long pk = __shfl_xor_sync(kFull, best_key, off);
    const int pi = __shfl_xor_sync(kFull, best_i, off);
    if (pk > best_key || (pk == best_key && pi < best_i)) best_key = pk, best_i = pi;
  }
  if (__all_sync(kFull, ok)) {
    if (lane == 0) {
      const int exponent = int(best_key >> 23) - 127;
      scores[b] = best_i < 0 ? 0.0f : k.tl * (float(exponent) + log2_(mantissa_of(unsigned(best_key))));
      best_row[b] = best_i;  // the backward finds the column (best_column)
    }
    return;
  }
  // The scaled rows could not hold this pair: its score and best cell in log space (forward_tiles, as the
  // forward that keeps the table finds them, without the table), and the caller takes the table's path.
  // Its rows of S as launch_dense reads them: in groups of 16-byte loads where aligned, else one at a time.
  using Source = std::conditional_t<ALIGNED, DenseGroups<8>, DenseDirect<float, 4, source_depth(4, true)>>;
  Source src;
  src.S = S, src.M = M, src.N = N;
  const Outputs<float> out{scores, nullptr, nullptr, nullptr};
  const InPlace<float> handoff{boundary ? boundary + b * M : nullptr};
  float best;
  int64_t at;
  forward_tiles<float, 4, true, true, Source, InPlace<float>, false, false>(Pair{b, qn, tn}, src, k, out, M, N, handoff,
                                                                           0, 1, best, at);
  if (lane == 0) {
    scores[b] = best, best_row[b] = at < 0 ? -1 : at / N;
    atomicAdd(failed, 1);
  }
}

// Shared memory of the backward by rows, per warp: a band's rows of E (the row above it first), each in
// two halves of the warp's 4 values (16-byte accesses without bank conflicts), and their sigma.
struct BandRows {
  float4 e[kBandRows + 1][2][kWarp];
  int sig[kBandRows + 1][kWarp];
};

__device__ __forceinline__ void put_row(BandRows& sh, int slot, const float (&U)[kRowCols], int sig, int lane) {
  sh.e[slot][0][lane] = make_float4(U[0], U[1], U[2], U[3]);
  sh.e[slot][1][lane] = make_float4(U[4], U[5], U[6], U[7]);
  sh.sig[slot][lane] = sig;
}
__device__ __forceinline__ void get_row(const BandRows& sh, int slot, float (&U)[kRowCols], int& sig, int lane) {
  const float4 a = sh.e[slot][0][lane], b = sh.e[slot][1][lane];
  U[0] = a.x, U[1] = a.y, U[2] = a.z, U[3] = a.w, U[4] = b.x, U[5] = b.y, U[6] = b.z, U[7] = b.w;
  sig = sh.sig[slot][lane];
}

// The lane's 8 columns of a gradient row, at = the row + col. Not ALIGNED: through the staging row, and
// stored in coalesced pieces (columns lane, lane + 32, ...).
template <bool ALIGNED>
__device__ __forceinline__ void store_gradient_row(float* at, const float (&g)[kRowCols], int col, int N,
                                                   Staging& st) {
  if constexpr (ALIGNED) {
    if (col < N) __stcs(reinterpret_cast<float4*>(at), make_float4(g[0], g[1], g[2], g[3]));
    if (col + 4 < N) __stcs(reinterpret_cast<float4*>(at + 4), make_float4(g[4], g[5], g[6], g[7]));
  } else {
    const int lane = col / kRowCols;
    st.v[2 * lane] = make_float4(g[0], g[1], g[2], g[3]);
    st.v[2 * lane + 1] = make_float4(g[4], g[5], g[6], g[7]);
    __syncwarp();
    const float* f = reinterpret_cast<const float*>(st.v);
    float* row = at - col;
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) {
      const int c = r * kWarp + lane;
      if (c < N) __stcs(row + c, f[c]);
    }
    __syncwarp();  // read by every lane before the next row overwrites it
  }
}

// The adjoint's carry from one row to the row above: Ahat and w of the row below, and its sigma.
struct Below {
  float A[kRowCols], w[kRowCols];
  int sig;
};

// One row i of the adjoint (E of it and of the row above), from the row below: writes the gradient row and
// makes `below` row i. SEED: the best cell's row, the first (nothing comes from below it): the seed g
// enters as w from below-right of the best cell, at column seed_col of this lane (or -1).
template <bool MASKED, bool ALIGNED, bool SEED>
__device__ __forceinline__ void adjoint_row(const float (&Er)[kRowCols], int sig_r, const float (&Eu)[kRowCols],
                                            int sig_u, Below& below, float seed, int seed_col, int valid, int lane,
                                            const RowConsts& k, float* grad_row, int col, int N, Staging& st) {
  const float G = k.G;
  const float one = __int_as_float(max(127 - sig_r, 0) << 23);
  const float fsig = float(sig_r);
  // E[i][8 lane - 1] in this lane's scale (the border, 1, for lane 0), and w[i+1][8 lane + 8]
  const float left_e = __shfl_up_sync(kFull, Er[kRowCols - 1], 1);
  const int left_sig = __shfl_up_sync(kFull, sig_r, 1);
  const float left = lane == 0 ? one : times_pow2(left_e, left_sig - sig_r);
  const float w_right = SEED ? 0.0f : __shfl_down_sync(kFull, below.w[0], 1);
  // G 2^(sigma_u - sigma_r) and G 2^(sigma_r - sigma_b), as one power of 2 each (G alone may be far below
  // 2^-126 while the product is not); capped where the value it multiplies is 0
  const float Gu = exp2_(fminf(float(sig_u) - fsig - k.g1, 126.0f));
  const float Gd = SEED ? 0.0f : exp2_(fminf(fsig - float(below.sig) - k.g1, 126.0f));
  float y[kRowCols], Q[kRowCols];
#pragma unroll
  for (int r = kRowCols - 1; r >= 0; --r) {
    const float e_left = r > 0 ? Er[r - 1] : left;
    Q[r] = max_nan(Er[r] - fmaf(G, e_left, fmaf(Gu, Eu[r], one)), 0.0f);
    float x;
    if (SEED) {
      x = r == seed_col ? seed * rcp_(Er[r]) : 0.0f;
    } else {
      const float from_diag = r + 1 < kRowCols ? below.w[r + 1] : (lane + 1 < kWarp ? w_right : 0.0f);
      x = fmaf(from_diag, rcp_(Er[r]), Gd * below.A[r]);
    }
    if (MASKED) x = r < valid ? x : 0.0f;
    y[r] = r + 1 < kRowCols ? fmaf(G, y[r + 1], x) : x;  // the lane's own scan, nothing from the right
  }
  // Across lanes, right to left: Z = sum over m >= 0 of G^(8m) y[0] of lane + m, in this lane's scale.
  float Z = y[0];
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const float z = __shfl_down_sync(kFull, Z, d);
    const float fs = __shfl_down_sync(kFull, fsig, d);
    const float f = scan_factor<MASKED>(fsig, fs, d, k);  // G^(8d) 2^(sigma - s)
    if (lane + d < kWarp) Z = fmaf(z, f, Z);
  }
  const float z_right = __shfl_down_sync(kFull, Z, 1);
  const int s_right = __shfl_down_sync(kFull, sig_r, 1);
  const float carry = lane + 1 < kWarp ? times_pow2(z_right, sig_r - s_right) : 0.0f;  // Ahat[i][8 lane + 8]
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    float a = fmaf(k.Gpow[kRowCols - 1 - r], carry, y[r]);
    if (MASKED) a = r < valid ? a : 0.0f;
    below.A[r] = a, below.w[r] = a * Q[r];
  }
  below.sig = sig_r;
  store_gradient_row<ALIGNED>(grad_row, below.w, col, N, st);
}

// The first column of a row (this lane's E and sigma) that holds the row's largest value: the best cell's,
// in the row the forward found (no cell anywhere is larger, and the backward computes the row bit for bit).
template <bool MASKED>
__device__ __forceinline__ int best_column(const float (&E)[kRowCols], int sig, int valid, int lane) {
  float hi = 0.0f;
  int at = kRowCols;
#pragma unroll
  for (int r = kRowCols - 1; r >= 0; --r) {
    const bool in = !MASKED || r < valid;
    if (in && E[r] >= hi) hi = E[r], at = r;  // the first of equals, going left
  }
  long long key = valid > 0 ? scaled_key(sig, hi) : LLONG_MIN;
  int column = lane * kRowCols + at;
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const long long pk = __shfl_xor_sync(kFull, key, off);
    const int pc = __shfl_xor_sync(kFull, column, off);
    if (pk > key || (pk == key && pc < column)) key = pk, column = pc;
  }
  return column;
}

template <bool MASKED, bool ALIGNED>
__global__ void __launch_bounds__(kWarp* kRowsWarps)
    rows_backward_kernel(const float* grad_scores, const float* S, const float* kept, const int64_t* best_row,
                         const int64_t* qlen, const int64_t* tlen, const int64_t* order, float* grad_S,
                         Consts<float> k, int64_t B, int M, int N) {
  __shared__ BandRows shared_rows[kRowsWarps];
  __shared__ Staging staging_rows[ALIGNED ? 1 : kRowsWarps];  // ALIGNED: unused
  const int64_t slot = int64_t(blockIdx.x) * kRowsWarps + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  BandRows& sh = shared_rows[threadIdx.x / kWarp];
  Staging& staging = staging_rows[ALIGNED ? 0 : threadIdx.x / kWarp];
  const RowsLane where(b, qlen, tlen, M, N);
  const int lane = where.lane, qn = where.qn, tn = where.tn, col = where.col, valid = where.valid;
  const RowConsts rc = row_consts(k);
  const float* Sb = S + b * int64_t(M) * N;
  const float* kept_b = kept + b * kept_rows(M) * kKeptRowFloats;
  float* Gb = grad_S + b * int64_t(M) * N + col;
  const bool border = best_row[b] < 0 || qn == 0 || tn == 0;
  const int bi = border ? -1 : int(best_row[b]);
  // Rows below the best cell's take nothing: zero (all rows where the score is the border).
  {
    const float zeros[kRowCols] = {};
    for (int i = bi + 1; i < M; ++i) store_gradient_row<ALIGNED>(Gb + int64_t(i) * N, zeros, col, N, staging);
  }
  if (border) return;
  Below below;
  // A band's first rows of S and the row above it, loaded while the band below runs its adjoint.
  float ring[kRowsAhead][kRowCols];
  float U[kRowCols];
  int sig;
  auto load_band = [&](int band) {
    const int r0 = band * kBandRows, r1 = min(r0 + kBandRows, bi + 1);
    if (band == 0)
      border_row<MASKED>(U, sig, valid);
    else
      load_kept_row(kept_b + int64_t(band - 1) * kKeptRowFloats, U, sig, lane);
#pragma unroll
    for (int u = 0; u < kRowsAhead; ++u) load_score_row<ALIGNED>(Sb, r0 + u, r1, N, col, ring[u]);
  };
  load_band(bi / kBandRows);
  for (int band = bi / kBandRows; band >= 0; --band) {
    const int r0 = band * kBandRows, r1 = min(r0 + kBandRows, bi + 1);
    // ---- The band's rows again, from the row above it (kept, or the border).
    put_row(sh, 0, U, sig, lane);
    bool ok = true;  // as in the forward, which passed
    for (int i0 = r0; i0 < r1; i0 += kRowsAhead) {
#pragma unroll
      for (int u = 0; u < kRowsAhead; ++u) {
        const int i = i0 + u;
        if (i >= r1) break;
        float hi;
        arrange_row<ALIGNED>(ring[u], staging, lane);
        row_step<MASKED>(U, sig, hi, ring[u], valid, lane, rc, ok);
        load_score_row<ALIGNED>(Sb, i + kRowsAhead, r1, N, col, ring[u]);
        put_row(sh, i - r0 + 1, U, sig, lane);
      }
    }
    if (band > 0) load_band(band - 1);
    // ---- The adjoint over the band, bottom up (each lane reads only its own slots: no barrier).
    float Er[kRowCols];
    int sig_r;
    get_row(sh, r1 - r0, Er, sig_r, lane);
    int i = r1 - 1;
    if (i == bi) {  // the best cell's row
      float Eu[kRowCols];
      int sig_u;
      get_row(sh, i - r0, Eu, sig_u, lane);
      const int seed_col = best_column<MASKED>(Er, sig_r, valid, lane) - col;  // in [0, 8) in its lane only
      adjoint_row<MASKED, ALIGNED, true>(Er, sig_r, Eu, sig_u, below, grad_scores[b], seed_col, valid, lane, rc,
                                         Gb + int64_t(i) * N, col, N, staging);
#pragma unroll
      for (int r = 0; r < kRowCols; ++r) Er[r] = Eu[r];
      sig_r = sig_u;
      --i;
    }
    for (; i >= r0; --i) {
      float Eu[kRowCols];
      int sig_u;
      get_row(sh, i - r0, Eu, sig_u, lane);
      adjoint_row<MASKED, ALIGNED, false>(Er, sig_r, Eu, sig_u, below, 0.0f, -1, valid, lane, rc,
                                          Gb + int64_t(i) * N, col, N, staging);
#pragma unroll
      for (int r = 0; r < kRowCols; ++r) Er[r] = Eu[r];
      sig_r = sig_u;
    }
  }
}

__global__ void empty_kernel() {}

// The key of the longest-first order: rows x column tiles of each pair, as the kernels orient it (codes:
// see transposes; R is the kernel's, so where a codes kernel of 8 takes 4 the orientation may differ).
// int32, clamped: an order, not a count.
__global__ void pair_work_kernel(Problem pr, int R, bool codes, int64_t tile, int* work) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= pr.B) return;
  const int q = int(pr.qlen ? pr.qlen[b] : pr.M), t = int(pr.tlen ? pr.tlen[b] : pr.N);
  const Pair p = codes ? oriented(b, q, t, R) : Pair{b, q, t};
  const int64_t w = p.qn * ((p.tn + tile - 1) / tile);
  work[b] = int(w < INT32_MAX ? w : INT32_MAX);
}

// How many of the first max_coop pairs in `order` have at least min_work (a prefix: the order sorts by
// work, descending); one block.
__global__ void coop_count_kernel(const int* work, const int64_t* order, int64_t max_coop, int min_work,
                                  int64_t* count) {
  __shared__ int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  int mine = 0;
  for (int64_t x = threadIdx.x; x < max_coop; x += blockDim.x) mine += work[order[x]] >= min_work;
  atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0) *count = total;
}

int blocks_for(int64_t B) { return int((B + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <typename A>
Consts<A> consts(double gap, double temperature) {
  Consts<A> k;
  k.gap = A(gap);
  const double c = temperature > 0 ? 1.4426950408889634 / temperature : 0.0;
  const double cap = sizeof(A) == 4 ? double(FLT_MAX) : DBL_MAX;
  k.c = A(c < cap ? c : cap);
  k.tl = A(temperature * 0.6931471805599453);
  k.G = A(temperature > 0 ? exp2(gap * c) : 1.0);
  return k;
}

// The settings of the scaled sweep for a call at gap and t; allowed only where the caller allows it and
// the kernel can take it (float, t > 0, 1 or 4 columns per lane, no DP table kept, gap <= 0).
Scaled scaled_settings(double gap, double t, bool allowed) {
  Scaled sc{};
  sc.c = t > 0 ? 1.4426950408889634 / t : 0.0;
  sc.gap_bits = float(-gap * sc.c);
  sc.allowed = allowed && t > 0 && gap <= 0;
  return sc;
}

template <typename A, int R, bool STORE>
cudaError_t launch_dense(const Problem& pr, const A* S, A* scores, A* table, int64_t* best_at,
                         A* boundary, double gap, double t, bool allow_scaled, int* log_pairs, cudaStream_t stream) {
  const Consts<A> k = consts<A>(gap, t);
  const Outputs<A> out{scores, table, best_at, boundary};
  const Scaled sc = scaled_settings(gap, t, allow_scaled && sizeof(A) == 4 && (R == 4 || R == 1) && !STORE);
  auto launch = [&](auto soft, auto src) {
    src.S = S, src.M = pr.M, src.N = pr.N;
    forward_kernel<A, R, decltype(soft)::value, STORE><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, stream>>>(
        src, k, out, pr.qlen, pr.tlen, pr.order, pr.B, pr.M, pr.N, sc, log_pairs);
    return cudaGetLastError();
  };
  // The source for t > 0 and the one for t = 0.
  auto go = [&](auto soft_src, auto hard_src) {
    return t > 0 ? launch(std::true_type{}, soft_src) : launch(std::false_type{}, hard_src);
  };
  if constexpr (sizeof(A) == 4 && R == 4) {
    if (pr.N % 4 == 0 && reinterpret_cast<uintptr_t>(S) % 16 == 0) {
      // Groups of 8 where the step is short (t = 0, the scaled sweep) or shares the memory with the
      // table's stores; 4 for the log-space t > 0 step (see DenseGroups).
      if (STORE || sc.allowed)
        return go(DenseGroups<8>{}, DenseGroups<8>{});
      return go(DenseGroups<4>{}, DenseGroups<8>{});
    }
  }
  if constexpr (sizeof(A) == 4 && R == 1)
    return go(DenseBlocks<A>{}, DenseBlocks<A>{});
  else
    return go(DenseDirect<A, R, source_depth(R, STORE)>{}, DenseDirect<A, R, source_depth(R, STORE)>{});
}

}  // namespace

int sw_cuda_tile_columns(int lane_columns) { return kWarp * lane_columns; }

int64_t sw_cuda_table_columns(int64_t N, int lane_columns) { return table_columns(N, lane_columns); }

template <typename A>
static cudaError_t forward_any(const Problem& pr, const A* S, A* scores, A* table, int64_t* best_at, A* boundary,
                               double gap, double t, int lane_columns, bool scaled, int* log_pairs,
                               cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  if (lane_columns == 1)
    return table ? launch_dense<A, 1, true>(pr, S, scores, table, best_at, boundary, gap, t, false, nullptr, stream)
                 : launch_dense<A, 1, false>(pr, S, scores, table, best_at, boundary, gap, t, scaled, log_pairs,
                                             stream);
  return table ? launch_dense<A, 4, true>(pr, S, scores, table, best_at, boundary, gap, t, false, nullptr, stream)
               : launch_dense<A, 4, false>(pr, S, scores, table, best_at, boundary, gap, t, scaled, log_pairs, stream);
}

cudaError_t sw_cuda_forward_f32(const Problem& pr, const float* S, float* scores, float* table,
                                int64_t* best_at, float* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream, bool scaled, int* log_pairs) {
  return forward_any<float>(pr, S, scores, table, best_at, boundary, gap, t, lane_columns, scaled, log_pairs,
                            stream);
}

cudaError_t sw_cuda_forward_f64(const Problem& pr, const double* S, double* scores, double* table,
                                int64_t* best_at, double* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream) {
  return forward_any<double>(pr, S, scores, table, best_at, boundary, gap, t, lane_columns, false, nullptr, stream);
}

int sw_cuda_relay_warps() { return kRelayWarps; }

cudaError_t sw_cuda_pair_work(const Problem& pr, int lane_columns, bool codes, int64_t tile_columns, int* work,
                              cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  constexpr int threads = 256;
  pair_work_kernel<<<unsigned((pr.B + threads - 1) / threads), threads, 0, stream>>>(pr, lane_columns, codes,
                                                                                   tile_columns, work);
  return cudaGetLastError();
}

cudaError_t sw_cuda_coop_count(const int* work, const int64_t* order, int64_t max_coop, int min_work,
                               int64_t* count, cudaStream_t stream) {
  coop_count_kernel<<<1, 256, 0, stream>>>(work, order, max_coop, min_work, count);
  return cudaGetLastError();
}

cudaError_t sw_cuda_forward_codes(const Problem& pr, const uint8_t* query, const uint8_t* target,
                                  const float* matrix, int K, float* scores, float* boundary, double gap,
                                  double t, int lane_columns, cudaStream_t stream, const Relaying* relaying,
                                  bool allow_scaled, int* log_pairs, int64_t shared_limit) {
  if (pr.B == 0) return cudaSuccess;
  const Consts<float> k = consts<float>(gap, t);
  const Outputs<float> out{scores, nullptr, nullptr, boundary};
  size_t smem = sizeof(float) * K * K;
  // The scaled sweep (t > 0, 4 or 8 columns per lane) needs two tables of powers beside the matrix.
  const Scaled sc = scaled_settings(gap, t, allow_scaled && lane_columns >= 4 &&
                                                int64_t(3 * smem) + 1024 <= shared_limit);
  if (sc.allowed) smem *= 3;
  const int blocks = blocks_for(pr.B), threads = kWarp * kWarpsPerBlock;
  auto go = [&](auto kernel, auto src) {
    if (smem > 48 * 1024) {  // past the default limit: ask for more (rare: K > 110, or K > 64 scaled)
      cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (err != cudaSuccess) return err;
    }
    src.query = query, src.target = target, src.M = pr.M, src.N = pr.N, src.K = K;
    kernel<<<blocks, threads, smem, stream>>>(src, matrix, k, out, pr.qlen, pr.tlen, pr.order, pr.B, sc,
                                              log_pairs);
    return cudaGetLastError();
  };
  auto relay = [&](auto kernel, auto src) {
    if (smem > 48 * 1024 - 64) {
      cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (err != cudaSuccess) return err;
    }
    src.query = query, src.target = target, src.M = pr.M, src.N = pr.N, src.K = K;
    // at most max_coop blocks relay; the rest hold kRelayWarps pairs each
    const int64_t grid = relaying->max_coop + (pr.B + kRelayWarps - 1) / kRelayWarps;
    kernel<<<unsigned(grid), kWarp * kRelayWarps, smem, stream>>>(
        src, matrix, k, out, relaying->relay, pr.qlen, pr.tlen, pr.order, pr.B, relaying->coop_count, sc,
        log_pairs);
    return cudaGetLastError();
  };
  // The kernels of R columns per lane (4 or 8), with or without relaying, soft or hard.
  auto wide = [&](auto columns) {
    constexpr int R = decltype(columns)::value;
    if (relaying)
      return t > 0 ? relay(forward_codes_relay_kernel<R, true>, Codes<R>{})
                   : relay(forward_codes_relay_kernel<R, false>, Codes<R>{});
    return t > 0 ? go(forward_codes_kernel<R, true>, Codes<R>{}) : go(forward_codes_kernel<R, false>, Codes<R>{});
  };
  if (lane_columns == 1)
    return t > 0 ? go(forward_codes_kernel<1, true>, Codes<1>{}) : go(forward_codes_kernel<1, false>, Codes<1>{});
  return lane_columns == 8 ? wide(std::integral_constant<int, 8>{}) : wide(std::integral_constant<int, 4>{});
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

int sw_cuda_rows_width() { return kRowsWidth; }

// Which case of a rows kernel takes a call (see MASKED and ALIGNED at kRowCols). The gradient comes from
// at::empty, as aligned as S's rows are when N is a multiple of 4.
template <class Kernel>
static Kernel rows_kernel(const Problem& pr, const float* S, Kernel plain, Kernel masked, Kernel unaligned) {
  if (pr.N % 4 != 0 || reinterpret_cast<uintptr_t>(S) % 16 != 0) return unaligned;
  return pr.qlen || pr.tlen || pr.N % kRowCols != 0 ? masked : plain;
}

int64_t sw_cuda_rows_kept_floats(int64_t M) { return kept_rows(M) * kKeptRowFloats; }

cudaError_t sw_cuda_rows_forward(const Problem& pr, const float* S, float* scores, int64_t* best_row, float* kept,
                                 float* boundary, int* failed, double gap, double t, cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  auto kernel = rows_kernel(pr, S, rows_forward_kernel<false, true>, rows_forward_kernel<true, true>,
                            rows_forward_kernel<true, false>);
  kernel<<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, stream>>>(S, pr.qlen, pr.tlen, pr.order, scores, best_row, kept,
                                                                  boundary, failed, consts<float>(gap, t), pr.B,
                                                                  int(pr.M), int(pr.N));
  return cudaGetLastError();
}

cudaError_t sw_cuda_rows_backward(const Problem& pr, const float* grad_scores, const float* S, const float* kept,
                                  const int64_t* best_row, float* grad_S, double gap, double t, cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  const unsigned blocks = unsigned((pr.B + kRowsWarps - 1) / kRowsWarps);
  auto kernel = rows_kernel(pr, S, rows_backward_kernel<false, true>, rows_backward_kernel<true, true>,
                            rows_backward_kernel<true, false>);
  kernel<<<blocks, kWarp * kRowsWarps, 0, stream>>>(grad_scores, S, kept, best_row, pr.qlen, pr.tlen, pr.order, grad_S,
                                                    consts<float>(gap, t), pr.B, int(pr.M), int(pr.N));
  return cudaGetLastError();
}

cudaError_t sw_cuda_empty(cudaStream_t stream) {
  empty_kernel<<<1, kWarp, 0, stream>>>();
  return cudaGetLastError();
}
