// The C entry points of the emulated tiles of long pairs (tests/cuda_emulation/emulate.py), over engine.h.
#include "engine.h"

extern "C" {
int64_t emu_state_floats(int64_t B, int64_t M, int64_t N) { return sw_cuda_long_state_floats(B, M, N); }
int64_t emu_tiles(int64_t B, int64_t M, int64_t N) { return sw_cuda_long_tiles(B, M, N); }
int64_t emu_flow_floats(int64_t B, int64_t M, int64_t N) { return sw_cuda_long_flow_floats(B, M, N); }
int emu_forward(int64_t B, int64_t M, int64_t N, const int64_t* qlen, const int64_t* tlen, const float* S,
                float* scores, int64_t* best_at, float* state, float* tile_best, int64_t* tile_at, int* log_pairs,
                double gap, double t) {
  const Problem pr{B, M, N, qlen, tlen, nullptr};
  return sw_cuda_long_forward(pr, S, scores, best_at, state, tile_best, tile_at, log_pairs, gap, t, nullptr);
}
int emu_backward(int64_t B, int64_t M, int64_t N, const int64_t* qlen, const int64_t* tlen, const float* grad,
                 const float* S, const float* state, const int64_t* best_at, float* grad_S, float* flows, double gap,
                 double t) {
  const Problem pr{B, M, N, qlen, tlen, nullptr};
  return sw_cuda_long_backward(pr, grad, S, state, best_at, grad_S, flows, gap, t, nullptr);
}
}
