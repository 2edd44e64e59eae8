// The CPU backward: d score / d S from the forward's DP table H, a reverse sweep per pair through the
// softmax (t > 0) or argmax (t = 0) weights of every cell.
#pragma once

#include <cstdint>

#include "sources.h"

namespace swcli_cpu {

// grad_S (B, M, N), zero on entry, gets grad[b] * d score[b] / d S[b] for every pair with grad[b] != 0.
// H is the forward's table (B, M+1, N+1), contiguous. Instantiated in backward.cpp for float and double.
template <typename T>
void backward(const Problem& pr, const DenseSource<T>& S, const T* H, const T* grad, T gap, T temperature,
              T* grad_S);

}  // namespace swcli_cpu
