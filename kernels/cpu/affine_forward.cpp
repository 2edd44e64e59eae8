// The affine forward sweep in log space, laid out as the linear one (forward_log.cpp): W lanes, one pair
// each, so the serial dependencies along a row (M, X, Y of the cell to the left) run in W independent
// chains at once; a lane takes the next pair of the longest-first queue as soon as its pair is done.
// A cell is three four-term soft maxima (X, Y, then H), so three times the linear cell's exp2 and log2.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

#include "affine.h"
#include "simd.h"
#include "sources.h"

namespace swcli_cpu {

namespace {

// One worker. Lane l is element l % L of pack l / L; row[j * kPacks + k] holds H, M, X and Y of cell
// [i-1][j] of pack k's lanes (each lane at its own row i) while row i is swept, which then replaces it.
template <typename T, bool Hard, typename Source>
void affine_worker(const Problem& pr, Source& source, const std::vector<int64_t>& queue, std::atomic<int64_t>& next,
                   AffineGaps<T> gaps, T temperature, T* scores, const AffineTables<T>* tables) {
  using V = typename Lanes<T>::V;
  using I = typename Lanes<T>::I;
  using Index = typename Lanes<T>::Index;
  constexpr int W = Lanes<T>::W, L = Lanes<T>::L;
  struct Above {
    V h, m, x, y;
  };
  const int64_t cols = queue.empty() ? 0 : pr.tlen[queue[0]];  // the longest target
  std::vector<Above> row((cols + 1) * kPacks);
  source.prepare(cols);
  const T minus_inf = -std::numeric_limits<T>::infinity();
  const V zero = splat<V>(T(0)), none = splat<V>(minus_inf);
  const V open = splat<V>(gaps.open), extend = splat<V>(gaps.extend);
  const T log2e_t = Hard ? T(0) : static_cast<T>(log2e_over<T>(temperature));
  const T back = temperature * T(0.69314718055994531);
  const int64_t stride_b = (pr.M + 1) * (pr.N + 1);
  int64_t pair[W], row_of[W];  // the lane's pair (-1 when idle) and its current row, 1-based
  I tv[kPacks];                // the lane's target length (0 when idle: every column masked)
  V best[kPacks];
  for (int k = 0; k < kPacks; ++k) best[k] = zero;
  int active = 0;
  auto take_next_pair = [&](int l) {
    pair[l] = next_pair(pr, queue, next, scores);
    tv[l / L][l % L] = pair[l] < 0 ? 0 : static_cast<Index>(pr.tlen[pair[l]]);
    if (pair[l] < 0) return;
    row_of[l] = 1;
    ++active;
    for (int64_t j = 0; j <= pr.tlen[pair[l]]; ++j) {  // row 0: H = 0, M = X = Y = -inf
      Above& a = row[j * kPacks + l / L];
      a.h[l % L] = T(0), a.m[l % L] = a.x[l % L] = a.y[l % L] = minus_inf;
    }
    source.start_pair(l, pair[l]);
  };
  for (int l = 0; l < W; ++l) take_next_pair(l);
  while (active > 0) {
    int64_t width = 0;  // columns any busy lane needs in this row
    for (int l = 0; l < W; ++l) {
      if (pair[l] < 0) continue;
      source.begin_row(l, pair[l], row_of[l] - 1);
      width = std::max(width, pr.tlen[pair[l]]);
    }
    // column 0 of row i: H[i-1][0] = 0 (the diagonal of column 1), M = X = Y = -inf
    V diag[kPacks], left_m[kPacks], left_x[kPacks], left_y[kPacks];
    for (int k = 0; k < kPacks; ++k) diag[k] = zero, left_m[k] = left_x[k] = left_y[k] = none;
    for (int64_t j = 1; j <= width; ++j) {
      const I column = splat<I>(static_cast<Index>(j));
#pragma GCC unroll 8
      for (int k = 0; k < kPacks; ++k) {
        Above& up = row[j * kPacks + k];
        const V m = diag[k] + source.load(j, k);
        const V x = max4<T, Hard>(open, left_m[k] + open, left_y[k] + open, left_x[k] + extend, log2e_t, back);
        const V y = max4<T, Hard>(open, up.m + open, up.y + extend, up.x + open, log2e_t, back);
        const V h = max4<T, Hard>(zero, m, y, x, log2e_t, back);
        diag[k] = up.h;
        up.h = h, up.m = m, up.x = x, up.y = y;
        left_m[k] = m, left_x[k] = x, left_y[k] = y;
        best[k] = column <= tv[k] ? nan_max(best[k], h) : best[k];
      }
    }
    for (int l = 0; l < W; ++l) {
      if (pair[l] < 0) continue;
      if (tables != nullptr) {
        const int64_t at = pair[l] * stride_b + row_of[l] * (pr.N + 1);
        T *H = tables->H + at, *X = tables->X + at, *Y = tables->Y + at;
        for (int64_t j = 1; j <= pr.tlen[pair[l]]; ++j) {
          const Above& a = row[j * kPacks + l / L];
          H[j] = a.h[l % L], X[j] = a.x[l % L], Y[j] = a.y[l % L];
        }
      }
      if (row_of[l]++ < pr.qlen[pair[l]]) continue;
      scores[pair[l]] = best[l / L][l % L];
      best[l / L][l % L] = T(0);
      --active;
      take_next_pair(l);
    }
  }
}

}  // namespace

template <typename T, typename Source>
void affine_forward(const Problem& pr, const Source& prototype, AffineGaps<T> gaps, T temperature, T* scores,
                    const AffineTables<T>* tables, const std::vector<int64_t>* pairs) {
  if (pairs != nullptr && pairs->empty()) return;
  const std::vector<int64_t> queue = pairs != nullptr ? longest_first(pr, *pairs) : longest_first(pr);
  in_workers<T>(queue, prototype, [&](Source& source, std::atomic<int64_t>& next, int64_t) {
    if (temperature == T(0))
      affine_worker<T, true>(pr, source, queue, next, gaps, temperature, scores, tables);
    else
      affine_worker<T, false>(pr, source, queue, next, gaps, temperature, scores, tables);
  });
}

template void affine_forward<float, DenseSource<float>>(const Problem&, const DenseSource<float>&, AffineGaps<float>,
                                                        float, float*, const AffineTables<float>*,
                                                        const std::vector<int64_t>*);
template void affine_forward<double, DenseSource<double>>(const Problem&, const DenseSource<double>&,
                                                          AffineGaps<double>, double, double*,
                                                          const AffineTables<double>*, const std::vector<int64_t>*);
template void affine_forward<float, CodeSource>(const Problem&, const CodeSource&, AffineGaps<float>, float, float*,
                                                const AffineTables<float>*, const std::vector<int64_t>*);

}  // namespace swcli_cpu
