// Long pairs in small batches: each pair's DP cut into tiles of kLongRows rows x kLongColumns columns, a warp
// a tile, the tiles of one anti-diagonal of tiles launched together, so that a pair is swept by as many warps
// as that diagonal holds (as SW# and CUDAlign do). One warp per pair (forward_dense.cu) sweeps a 35,000 x
// 35,000 pair alone, cell row after cell row; here the middle diagonals of its 274 x 274 tiles hold up to
// 274 warps.
//
// A tile is swept as the one-warp kernels sweep a column tile (forward_log.cuh): lane k holds columns
// c0 + 4k .. c0 + 4k + 3, computes row s - k at step s, and takes the value left of its columns from lane
// k - 1 by shuffle. What a tile needs from outside it, it reads from buffers its neighbours wrote in earlier
// launches, staged in shared memory first (Edges): the row above it (the last row of the tile above, and
// left of it the corner, the last value of the tile above-left), and the column left of it (the last column
// of the tile to its left). It writes its own last row and last column there for the tiles below and to its
// right, and its best cell (the first maximal one in row-major order) for the reduction that ends the
// forward. The buffers of last rows and columns are the forward's state for the gradient: M N / 128 floats of
// last rows and as many of last columns, about 1/64 of the DP table.
//
// Cells are computed in log space by common.cuh's cell(), the sweep of every kernel that keeps the DP
// table (forward_log.cuh): a tile's values cross to its neighbours in score units, so no scale has to agree
// across tiles, and no pair is ever handed to another sweep. At t = 0 the cell is the exact max and add.
//
// The gradient sweeps the tiles again in reverse anti-diagonal order. Each tile first sweeps its rows again
// from the same row above and column left (the same function as the forward, so the same floats), keeping
// them in shared memory: H at t > 0 (66 KB, the row above first), at t = 0 the choice each cell made, a byte
// a cell. Then it runs the adjoint over them as the table's backward does (backward_table.cu): a reverse
// wavefront whose rightmost lane leads, each cell pushing its adjoint E to the three cells it came from by
// the softmax weights of its terms (t > 0), or along its first maximal term in the order zero, match,
// delete, insert (t = 0). What leaves the tile goes into buffers for the tiles to its left (the flow into
// the column left of it, by row) and above (the flows out of its first row, up and up-left, by column: the
// up-left flow of its first column reaches the tile above-left through the tile above's leftmost lane).
// Only the tiles above and left of the best cell's run (rows up to the best cell's in its tile row); the
// rest of the gradient is zeroed by a kernel of its own.
//
// A launch sweeps one anti-diagonal of tiles, a small part of the pair: when a Ctrl-C ends the process at once
// (swcli/interrupt.py), the kernel running is one such launch, not one over the whole pair.
//
// tests/long_pairs_model.py runs this plan step for step in float64 on small tiles, against the reference;
// tests/test_long_pairs_emulated.py runs this file itself on the CPU (tests/cuda_emulation), against the CPU
// engine.
#include "dispatch.cuh"
#include "forward_log.cuh"

