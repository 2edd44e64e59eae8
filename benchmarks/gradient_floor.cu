// The memory floor of a gradient that recomputes H from S: benchmarks/gradient_floor.py builds and times it.
// The loads and stores such a backward makes over dense float S (B, M, N), with no DP at all. One warp per
// pair, tiles of 128 columns (4 per lane), the backward's skewed order (lane k at row rows - 1 - (s - rank)),
// S loaded 8 rows ahead in registers, gradient rows written by groups of 8 lanes in whole 128-byte lines
// through a delay buffer in shared memory (as the DP table's backward writes them). MODE 0: read S and
// write the gradient; 1: read only; 2: write only.
#include <cuda_runtime.h>
#include <cstdint>

namespace {
constexpr int kWarp = 32, kWarps = 4, kDepth = 8, kDelay = 8;
constexpr unsigned kFull = 0xffffffffu;

template <int MODE>
__global__ void __launch_bounds__(kWarp* kWarps) floor_kernel(const float* S, float* grad, int64_t B, int M, int N) {
  const int64_t b = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (b >= B) return;
  const int lane = threadIdx.x % kWarp;
  __shared__ __align__(16) float4 delay_all[kWarps][kDelay][kWarp];
  float4 (*delay)[kWarp] = delay_all[threadIdx.x / kWarp];
  const float* Sb = S + b * M * N;
  float* Gb = grad + b * M * N;
  float acc = 0.0f;
  const int tiles = (N + 127) / 128;
  for (int tile = tiles - 1; tile >= 0; --tile) {
    const int col = tile * 128 + lane * 4;
    const int lanes = min(32, (N - tile * 128 + 3) / 4), rank = lanes - 1 - lane;
    const int steps = M + lanes - 1;
    float4 ring[kDepth];
    auto row_of = [&](int s) { return M - 1 - (s - rank); };
    auto fetch = [&](int s) {
      const int i = row_of(s);
      return MODE != 2 && rank >= 0 && unsigned(i) < unsigned(M)
                 ? __ldg(reinterpret_cast<const float4*>(Sb + int64_t(i) * N + col))
                 : make_float4(0.f, 0.f, 0.f, 0.f);
    };
#pragma unroll
    for (int d = 0; d < kDepth; ++d) ring[d] = fetch(d);
    for (int s0 = 0; s0 < steps; s0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int s = s0 + d, i = row_of(s);
        const float4 v = ring[d];
        ring[d] = fetch(s + kDepth);
        // a dependency through the warp, as the DP's: the neighbour's value of the step before
        acc = __shfl_down_sync(kFull, acc, 1) * 0.5f + (v.x + v.y + v.z + v.w);
        if (MODE != 1) {
          if (rank >= 0 && unsigned(i) < unsigned(M)) delay[i & (kDelay - 1)][lane] = make_float4(v.x + acc, v.y, v.z, v.w);
          __syncwarp();
          const int out_row = i + (lane & (kDelay - 1));
          if (rank >= 0 && unsigned(out_row) < unsigned(M) && s < steps)
            *reinterpret_cast<float4*>(Gb + int64_t(out_row) * N + col) = delay[out_row & (kDelay - 1)][lane];
          __syncwarp();
        }
      }
    }
  }
  if (MODE == 1 && acc == 12345.678f) Gb[lane] = acc;  // keeps the loads
}
}  // namespace

void gradient_floor(const float* S, float* grad, int64_t B, int M, int N, int mode, cudaStream_t stream) {
  const unsigned blocks = unsigned((B + kWarps - 1) / kWarps);
  if (mode == 0) floor_kernel<0><<<blocks, kWarp * kWarps, 0, stream>>>(S, grad, B, M, N);
  if (mode == 1) floor_kernel<1><<<blocks, kWarp * kWarps, 0, stream>>>(S, grad, B, M, N);
  if (mode == 2) floor_kernel<2><<<blocks, kWarp * kWarps, 0, stream>>>(S, grad, B, M, N);
}
