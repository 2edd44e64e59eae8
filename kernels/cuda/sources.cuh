// Score sources: give lane k the R scores of its row i = s - k at step s. A source keeps kDepth rows
// in flight in registers: fetch(d, i) starts the loads of row i into slot d, take(d, v) hands over
// what that slot holds. The sweep unrolls its steps by kDepth and step s uses slot s % kDepth, so a
// row is fetched kDepth steps before it is used and the slots are compile-time register indices.
// start_block() is called at the start of each block of 32 steps (DenseBlocks loads there), and
// start_group() at the start of each group of kDepth steps (DenseGroups loads there).
//
// Dense scores are loaded by each lane for its own row into registers ahead of use: 16-byte float rows
// in groups of 4 or 8 steps, a group ahead (DenseGroups); other rows kDepth steps ahead, into registers
// that stay fixed across the unrolled steps; float 1-column lanes (few pairs, latency-bound) 32 rows at
// a time, a block of steps ahead, with a step without branches (DenseBlocks). Scores from codes are
// looked up in the substitution matrix, held in shared memory (Codes).
#pragma once

#include "common.cuh"

namespace swcli_cuda {

// 4 rows ahead keep the issue-bound wide lanes fed. The 1-column sources that load per step (double,
// codes) look 8 rows ahead: deeper hides more of the load latency of their one-cell steps, with little
// left to gain past 8. A forward that stores H shares the memory with its stores and looks 8 rows ahead
// too. Dense float rows load in groups instead (DenseGroups, below).
__host__ __device__ constexpr int source_depth(int R, bool store = false) { return R == 1 || store ? 8 : 4; }

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
// scoreboards, so that a step could wait for the load issued just before it (a large stall in the
// profile of the seed). Here the 32 loads of the next block of steps all start at the start of a block
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
// of H, in the forward that keeps them). Which G a sweep takes: see launch_dense (forward_dense.cu).
// DenseBlocks is the same scheme for 1-column lanes (groups of 32, started with the block, rows off the
// pair zeroed); the two share DenseRows, and one template for both loads would change the code of those
// latency-bound kernels.
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
// window's base at every step. A transposed pair (see oriented, common.cuh) takes its rows from the
// target and its columns from the query, and reads the matrix transposed: entry [column code][row
// code], the same score as the pair as given.
template <int R>
struct Codes {
  const uint8_t* query;   // (B, M): pair b's row at query + b * query_stride
  const uint8_t* target;  // (B, N)
  int64_t M, N;
  int64_t query_stride;   // M, or 0 where every pair has the same query (a search: no copy per target)
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
    const uint8_t* const rows = p.transposed ? target + p.b * N : query + p.b * query_stride;
    const uint8_t* const cols = p.transposed ? query + p.b * query_stride : target + p.b * N;
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
    c.query = query, c.target = target, c.M = M, c.N = N, c.query_stride = query_stride, c.matrix = matrix, c.K = K;
    return c;
  }
};

}  // namespace swcli_cuda