namespace swcli_cuda {
namespace {

inline constexpr int kLongRows = 128;                         // rows of a tile
inline constexpr int kLongLaneColumns = 4;                    // columns of a lane
inline constexpr int kLongColumns = kWarp * kLongLaneColumns;  // columns of a tile
inline constexpr int kLongDepth = 8;  // rows of S loaded ahead (DenseGroups), as the table's forward takes

// The tile grid of an M x N pair (or of the batch's padded size).
struct Grid {
  int rows, cols;
  __host__ __device__ Grid(int64_t M, int64_t N)
      : rows(int((M + kLongRows - 1) / kLongRows)), cols(int((N + kLongColumns - 1) / kLongColumns)) {}
  __host__ __device__ int diagonals() const { return rows > 0 && cols > 0 ? rows + cols - 1 : 0; }
  // The first tile row on anti-diagonal d, and how many tiles it holds.
  __host__ __device__ int first_row(int d) const { return d - (cols - 1) > 0 ? d - (cols - 1) : 0; }
  __host__ __device__ int count(int d) const { return (d < rows - 1 ? d : rows - 1) - first_row(d) + 1; }
};

// Rows of the last-row buffers hold N rounded up to a lane's columns, so that a lane moves its 4 values in
// one 16-byte access.
__host__ __device__ inline int64_t padded_columns(int64_t N) {
  return (N + kLongLaneColumns - 1) / kLongLaneColumns * kLongLaneColumns;
}

// The forward's state, for a batch of B pairs of (up to) M x N: each tile row's last row of H but the
// last's, then each tile column's last column but the last's.
struct State {
  float* bottom;  // (B, grid.rows - 1, padded N)
  float* right;   // (B, grid.cols - 1, M)
  int64_t M, padded;
  Grid grid;
  __host__ __device__ State(float* state, int64_t B, int64_t M_, int64_t N)
      : bottom(state), right(nullptr), M(M_), padded(padded_columns(N)), grid(M_, N) {
    right = bottom + B * (grid.rows > 1 ? grid.rows - 1 : 0) * padded;
  }
  __host__ __device__ static int64_t floats(int64_t B, int64_t M, int64_t N) {
    const Grid g(M, N);
    return B * ((g.rows > 1 ? g.rows - 1 : 0) * padded_columns(N) + (g.cols > 1 ? g.cols - 1 : 0) * M);
  }
  __device__ float* bottom_row(int64_t b, int tr) const {
    return bottom + (b * (grid.rows - 1) + tr) * padded;
  }
  __device__ float* right_column(int64_t b, int tc) const { return right + (b * (grid.cols - 1) + tc) * M; }
};

// The adjoint flows the gradient's tiles hand on, laid out as the state: into the column left of a tile by
// row (tile column tc writes slot tc - 1), and out of a tile's first row, up and up-left, by column (tile
// row tr writes slot tr - 1).
struct Flows {
  float* left;  // (B, grid.cols - 1, M)
  float* up;    // (B, grid.rows - 1, padded N)
  float* diag;  // the same
  int64_t M, padded;
  Grid grid;
  __host__ __device__ Flows(float* flows, int64_t B, int64_t M_, int64_t N)
      : left(flows), up(nullptr), diag(nullptr), M(M_), padded(padded_columns(N)), grid(M_, N) {
    up = left + B * (grid.cols > 1 ? grid.cols - 1 : 0) * M;
    diag = up + B * (grid.rows > 1 ? grid.rows - 1 : 0) * padded;
  }
  __host__ __device__ static int64_t floats(int64_t B, int64_t M, int64_t N) {
    const Grid g(M, N);
    return B * ((g.cols > 1 ? g.cols - 1 : 0) * M + 2 * (g.rows > 1 ? g.rows - 1 : 0) * padded_columns(N));
  }
  __device__ float* left_column(int64_t b, int slot) const { return left + (b * (grid.cols - 1) + slot) * M; }
  __device__ float* up_row(int64_t b, int slot) const { return up + (b * (grid.rows - 1) + slot) * padded; }
  __device__ float* diag_row(int64_t b, int slot) const { return diag + (b * (grid.rows - 1) + slot) * padded; }
};

// Where a block's tile stands: its pair, its place in the pair, and how much of it the pair covers.
struct TileAt {
  int64_t b;
  int tr, tc, r0, c0;
  int qn, tn;   // the pair's lengths
  int height;   // rows swept
  int width;    // columns inside the target
  int lanes;    // lanes that hold columns
};

// Block blockIdx.x of the launch of anti-diagonal d: pair blockIdx.x / count, the diagonal's tile
// blockIdx.x % count. False where the tile lies past the pair's end (its lengths).
__device__ __forceinline__ bool tile_of_block(const Grid& grid, int d, const int64_t* qlen, const int64_t* tlen,
                                              int64_t M, int64_t N, TileAt& at) {
  const int count = grid.count(d);
  at.b = blockIdx.x / count;
  at.tr = grid.first_row(d) + int(blockIdx.x % count);
  at.tc = d - at.tr;
  at.qn = int(qlen ? qlen[at.b] : M);
  at.tn = int(tlen ? tlen[at.b] : N);
  at.r0 = at.tr * kLongRows;
  at.c0 = at.tc * kLongColumns;
  if (at.r0 >= at.qn || at.c0 >= at.tn) return false;
  at.height = min(kLongRows, at.qn - at.r0);
  at.width = min(kLongColumns, at.tn - at.c0);
  at.lanes = (at.width + kLongLaneColumns - 1) / kLongLaneColumns;
  return true;
}

// What a tile reads from its neighbours, staged in shared memory: top[x] = H[r0 - 1][c0 - 1 + x] (the
// corner first) and left[x] = H[r0 - 1 + x][c0 - 1] (the same corner first); zero on the DP's border,
// nothing read past the target.
struct Edges {
  float top[kLongColumns + 1];
  float left[kLongRows + 1];
};

__device__ __forceinline__ void stage_edges(Edges& edges, const State& state, const TileAt& at) {
  const int lane = threadIdx.x % kWarp;
  const float* above = at.tr > 0 ? state.bottom_row(at.b, at.tr - 1) : nullptr;
  for (int x = lane; x <= kLongColumns; x += kWarp) {
    const int j = at.c0 - 1 + x;
    edges.top[x] = above && j >= 0 && j < at.tn ? __ldcg(above + j) : 0.0f;
  }
  const float* left = at.tc > 0 ? state.right_column(at.b, at.tc - 1) : nullptr;
  for (int x = lane; x <= at.height; x += kWarp) {
    if (x == 0)
      edges.left[0] = above && left ? __ldcg(above + at.c0 - 1) : 0.0f;
    else
      edges.left[x] = left ? __ldcg(left + at.r0 + x - 1) : 0.0f;
  }
  __syncwarp();
}

// The choice of a cell at t = 0, as the table's backward makes it: its first maximal term in the order zero
// (0), match (1), delete (2), insert (3); 0 for a NaN.
__device__ __forceinline__ unsigned choice_of(float h, float xd, float xu, float xl) {
  if (!(h != 0.0f)) return 0u;
  return xd == h ? 1u : xu == h ? 2u : xl == h ? 3u : 0u;
}

// Whether the cell (h, at) replaces the best so far (best, best_at): a NaN first (the first NaN in row-major
// order), then a larger value, then among equals the first in row-major order (the border, -1, is first).
__device__ __forceinline__ bool takes(float h, int64_t at, float best, int64_t best_at) {
  if (h != h) return best == best || at < best_at;
  if (best != best) return false;
  return h > best || (h == best && at < best_at);
}

// Where a tile's sweep keeps its rows for the gradient (KEEP): at t > 0 H, lane k's 4 values of row u at
// rows[(u + 1) * 32 + k] (row 0: the row above the tile); at t = 0 their 4 choices, a byte each, at
// choices[u * 32 + k]. Rows of whole lanes' 16 bytes (or 4): a step's lanes, each on its own row, use
// different banks.
struct Kept {
  float4* rows;
  unsigned* choices;
};

// One warp's wavefront over a tile (lane k: row s - k of its 4 columns at step s), from the staged edges.
// The forward (KEEP false) writes the tile's last row and last column into the state where the batch's grid
// has a tile below or to the right, and returns its best cell (value, row-major index or -1) in every lane;
// the gradient's sweep (KEEP) keeps its rows instead.
template <bool SOFT, bool KEEP, class Source>
__device__ void sweep_tile(const TileAt& at, Source& src, const Consts<float>& k, const Edges& edges,
                           const State& state, const Kept& kept, int64_t N, float& best_out, int64_t& best_at_out) {
  constexpr int R = kLongLaneColumns, kDepth = Source::kDepth;
  static_assert(Source::kDepth == kLongDepth, "rows of S in groups of kLongDepth");
  const int lane = threadIdx.x % kWarp;
  const int col = at.c0 + lane * R;
  const int valid = min(max(at.tn - col, 0), R);
  const bool active = lane < at.lanes;
  float up[R], up_gap[R];  // H[i-1][col + r], and that + gap
#pragma unroll
  for (int r = 0; r < R; ++r) up[r] = edges.top[1 + lane * R + r], up_gap[r] = up[r] + k.gap;
  float left_above = edges.top[lane * R];  // H[i-1][col-1]
  float last = 0.0f;                       // H[i][col+3], handed to lane + 1
  float lane_best[R];
  int lane_best_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) lane_best[r] = 0.0f, lane_best_row[r] = -1;
  float* const bottom = !KEEP && at.tr + 1 < state.grid.rows ? state.bottom_row(at.b, at.tr) + col : nullptr;
  float* const right =
      !KEEP && at.tc + 1 < state.grid.cols && lane == kWarp - 1 ? state.right_column(at.b, at.tc) + at.r0 : nullptr;
  src.begin_tile(Pair{0, at.height, at.tn}, lane, col);  // the source's S starts at the tile's first row
#pragma unroll
  for (int d = 0; d < kDepth; ++d) src.fetch(d, d - lane);
  const int steps = at.height + at.lanes - 1;
  for (int s0 = 0; s0 < steps; s0 += kDepth) {
    src.start_group();
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int u = s0 + d - lane;  // this lane's row of the tile; steps past the last compute nothing
      float left = __shfl_up_sync(kFull, last, 1);
      const float from_edge = edges.left[min(max(u + 1, 0), at.height)];
      if (lane == 0) left = from_edge;
      float v[R];
      src.take(d, v);
      if (active && unsigned(u) < unsigned(at.height)) {
        float diag = left_above, left_gap = left + k.gap;
        unsigned choices = 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float xd = diag + v[r];
          const float h = cell<float, SOFT>(xd, up_gap[r], left_gap, k);
          if (KEEP && !SOFT) choices |= choice_of(h, xd, up_gap[r], left_gap) << (8 * r);
          diag = up[r];
          up[r] = h;
          left_gap = h + k.gap;
          up_gap[r] = left_gap;
          if (!KEEP && lane_best[r] == lane_best[r] && !(h <= lane_best[r]))  // larger, or the first NaN
            lane_best[r] = h, lane_best_row[r] = u;
        }
        left_above = left;
        if (KEEP) {
          if (SOFT)
            kept.rows[(u + 1) * kWarp + lane] = make_float4(up[0], up[1], up[2], up[3]);
          else
            kept.choices[u * kWarp + lane] = choices;
        } else {
          if (bottom && u == at.height - 1) __stcg(reinterpret_cast<float4*>(bottom), make_float4(up[0], up[1], up[2], up[3]));
          if (right) right[u] = up[R - 1];
        }
      }
      last = up[R - 1];
      src.fetch(d, u + kDepth);
    }
  }
  if (KEEP) {
    __syncwarp();  // the kept rows, written by each lane, are read by its neighbours
    return;
  }
  float best = 0.0f;
  int64_t best_at = -1;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t at_r = int64_t(at.r0 + lane_best_row[r]) * N + col + r;
    if (r < valid && lane_best_row[r] >= 0 && takes(lane_best[r], at_r, best, best_at)) best = lane_best[r], best_at = at_r;
  }
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float other = __shfl_xor_sync(kFull, best, off);
    const int64_t other_at = __shfl_xor_sync(kFull, best_at, off);
    if (takes(other, other_at, best, best_at)) best = other, best_at = other_at;
  }
  best_out = best;
  best_at_out = best_at;
}

