// The forward of dense score matrices S (B, M, N), float or double: one warp per pair, 1 or 4 columns per
// lane, with or without the DP table for the backward (STORE). Float at t > 0 without the table takes the
// scaled sweeps (forward_scaled.cuh), everything else the log-space one (forward_log.cuh).
#include "dispatch.cuh"
#include "forward_scaled.cuh"

namespace swcli_cuda {
namespace {

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

// What every forward kernel of a call takes.
template <typename A>
struct DenseCall {
  const Problem& pr;
  const A* S;
  Consts<A> k;
  Outputs<A> out;
  Scaled sc;
  int* log_pairs;
  cudaStream_t stream;
};

// forward_kernel with the score source Source.
template <typename A, int R, bool SOFT, bool STORE, class Source>
cudaError_t launch_forward(const DenseCall<A>& call) {
  const Problem& pr = call.pr;
  Source src{};
  src.S = call.S, src.M = pr.M, src.N = pr.N;
  forward_kernel<A, R, SOFT, STORE><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, call.stream>>>(
      src, call.k, call.out, pr.qlen, pr.tlen, pr.order, pr.B, pr.M, pr.N, call.sc, call.log_pairs);
  return cudaGetLastError();
}

template <typename A, int R, bool STORE>
cudaError_t launch_dense(const Problem& pr, const A* S, A* scores, A* table, int64_t* best_at, A* boundary,
                         double gap, double t, bool allow_scaled, int* log_pairs, cudaStream_t stream) {
  const Scaled sc = scaled_settings(gap, t, allow_scaled && sizeof(A) == 4 && (R == 4 || R == 1) && !STORE);
  const DenseCall<A> call{pr, S, consts<A>(gap, t), Outputs<A>{scores, table, best_at, boundary}, sc, log_pairs,
                          stream};
  return SWCLI_BOOL_SWITCH(t > 0, SOFT, [&] {
    if constexpr (sizeof(A) == 4 && R == 4) {
      if (pr.N % 4 == 0 && reinterpret_cast<uintptr_t>(S) % 16 == 0) {
        // Groups of 8 where the step is short (t = 0, the scaled sweep) or shares the memory with the
        // table's stores; 4 for the log-space t > 0 step (see DenseGroups in sources.cuh).
        if constexpr (SOFT && !STORE) {
          if (!sc.allowed) return launch_forward<A, R, SOFT, STORE, DenseGroups<4>>(call);
        }
        return launch_forward<A, R, SOFT, STORE, DenseGroups<8>>(call);
      }
    }
    if constexpr (sizeof(A) == 4 && R == 1)
      return launch_forward<A, R, SOFT, STORE, DenseBlocks<A>>(call);
    else
      return launch_forward<A, R, SOFT, STORE, DenseDirect<A, R, source_depth(R, STORE)>>(call);
  });
}

template <typename A>
cudaError_t forward_any(const Problem& pr, const A* S, A* scores, A* table, int64_t* best_at, A* boundary,
                        double gap, double t, int lane_columns, bool scaled, int* log_pairs, cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  return SWCLI_COLUMNS_1_4_SWITCH(lane_columns, R, [&] {
    return SWCLI_BOOL_SWITCH(table != nullptr, STORE, [&] {
      // A forward that keeps the table takes no scaled sweep, so it has no pairs to count.
      return launch_dense<A, R, STORE>(pr, S, scores, table, best_at, boundary, gap, t, !STORE && scaled,
                                       STORE ? nullptr : log_pairs, stream);
    });
  });
}

}  // namespace
}  // namespace swcli_cuda

int sw_cuda_tile_columns(int lane_columns) { return swcli_cuda::kWarp * lane_columns; }

int64_t sw_cuda_table_columns(int64_t N, int lane_columns) { return swcli_cuda::table_columns(N, lane_columns); }

cudaError_t sw_cuda_forward_f32(const Problem& pr, const float* S, float* scores, float* table,
                                int64_t* best_at, float* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream, bool scaled, int* log_pairs) {
  return swcli_cuda::forward_any<float>(pr, S, scores, table, best_at, boundary, gap, t, lane_columns, scaled,
                                        log_pairs, stream);
}

cudaError_t sw_cuda_forward_f64(const Problem& pr, const double* S, double* scores, double* table,
                                int64_t* best_at, double* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream) {
  return swcli_cuda::forward_any<double>(pr, S, scores, table, best_at, boundary, gap, t, lane_columns, false,
                                         nullptr, stream);
}
