// The C entry points of the emulated exact search kernel (tests/cuda_emulation/emulate.py), over engine.h.
#include "common.cuh"
#include "engine.h"

extern "C" {
// The search kernels' columns a lane for a warp (common.cuh), which swcli.search.warp_columns mirrors.
int emu_warp_columns(int G, int widest, int most, int step, int fewest) {
  return swcli_cuda::warp_columns(G, widest, most, step, fewest);
}
int64_t emu_search_s16_edge_bytes(int64_t B, int64_t M, int64_t N, int affine) {
  return sw_cuda_search_s16_edge_bytes(B, M, N, affine != 0);
}
int emu_search_s16(const uint8_t* query, int M, const uint8_t* target, int64_t N, int64_t B, const int64_t* tlen,
                   const unsigned* table, int K, int gap_open, int gap_extend, int limit, int* scores, int* overflows,
                   void* boundary) {
  const SearchS16Call call{query, M, target, N, B, tlen, table, K, gap_open, gap_extend, limit, scores, boundary,
                           overflows};
  return sw_cuda_search_s16(call, nullptr);
}
}
