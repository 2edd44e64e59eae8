// The backward through the DP table the forward kept (forward_dense.cu, STORE): a reverse wavefront
// over the stored H. E = d score / d H; each cell passes E on to the
// three cells it was computed from, weighted by the softmax of its terms (t > 0) or by the first
// maximal term in the reference's order zero, match, delete, insert (t = 0). Lane k owns the same
// columns as in the forward; the rightmost lane starts at the last row, and the flow into the column
// left of a lane's strip goes to lane k-1 by shuffle, or across tiles through the per-pair buffer.
//
// SUMS (backward_parameters): each pair also gets, in a (2, B) array, g times the flow along its gap edges,
// the sum over the cells of E (w_up + w_left) (each gap term holds the gap once: d score / d gap), and
// <S, grad_S>, for which the soft backward reads S too (tests/test_parameter_sums_model.py models both).
#include "common.cuh"
#include "dispatch.cuh"

namespace swcli_cuda {
namespace {

// The rows a lane of the backward reads, in groups of kBackGroup steps: at the start of each group the
// rows loaded a group ago become current, and the next group's loads start together. The step that
// handles row i takes H[i-1][col .. col+R-1] (zero outside rows [0, rows), and in columns past the
// target) as its row above, the previous step's row above as its own row, and, at t = 0,
// S[i][col .. col+R-1]. H comes from the wavefront-ordered table, where the lanes of a step read one
// contiguous row. The column left of the strip needs no load: it is the left neighbour's own row
// above, one row ahead (see the sweep). A load per step into a ring of slots waited, in the compiled
// code, for the load issued a step before (all the loads share one scoreboard): the profile's largest
// stall. Groups of 4 beat groups of 8, which take more registers and so leave fewer warps per SM; L2
// prefetches of the rows further up did not pay, nor would a copy of H into shared memory by cp.async,
// a second source of rows with its own PTX, for little.
constexpr int kBackGroup = 4;  // rows per group of the backward's loads
constexpr int kDelay = 8;      // lanes whose gradient rows the backward writes together (backward_kernel)
static_assert((kDelay & (kDelay - 1)) == 0 && kWarp % kDelay == 0, "kDelay: a power of 2 dividing the warp");


template <typename A, int R, bool READ_S>
struct BackwardRows {
  static constexpr int G = kBackGroup;
  static_assert(kWarp % G == 0, "a block of 32 steps holds whole groups");
  Skewed<const A, R> H;
  const A* S;  // this pair's scores (READ_S only: t = 0, or the sums)
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
    if (READ_S) {
      const bool ok = unsigned(i) < unsigned(rows);
#pragma unroll
      for (int r = 0; r < R; ++r) sv[r] = ok && r < valid ? __ldg(S + int64_t(i) * N + col + r) : A(0);
    }
    mine.step(-1);
  }
};

template <typename A, int R, bool SOFT, bool SUMS>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    backward_kernel(const A* grad_scores, const A* S, const A* table, const int64_t* best_at,
                    const int64_t* qlen, const int64_t* tlen, const int64_t* order, A* grad_S,
                    A* boundary, A* sums, Consts<A> k, int64_t B, int64_t M, int64_t N) {
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
  BackwardRows<A, R, !SOFT || SUMS> src;
  PairSums<A, 2> sum;  // SUMS: the gap edges' flow (not yet times g), and <S, grad_S>
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
              // Past the target, the table's H comes from the padding: a weight there can overflow to
              // inf, and 0 * inf would pass a NaN on to the columns inside.
              if (r >= valid) wd = wu = wl = A(0);
              const A diag_flow = e * wd;
              g[r] = grad * diag_flow;
              if (SUMS) {
                sum.add_flow(0, e, wu + wl);
                sum.add_inner(1, g[r], src.s[d][r]);
              }
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
  if (SUMS) {
    // g times the gap flow; 0 where g is 0, whatever the flow (a NaN in S), as the CPU engine skips the pair
    sum.part[0] = grad == A(0) ? A(0) : grad * sum.part[0];
    sum.add_to(sums, B, b);
  }
}

template <typename A>
cudaError_t backward_any(const Problem& pr, const A* grad_scores, const A* S, const A* table, const int64_t* best_at,
                         A* grad_S, A* boundary, A* sums, double gap, double t, int lane_columns,
                         cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  const Consts<A> k = consts<A>(gap, t);
  const int blocks = blocks_for(pr.B), threads = kWarp * kWarpsPerBlock;
  return SWCLI_COLUMNS_1_4_SWITCH(lane_columns, R, [&] {
    return SWCLI_BOOL_SWITCH(t > 0, SOFT, [&] {
      return SWCLI_BOOL_SWITCH(sums != nullptr, SUMS, [&] {
        backward_kernel<A, R, SOFT, SUMS><<<blocks, threads, 0, stream>>>(
            grad_scores, S, table, best_at, pr.qlen, pr.tlen, pr.order, grad_S, boundary, sums, k, pr.B, pr.M, pr.N);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace
}  // namespace swcli_cuda

cudaError_t sw_cuda_backward_f32(const Problem& pr, const float* grad_scores, const float* S, const float* table,
                                 const int64_t* best_at, float* grad_S, float* boundary, float* sums, double gap,
                                 double t, int lane_columns, cudaStream_t stream) {
  return swcli_cuda::backward_any<float>(pr, grad_scores, S, table, best_at, grad_S, boundary, sums, gap, t,
                                         lane_columns, stream);
}

cudaError_t sw_cuda_backward_f64(const Problem& pr, const double* grad_scores, const double* S,
                                 const double* table, const int64_t* best_at, double* grad_S, double* boundary,
                                 double* sums, double gap, double t, int lane_columns, cudaStream_t stream) {
  return swcli_cuda::backward_any<double>(pr, grad_scores, S, table, best_at, grad_S, boundary, sums, gap, t,
                                          lane_columns, stream);
}