// The source of S for a tile: rows of 16-byte loads where N is a multiple of 4 and S 16-byte aligned, else
// one value at a time; its S starts at the tile's first row.
template <class Source>
__device__ __forceinline__ Source tile_source(const float* S, const TileAt& at, int64_t M, int64_t N) {
  Source src{};
  src.S = S + at.b * M * N + int64_t(at.r0) * N;
  src.M = M;
  src.N = N;
  return src;
}

// The forward's launch for anti-diagonal d: one warp a tile, each writing its last row and column into the
// state and its best cell into tile_best / tile_at (by the batch grid's tile index).
template <bool SOFT, class Source>
__global__ void __launch_bounds__(kWarp)
    long_forward_kernel(const float* S, const int64_t* qlen, const int64_t* tlen, int64_t M, int64_t N,
                        Consts<float> k, State state, float* tile_best, int64_t* tile_at, int d) {
  __shared__ Edges edges;
  TileAt at;
  if (!tile_of_block(state.grid, d, qlen, tlen, M, N, at)) return;
  stage_edges(edges, state, at);
  Source src = tile_source<Source>(S, at, M, N);
  float best;
  int64_t best_at;
  sweep_tile<SOFT, false>(at, src, k, edges, state, Kept{}, N, best, best_at);
  if (threadIdx.x == 0) {
    const int64_t slot = (at.b * state.grid.rows + at.tr) * state.grid.cols + at.tc;
    tile_best[slot] = best;
    tile_at[slot] = best_at;
  }
}

