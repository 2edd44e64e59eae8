// The C entry points of the emulated soft search kernel (tests/cuda_emulation/emulate.py), over engine.h.
#include "engine.h"

extern "C" {
int64_t emu_search_soft_scratch_bytes(int64_t B, int64_t M, int64_t warps, int affine) {
  return sw_cuda_search_soft_scratch_bytes(B, M, warps, affine != 0);
}
// tl: t ln 2, as ops.cpp passes it (a score is t ln 2 times the best cell's log2).
int emu_search_soft(const uint8_t* query, int M, const uint8_t* target, int64_t N, int64_t B, const int64_t* tlen,
                    const float* powers, int K, int affine, float gap_factor, float extend_factor, int upper,
                    int middle, int floor, float bound, double tl, float* scores, int* flagged, void* scratch,
                    int warps) {
  const SearchSoftCall call{query, M,     target, N,      B,     tlen,   powers, K,       affine != 0, gap_factor,
                            extend_factor, upper, middle, floor, bound, tl, scores, scratch, flagged,     warps};
  return sw_cuda_search_soft(call, nullptr);
}
}
