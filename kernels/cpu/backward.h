// The CPU backward: d score / d S from the forward's DP table H, a reverse sweep per pair through the
// softmax (t > 0) or argmax (t = 0) weights of every cell.
#pragma once

#include <cstdint>

#include "sources.h"

namespace swcli_cpu {

// One pair's part of a backward: its H (rows of ld values), S and gradient, and its best cell (bi, bj),
// the first maximal cell of H in row-major order, as torch.max picks it (a NaN first). Shared by the
// linear and the affine backward (affine.h), whose tables of H have the same layout.
template <typename T>
struct PairGradient {
  int64_t q, n, ld, bi = 0, bj = 0;
  const T* H;
  const T* S;
  T* G;
  PairGradient(const Problem& pr, const DenseSource<T>& scores, const T* table, T* grad_S, int64_t b)
      : q(pr.qlen[b]), n(pr.tlen[b]), ld(pr.N + 1), H(table + b * (pr.M + 1) * ld), S(scores.S + b * scores.sB),
        G(grad_S + b * pr.M * pr.N) {
    T best = H[0];
    for (int64_t i = 0; i <= q; ++i) {
      const T* h_row = H + i * ld;
      for (int64_t j = 0; j <= n; ++j) {
        const T h = h_row[j];
        if (h > best || (h != h && best == best)) bi = i, bj = j, best = h;
      }
    }
  }
};

// grad_S (B, M, N), zero on entry, gets grad[b] * d score[b] / d S[b] for every pair with grad[b] != 0.
// H is the forward's table (B, M+1, N+1), contiguous. With grad_gap (B,), zero on entry (else null), it
// also gets grad[b] * d score[b] / d gap: the adjoint that flows along the gap edges, which is the
// expected number of gap positions of the soft alignment (of the best alignment at t = 0). Instantiated
// in backward.cpp for float and double.
template <typename T>
void backward(const Problem& pr, const DenseSource<T>& S, const T* H, const T* grad, T gap, T temperature,
              T* grad_S, T* grad_gap = nullptr);

}  // namespace swcli_cpu
