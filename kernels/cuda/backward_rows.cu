// The gradient of float scores at t > 0 by rows (rows.cuh): the forward that keeps every kBandRows-th
// row of the DP instead of the table, and the backward that computes the bands again and runs the
// adjoint over them. A pair the scaled rows cannot hold is scored in log space (forward_log.cuh), and
// its gradient takes the table's path (backward_table.cu). With SUMS (backward_parameters) the backward
// also sums, per pair, the flow along the gap edges and <S, grad_S> (adjoint_row in rows.cuh).
#include "dispatch.cuh"
#include "rows.cuh"

namespace swcli_cuda {
namespace {

// The forward for the gradient by rows: scores, the first best cell (row-major, as the reference's max:
// a strictly larger scaled key wins, and keys order as E does, across scales), and the kept rows. A pair
// the scaled rows cannot hold is scored in log space instead and counted in *failed (the caller then
// takes the DP table's path). PER_PAIR: each pair's constants and case come from items (values read on
// the device); a pair whose values the rows do not take (linear_rows_case) is counted too, scored by the
// exact sweep at t = 0 and in log space otherwise, and one whose values are not valid scores NaN.
template <bool MASKED, bool ALIGNED, bool PER_PAIR>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    rows_forward_kernel(const float* S, const int64_t* qlen, const int64_t* tlen, const int64_t* order,
                        float* scores, int64_t* best_row, float* kept, float* boundary, int* failed, Consts<float> k,
                        const PairItem<Consts<float>>* items, int64_t B, int M, int N) {
  __shared__ Staging staging_rows[ALIGNED ? 1 : kWarpsPerBlock];  // ALIGNED: unused
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  Staging& staging = staging_rows[ALIGNED ? 0 : threadIdx.x / kWarp];
  const RowsLane where(b, qlen, tlen, M, N);
  const int lane = where.lane, qn = where.qn, tn = where.tn, col = where.col, valid = where.valid;
  RowsCase pair_case = kRowsHold;
  if constexpr (PER_PAIR) {
    const PairItem<Consts<float>> item = items[b];
    k = item.k, pair_case = RowsCase(item.rows_case);
  }
  const RowConsts rc = row_consts(k);
  const float* Sb = S + b * int64_t(M) * N;
  float* kept_b = kept + b * kept_rows(M) * kKeptRowFloats;
  float U[kRowCols];
  int sig;
  border_row<MASKED>(U, sig, valid);
  bool ok = pair_case == kRowsHold;  // the same in every lane
  long long best_key = scaled_key(0, 1.0f);  // the border
  int best_i = -1;  // the first row that holds best_key (its column: best_column, in the backward)
  const int rows = tn > 0 && ok ? qn : 0;
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
  if (PER_PAIR && pair_case == kRowsInvalid) {
    if (lane == 0) {
      scores[b] = __int_as_float(0x7fc00000), best_row[b] = -1;
      atomicAdd(failed, 1);
    }
    return;
  }
  // The scaled rows could not hold this pair: its score and best cell in log space (forward_tiles, as the
  // forward that keeps the table finds them, without the table), and the caller takes the table's path.
  // Its rows of S as launch_dense (forward_dense.cu) reads them: in groups of 16-byte loads where aligned,
  // else one at a time.
  using Source = std::conditional_t<ALIGNED, DenseGroups<8>, DenseDirect<float, 4, source_depth(4, true)>>;
  Source src;
  src.S = S, src.M = M, src.N = N;
  const Outputs<float> out{scores, nullptr, nullptr, nullptr};
  const InPlace<float> handoff{boundary ? boundary + b * M : nullptr};
  float best;
  int64_t at;
  if (PER_PAIR && pair_case == kRowsHard)
    forward_tiles<float, 4, false, true, Source, InPlace<float>, false, false>(Pair{b, qn, tn}, src, k, out, M, N,
                                                                              handoff, 0, 1, best, at);
  else
    forward_tiles<float, 4, true, true, Source, InPlace<float>, false, false>(Pair{b, qn, tn}, src, k, out, M, N,
                                                                             handoff, 0, 1, best, at);
  if (lane == 0) {
    scores[b] = best, best_row[b] = at < 0 ? -1 : at / N;
    atomicAdd(failed, 1);
  }
}

// The backward of one pair a warp (rows_backward_kernel and, for values read on the device,
// rows_backward_per_pair_kernel).
template <bool MASKED, bool ALIGNED, bool SUMS, bool PER_PAIR>
__device__ __forceinline__ void rows_backward_pair(const float* grad_scores, const float* S, const float* kept,
                                                   const int64_t* best_row, const int64_t* qlen, const int64_t* tlen,
                                                   const int64_t* order, float* grad_S, float* sums, Consts<float> k,
                                                   const PairItem<Consts<float>>* items, int64_t B, int M, int N) {
  __shared__ BandRows shared_rows[kRowsWarps];
  __shared__ Staging staging_rows[ALIGNED ? 1 : kRowsWarps];  // ALIGNED: unused
  const int64_t slot = int64_t(blockIdx.x) * kRowsWarps + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  BandRows& sh = shared_rows[threadIdx.x / kWarp];
  Staging& staging = staging_rows[ALIGNED ? 0 : threadIdx.x / kWarp];
  const RowsLane where(b, qlen, tlen, M, N);
  const int lane = where.lane, qn = where.qn, tn = where.tn, col = where.col, valid = where.valid;
  if constexpr (PER_PAIR) k = items[b].k;  // every pair's case is kRowsHold: the forward counted no failure
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
  PairSums<float, 2> sum;  // SUMS: the gap edges' flow and <S, grad_S>, both times g already (the seed)
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
    for (int u = 0; u < kRowsAhead; ++u) load_score_row<ALIGNED, SUMS>(Sb, r0 + u, r1, N, col, ring[u]);
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
        load_score_row<ALIGNED, SUMS>(Sb, i + kRowsAhead, r1, N, col, ring[u]);
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
      adjoint_row<MASKED, ALIGNED, true, SUMS>(Er, sig_r, Eu, sig_u, below, grad_scores[b], seed_col, valid, lane,
                                               rc, Gb + int64_t(i) * N, col, N, staging, &sum, Sb, i);
#pragma unroll
      for (int r = 0; r < kRowCols; ++r) Er[r] = Eu[r];
      sig_r = sig_u;
      --i;
    }
    for (; i >= r0; --i) {
      float Eu[kRowCols];
      int sig_u;
      get_row(sh, i - r0, Eu, sig_u, lane);
      adjoint_row<MASKED, ALIGNED, false, SUMS>(Er, sig_r, Eu, sig_u, below, 0.0f, -1, valid, lane, rc,
                                                Gb + int64_t(i) * N, col, N, staging, &sum, Sb, i);
#pragma unroll
      for (int r = 0; r < kRowCols; ++r) Er[r] = Eu[r];
      sig_r = sig_u;
    }
  }
  if (SUMS) sum.add_to(sums, B, b);
}