// The end of the forward, one block a pair: its best cell over its tiles (score, row-major index or -1),
// and with log_pairs (t > 0) a count of the pairs scored (every one in log space: there is no scaled sweep
// here).
__global__ void __launch_bounds__(256)
    long_best_kernel(const float* tile_best, const int64_t* tile_at, const int64_t* qlen, const int64_t* tlen,
                     int64_t M, int64_t N, float* scores, int64_t* best_at, int* log_pairs) {
  const int64_t b = blockIdx.x;
  const int qn = int(qlen ? qlen[b] : M), tn = int(tlen ? tlen[b] : N);
  const Grid batch(M, N), own(qn, tn);
  const int64_t tiles = qn > 0 && tn > 0 ? int64_t(own.rows) * own.cols : 0;
  float best = 0.0f;
  int64_t at = -1;
  for (int64_t x = threadIdx.x; x < tiles; x += blockDim.x) {
    const int64_t slot = (b * batch.rows + x / own.cols) * batch.cols + x % own.cols;
    const float h = tile_best[slot];
    const int64_t h_at = tile_at[slot];
    if (takes(h, h_at, best, at)) best = h, at = h_at;
  }
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float other = __shfl_xor_sync(kFull, best, off);
    const int64_t other_at = __shfl_xor_sync(kFull, at, off);
    if (takes(other, other_at, best, at)) best = other, at = other_at;
  }
  __shared__ float warp_best[256 / kWarp];
  __shared__ int64_t warp_at[256 / kWarp];
  const int warp = threadIdx.x / kWarp;
  if (threadIdx.x % kWarp == 0) warp_best[warp] = best, warp_at[warp] = at;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / kWarp); ++w)
      if (takes(warp_best[w], warp_at[w], best, at)) best = warp_best[w], at = warp_at[w];
    scores[b] = best;
    best_at[b] = at;
    if (log_pairs && tiles > 0) atomicAdd(log_pairs, 1);
  }
}

