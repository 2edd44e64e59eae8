// Affine gaps (soft Gotoh) on the CPU: the log-space forward sweep and the backward, with an open score
// o for a gap's first position and an extension score e for each further one, o <= e <= 0:
//
//     M[i][j] = H[i-1][j-1] + S[i-1][j-1]
//     X[i][j] = smax(o, M[i][j-1] + o, Y[i][j-1] + o, X[i][j-1] + e)     a gap along the target
//     Y[i][j] = smax(o, M[i-1][j] + o, Y[i-1][j] + e, X[i-1][j] + o)     a gap along the query
//     H[i][j] = smax(0, M[i][j], Y[i][j], X[i][j])
//     borders H = 0, M = X = Y = -inf; score = the max over every cell of H
//
// smax is the soft maximum t log(sum exp(x / t)) at t > 0 and max at t = 0. X and Y are written as one
// smax of four terms, which equals swcli/reference.py's smax(smax(0, M, Y) + o, X + e): the same cell
// as the linear sweep's (max4 in simd.h), with the open score where the linear cell has its 0.
#pragma once

#include <cstdint>
#include <vector>

#include "sources.h"

namespace swcli_cpu {

template <typename T>
struct AffineGaps {
  T open;    // the score of a gap's first position
  T extend;  // the score of each further position
};

// The tables the forward keeps for the backward: H, X and Y of every pair, each (B, M+1, N+1) and
// contiguous. The caller fills them first with their borders (H = 0, X = Y = -inf), which the forward
// never writes: it writes each pair's cells inside its lengths. M is not kept: the backward takes it
// again from H and S, one add.
template <typename T>
struct AffineTables {
  T* H;
  T* X;
  T* Y;
};

// scores[p] of every pair (of `pairs` only, where given), and with tables (else null) their H, X and Y.
// Instantiated in affine_forward.cpp for DenseSource<float>, DenseSource<double> and CodeSource.
template <typename T, typename Source>
void affine_forward(const Problem& pr, const Source& prototype, AffineGaps<T> gaps, T temperature, T* scores,
                    const AffineTables<T>* tables, const std::vector<int64_t>* pairs = nullptr);

// What flowed along the gap edges of a pair: d score / d gap_open (the expected number of gap openings)
// and d score / d gap_extend (of extensions), each times the incoming gradient.
template <typename T>
struct AffineGapFlow {
  T open = T(0), extend = T(0);
};

// grad_S (B, M, N), zero on entry, gets grad[b] * d score[b] / d S[b] for every pair with grad[b] != 0,
// from the forward's tables; with grad_gaps (B,), zero on entry (else null), also what flowed along the
// gap edges. Instantiated in affine_backward.cpp for float and double.
template <typename T>
void affine_backward(const Problem& pr, const DenseSource<T>& S, const AffineTables<const T>& tables,
                     const T* grad, AffineGaps<T> gaps, T temperature, T* grad_S,
                     AffineGapFlow<T>* grad_gaps = nullptr);

}  // namespace swcli_cpu
