// The affine forward (affine.cuh), dense S (B, M, N) float or double and uint8 codes looked up in a K x K
// matrix in shared memory: one warp per pair, 1 or 4 columns per lane (codes also 8), with or without the
// state for the backward (dense only). The longest pairs of codes get a block of kAffineRelayWarps warps
// that relay their tiles, as the linear codes kernels do (forward_codes.cu). Float at t > 0 in the shared
// form without the state takes the scaled sweep (affine_scaled.cuh) with 4 columns per lane, from codes
// also 8, and log space where a pair fails its checks; everything else is in log space.
#include "affine_scaled.cuh"
#include "dispatch.cuh"

namespace swcli_cuda {
namespace {

template <typename A, int R, int MODE, bool STORE, class Source>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    affine_dense_kernel(Source src, AffineConsts<A> k, AffineOut<A> out, const int64_t* qlen, const int64_t* tlen,
                        const int64_t* order, int64_t B, int64_t M, int64_t N) {
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;  // a whole warp leaves together
  const int64_t b = order ? order[slot] : slot;
  const Pair p{b, int(qlen ? qlen[b] : M), int(tlen ? tlen[b] : N)};
  if constexpr (sizeof(A) == 4 && R == 4 && MODE == kShared && !STORE)
    affine_scaled_pair<false, 4>(p, src, nullptr, 0, k, out, M, N);
  else
    affine_pair<A, R, MODE, STORE>(p, src, k, out, M, N);
}

template <typename A, int R, int MODE, bool STORE, class Source>
cudaError_t launch_affine_dense(const Problem& pr, const A* S, const AffineConsts<A>& k, const AffineOut<A>& out,
                                cudaStream_t stream) {
  Source src{};
  src.S = S, src.M = pr.M, src.N = pr.N;
  affine_dense_kernel<A, R, MODE, STORE><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, stream>>>(
      src, k, out, pr.qlen, pr.tlen, pr.order, pr.B, pr.M, pr.N);
  return cudaGetLastError();
}

// The dense sources of the linear forward (launch_dense in forward_dense.cu): float rows of 4 columns in
// groups of 8 where 16-byte aligned, float 1-column lanes 32 rows at a time, else one value at a time.
template <typename A, int R, bool STORE>
cudaError_t affine_dense(const Problem& pr, const A* S, const AffineConsts<A>& k, const AffineOut<A>& out, int mode,
                         cudaStream_t stream) {
  return SWCLI_AFFINE_MODE_SWITCH(mode, MODE, [&] {
    if constexpr (sizeof(A) == 4 && R == 4) {
      if (pr.N % 4 == 0 && reinterpret_cast<uintptr_t>(S) % 16 == 0)
        return launch_affine_dense<A, R, MODE, STORE, DenseGroups<8>>(pr, S, k, out, stream);
    }
    if constexpr (sizeof(A) == 4 && R == 1)
      return launch_affine_dense<A, R, MODE, STORE, DenseBlocks<A>>(pr, S, k, out, stream);
    else
      return launch_affine_dense<A, R, MODE, STORE, DenseDirect<A, R, source_depth(R, STORE)>>(pr, S, k, out, stream);
  });
}

template <typename A>
cudaError_t affine_dense_any(const Problem& pr, const A* S, A* scores, A* state, int64_t* best_at, A* boundary,
                             double o, double e, double t, int lane_columns, cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  const AffineConsts<A> k = affine_consts<A>(o, e, t);
  const int mode = affine_mode<A>(o, t);
  return SWCLI_COLUMNS_1_4_SWITCH(lane_columns, R, [&] {
    const AffineOut<A> out{scores, state, pr.B * pr.M * table_columns(pr.N, R), best_at,
                           reinterpret_cast<Pair2<A>*>(boundary)};
    return SWCLI_BOOL_SWITCH(state != nullptr, STORE,
                             [&] { return affine_dense<A, R, STORE>(pr, S, k, out, mode, stream); });
  });
}

// ---------------------------------------------------------------------------------------------------
// Codes

inline constexpr int kAffineRelayWarps = 16;

// The columns per lane of the sweep a pair of a codes kernel of R columns per lane starts with: 4 in the
// scaled sweep where it cannot hold 8 (affine_wide_scaled).
template <int R, int MODE>
__device__ __forceinline__ int affine_sweep_columns(int bias, float wide_bits) {
  return R == 8 && MODE == kShared && bias >= 0 && !affine_wide_scaled(bias, wide_bits) ? 4 : R;
}

// The codes of one pair, one warp: scaled where the block staged the powers (bias >= 0), else log space.
template <int R, int MODE>
__device__ void affine_codes_pair(const Pair& p, Codes<R>& src, const float* shared_p, int bias, float wide_bits,
                                  const AffineConsts<float>& k, const AffineOut<float>& out) {
  if constexpr (MODE == kShared && R >= 4) {
    if (bias >= 0 && affine_sweep_columns<R, MODE>(bias, wide_bits) == 4) {
      Codes<4> narrow = src.template columns<4>();
      affine_scaled_pair<true, 4>(p, narrow, shared_p, bias, k, out, src.M, src.N);
      return;
    }
    if (bias >= 0) {
      affine_scaled_pair<true, R>(p, src, shared_p, bias, k, out, src.M, src.N);
      return;
    }
  }
  affine_pair<float, R, MODE, false>(p, src, k, out, src.M, src.N);
}

// As forward_codes_kernel: a minimum of blocks per SM, so that ptxas takes the registers it needs.
template <int R, int MODE>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock, 4)
    affine_codes_kernel(Codes<R> src, const float* matrix, AffineConsts<float> k, AffineOut<float> out,
                        const int64_t* qlen, const int64_t* tlen, const int64_t* order, int64_t B, Scaled sc,
                        float wide_bits) {
  extern __shared__ float shared_matrix[];
  const int bias = stage_matrix<R >= 4 && MODE == kShared>(shared_matrix, matrix, src.K, sc);
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  src.matrix = shared_matrix;
  const Pair p = oriented(b, int(qlen ? qlen[b] : src.M), int(tlen ? tlen[b] : src.N),
                          affine_sweep_columns<R, MODE>(bias, wide_bits));
  affine_codes_pair<R, MODE>(p, src, shared_matrix + src.K * src.K, bias, wide_bits, k, out);
}

// The first `coop` blocks each take one of the longest pairs (first in `order`) and share its tiles
// through a Relay of (H, X) columns; the other blocks give one warp to each pair.
template <int R, int MODE>
__global__ void __launch_bounds__(kWarp* kAffineRelayWarps, 1)
    affine_codes_relay_kernel(Codes<R> src, const float* matrix, AffineConsts<float> k, AffineOut<float> out,
                              float2* relay, const int64_t* qlen, const int64_t* tlen, const int64_t* order,
                              int64_t B, const int64_t* coop_count, Scaled sc, float wide_bits) {
  extern __shared__ float shared_matrix[];
  __shared__ int done[kAffineRelayWarps];
  __shared__ float warp_best[kAffineRelayWarps];
  if (threadIdx.x < kAffineRelayWarps) done[threadIdx.x] = 0;
  const int bias = stage_matrix<MODE == kShared>(shared_matrix, matrix, src.K, sc);  // also the barrier for done
  src.matrix = shared_matrix;
  const float* const shared_p = shared_matrix + src.K * src.K;
  const int warp = threadIdx.x / kWarp;
  const int64_t coop = *coop_count;
  if (blockIdx.x < coop) {  // the same for the whole block
    const int64_t b = order[blockIdx.x];
    const int columns = affine_sweep_columns<R, MODE>(bias, wide_bits);
    const Pair p = oriented(b, int(qlen[b]), int(tlen[b]), columns);
    const Relay<float2, kAffineRelayWarps> handoff{relay + int64_t(blockIdx.x) * (kAffineRelayWarps + 1) * src.M,
                                                   src.M, p.qn, done};
    float best;
    int64_t unused;
    bool scored = false;
    Codes<4> narrow = src.template columns<4>();
    if (MODE == kShared && bias >= 0) {
      const bool ok = columns == R ? affine_codes_scaled<R>(p, src, shared_p, bias, k, handoff, warp,
                                                            kAffineRelayWarps, best)
                                   : affine_codes_scaled<4>(p, narrow, shared_p, bias, k, handoff, warp,
                                                            kAffineRelayWarps, best);
      scored = __syncthreads_and(ok);  // every warp is past the pair: the relay counts can start again
      if (!scored) {
        if (threadIdx.x < kAffineRelayWarps) done[threadIdx.x] = 0;
        __syncthreads();
      }
    }
    if (!scored) {
      if (columns == R)
        affine_tiles<float, R, MODE, false>(p, src, k, out, src.M, src.N, handoff, warp, kAffineRelayWarps, best,
                                            unused);
      else
        affine_tiles<float, 4, MODE, false>(p, narrow, k, out, src.M, src.N, handoff, warp, kAffineRelayWarps, best,
                                            unused);
    }
    if (threadIdx.x % kWarp == 0) warp_best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kAffineRelayWarps; ++w) best = max_nan(best, warp_best[w]);
      out.scores[b] = best;
    }
    return;
  }
  const int64_t slot = coop + (int64_t(blockIdx.x) - coop) * kAffineRelayWarps + warp;
  if (slot >= B) return;
  const int64_t b = order[slot];
  const Pair p = oriented(b, int(qlen[b]), int(tlen[b]), affine_sweep_columns<R, MODE>(bias, wide_bits));
  affine_codes_pair<R, MODE>(p, src, shared_p, bias, wide_bits, k, out);
}