// The rows and columns of a pair the gradient's tiles write: up to the best cell's row, and up to the end of
// its tile column within the target (none where the score is the border).
struct Swept {
  int rows, cols;
  __device__ Swept(int64_t best_at, int qn, int tn, int64_t N) : rows(0), cols(0) {
    if (best_at < 0 || qn == 0 || tn == 0) return;
    rows = int(best_at / N) + 1;
    cols = min(tn, int(best_at % N) / kLongColumns * kLongColumns + kLongColumns);
  }
};

// The gradient outside what the tiles write: zero. Blocks of kZeroRows rows of one pair.
inline constexpr int kZeroRows = 8;
__global__ void __launch_bounds__(256)
    long_zero_kernel(const int64_t* best_at, const int64_t* qlen, const int64_t* tlen, int64_t M, int64_t N,
                     float* grad_S) {
  const int64_t blocks_a_pair = (M + kZeroRows - 1) / kZeroRows;
  const int64_t b = blockIdx.x / blocks_a_pair;
  const int64_t i0 = blockIdx.x % blocks_a_pair * kZeroRows;
  const Swept swept(best_at[b], int(qlen ? qlen[b] : M), int(tlen ? tlen[b] : N), N);
  for (int64_t i = i0; i < i0 + kZeroRows && i < M; ++i) {
    float* row = grad_S + (b * M + i) * N;
    for (int64_t j = (i < swept.rows ? swept.cols : 0) + threadIdx.x; j < N; j += blockDim.x) row[j] = 0.0f;
  }
}

