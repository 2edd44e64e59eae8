// The affine backward: d score / d S from the forward's tables H, X and Y, per pair from its best cell.
// d score / d S[i-1][j-1] is the adjoint of M[i][j], the posterior of the match state there.
//
// t = 0: the gradient is the indicator of one optimal alignment's match cells, so it is a traceback:
// from the best cell, each state takes the first of its terms that equals it, in the order start, match,
// Y, X (swcli/reference.py stacks them so; for H that is the linear backward's zero, match, delete,
// insert), and the walk ends at a start or the border.
//
// t > 0: the adjoints E_H, E_X, E_Y, E_M, row by row upwards from the best cell's, each row right to
// left. A state's weight in a later state s is exp((its term in s - s) / t), so a row's nine weights
// (M, Y, X into H[i][j]; M, Y, X into X[i][j+1]; M, X, Y into Y[i+1][j]) depend on the tables and S
// alone and are computed on whole vectors; what is left in series is the chain of E_X along the row,
// one multiply-add a cell:
//
//     E_H[i][j] = E_M[i+1][j+1]                                      (+ the incoming gradient at the best cell)
//     E_X[i][j] = E_H[i][j] w(X -> H) + E_Y[i+1][j] w(X -> Y below) + E_X[i][j+1] w(X -> X right)
//     E_Y[i][j] = E_H[i][j] w(Y -> H) + E_Y[i+1][j] w(Y -> Y below) + E_X[i][j+1] w(Y -> X right)
//     E_M[i][j] = E_H[i][j] w(M -> H) + E_Y[i+1][j] w(M -> Y below) + E_X[i][j+1] w(M -> X right)
//
// A state whose E is 0 passes nothing on, whatever its weights (a NaN among them included).
//
// The gap scores' gradients (on request): a gap state's terms hold o once (start, M, the other gap) or e
// once (itself), and their weights sum to 1, so d score / d e is the adjoint that flows along extension
// edges, E_X[i][j+1] w(X -> X right) + E_Y[i+1][j] w(Y -> Y below) summed over the cells, and
// d score / d o is all that enters the gap states, the sum of E_X + E_Y, less that.
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "affine.h"
#include "backward.h"
#include "simd.h"
#include "sources.h"