struct AffineCodesCall {
  const Problem& pr;
  const uint8_t* query;
  int64_t query_stride;
  const uint8_t* target;
  const float* matrix;
  int K;
  AffineConsts<float> k;
  AffineOut<float> out;
  Scaled sc;         // the scaled sweep's settings (allowed: the powers are staged)
  float wide_bits;   // log2(1 / O) + log2(1 / E), for affine_wide_scaled
  size_t smem;       // the matrix, and for the scaled sweep its two tables of powers
  cudaStream_t stream;
};

template <int R>
Codes<R> affine_codes_source(const AffineCodesCall& call) {
  Codes<R> src{};
  src.query = call.query, src.target = call.target, src.M = call.pr.M, src.N = call.pr.N, src.K = call.K;
  src.query_stride = call.query_stride;
  return src;
}

template <int R, int MODE>
cudaError_t launch_affine_codes(const AffineCodesCall& call) {
  if (call.smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(affine_codes_kernel<R, MODE>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(call.smem));
    if (err != cudaSuccess) return err;
  }
  affine_codes_kernel<R, MODE><<<blocks_for(call.pr.B), kWarp * kWarpsPerBlock, call.smem, call.stream>>>(
      affine_codes_source<R>(call), call.matrix, call.k, call.out, call.pr.qlen, call.pr.tlen, call.pr.order,
      call.pr.B, call.sc, call.wide_bits);
  return cudaGetLastError();
}

