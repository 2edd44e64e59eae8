// The affine backward: d score / d S from the state of the affine forward (M, X and Y of every cell in
// wavefront order, affine.cuh), per pair from its best cell. d score / d S[i][j] is the adjoint of the
// match state M[i+1][j+1] (DP indices), the posterior of the match there.
//
// t > 0 (affine_backward_kernel): a reverse wavefront of one warp per pair, the lanes holding the forward's
// columns. Each cell takes H, Xn = X[i][j+1] and Yn = Y[i+1][j] again from its own M, X and Y, and turns
// the adjoints of H, Xn and Yn into those of M, X and Y (affine_adjoint):
//
//     E_H[i][j] = E_M[i+1][j+1]           (+ 1 at the best cell)
//     E_M, E_X, E_Y of [i][j] = the softmax weights of their terms in H[i][j], X[i][j+1], Y[i+1][j]
//
// The rightmost lane leads, a row ahead of the lane to its left: that lane takes E_X of the column to its
// right (this row) and E_M of that column one row below (the E_H of its last column) by shuffle; E_Y of
// the row below stays in the lane's registers. Across tiles the two go through a per-pair buffer.
//
// t = 0 (affine_traceback_kernel): the indicator of one optimal alignment, a traceback from the best cell
// with the CPU engine's tie rules (kernels/cpu/affine_backward.cpp): each state takes the first of its
// terms equal to it in the order start, match, Y, X.
//
// SUMS (affine_backward_parameters): each pair also gets, in a (3, B) array, g times d score / d gap_open
// and d gap_extend, and <S, grad_S>. A gap state's terms hold o once (start, M, the other gap) or e once
// (itself) and their weights sum to 1, so d / d e is what flows along extension edges and d / d o all
// that enters X and Y (E_X + E_Y over the cells) less that; the traceback counts its openings and
// extensions (tests/test_parameter_sums_model.py models both).
#include "affine.cuh"
#include "dispatch.cuh"