namespace swcli_cpu {

namespace {

// One pair's tables, each with rows of ld values.
template <typename T>
struct PairTables {
  const T *H, *X, *Y;
  int64_t ld;
  T h(int64_t i, int64_t j) const { return H[i * ld + j]; }
  T x(int64_t i, int64_t j) const { return X[i * ld + j]; }
  T y(int64_t i, int64_t j) const { return Y[i * ld + j]; }
};

template <typename T>
PairTables<T> pair_tables(const Problem& pr, const AffineTables<const T>& tables, int64_t b) {
  const int64_t ld = pr.N + 1, at = b * (pr.M + 1) * ld;
  return {tables.H + at, tables.X + at, tables.Y + at, ld};
}

template <typename T>
AffineGapFlow<T> affine_pair_hard(const Problem& pr, const DenseSource<T>& S, const AffineTables<const T>& tables,
                                  int64_t b, T grad, AffineGaps<T> gaps, T* grad_S) {
  const PairGradient<T> p(pr, S, tables.H, grad_S, b);
  const PairTables<T> tb = pair_tables(pr, tables, b);
  const T o = gaps.open, e = gaps.extend;
  // M[i][j], the same float add as the forward's, and -inf on the border
  auto match = [&](int64_t i, int64_t j) {
    return i >= 1 && j >= 1 ? tb.h(i - 1, j - 1) + p.S[(i - 1) * S.sM + (j - 1) * S.sN]
                            : -std::numeric_limits<T>::infinity();
  };
  // the walk takes a match at cell (i, j): its gradient, then H of the cell diagonally above
  auto take_match = [&](int64_t& i, int64_t& j) {
    p.G[(i - 1) * pr.N + (j - 1)] = grad;
    --i, --j;
  };
  enum State { kH, kX, kY };
  State state = kH;
  AffineGapFlow<T> flow;  // the walk's gap openings and extensions, each worth grad
  int64_t i = p.bi, j = p.bj;
  while (i >= 1 && j >= 1) {
    if (state == kH) {
      const T h = tb.h(i, j);
      if (h == T(0)) break;  // the start
      if (match(i, j) == h) {
        take_match(i, j);
      } else if (tb.y(i, j) == h) {
        state = kY;
      } else if (tb.x(i, j) == h) {
        state = kX;
      } else {
        break;  // NaN
      }
    } else if (state == kX) {  // from column j-1
      const T x = tb.x(i, j);
      if (x == o) {
        flow.open += grad;
        break;
      }
      if (match(i, j - 1) + o == x) {  // the match state at (i, j-1), then H above-left of it
        --j, state = kH, flow.open += grad;
        take_match(i, j);
      } else if (tb.y(i, j - 1) + o == x) {
        --j, state = kY, flow.open += grad;
      } else if (tb.x(i, j - 1) + e == x) {
        --j, flow.extend += grad;
      } else {
        break;
      }
    } else {  // Y, from row i-1
      const T y = tb.y(i, j);
      if (y == o) {
        flow.open += grad;
        break;
      }
      if (match(i - 1, j) + o == y) {
        --i, state = kH, flow.open += grad;
        take_match(i, j);
      } else if (tb.y(i - 1, j) + e == y) {
        --i, flow.extend += grad;
      } else if (tb.x(i - 1, j) + o == y) {
        --i, state = kX, flow.open += grad;
      } else {
        break;
      }
    }
  }
  return flow;
}

// Per-thread rows of the soft sweep, each padded past the best cell's column by a vector and a column.
template <typename T>
struct AffineRows {
  enum {
    kH, kX, kY, kM, kXRight, kYBelow,                            // the states around the row's cells
    kHM, kHY, kHX, kXM, kXY, kXX, kYM, kYX, kYY,                 // the nine weights
    kEH, kEX, kEY, kEM, kEYBelow, kEMBelow,                       // the adjoints
    kCount
  };
  std::vector<T> data;
  int64_t size = 0;
  void resize(int64_t bj) {
    size = bj + 2 + 2 * Lanes<T>::L;
    data.assign(static_cast<size_t>(size * kCount), T(0));
  }
  T* operator[](int k) { return data.data() + k * size; }
};

template <typename T>
AffineGapFlow<T> affine_pair_soft(const Problem& pr, const DenseSource<T>& S, const AffineTables<const T>& tables,
                                  int64_t b, T grad, AffineGaps<T> gaps, T temperature, T* grad_S,
                                  AffineRows<T>& rows, bool count_gaps) {
  using V = typename Lanes<T>::V;
  using R = AffineRows<T>;
  constexpr int L = Lanes<T>::L;
  const PairGradient<T> p(pr, S, tables.H, grad_S, b);
  const int64_t bi = p.bi, bj = p.bj, n = p.n;
  if (bi == 0 || bj == 0) return {};  // the zero border: nothing flows into S
  const PairTables<T> tb = pair_tables(pr, tables, b);
  T into_gaps = T(0), extended = T(0);  // with count_gaps: the sums of E_X + E_Y and of the extension flows
  const T log2e_t = static_cast<T>(log2e_over<T>(temperature));
  rows.resize(bj);
  const int64_t padded = (bj + L - 1) / L * L;  // columns 1 .. padded, whole vectors
  T *h = rows[R::kH], *x = rows[R::kX], *y = rows[R::kY], *m = rows[R::kM];
  T *x_right = rows[R::kXRight], *y_below = rows[R::kYBelow];
  T *w_hm = rows[R::kHM], *w_hy = rows[R::kHY], *w_hx = rows[R::kHX];
  T *w_xm = rows[R::kXM], *w_xy = rows[R::kXY], *w_xx = rows[R::kXX];
  T *w_ym = rows[R::kYM], *w_yx = rows[R::kYX], *w_yy = rows[R::kYY];
  T *e_h = rows[R::kEH], *e_x = rows[R::kEX], *e_y = rows[R::kEY], *e_m = rows[R::kEM];
  T *e_y_below = rows[R::kEYBelow], *e_m_below = rows[R::kEMBelow];  // the row below the best cell's: 0
  const V o = splat<V>(gaps.open), e = splat<V>(gaps.extend), zero = splat<V>(T(0));
  auto load = [](const T* at) {
    V v;
    __builtin_memcpy(&v, at, sizeof(V));
    return v;
  };
  auto store = [](T* at, V v) { __builtin_memcpy(at, &v, sizeof(V)); };
  auto flow = [](T adjoint, T weight) { return adjoint != T(0) ? adjoint * weight : T(0); };
  auto flow_v = [&](V adjoint, V weight) { return adjoint != zero ? adjoint * weight : zero; };
  for (int64_t i = bi; i >= 1; --i) {
    // The states of row i and their neighbours, columns 1 .. bj; the padding stays 0. X[i][bj+1] and
    // Y[i+1][*] of the best cell's row lie past what flows (their E is 0), so they are read only where
    // they exist.
    for (int64_t j = 1; j <= bj; ++j) {
      h[j] = tb.h(i, j), x[j] = tb.x(i, j), y[j] = tb.y(i, j);
      m[j] = tb.h(i - 1, j - 1) + p.S[(i - 1) * S.sM + (j - 1) * S.sN];
      x_right[j] = j < n ? tb.x(i, j + 1) : T(0);
      y_below[j] = i < bi ? tb.y(i + 1, j) : T(0);
    }
    for (int64_t j = 1; j <= padded; j += L) {
      const V hv = load(h + j), xv = load(x + j), yv = load(y + j), mv = load(m + j);
      const V xr = load(x_right + j), yb = load(y_below + j);
      store(w_hm + j, softmax_weight(mv, hv, log2e_t, temperature));
      store(w_hy + j, softmax_weight(yv, hv, log2e_t, temperature));
      store(w_hx + j, softmax_weight(xv, hv, log2e_t, temperature));
      store(w_xm + j, softmax_weight(mv + o, xr, log2e_t, temperature));
      store(w_xy + j, softmax_weight(yv + o, xr, log2e_t, temperature));
      store(w_xx + j, softmax_weight(xv + e, xr, log2e_t, temperature));
      store(w_ym + j, softmax_weight(mv + o, yb, log2e_t, temperature));
      store(w_yx + j, softmax_weight(xv + o, yb, log2e_t, temperature));
      store(w_yy + j, softmax_weight(yv + e, yb, log2e_t, temperature));
      store(e_h + j, load(e_m_below + j + 1));
    }
    if (i == bi) e_h[bj] += grad;  // the best cell: d score / d H of itself (nothing else reaches it)
    // E_X along the row, right to left: the one serial chain
    e_x[bj + 1] = T(0);
    T right = T(0);
    for (int64_t j = bj; j >= 1; --j) {
      right = flow(e_h[j], w_hx[j]) + flow(e_y_below[j], w_yx[j]) + flow(right, w_xx[j]);
      e_x[j] = right;
    }
    for (int64_t j = 1; j <= padded; j += L) {
      const V eh = load(e_h + j), eyb = load(e_y_below + j), exr = load(e_x + j + 1);
      store(e_y + j, flow_v(eh, load(w_hy + j)) + flow_v(eyb, load(w_yy + j)) + flow_v(exr, load(w_xy + j)));
      store(e_m + j, flow_v(eh, load(w_hm + j)) + flow_v(eyb, load(w_ym + j)) + flow_v(exr, load(w_xm + j)));
    }
    // Past the best cell's column nothing flows: the padding's results are dropped.
    for (int64_t j = bj + 1; j <= padded + 1; ++j) e_y[j] = e_m[j] = T(0);
    T* G = p.G + (i - 1) * pr.N - 1;  // G[j] is d score / d S[i-1][j-1]
    for (int64_t j = 1; j <= bj; ++j) G[j] = e_m[j];
    if (count_gaps) {
      for (int64_t j = 1; j <= bj; ++j) {
        into_gaps += e_x[j] + e_y[j];
        extended += flow(e_x[j + 1], w_xx[j]) + flow(e_y_below[j], w_yy[j]);
      }
    }
    std::swap(e_y, e_y_below), std::swap(e_m, e_m_below);
  }
  return {into_gaps - extended, extended};
}

}  // namespace

template <typename T>
void affine_backward(const Problem& pr, const DenseSource<T>& S, const AffineTables<const T>& tables,
                     const T* grad, AffineGaps<T> gaps, T temperature, T* grad_S, AffineGapFlow<T>* grad_gaps) {
  at::parallel_for(0, pr.B, 1, [&](int64_t begin, int64_t end) {
    AffineRows<T> rows;
    for (int64_t b = begin; b < end; ++b) {
      if (grad[b] == T(0)) continue;
      const AffineGapFlow<T> flow =
          temperature == T(0)
              ? affine_pair_hard<T>(pr, S, tables, b, grad[b], gaps, grad_S)
              : affine_pair_soft<T>(pr, S, tables, b, grad[b], gaps, temperature, grad_S, rows, grad_gaps != nullptr);
      if (grad_gaps != nullptr) grad_gaps[b] = flow;
    }
  });
}

template void affine_backward<float>(const Problem&, const DenseSource<float>&, const AffineTables<const float>&,
                                     const float*, AffineGaps<float>, float, float*, AffineGapFlow<float>*);
template void affine_backward<double>(const Problem&, const DenseSource<double>&, const AffineTables<const double>&,
                                      const double*, AffineGaps<double>, double, double*, AffineGapFlow<double>*);

}  // namespace swcli_cpu