template <bool MASKED, bool ALIGNED, bool SUMS>
__global__ void __launch_bounds__(kWarp* kRowsWarps)
    rows_backward_kernel(const float* grad_scores, const float* S, const float* kept, const int64_t* best_row,
                         const int64_t* qlen, const int64_t* tlen, const int64_t* order, float* grad_S,
                         float* sums, Consts<float> k, int64_t B, int M, int N) {
  rows_backward_pair<MASKED, ALIGNED, SUMS, false>(grad_scores, S, kept, best_row, qlen, tlen, order, grad_S, sums, k,
                                                   nullptr, B, M, N);
}

// With the pair's constants in registers rather than the call's in constant memory the sweep takes a few
// registers more: held to 128, 4 blocks an SM as the call's kernel with sums (a few bytes spilled, once).
template <bool MASKED, bool ALIGNED>
__global__ void __launch_bounds__(kWarp* kRowsWarps, 4)
    rows_backward_per_pair_kernel(const float* grad_scores, const float* S, const float* kept,
                                  const int64_t* best_row, const int64_t* qlen, const int64_t* tlen,
                                  const int64_t* order, float* grad_S, float* sums,
                                  const PairItem<Consts<float>>* items, int64_t B, int M, int N) {
  rows_backward_pair<MASKED, ALIGNED, true, true>(grad_scores, S, kept, best_row, qlen, tlen, order, grad_S, sums,
                                                  Consts<float>{}, items, B, M, N);
}

