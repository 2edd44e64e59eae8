// The forward of scores from uint8 codes (B, M), (B, N) looked up in a K x K substitution matrix held in
// shared memory: one warp per pair with 1, 4 or 8 columns per lane (forward_codes_kernel), or, for the
// longest pairs, a block of kRelayWarps warps per pair that relay its tiles (forward_codes_relay_kernel).
// At t > 0 with 4 or 8 columns per lane, pairs take the scaled sweep (forward_scaled.cuh) where the
// matrix allows it, else or where it fails the log-space one (forward_log.cuh).
#include "dispatch.cuh"
#include "forward_scaled.cuh"

namespace swcli_cuda {
namespace {

// Whether a block of the codes kernels with 8 columns per lane scales with them (see kWideLimit in
// forward_scaled.cuh); else it takes 4 columns per lane at t > 0. The same in every block: it depends on
// the matrix, t and gap.
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
// registers and spilled in the scaled sweep.
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
inline constexpr int kRelayWarps = 16;

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

// What every codes kernel of a call takes.
struct CodesCall {
  const Problem& pr;
  const uint8_t* query;
  int64_t query_stride;
  const uint8_t* target;
  const float* matrix;  // global memory, K x K
  int K;
  Consts<float> k;
  Outputs<float> out;
  Scaled sc;
  int* log_pairs;
  size_t smem;  // dynamic shared memory per block: the matrix, and for the scaled sweep its two tables
  cudaStream_t stream;
};

template <int R>
Codes<R> codes_source(const CodesCall& call) {
  Codes<R> src{};
  src.query = call.query, src.target = call.target, src.M = call.pr.M, src.N = call.pr.N, src.K = call.K;
  src.query_stride = call.query_stride;
  return src;
}

// One warp per pair.
template <int R, bool SOFT>
cudaError_t launch_codes(const CodesCall& call) {
  const Problem& pr = call.pr;
  if (call.smem > 48 * 1024) {  // past the default limit: ask for more (rare: K > 110, or K > 64 scaled)
    cudaError_t err = cudaFuncSetAttribute(forward_codes_kernel<R, SOFT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(call.smem));
    if (err != cudaSuccess) return err;
  }
  forward_codes_kernel<R, SOFT><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, call.smem, call.stream>>>(
      codes_source<R>(call), call.matrix, call.k, call.out, pr.qlen, pr.tlen, pr.order, pr.B, call.sc,
      call.log_pairs);
  return cudaGetLastError();
}

// The longest pairs relayed by blocks of kRelayWarps warps, the others one warp per pair.
template <int R, bool SOFT>
cudaError_t launch_codes_relay(const CodesCall& call, const Relaying& relaying) {
  const Problem& pr = call.pr;
  if (call.smem > 48 * 1024 - 64) {
    cudaError_t err = cudaFuncSetAttribute(forward_codes_relay_kernel<R, SOFT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(call.smem));
    if (err != cudaSuccess) return err;
  }
  // at most max_coop blocks relay; the rest hold kRelayWarps pairs each
  const int64_t grid = relaying.max_coop + (pr.B + kRelayWarps - 1) / kRelayWarps;
  forward_codes_relay_kernel<R, SOFT><<<unsigned(grid), kWarp * kRelayWarps, call.smem, call.stream>>>(
      codes_source<R>(call), call.matrix, call.k, call.out, relaying.relay, pr.qlen, pr.tlen, pr.order, pr.B,
      relaying.coop_count, call.sc, call.log_pairs);
  return cudaGetLastError();
}

}  // namespace
}  // namespace swcli_cuda

int sw_cuda_relay_warps() { return swcli_cuda::kRelayWarps; }

cudaError_t sw_cuda_forward_codes(const Problem& pr, const uint8_t* query, int64_t query_stride, const uint8_t* target,
                                  const float* matrix, int K, float* scores, float* boundary, double gap,
                                  double t, int lane_columns, cudaStream_t stream, const Relaying* relaying,
                                  bool allow_scaled, int* log_pairs, int64_t shared_limit) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  size_t smem = sizeof(float) * K * K;
  // The scaled sweep (t > 0, 4 or 8 columns per lane) needs two tables of powers beside the matrix.
  const Scaled sc = scaled_settings(gap, t, allow_scaled && lane_columns >= 4 &&
                                                int64_t(3 * smem) + 1024 <= shared_limit);
  if (sc.allowed) smem *= 3;
  const CodesCall call{pr, query, query_stride, target, matrix, K, consts<float>(gap, t),
                       Outputs<float>{scores, nullptr, nullptr, boundary}, sc, log_pairs, smem, stream};
  // 1-column lanes never relay.
  return SWCLI_COLUMNS_1_4_8_SWITCH(lane_columns, R, [&] {
    return SWCLI_BOOL_SWITCH(t > 0, SOFT, [&] {
      if constexpr (R >= 4) {
        if (relaying) return launch_codes_relay<R, SOFT>(call, *relaying);
      }
      return launch_codes<R, SOFT>(call);
    });
  });
}
