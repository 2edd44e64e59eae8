// What every kernel family of the CUDA engine uses: the launch shape, the cell arithmetic, a pair and
// its orientation, the DP table's layout, the outputs. Plain CUDA: no torch headers in kernels/cuda but
// ops.cpp (the torch binding), so nvcc compiles each .cu in seconds; engine.h is the interface between them.
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
// instead (cell_from_up: a shorter step), and a pair it cannot hold takes cell(). Float scores at
// t > 0 with 4 columns per lane (8 for scores from codes, where kWideLimit allows), without the DP
// table, take the scaled sweep instead (forward_scaled.cuh: H as 2^(H log2(e) / t), scaled per lane,
// 3 fused multiply-adds per cell), and a pair it cannot hold goes through the log-space one
// (forward_log.cuh). Dense pairs of one tile in 1-column lanes (the seed) take a scaled sweep with one
// scale per warp (forward_one_scale).
//
// The headers hold inline code in namespace swcli_cuda; each .cu puts its kernels and launchers in an
// anonymous namespace inside it, so every translation unit compiles only what it launches.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "engine.h"

namespace swcli_cuda {

inline constexpr int kWarp = 32;
inline constexpr int kWarpsPerBlock = 4;
inline constexpr unsigned kFull = 0xffffffffu;

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
// exponent is a difference of neighbours times c, and G comes rounded once from the host. Terms taken
// relative to the delete term up + gap instead would put its rounding (at the magnitude of the gap) into
// every cell, far less accurate at large gaps (benchmarks/fuzz_scaled.py cuda); this form is about as accurate
// as cell().
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
// A pair, as a sweep takes it.

struct Pair {
  int64_t b;  // pair index
  int qn;     // rows of the sweep: the query's length, or the target's in a transposed pair
  int tn;     // columns of the sweep: the target's length, or the query's
  bool transposed = false;  // codes only: rows from the target, columns from the query (see oriented)
};

// The exact search kernel's columns a lane for a warp of groups of G lanes whose widest target is `widest`
// (search_s16.cu; swcli.search.warp_columns mirrors it): the narrowest tile that holds it,
// from 8 columns a lane up to `most` by `step`, so that its targets pay at most `step` columns a lane of
// padding; past the widest tile, the tiles of `fewest` or more columns a lane that pad the fewest columns
// (a narrower tile would repeat the step's fixed cost and the wavefront's ramp too often; ties: the most).
// Each R is its own compiled sweep: a kernel whose warps alternate among many of them at neighbouring
// lengths runs short of instruction cache, which `fewest` bounds.
__device__ __forceinline__ int warp_columns(int G, int widest, int most, int step, int fewest = 16) {
  if (widest <= G * most) {
    const int r = max((widest + G - 1) / G, 8);
    return (r + step - 1) / step * step;
  }
  int chosen = most, least = 0;
  for (int r = most; r >= fewest; r -= step) {
    const int padded = (widest + G * r - 1) / (G * r) * (G * r);
    if (r == most || padded < least) chosen = r, least = padded;
  }
  return chosen;
}

// The exact search kernel's launch classes: lanes a group, 8, 16 or 32, the narrowest whose tile of `most`
// columns a lane holds the launch's widest target (`width`), else 32. A step's shuffles and loop cost
// as much as several columns, so lanes hold many columns, and narrower groups take shorter targets (more
// targets in flight, a shorter wavefront ramp), as in CUDASW++4.0's partitions; each warp then takes the
// columns a lane its own targets need (warp_columns), so a launch spans classes at little cost in padding.
inline int launch_lanes(int64_t width, int most) {
  for (int G = 8; G < kWarp; G *= 2)
    if (width <= int64_t(G) * most) return G;
  return kWarp;
}

// sweep(std::integral_constant<int, R>) for the warp's columns a lane (warp_columns), from R to MOST by STEP
// (warp-uniform: no divergence); the kernels are compiled for each.
template <int R, int MOST, int STEP, class Sweep>
__device__ __forceinline__ auto sweep_by_columns(int columns, Sweep&& sweep) {
  if constexpr (R >= MOST) {
    return sweep(std::integral_constant<int, MOST>{});
  } else {
    if (columns == R) return sweep(std::integral_constant<int, R>{});
    return sweep_by_columns<R + STEP, MOST, STEP>(columns, sweep);
  }
}

// launch(std::integral_constant<int, G>) for the launch class of `width` (launch_lanes): the kernels are
// compiled for each G.
template <class Launch>
cudaError_t launch_by_lanes(int64_t width, int most, Launch&& launch) {
  switch (launch_lanes(width, most)) {
    case 8: return launch(std::integral_constant<int, 8>{});
    case 16: return launch(std::integral_constant<int, 16>{});
    default: return launch(std::integral_constant<int, kWarp>{});
  }
}

// Wavefront steps of one warp over a pair of `rows` x `cols` in tiles of 32 R columns: each tile takes
// its rows plus its lanes less one, and a step costs the same whether its lanes hold 1 column or R.
__device__ __forceinline__ int64_t sweep_steps(int64_t rows, int64_t cols, int R) {
  return (cols + kWarp * R - 1) / (kWarp * R) * (rows - 1) + (cols + R - 1) / R;
}

// A pair of codes, oriented to take fewer steps with R columns per lane. A target just past a tile
// boundary costs a whole tile of steps for its last few columns; on real protein lengths this rule saves
// nearly as many lane steps as the better of the two orientations everywhere would. The score is the
// same either way: the recurrence is symmetric in its two gap terms, so the transposed DP holds the same
// cells, and the log-space cell of R >= 4 columns (cell) computes them from the same floats, bit for bit;
// the scaled sweeps round differently. A pair is transposed only if its target is not longer than its
// query: the choice is then the pair's own, whatever the batch, and its rows fit the boundary buffers'
// M. 1-column lanes keep the pair as given: their cell (cell_from_up) is not symmetric, and they are the
// latency-bound small batches. The host orders the pairs by the same rule (pair_work_kernel in
// scheduling.cu).
__device__ __forceinline__ bool transposes(int64_t qn, int64_t tn, int R) {
  return R >= 4 && tn <= qn && sweep_steps(tn, qn, R) < sweep_steps(qn, tn, R);
}
__device__ __forceinline__ Pair oriented(int64_t b, int qn, int tn, int R) {
  return transposes(qn, tn, R) ? Pair{b, tn, qn, true} : Pair{b, qn, tn};
}

// ---------------------------------------------------------------------------------------------------
// The DP table and the outputs.

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

// ---------------------------------------------------------------------------------------------------
// The per-pair sums of a backward that also gives the gradients of the gaps and the temperature (the
// operators backward_parameters and affine_backward_parameters, SUMS in the kernels' templates): K values a
// pair in a (K, B) array that the caller zeroes, the gap flows first, then <S, grad_S>. Each lane adds up
// its own cells; at the end the warp adds its lanes and lane 0 adds the result to the pair's entries (one
// atomic add each, so that warps sharing a pair may add theirs).
template <typename A, int K>
struct PairSums {
  A part[K];
  __device__ __forceinline__ PairSums() {
#pragma unroll
    for (int k = 0; k < K; ++k) part[k] = A(0);
  }
  // adjoint * weight where the adjoint is not 0 (a flow: a NaN weight where nothing flows adds nothing)
  __device__ __forceinline__ void add_flow(int k, A adjoint, A weight) {
    if (adjoint != A(0)) part[k] += adjoint * weight;
  }
  // grad_S * S where grad_S is not 0 and S is not -inf: a -inf cell's weight is 0, but the linear kernels
  // take the match weight as what the other weights leave, a rounding error of about 1e-8 there, whose
  // product with -inf would make the inner product, and so d score / d t, infinite.
  __device__ __forceinline__ void add_inner(int k, A grad_S, A s) {
    if (grad_S != A(0) && !(s == A(-INFINITY))) part[k] += grad_S * s;
  }
  // Every lane of the warp calls it.
  __device__ __forceinline__ void add_to(A* sums, int64_t B, int64_t b) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      A v = part[k];
#pragma unroll
      for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(kFull, v, off);
      if (threadIdx.x % kWarp == 0) atomicAdd(sums + k * B + b, v);
    }
  }
};

// ---------------------------------------------------------------------------------------------------
// Host side: the grid of a launch of one warp per pair, and the constants of a call.

inline int blocks_for(int64_t B) { return int((B + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// (Also on the device, for values read there: PairValues, engine.h. exp2 in double, rounded once to A,
// gives the host's G but where the two round the double across a float boundary, a chance of about 2^-28.)
template <typename A>
__host__ __device__ Consts<A> consts(double gap, double temperature) {
  Consts<A> k;
  k.gap = A(gap);
  const double c = temperature > 0 ? 1.4426950408889634 / temperature : 0.0;
  const double cap = sizeof(A) == 4 ? double(FLT_MAX) : DBL_MAX;
  k.c = A(c < cap ? c : cap);
  k.tl = A(temperature * 0.6931471805599453);
  k.G = A(temperature > 0 ? exp2(gap * c) : 1.0);
  return k;
}

}  // namespace swcli_cuda