// Which case of a rows kernel takes a call (see MASKED and ALIGNED at kRowCols in rows.cuh). The gradient
// comes from at::empty, as aligned as S's rows are when N is a multiple of 4.
bool rows_aligned(const Problem& pr, const float* S) {
  return pr.N % 4 == 0 && reinterpret_cast<uintptr_t>(S) % 16 == 0;
}
bool rows_masked(const Problem& pr) { return pr.qlen || pr.tlen || pr.N % kRowCols != 0; }

}  // namespace
}  // namespace swcli_cuda

int sw_cuda_rows_width() { return swcli_cuda::kRowsWidth; }

int64_t sw_cuda_pair_values_bytes(int64_t B) { return B * swcli_cuda::kPairItemBytes; }

int64_t sw_cuda_rows_kept_floats(int64_t M) { return swcli_cuda::kept_rows(M) * swcli_cuda::kKeptRowFloats; }

cudaError_t sw_cuda_rows_forward(const Problem& pr, const float* S, float* scores, int64_t* best_row, float* kept,
                                 float* boundary, int* failed, double gap, double t, cudaStream_t stream,
                                 const PairValues* values) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  const PairItem<Consts<float>>* items = pair_items<Consts<float>, LinearDerive>(values, pr.B, stream, err);
  if (err != cudaSuccess) return err;
  return SWCLI_MASKED_ALIGNED_SWITCH(rows_masked(pr), rows_aligned(pr, S), MASKED, ALIGNED, [&] {
    return SWCLI_BOOL_SWITCH(items != nullptr, PER_PAIR, [&] {
      rows_forward_kernel<MASKED, ALIGNED, PER_PAIR><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, stream>>>(
          S, pr.qlen, pr.tlen, pr.order, scores, best_row, kept, boundary, failed, consts<float>(gap, t), items, pr.B,
          int(pr.M), int(pr.N));
      return cudaGetLastError();
    });
  });
}

cudaError_t sw_cuda_rows_backward(const Problem& pr, const float* grad_scores, const float* S, const float* kept,
                                  const int64_t* best_row, float* grad_S, float* sums, double gap, double t,
                                  cudaStream_t stream, const PairValues* values) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  const PairItem<Consts<float>>* items = pair_items<Consts<float>, LinearDerive>(values, pr.B, stream, err);
  if (err != cudaSuccess) return err;
  if (items && !sums) return cudaErrorInvalidValue;  // values read on the device come with their sums
  const unsigned blocks = unsigned((pr.B + kRowsWarps - 1) / kRowsWarps);
  return SWCLI_MASKED_ALIGNED_SWITCH(rows_masked(pr), rows_aligned(pr, S), MASKED, ALIGNED, [&] {
    if (items)
      rows_backward_per_pair_kernel<MASKED, ALIGNED><<<blocks, kWarp * kRowsWarps, 0, stream>>>(
          grad_scores, S, kept, best_row, pr.qlen, pr.tlen, pr.order, grad_S, sums, items, pr.B, int(pr.M),
          int(pr.N));
    else
      SWCLI_BOOL_SWITCH(sums != nullptr, SUMS, [&] {
        rows_backward_kernel<MASKED, ALIGNED, SUMS><<<blocks, kWarp * kRowsWarps, 0, stream>>>(
            grad_scores, S, kept, best_row, pr.qlen, pr.tlen, pr.order, grad_S, sums, consts<float>(gap, t), pr.B,
            int(pr.M), int(pr.N));
        return 0;
      });
    return cudaGetLastError();
  });
}