// Shared memory of the gradient's kept rows: at t > 0 H of the tile's rows and the row above (66 KB, past
// the 48 KB of static shared memory), at t = 0 their choices.
template <bool SOFT>
constexpr int kept_bytes() {
  return SOFT ? (kLongRows + 1) * kWarp * int(sizeof(float4)) : kLongRows * kWarp * int(sizeof(unsigned));
}

// The gradient's launch for anti-diagonal d: each tile above and left of its pair's best cell sweeps its rows
// again (sweep_tile, KEEP), then runs the adjoint over them from the bottom up, the rightmost lane leading
// (lane k: row height - 1 - (s - rank) at step s, rank = lanes - 1 - k). A lane's cell (u, c) takes its
// adjoint E from the cell to its right (with the up-left flow of the cell below that, both in `right`: from
// lane k + 1 by shuffle, or for the last lane from the tile to the right) and from below (carry_up); it
// pushes E w_insert to its left (into `right` for the next column, with carry_diag, the up-left flow of the
// cell below it), E w_delete up (carry_up) and E w_match up-left (carry_diag), and E w_match is the
// gradient of its S. The best cell's E = 1 enters as a flow from below.
template <bool SOFT, class Source>
__global__ void __launch_bounds__(kWarp)
    long_backward_kernel(const float* grad_scores, const float* S, const int64_t* best_at, const int64_t* qlen,
                         const int64_t* tlen, int64_t M, int64_t N, Consts<float> k, State state, Flows flows,
                         float* grad_S, int d) {
  extern __shared__ float4 kept_shared[];
  __shared__ Edges edges;
  __shared__ float from_right[kLongRows];  // the flow into the tile's last column from the tile to its right
  TileAt at;
  if (!tile_of_block(state.grid, d, qlen, tlen, M, N, at)) return;
  const int64_t best = best_at[at.b];
  if (best < 0) return;  // the score is the border: no gradient (zeroed)
  const int bi = int(best / N), bj = int(best % N);
  const int tr_best = bi / kLongRows, tc_best = bj / kLongColumns;
  if (at.tr > tr_best || at.tc > tc_best) return;  // nothing flows below or right of the best cell
  if (at.tr == tr_best) at.height = bi - at.r0 + 1;
  const int lane = threadIdx.x % kWarp;
  const float* const right_flows = at.tc < tc_best ? flows.left_column(at.b, at.tc) + at.r0 : nullptr;
  for (int x = lane; x < at.height; x += kWarp) from_right[x] = right_flows ? __ldcg(right_flows + x) : 0.0f;
  stage_edges(edges, state, at);  // its __syncwarp covers from_right too
  const Kept kept{kept_shared, reinterpret_cast<unsigned*>(kept_shared)};
  if (SOFT) {  // row 0: the row above the tile
    kept.rows[lane] = make_float4(edges.top[1 + lane * 4], edges.top[2 + lane * 4], edges.top[3 + lane * 4],
                                  edges.top[4 + lane * 4]);
  }
  Source src = tile_source<Source>(S, at, M, N);
  float unused;
  int64_t unused_at;
  sweep_tile<SOFT, true>(at, src, k, edges, state, kept, N, unused, unused_at);

  constexpr int R = kLongLaneColumns;
  const int col = at.c0 + lane * R;
  const int valid = min(max(at.tn - col, 0), R);
  const int rank = at.lanes - 1 - lane;
  float carry_up[R], carry_diag[R];  // the flows from the row below: up into this cell, up-left out of the cell below
  const float* const below_up = at.tr < tr_best ? flows.up_row(at.b, at.tr) + col : nullptr;
  const float* const below_diag = at.tr < tr_best ? flows.diag_row(at.b, at.tr) + col : nullptr;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    carry_up[r] = below_up && r < valid ? __ldcg(below_up + r) : 0.0f;
    carry_diag[r] = below_diag && r < valid ? __ldcg(below_diag + r) : 0.0f;
    if (at.tr == tr_best && at.tc == tc_best && col + r == bj) carry_up[r] = 1.0f;
  }
  const float grad = grad_scores[at.b];
  float* const grad_rows = grad_S + (at.b * M + at.r0) * N + col;
  const bool vec = N % 4 == 0;  // the gradient is a fresh allocation: its rows are 16-byte aligned then
  float* const left_out = at.tc > 0 && lane == 0 ? flows.left_column(at.b, at.tc - 1) + at.r0 : nullptr;
  float* const up_out = at.tr > 0 ? flows.up_row(at.b, at.tr - 1) + col : nullptr;
  float* const diag_out = at.tr > 0 ? flows.diag_row(at.b, at.tr - 1) + col : nullptr;
  float flow_out = 0.0f;  // the flow into the cell left of this lane's columns, handed to lane - 1
  const int steps = at.height + at.lanes - 1;
  for (int s = 0; s < steps; ++s) {
    const int u = at.height - 1 - (s - rank);
    float right = __shfl_down_sync(kFull, flow_out, 1);
    const float right_in = from_right[min(max(u, 0), at.height - 1)];
    if (lane == at.lanes - 1) right = right_in;
    // t > 0: this lane's row u and the row above (kept rows u + 1 and u: a lane one row ahead of its start
    // still reads the row above, which the lane to its right takes as its left column), and H[u][col - 1],
    // the row above of lane k - 1, a row below.
    float4 cur4 = make_float4(0.f, 0.f, 0.f, 0.f), above4 = cur4;
    unsigned choices = 0;
    if (SOFT) {
      cur4 = kept.rows[min(max(u + 1, 0), at.height) * kWarp + lane];
      above4 = kept.rows[min(max(u, 0), at.height) * kWarp + lane];
    } else {
      choices = kept.choices[min(max(u, 0), at.height - 1) * kWarp + lane];
    }
    float left = __shfl_up_sync(kFull, above4.w, 1);
    const float left_edge = edges.left[min(max(u + 1, 0), at.height)];
    if (lane == 0) left = left_edge;
    if (rank >= 0 && unsigned(u) < unsigned(at.height)) {
      const float cur[R] = {cur4.x, cur4.y, cur4.z, cur4.w}, above[R] = {above4.x, above4.y, above4.z, above4.w};
      float g[R] = {};
#pragma unroll
      for (int r = R - 1; r >= 0; --r) {
        if (r >= valid) continue;  // past the target: no flow in or out (its H comes from the padding)
        const float e = right + carry_up[r];
        float wd, wu, wl;
        if (SOFT) {
          // The four softmax weights sum to 1: the match weight is what the others leave (the backward
          // reads H only), as in backward_table.cu.
          const float h = cur[r];
          wu = exp2_((above[r] + k.gap - h) * k.c);
          wl = exp2_(((r > 0 ? cur[r - 1] : left) + k.gap - h) * k.c);
          wd = max_nan(1.0f - wu - wl - exp2_(-h * k.c), 0.0f);
        } else {
          const unsigned code = (choices >> (8 * r)) & 0xffu;
          wd = code == 1u, wu = code == 2u, wl = code == 3u;
        }
        const float diag_flow = e * wd;
        g[r] = grad * diag_flow;
        right = e * wl + carry_diag[r];
        carry_diag[r] = diag_flow;
        carry_up[r] = e * wu;
      }
      store_row<float, R>(grad_rows + int64_t(u) * N, g, valid, vec);
      flow_out = right;
      if (left_out) left_out[u] = right;
      if (up_out && u == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < valid) up_out[r] = carry_up[r], diag_out[r] = carry_diag[r];
      }
    }
  }
}

