// The C entry points of the emulated soft search kernel (tests/cuda_emulation/emulate.py), over engine.h.
#include "engine.h"

extern "C" {
int64_t emu_search_soft_edge_bytes(int64_t B, int64_t M, int64_t width, int affine) {
  return sw_cuda_search_soft_edge_bytes(B, M, width, affine != 0);
}
// tl: t ln 2, as ops.cpp passes it (a score is t ln 2 times the best cell's log2).
int emu_search_soft(const uint8_t* query, int M, const uint8_t* target, int64_t N, int64_t B, int64_t width,
                    const int64_t* tlen, const float* powers, int K, int affine, float gap_factor, float extend_factor,
                    int upper, int middle, int floor, float bound, double tl, float* scores, int* flagged,
                    void* boundary) {
  const SearchSoftCall call{query, M, target, N, B, width, tlen, powers, K, affine != 0, gap_factor, extend_factor,
                            upper, middle, floor, bound, tl, scores, boundary, flagged};
  return sw_cuda_search_soft(call, nullptr);
}
}