template <int R, int MODE>
cudaError_t launch_affine_codes_relay(const AffineCodesCall& call, const Relaying& relaying) {
  if (call.smem > 48 * 1024 - 128) {
    const cudaError_t err = cudaFuncSetAttribute(affine_codes_relay_kernel<R, MODE>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(call.smem));
    if (err != cudaSuccess) return err;
  }
  const Problem& pr = call.pr;
  const int64_t grid = relaying.max_coop + (pr.B + kAffineRelayWarps - 1) / kAffineRelayWarps;
  affine_codes_relay_kernel<R, MODE><<<unsigned(grid), kWarp * kAffineRelayWarps, call.smem, call.stream>>>(
      affine_codes_source<R>(call), call.matrix, call.k, call.out, reinterpret_cast<float2*>(relaying.relay), pr.qlen,
      pr.tlen, pr.order, pr.B, relaying.coop_count, call.sc, call.wide_bits);
  return cudaGetLastError();
}

}  // namespace
}  // namespace swcli_cuda

int sw_cuda_affine_relay_warps() { return swcli_cuda::kAffineRelayWarps; }

int64_t sw_cuda_affine_state_size(int64_t B, int64_t M, int64_t N, int lane_columns) {
  return 3 * B * M * swcli_cuda::table_columns(N, lane_columns);
}

cudaError_t sw_cuda_affine_forward_f32(const Problem& pr, const float* S, float* scores, float* state,
                                       int64_t* best_at, float* boundary, double gap_open, double gap_extend,
                                       double t, int lane_columns, cudaStream_t stream) {
  return swcli_cuda::affine_dense_any<float>(pr, S, scores, state, best_at, boundary, gap_open, gap_extend, t,
                                             lane_columns, stream);
}

cudaError_t sw_cuda_affine_forward_f64(const Problem& pr, const double* S, double* scores, double* state,
                                       int64_t* best_at, double* boundary, double gap_open, double gap_extend,
                                       double t, int lane_columns, cudaStream_t stream) {
  return swcli_cuda::affine_dense_any<double>(pr, S, scores, state, best_at, boundary, gap_open, gap_extend, t,
                                              lane_columns, stream);
}

cudaError_t sw_cuda_affine_forward_codes(const Problem& pr, const uint8_t* query, int64_t query_stride,
                                         const uint8_t* target, const float* matrix, int K, float* scores,
                                         float* boundary, double gap_open, double gap_extend, double t,
                                         int lane_columns, cudaStream_t stream, const Relaying* relaying,
                                         int64_t shared_limit) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  const int mode = affine_mode<float>(gap_open, t);
  size_t smem = sizeof(float) * size_t(K) * size_t(K);
  // The scaled sweep (the shared form, 4 or 8 columns per lane) needs two tables of powers beside the matrix.
  const Scaled sc = scaled_settings(gap_open, t, mode == kShared && lane_columns >= 4 &&
                                                     int64_t(3 * smem) + 1024 <= shared_limit);
  if (sc.allowed) smem *= 3;
  const AffineCodesCall call{pr,
                             query,
                             query_stride,
                             target,
                             matrix,
                             K,
                             affine_consts<float>(gap_open, gap_extend, t),
                             AffineOut<float>{scores, nullptr, 0, nullptr, reinterpret_cast<float2*>(boundary)},
                             sc,
                             float(-(gap_open + gap_extend) * sc.c),
                             smem,
                             stream};
  return SWCLI_COLUMNS_1_4_8_SWITCH(lane_columns, R, [&] {
    return SWCLI_AFFINE_MODE_SWITCH(mode, MODE, [&] {
      if constexpr (R >= 4) {
        if (relaying) return launch_affine_codes_relay<R, MODE>(call, *relaying);
      }
      return launch_affine_codes<R, MODE>(call);
    });
  });
}