template <bool ALIGNED>
using LongSource = std::conditional_t<ALIGNED, DenseGroups<kLongDepth>, DenseDirect<float, kLongLaneColumns, kLongDepth>>;

bool long_aligned(const Problem& pr, const float* S) { return pr.N % 4 == 0 && reinterpret_cast<uintptr_t>(S) % 16 == 0; }

}  // namespace
}  // namespace swcli_cuda

int sw_cuda_long_tile_rows() { return swcli_cuda::kLongRows; }
int sw_cuda_long_tile_columns() { return swcli_cuda::kLongColumns; }

int64_t sw_cuda_long_state_floats(int64_t B, int64_t M, int64_t N) { return swcli_cuda::State::floats(B, M, N); }

int64_t sw_cuda_long_tiles(int64_t B, int64_t M, int64_t N) {
  const swcli_cuda::Grid g(M, N);
  return B * g.rows * g.cols;
}

int64_t sw_cuda_long_flow_floats(int64_t B, int64_t M, int64_t N) { return swcli_cuda::Flows::floats(B, M, N); }

cudaError_t sw_cuda_long_forward(const Problem& pr, const float* S, float* scores, int64_t* best_at, float* state,
                                 float* tile_best, int64_t* tile_at, int* log_pairs, double gap, double t,
                                 cudaStream_t stream) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  const State st(state, pr.B, pr.M, pr.N);
  const Consts<float> k = consts<float>(gap, t);
  return SWCLI_BOOL_SWITCH(t > 0, SOFT, [&] {
    return SWCLI_BOOL_SWITCH(long_aligned(pr, S), ALIGNED, [&] {
      for (int d = 0; d < st.grid.diagonals(); ++d) {
        long_forward_kernel<SOFT, LongSource<ALIGNED>><<<unsigned(st.grid.count(d) * pr.B), kWarp, 0, stream>>>(
            S, pr.qlen, pr.tlen, pr.M, pr.N, k, st, tile_best, tile_at, d);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
      }
      long_best_kernel<<<unsigned(pr.B), 256, 0, stream>>>(tile_best, tile_at, pr.qlen, pr.tlen, pr.M, pr.N, scores,
                                                          best_at, SOFT ? log_pairs : nullptr);
      return cudaGetLastError();
    });
  });
}