namespace swcli_cuda {
namespace {

// grad_S comes uninitialised: zero what the sweep does not write, the rows past the best cell's and the
// columns past its tile (all of the pair when the score is the zero border).
template <typename A, int R>
__device__ __forceinline__ void zero_unswept(A* Gb, int64_t M, int64_t N, int tn, int64_t arg, bool border,
                                             int lane) {
  constexpr int kTileCols = kWarp * R;
  const int rows_swept = border ? 0 : int(arg / N) + 1;
  const int cols_swept = border ? 0 : min(tn, int(arg % N) / kTileCols * kTileCols + kTileCols);
  for (int i = 0; i < M; ++i)
    for (int j = (i < rows_swept ? cols_swept : 0) + lane; j < N; j += kWarp) Gb[int64_t(i) * N + j] = A(0);
}

template <typename A, int R, int MODE, bool SUMS>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    affine_backward_kernel(const A* grad_scores, const A* state, int64_t plane, const int64_t* best_at,
                           const int64_t* qlen, const int64_t* tlen, const int64_t* order, A* grad_S,
                           Pair2<A>* boundary, const A* S, A* sums, AffineConsts<A> k, int64_t B, int64_t M,
                           int64_t N) {
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = order ? order[slot] : slot;
  const int qn = int(qlen ? qlen[b] : M), tn = int(tlen ? tlen[b] : N);
  const int64_t arg = best_at[b];
  const A grad = grad_scores[b];
  constexpr int kTileCols = kWarp * R;
  A* const Gb = grad_S + b * M * N;
  const bool border = arg < 0 || qn == 0 || tn == 0;
  zero_unswept<A, R>(Gb, M, N, tn, arg, border, lane);
  if (border) return;  // the score is the zero border: no gradient
  const int bi = int(arg / N), bj = int(arg % N);
  const int64_t cols = table_columns(N, R);
  const Skewed<const A, R> table{state + b * M * cols, int(M), cols};
  Pair2<A>* const bnd = boundary ? boundary + b * M : nullptr;
  const int last_tile = bj / kTileCols, rows = bi + 1;
  const Pair2<A> nothing = pair2(A(0), A(0));
  PairSums<A, 3> sum;  // SUMS: what enters the gap states, the extension flow (not yet times g), <S, grad_S>
  const A* const Sb = SUMS ? S + b * M * N : nullptr;
  for (int tile = last_tile; tile >= 0; --tile) {
    const int c0 = tile * kTileCols, col = c0 + lane * R;
    const int width = tn - c0 < kTileCols ? tn - c0 : kTileCols;
    const int lanes = (width + R - 1) / R;
    const int valid = tn - col >= R ? R : (tn - col > 0 ? tn - col : 0);
    const int rank = lanes - 1 - lane;  // 0 for the rightmost lane, which leads; < 0: no columns here
    const bool from_right = tile < last_tile;
    // Lane k handles row i = rows - 1 - (s - rank) at step s; its storage rows go up one a step.
    typename Skewed<const A, R>::Cursor cursor = table.cursor(tile, rows - 1 + (rank > 0 ? rank : 0), lane);
    if (rank < 0) cursor.at = nullptr;  // never read
    A carry_m[R], carry_y[R];  // E_M and E_Y of the row below
#pragma unroll
    for (int r = 0; r < R; ++r) carry_m[r] = A(0), carry_y[r] = A(0);
    A send_x = A(0), send_m = A(0);  // E_X[i][col] of this row and E_M[i+1][col], for lane - 1
    A below_m0 = A(0);               // E_M[i+1][col]
    // The values of the next step, loaded a step ahead: this lane's M, X, Y, and for the rightmost lane
    // what comes from the tile to the right.
    A nm[R], nx[R], ny[R];
    Pair2<A> n_right = nothing, n_right_below = nothing;
    auto load = [&](int s) {
      const int i = rows - 1 - (s - rank);
      const bool on = rank >= 0 && unsigned(i) < unsigned(rows);
      if (on) {
        load_row_values<A, R>(cursor.at, nm, valid);
        load_row_values<A, R>(cursor.at + plane, nx, valid);
        load_row_values<A, R>(cursor.at + 2 * plane, ny, valid);
      }
      if (rank >= 0) cursor.step(-1);  // every step: the storage row is the warp's, on its rows or not
      if (from_right && rank == 0 && on) {
        n_right = bnd[i];
        n_right_below = i + 1 < rows ? bnd[i + 1] : nothing;
      }
    };
    load(0);
    const int steps = rows + lanes - 1;
    for (int s = 0; s < steps; ++s) {
      const int i = rows - 1 - (s - rank);
      A m[R], x[R], y[R];
#pragma unroll
      for (int r = 0; r < R; ++r) m[r] = nm[r], x[r] = nx[r], y[r] = ny[r];
      const Pair2<A> right = n_right, right_below = n_right_below;
      load(s + 1);
      // Boundary reads of the rightmost lane happen before lane 0 of this tile overwrites those rows
      // (it reaches row i lanes - 1 steps later); the warp's shuffles order the steps.
      A exn = __shfl_down_sync(kFull, send_x, 1);
      A eh_right = __shfl_down_sync(kFull, send_m, 1);
      if (rank == 0) exn = right.x, eh_right = right_below.y;  // zero in the last tile
      if (rank >= 0 && unsigned(i) < unsigned(rows)) {
        A g[R];
        A diag = eh_right;
#pragma unroll
        for (int r = R - 1; r >= 0; --r) {
          A eh = diag;
          diag = carry_m[r];
          if (tile == last_tile && i == bi && col + r == bj) eh += A(1);
          A em = A(0), ex = A(0), ey = A(0), extended = A(0);
          if (r < valid)  // columns past the target take no flow and pass none on
            affine_adjoint<A, MODE, SUMS>(m[r], x[r], y[r], eh, exn, carry_y[r], k, em, ex, ey, &extended);
          carry_m[r] = em;
          carry_y[r] = ey;
          exn = ex;
          g[r] = grad * em;
          if (SUMS && r < valid) {
            sum.part[0] += ex + ey;
            sum.part[1] += extended;
            sum.add_flow(2, g[r], __ldg(Sb + int64_t(i) * N + col + r));
          }
        }
        send_x = exn;
        send_m = below_m0;
        below_m0 = carry_m[0];
        if (lane == 0 && tile > 0) bnd[i] = pair2(send_x, carry_m[0]);
        store_row<A, R>(Gb + int64_t(i) * N + col, g, valid, false);
      }
    }
    __syncwarp();  // lane 0's boundary writes are visible to the rightmost lane in the next tile
  }
  if (SUMS) {  // g times the flows; 0 where g is 0, whatever they are (a NaN in S), as on the CPU
    const A into = sum.part[0], extended = sum.part[1];
    sum.part[0] = grad == A(0) ? A(0) : grad * (into - extended);
    sum.part[1] = grad == A(0) ? A(0) : grad * extended;
    sum.add_to(sums, B, b);
  }
}

template <typename A, int R, bool SUMS>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    affine_traceback_kernel(const A* grad_scores, const A* state, int64_t plane, const int64_t* best_at,
                            const int64_t* qlen, const int64_t* tlen, const int64_t* order, A* grad_S,
                            const A* S, A* sums, AffineConsts<A> k, int64_t B, int64_t M, int64_t N) {
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = order ? order[slot] : slot;
  const int qn = int(qlen ? qlen[b] : M), tn = int(tlen ? tlen[b] : N);
  const int64_t arg = best_at[b];
  A* const Gb = grad_S + b * M * N;
  for (int64_t x = lane; x < M * N; x += kWarp) Gb[x] = A(0);
  __syncwarp();
  if (lane != 0 || arg < 0 || qn == 0 || tn == 0) return;
  const A grad = grad_scores[b];
  constexpr int kTileCols = kWarp * R;
  const int64_t cols = table_columns(N, R);
  const Skewed<const A, R> table{state + b * M * cols, int(M), cols};
  const A minus_inf = -INFINITY;
  // The state of DP cell (i, j), 1-based: plane 0 M, 1 X, 2 Y; -inf on the border.
  auto value = [&](int q, int i, int j) -> A {
    if (i < 1 || j < 1) return minus_inf;
    const int c = j - 1;
    return table.at(c / kTileCols, i - 1, (c % kTileCols) / R)[q * plane + c % R];
  };
  auto match = [&](int i, int j) { return value(0, i, j); };
  auto gap_x = [&](int i, int j) { return value(1, i, j); };
  auto gap_y = [&](int i, int j) { return value(2, i, j); };
  A opened = A(0), extended = A(0), inner = A(0);  // SUMS: the walk's openings, extensions, S at its matches
  auto take_match = [&](int& i, int& j) {  // the gradient of M[i][j], then H of the cell above-left
    Gb[int64_t(i - 1) * N + (j - 1)] = grad;
    if (SUMS && grad != A(0)) inner += grad * S[b * M * N + int64_t(i - 1) * N + (j - 1)];
    --i, --j;
  };
  const A o = k.o, e = k.e;
  enum State { kH, kX, kY };
  State state_now = kH;
  int i = int(arg / N) + 1, j = int(arg % N) + 1;
  while (i >= 1 && j >= 1) {
    if (state_now == kH) {
      A h, xn, yn;
      affine_cell<A, kHard>(match(i, j), gap_x(i, j), gap_y(i, j), k, h, xn, yn);
      if (h == A(0)) break;  // the start
      if (match(i, j) == h) {
        take_match(i, j);
      } else if (gap_y(i, j) == h) {
        state_now = kY;
      } else if (gap_x(i, j) == h) {
        state_now = kX;
      } else {
        break;  // NaN
      }
    } else if (state_now == kX) {  // from column j-1
      const A x = gap_x(i, j);
      if (x == o) {
        opened += A(1);
        break;
      }
      if (match(i, j - 1) + o == x) {
        --j, state_now = kH, opened += A(1);
        take_match(i, j);
      } else if (gap_y(i, j - 1) + o == x) {
        --j, state_now = kY, opened += A(1);
      } else if (gap_x(i, j - 1) + e == x) {
        --j, extended += A(1);
      } else {
        break;
      }
    } else {  // Y, from row i-1
      const A y = gap_y(i, j);
      if (y == o) {
        opened += A(1);
        break;
      }
      if (match(i - 1, j) + o == y) {
        --i, state_now = kH, opened += A(1);
        take_match(i, j);
      } else if (gap_y(i - 1, j) + e == y) {
        --i, extended += A(1);
      } else if (gap_x(i - 1, j) + o == y) {
        --i, state_now = kX, opened += A(1);
      } else {
        break;
      }
    }
  }
  if (SUMS) {  // lane 0 alone: its own sums, each times g (0 where g is 0)
    atomicAdd(sums + b, grad == A(0) ? A(0) : grad * opened);
    atomicAdd(sums + B + b, grad == A(0) ? A(0) : grad * extended);
    atomicAdd(sums + 2 * B + b, inner);
  }
}

template <typename A>
cudaError_t affine_backward_any(const Problem& pr, const A* grad_scores, const A* state, const int64_t* best_at,
                                A* grad_S, A* boundary, const A* S, A* sums, double o, double e, double t,
                                int lane_columns, cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  const AffineConsts<A> k = affine_consts<A>(o, e, t);
  const int mode = affine_mode<A>(o, t);
  const int blocks = blocks_for(pr.B), threads = kWarp * kWarpsPerBlock;
  return SWCLI_COLUMNS_1_4_SWITCH(lane_columns, R, [&] {
    const int64_t plane = pr.B * pr.M * table_columns(pr.N, R);
    return SWCLI_BOOL_SWITCH(sums != nullptr, SUMS, [&] {
      if (mode == kHard) {
        affine_traceback_kernel<A, R, SUMS><<<blocks, threads, 0, stream>>>(
            grad_scores, state, plane, best_at, pr.qlen, pr.tlen, pr.order, grad_S, S, sums, k, pr.B, pr.M, pr.N);
        return cudaGetLastError();
      }
      return SWCLI_BOOL_SWITCH(mode == kShared, SHARED, [&] {
        affine_backward_kernel<A, R, SHARED ? kShared : kSeparate, SUMS><<<blocks, threads, 0, stream>>>(
            grad_scores, state, plane, best_at, pr.qlen, pr.tlen, pr.order, grad_S,
            reinterpret_cast<Pair2<A>*>(boundary), S, sums, k, pr.B, pr.M, pr.N);
        return cudaGetLastError();
      });
    });
  });
}

}  // namespace
}  // namespace swcli_cuda

cudaError_t sw_cuda_affine_backward_f32(const Problem& pr, const float* grad_scores, const float* state,
                                        const int64_t* best_at, float* grad_S, float* boundary, const float* S,
                                        float* sums, double gap_open, double gap_extend, double t, int lane_columns,
                                        cudaStream_t stream) {
  return swcli_cuda::affine_backward_any<float>(pr, grad_scores, state, best_at, grad_S, boundary, S, sums,
                                                gap_open, gap_extend, t, lane_columns, stream);
}

cudaError_t sw_cuda_affine_backward_f64(const Problem& pr, const double* grad_scores, const double* state,
                                        const int64_t* best_at, double* grad_S, double* boundary, const double* S,
                                        double* sums, double gap_open, double gap_extend, double t,
                                        int lane_columns, cudaStream_t stream) {
  return swcli_cuda::affine_backward_any<double>(pr, grad_scores, state, best_at, grad_S, boundary, S, sums,
                                                 gap_open, gap_extend, t, lane_columns, stream);
}
