// The host's scheduling aids: the work of each pair, the key of the longest-first order (pair_work_kernel),
// how many of the longest pairs the codes kernels relay (coop_count_kernel, forward_codes.cu), and an empty
// kernel, the launch-overhead yardstick of `swcli bench`.
#include "common.cuh"

namespace swcli_cuda {
namespace {

__global__ void empty_kernel() {}

// The key of the longest-first order: rows x column tiles of each pair, as the kernels orient it (codes:
// see transposes; R is the kernel's, so where a codes kernel of 8 takes 4 the orientation may differ).
// int32, clamped: an order, not a count.
__global__ void pair_work_kernel(Problem pr, int R, bool codes, int64_t tile, int* work) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= pr.B) return;
  const int q = int(pr.qlen ? pr.qlen[b] : pr.M), t = int(pr.tlen ? pr.tlen[b] : pr.N);
  const Pair p = codes ? oriented(b, q, t, R) : Pair{b, q, t};
  const int64_t w = p.qn * ((p.tn + tile - 1) / tile);
  work[b] = int(w < INT32_MAX ? w : INT32_MAX);
}

// How many of the first max_coop pairs in `order` have at least min_work (a prefix: the order sorts by
// work, descending); one block.
__global__ void coop_count_kernel(const int* work, const int64_t* order, int64_t max_coop, int min_work,
                                  int64_t* count) {
  __shared__ int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  int mine = 0;
  for (int64_t x = threadIdx.x; x < max_coop; x += blockDim.x) mine += work[order[x]] >= min_work;
  atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0) *count = total;
}

}  // namespace
}  // namespace swcli_cuda

cudaError_t sw_cuda_pair_work(const Problem& pr, int lane_columns, bool codes, int64_t tile_columns, int* work,
                              cudaStream_t stream) {
  if (pr.B == 0) return cudaSuccess;
  constexpr int threads = 256;
  swcli_cuda::pair_work_kernel<<<unsigned((pr.B + threads - 1) / threads), threads, 0, stream>>>(
      pr, lane_columns, codes, tile_columns, work);
  return cudaGetLastError();
}

cudaError_t sw_cuda_coop_count(const int* work, const int64_t* order, int64_t max_coop, int min_work,
                               int64_t* count, cudaStream_t stream) {
  swcli_cuda::coop_count_kernel<<<1, 256, 0, stream>>>(work, order, max_coop, min_work, count);
  return cudaGetLastError();
}

cudaError_t sw_cuda_empty(cudaStream_t stream) {
  swcli_cuda::empty_kernel<<<1, swcli_cuda::kWarp, 0, stream>>>();
  return cudaGetLastError();
}