cudaError_t sw_cuda_long_backward(const Problem& pr, const float* grad_scores, const float* S, const float* state,
                                  const int64_t* best_at, float* grad_S, float* flows, double gap, double t,
                                  cudaStream_t stream) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  const State st(const_cast<float*>(state), pr.B, pr.M, pr.N);  // read only here
  const Flows fl(flows, pr.B, pr.M, pr.N);
  const Consts<float> k = consts<float>(gap, t);
  const int64_t zero_blocks = pr.B * ((pr.M + kZeroRows - 1) / kZeroRows);
  long_zero_kernel<<<unsigned(zero_blocks), 256, 0, stream>>>(best_at, pr.qlen, pr.tlen, pr.M, pr.N, grad_S);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return SWCLI_BOOL_SWITCH(t > 0, SOFT, [&] {
    return SWCLI_BOOL_SWITCH(long_aligned(pr, S), ALIGNED, [&] {
      const auto kernel = long_backward_kernel<SOFT, LongSource<ALIGNED>>;
      constexpr int bytes = kept_bytes<SOFT>();
      cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      for (int d = st.grid.diagonals() - 1; d >= 0 && e == cudaSuccess; --d) {
        kernel<<<unsigned(st.grid.count(d) * pr.B), kWarp, bytes, stream>>>(grad_scores, S, best_at, pr.qlen, pr.tlen,
                                                                           pr.M, pr.N, k, st, fl, grad_S, d);
        e = cudaGetLastError();
      }
      return e;
    });
  });
}
