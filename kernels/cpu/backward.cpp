// The CPU backward. The forward stores the DP table H; a per-pair reverse sweep from the best cell
// pushes d score / d H back through the softmax (t > 0) or argmax (t = 0) weights of every cell, which
// is the gradient autograd gives through the reference loop.
#include "backward.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "simd.h"
#include "sources.h"

namespace swcli_cpu {

namespace {

// Per-thread rows of the reverse sweep (see backward_pair_soft), each padded by a vector for the loads.
template <typename T>
struct BackwardRows {
  std::vector<T> w1, w2, w3, w1_below, w2_below, e, e_below, scores;
  void resize(int64_t n) {
    const size_t size = static_cast<size_t>(n + 2 + Lanes<T>::L);
    for (auto* v : {&w1, &w2, &w3, &w1_below, &w2_below, &e, &e_below, &scores}) v->assign(size, T(0));
  }
};

// The reverse sweep at t = 0: E[i][j] = d score / d H[i][j] is 0 but on the best alignment, so each cell
// with E pushes it to the one term that was maximal, the first in the reference's order (zero, match,
// delete, insert), and every other cell is skipped. Returns what flowed along gap edges (d score / d gap).
template <typename T>
T backward_pair_hard(const Problem& pr, const DenseSource<T>& S, const T* H, int64_t b, T grad, T gap,
                     T* grad_S, std::vector<T>& E) {
  const PairGradient<T> p(pr, S, H, grad_S, b);
  const int64_t q = p.q, n = p.n, ld = p.ld, bi = p.bi, bj = p.bj;
  const T *Hb = p.H, *Sb = p.S;
  T* Gb = p.G;
  E.assign((q + 1) * (n + 1), T(0));
  E[bi * (n + 1) + bj] = grad;
  T through_gaps = T(0);
  for (int64_t i = bi; i >= 1; --i) {
    for (int64_t j = bj; j >= 1; --j) {  // nothing flows to larger i or j
      const T e = E[i * (n + 1) + j];
      if (e == T(0)) continue;
      const T h = Hb[i * ld + j];
      const T s = Sb[(i - 1) * S.sM + (j - 1) * S.sN];
      const T x1 = Hb[(i - 1) * ld + j - 1] + s;
      const T x2 = Hb[(i - 1) * ld + j] + gap;
      const T x3 = Hb[i * ld + j - 1] + gap;
      const bool take1 = h != T(0) && x1 == h;
      const bool take2 = h != T(0) && !take1 && x2 == h;
      const bool take3 = h != T(0) && !take1 && !take2 && x3 == h;
      const T w1 = take1, w2 = take2, w3 = take3;
      Gb[(i - 1) * pr.N + (j - 1)] = e * w1;
      E[(i - 1) * (n + 1) + j - 1] += e * w1;
      E[(i - 1) * (n + 1) + j] += e * w2;
      E[i * (n + 1) + j - 1] += e * w3;
      through_gaps += e * (w2 + w3);
    }
  }
  return through_gaps;
}

// The reverse sweep at t > 0: E[i][j] = d score / d H[i][j]; each cell hands E on to the cells it was
// computed from, weighted by the softmax of its terms. Row by row from the best cell's up, each cell pulls
// what it receives:
//
//     E[i][j] = E[i+1][j+1] w_match(i+1, j+1) + E[i+1][j] w_delete(i+1, j) + E[i][j+1] w_insert(i, j+1)
//
// A row's weights depend on H and S alone, so they are computed for the whole row on vectors (the 3
// exponentials of a cell dominate the cost); what is left along the row is one multiply-add a cell, the
// one serial chain. A cell whose E is 0 passes nothing on, whatever its weights (a NaN among them
// included), and the sums are added in the order in which a cell-by-cell push would add them.
// With count_gaps it returns d score / d gap, the sum over cells of E (w_delete + w_insert): each gap
// term holds the gap once (0 without count_gaps: the plain gradient pays nothing for it).
template <typename T>
T backward_pair_soft(const Problem& pr, const DenseSource<T>& S, const T* H, int64_t b, T grad, T gap,
                     T temperature, T* grad_S, BackwardRows<T>& rows, bool count_gaps) {
  using V = typename Lanes<T>::V;
  constexpr int L = Lanes<T>::L;
  const PairGradient<T> p(pr, S, H, grad_S, b);
  const int64_t ld = p.ld, bi = p.bi, bj = p.bj;
  const T *Hb = p.H, *Sb = p.S;
  T* Gb = p.G;
  if (bi == 0 || bj == 0) return T(0);  // the zero border: nothing flows into S
  const T log2e_t = static_cast<T>(log2e_over<T>(temperature));
  rows.resize(bj);
  T through_gaps = T(0);
  T *w1 = rows.w1.data(), *w2 = rows.w2.data(), *w3 = rows.w3.data(), *s = rows.scores.data();
  T *w1_below = rows.w1_below.data(), *w2_below = rows.w2_below.data();
  T *e = rows.e.data(), *e_below = rows.e_below.data();  // rows below the best cell's: E = 0
  const V g = splat<V>(gap);
  auto load = [](const T* at) {
    V v;
    __builtin_memcpy(&v, at, sizeof(V));
    return v;
  };
  auto store = [](T* at, V v) { __builtin_memcpy(at, &v, sizeof(V)); };
  for (int64_t i = bi; i >= 1; --i) {
    const T* here = Hb + i * ld;         // H[i][*]
    const T* above = Hb + (i - 1) * ld;  // H[i-1][*]
    for (int64_t j = 1; j <= bj; ++j) s[j] = Sb[(i - 1) * S.sM + (j - 1) * S.sN];
    // The weights of row i, j = 1 .. bj, a vector at a time (the last one from a padded copy).
    for (int64_t j = 1; j <= bj; j += L) {
      V h, left, up, diag, sv;
      if (j + L - 1 <= bj) {
        h = load(here + j), left = load(here + j - 1), up = load(above + j), diag = load(above + j - 1);
        sv = load(s + j);
      } else {
        T th[L], tl[L], tu[L], td[L];
        for (int l = 0; l < L; ++l) {
          const bool in = j + l <= bj;
          th[l] = in ? here[j + l] : T(0), tl[l] = in ? here[j + l - 1] : T(0);
          tu[l] = in ? above[j + l] : T(0), td[l] = in ? above[j + l - 1] : T(0);
        }
        h = load(th), left = load(tl), up = load(tu), diag = load(td), sv = load(s + j);
      }
      store(w1 + j, softmax_weight(diag + sv, h, log2e_t, temperature));
      store(w2 + j, softmax_weight(up + g, h, log2e_t, temperature));
      store(w3 + j, softmax_weight(left + g, h, log2e_t, temperature));
    }
    // What row i receives from the row below, then along the row from the right.
    for (int64_t j = 1; j <= bj; ++j) {
      const T from_diag = e_below[j + 1] != T(0) ? e_below[j + 1] * w1_below[j + 1] : T(0);
      e[j] = from_diag + (e_below[j] != T(0) ? e_below[j] * w2_below[j] : T(0));
    }
    if (i == bi) e[bj] += grad;  // the best cell: d score / d H of itself (nothing else reaches it)
    e[bj + 1] = T(0);
    T right = e[bj];  // E[i][j+1], in a register: the one serial chain of the row
    for (int64_t j = bj - 1; j >= 1; --j) {
      T v = e[j];
      if (right != T(0)) v += right * w3[j + 1];
      e[j] = v;
      right = v;
    }
    T* G = Gb + (i - 1) * pr.N - 1;  // G[j] is d score / d S[i-1][j-1]
    for (int64_t j = 1; j <= bj; ++j) G[j] = e[j] != T(0) ? e[j] * w1[j] : T(0);
    if (count_gaps)
      for (int64_t j = 1; j <= bj; ++j) through_gaps += e[j] != T(0) ? e[j] * (w2[j] + w3[j]) : T(0);
    std::swap(rows.e, rows.e_below), std::swap(rows.w1, rows.w1_below), std::swap(rows.w2, rows.w2_below);
    w1 = rows.w1.data(), w2 = rows.w2.data(), e = rows.e.data();
    w1_below = rows.w1_below.data(), w2_below = rows.w2_below.data(), e_below = rows.e_below.data();
  }
  return through_gaps;
}

}  // namespace

template <typename T>
void backward(const Problem& pr, const DenseSource<T>& S, const T* H, const T* grad, T gap, T temperature,
              T* grad_S, T* grad_gap) {
  at::parallel_for(0, pr.B, 1, [&](int64_t begin, int64_t end) {
    BackwardRows<T> buffers;
    std::vector<T> E;
    for (int64_t b = begin; b < end; ++b) {
      if (grad[b] == T(0)) continue;
      const T through_gaps =
          temperature == T(0)
              ? backward_pair_hard<T>(pr, S, H, b, grad[b], gap, grad_S, E)
              : backward_pair_soft<T>(pr, S, H, b, grad[b], gap, temperature, grad_S, buffers, grad_gap != nullptr);
      if (grad_gap != nullptr) grad_gap[b] = through_gaps;
    }
  });
}

template void backward<float>(const Problem&, const DenseSource<float>&, const float*, const float*, float, float,
                              float*, float*);
template void backward<double>(const Problem&, const DenseSource<double>&, const double*, const double*, double,
                               double, double*, double*);

}  // namespace swcli_cpu
