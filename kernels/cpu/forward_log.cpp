// The log-space forward sweep. W lanes each align one pair, one SIMD lane per pair, so that the serial
// dependency along a row (H[i][j-1]) runs in W independent chains at once; the kPacks native vectors of
// a group are interleaved to hide latency. One worker per thread (at::parallel_for); a lane takes the
// next pair of a shared queue, sorted by target length, as soon as its pair is done.
#include "forward_log.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "simd.h"
#include "sources.h"

namespace swcli_cpu {

namespace {

// One worker: W lanes, each aligning one pair; a lane takes the next pair of the shared queue as soon as
// its pair is done, so lanes share the column loop (up to the longest target in flight) but not the row
// count, and a long query costs what it costs alone. The queue holds the pairs by decreasing target
// length: lanes in flight have similar targets, and the work left at the end is the smallest.
// Lane l is element l % L of pack l / L; row[j * kPacks + k] holds H[i][j] of pack k, each lane at its
// own row i.
template <typename T, bool Hard, typename Source>
void forward_worker(const Problem& pr, Source& source, const std::vector<int64_t>& queue,
                    std::atomic<int64_t>& next, T gap, T temperature, T* scores, T* dp_table) {
  using V = typename Lanes<T>::V;
  using I = typename Lanes<T>::I;
  using Index = typename Lanes<T>::Index;
  constexpr int W = Lanes<T>::W, L = Lanes<T>::L;
  const int64_t B = static_cast<int64_t>(queue.size());
  const int64_t cols = B ? pr.tlen[queue[0]] : 0;  // the longest target
  std::vector<V> row((cols + 1) * kPacks);
  source.prepare(cols);
  const V zero = splat<V>(T(0));
  const V g = splat<V>(gap);
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
    for (int64_t j = 0; j <= pr.tlen[pair[l]]; ++j) row[j * kPacks + l / L][l % L] = T(0);
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
    V diag[kPacks], left[kPacks];
    for (int k = 0; k < kPacks; ++k) diag[k] = left[k] = zero;
    for (int64_t j = 1; j <= width; ++j) {
      const I column = splat<I>(static_cast<Index>(j));
#pragma GCC unroll 8
      for (int k = 0; k < kPacks; ++k) {
        const V up = row[j * kPacks + k];
        const V h = cell<T, Hard>(diag[k] + source.load(j, k), up + g, left[k] + g, log2e_t, back);
        row[j * kPacks + k] = h;
        diag[k] = up;
        left[k] = h;
        best[k] = column <= tv[k] ? nan_max(best[k], h) : best[k];
      }
    }
    for (int l = 0; l < W; ++l) {
      if (pair[l] < 0) continue;
      if (dp_table != nullptr) {
        T* dst = dp_table + pair[l] * stride_b + row_of[l] * (pr.N + 1);
        for (int64_t j = 1; j <= pr.tlen[pair[l]]; ++j) dst[j] = row[j * kPacks + l / L][l % L];
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
void forward_pairs(const Problem& pr, const Source& prototype, const std::vector<int64_t>& queue, T gap,
                   T temperature, T* scores, T* dp_table) {
  in_workers<T>(queue, prototype, [&](Source& source, std::atomic<int64_t>& next, int64_t) {
    if (temperature == T(0))
      forward_worker<T, true>(pr, source, queue, next, gap, temperature, scores, dp_table);
    else
      forward_worker<T, false>(pr, source, queue, next, gap, temperature, scores, dp_table);
  });
}

template void forward_pairs<float, DenseSource<float>>(const Problem&, const DenseSource<float>&,
                                                       const std::vector<int64_t>&, float, float, float*, float*);
template void forward_pairs<double, DenseSource<double>>(const Problem&, const DenseSource<double>&,
                                                         const std::vector<int64_t>&, double, double, double*,
                                                         double*);
template void forward_pairs<float, CodeSource>(const Problem&, const CodeSource&, const std::vector<int64_t>&,
                                               float, float, float*, float*);

}  // namespace swcli_cpu
