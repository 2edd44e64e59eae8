// The scaled forward sweep (float at t > 0). With E = 2^(H c), c = log2(e) / t,
// the recurrence is a sum of products, as in the CUDA engine's scaled sweep:
//
//     E[i][j] = 1 + E[i-1][j-1] P[i][j] + (E[i-1][j] + E[i][j-1]) G,   P = 2^(S c), G = 2^(gap c)
//
// two fused multiply-adds and an add a cell, against the log-space cell's 3 exp2 and 1 log2 polynomials
// and its sorting network. P is a gather from a table of 2^(m c) (scores from codes) or one exp2
// polynomial (dense scores). E overflows a float within a few dozen cells of a good alignment, so a
// lane keeps its values scaled per block of kScaledBlock columns: E = stored 2^sigma, and after each row
// the block's sigma takes the exponent of its largest value, which leaves that value in
// [2^top, 2^(top+1)), top = kScaledTop (the CUDA engine's). The left and diagonal values that cross into
// the next block are converted to its scale by powers of 2. Columns past a lane's target copy their
// left neighbour, so that they count neither for a block's scale nor for the best cell; a block wholly
// past the target keeps the scale of the values it copies.
//
// The sums have no cancellation, so this is at least as accurate as the log-space cell. What it cannot
// hold is a spread of more than about 2^(top+100) inside a block's row, or a value past the float range;
// each block checks that its smallest value is at least kScaledFloor before and after rescaling, and that
// nothing overflowed or became NaN. Terms that a change of scale may flush to 0 are only added, or are
// multiplied by P before the change (the border's 1 x P, the diagonal carried in from the left block):
// a term times a large P can be a cell's largest. A pair that fails anywhere, or whose scores hold a
// NaN, is scored again by the log-space sweep, whose result it then is.
#include "forward_scaled.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "forward_log.h"
#include "simd.h"
#include "sources.h"

namespace swcli_cpu {

namespace {

constexpr int kScaledTop = 50;
constexpr int kScaledBlock = 4;
// The smallest value a block may hold: a term that flushed to 0 (below 2^-126, as the zero term 2^-sigma
// does once sigma > 126) is then under 2^-26 of every cell. At 2^-125, a tiny cell could lose half its
// value, and a large P carry that error into the best alignment.
constexpr float kScaledFloor = 0x1p-100f;

// POWERS: the source's matrix is the table of 2^(m c) (scores from codes); else the source gives S.
// A pair that fails the check is given up at once and goes to `failed` (its score is left for the
// log-space sweep). Whether a pair fails depends on its own scores alone, not on its lane or worker.
// With dp_table, each row's H = t ln2 (sigma + log2 stored) also goes to the table (one log2 polynomial
// a cell vector), as the log-space forward writes it.
template <bool POWERS, typename Source>
void forward_worker_scaled(const Problem& pr, Source& source, const std::vector<int64_t>& queue,
                           std::atomic<int64_t>& next, float gap, float temperature, float* scores,
                           float* dp_table, std::vector<int64_t>& failed) {
  constexpr int W = Lanes<float>::W, L = Lanes<float>::L, top = kScaledTop;
  const int64_t B = static_cast<int64_t>(queue.size());
  const int64_t cols = B ? pr.tlen[queue[0]] : 0;  // the longest target
  const int64_t blocks = (cols + kScaledBlock - 1) / kScaledBlock;
  std::vector<VF> row((cols + 1) * kPacks);                          // stored E of the row above
  std::vector<VI> sigma(std::max<int64_t>(blocks, 1) * kPacks);      // each block's exponent
  std::vector<VF> h_row(dp_table ? (cols + 1) * kPacks : 0);         // the row's H, for the table
  source.prepare(cols);
  const double c_exact = log2e_over<float>(temperature);
  const float c = static_cast<float>(c_exact);
  const VF G = splat<VF>(static_cast<float>(std::exp2(double(gap) * c_exact)));
  const double back = double(temperature) * 0.69314718055994531;
  const float back_f = static_cast<float>(back);
  const int64_t stride_b = (pr.M + 1) * (pr.N + 1);
  const float scale = 0x1p50f;  // E = 1 at sigma -top
  static_assert(top == 50, "scale is 2^top");
  int64_t pair[W], row_of[W];
  VI tv[kPacks], best_sig[kPacks], ok[kPacks];
  VF best_m[kPacks];
  int active = 0;
  auto take_next_pair = [&](int l) {
    const int k = l / L, e = l % L;
    pair[l] = next_pair(pr, queue, next, scores);
    tv[k][e] = pair[l] < 0 ? 0 : static_cast<int32_t>(pr.tlen[pair[l]]);
    // Every column and block, not only the pair's: columns past the target copy values from these.
    for (int64_t j = 1; j <= cols; ++j) row[j * kPacks + k][e] = scale;
    for (int64_t b = 0; b < blocks; ++b) sigma[b * kPacks + k][e] = -top;
    best_sig[k][e] = -top, best_m[k][e] = scale, ok[k][e] = -1;
    if (pair[l] < 0) return;
    row_of[l] = 1;
    ++active;
    source.start_pair(l, pair[l]);
  };
  for (int l = 0; l < W; ++l) take_next_pair(l);
  while (active > 0) {
    int64_t width = 0;
    for (int l = 0; l < W; ++l) {
      if (pair[l] < 0) continue;
      source.begin_row(l, pair[l], row_of[l] - 1);
      width = std::max(width, pr.tlen[pair[l]]);
    }
    VF carry_left[kPacks], carry_diag[kPacks];  // E[i][j-1], E[i-1][j-1], in the scale `carried`
    VI carried[kPacks];
    for (int64_t b = 0; b * kScaledBlock < width; ++b) {
      const int64_t j0 = b * kScaledBlock + 1, j1 = std::min<int64_t>(j0 + kScaledBlock - 1, width);
      for (int k = 0; k < kPacks; ++k) {
        const VI old = sigma[b * kPacks + k];
        const VF one = (VF)((VI)(127 - old < 0 ? splat<VI>(0) : 127 - old) << 23);  // 2^-sigma: the zero term
        const VI mine = splat<VI>(static_cast<int32_t>(j0)) <= tv[k];  // lanes with a column in the block
        VI base;             // the scale the block's values are computed in
        VF to_block_1, to_block_2;  // from the scale of the values carried in (left, diagonal) to `base`
        if (b == 0) {
          carry_left[k] = carry_diag[k] = one;  // the zero border, H[i][0] = H[i-1][0] = 0
          base = old;
        } else {
          // A change of scale by 2^shift in two factors that are normal floats: 2^shift alone flushes to
          // 0 past 2^-126, while a value times it may still be a normal float. The left value is only
          // added (what flushes to 0 is under 2^-26 of every cell, kScaledFloor); the diagonal one is
          // multiplied by P first (first column, below), which may make it the cell's largest term.
          const VI shift = mine ? carried[k] - old : splat<VI>(0), half = shift >> 1;
          to_block_1 = pow2_int(clamp_int(half, -127, 128)), to_block_2 = pow2_int(clamp_int(shift - half, -127, 128));
          carry_left[k] = carry_left[k] * to_block_1 * to_block_2;
          base = mine ? old : carried[k];
        }
        VF hi = splat<VF>(0.0f), lo = splat<VF>(std::numeric_limits<float>::infinity());
        auto step = [&](int64_t j, bool first) {
          const VF up = row[j * kPacks + k];
          VF power = source.load(j, k);
          if (!POWERS) power = exp2_any(power * c);
          VF match;
          if (first && b == 0) {
            // The border's match term in column 1, 1 x P, is P 2^-sigma: in two factors that are normal
            // floats, since 2^-sigma alone (the zero term) flushes to 0 once sigma > 126, while times a
            // large P it can be the cell's largest term.
            const VI half = old >> 1;
            match = power * pow2_int(clamp_int(-half, -127, 128)) * pow2_int(clamp_int(half - old, -127, 128));
          } else if (first) {
            match = carry_diag[k] * power * to_block_1 * to_block_2;  // the product first, in the left block's scale
          } else {
            match = carry_diag[k] * power;
          }
          VF x = match + one;
          x = (up + carry_left[k]) * G + x;
          x = splat<VI>(static_cast<int32_t>(j)) <= tv[k] ? x : carry_left[k];
          carry_diag[k] = up;
          carry_left[k] = x;
          row[j * kPacks + k] = x;
          hi = x > hi ? x : hi;
          lo = (x < lo) | (x != x) ? x : lo;  // keeps a NaN
        };
        step(j0, true);
        for (int64_t j = j0 + 1; j <= j1; ++j) step(j, false);
        const VI exponent = ((VI)hi >> 23) & 0xff;
        const VF f = (VF)((254 + top - exponent) << 23);  // 2^(top - exponent of hi)
        for (int64_t j = j0; j <= j1; ++j) row[j * kPacks + k] *= f;
        sigma[b * kPacks + k] = base + exponent - (127 + top);
        if (dp_table) {
          const VF sig = __builtin_convertvector(sigma[b * kPacks + k], VF);
          for (int64_t j = j0; j <= j1; ++j)
            h_row[j * kPacks + k] = (sig + log2_one_to_four(row[j * kPacks + k])) * back_f;
        }
        carried[k] = base;
        ok[k] &= (lo >= kScaledFloor) & (lo * f >= kScaledFloor) & (hi <= std::numeric_limits<float>::max());
        const VI s = sigma[b * kPacks + k];
        const VF m = hi * f;
        const VI better = (s > best_sig[k]) | ((s == best_sig[k]) & (m > best_m[k]));
        best_sig[k] = better ? s : best_sig[k];
        best_m[k] = better ? m : best_m[k];
      }
    }
    for (int l = 0; l < W; ++l) {
      if (pair[l] < 0) continue;
      const int k = l / L, e = l % L;
      if (ok[k][e] && dp_table) {  // a pair that fails is written again, whole, by the log-space sweep
        float* dst = dp_table + pair[l] * stride_b + row_of[l] * (pr.N + 1);
        for (int64_t j = 1; j <= pr.tlen[pair[l]]; ++j) dst[j] = h_row[j * kPacks + k][e];
      }
      if (ok[k][e]) {
        if (row_of[l]++ < pr.qlen[pair[l]]) continue;
        scores[pair[l]] = static_cast<float>(back * (best_sig[k][e] + std::log2(double(best_m[k][e]))));
      } else {
        failed.push_back(pair[l]);  // given up at once: the log-space sweep scores it from the start
      }
      --active;
      take_next_pair(l);
    }
  }
}

// The scaled sweep over `queue` (longest first); returns the pairs it could not hold.
template <bool POWERS, typename Source>
std::vector<int64_t> scaled_pairs(const Problem& pr, const Source& prototype, const std::vector<int64_t>& queue,
                                  float gap, float temperature, float* scores, float* dp_table) {
  std::vector<std::vector<int64_t>> failed(at::get_num_threads());  // per worker (at most one per thread)
  in_workers<float>(queue, prototype, [&](Source& source, std::atomic<int64_t>& next, int64_t w) {
    forward_worker_scaled<POWERS>(pr, source, queue, next, gap, temperature, scores, dp_table, failed[w]);
  });
  std::vector<int64_t> all;
  for (const auto& f : failed) all.insert(all.end(), f.begin(), f.end());
  return all;
}

}  // namespace

// Every pair through the scaled sweep, then the pairs it could not hold through the log-space one. A
// pair fails as soon as a block does, so at small temperatures, where most pairs fail (t = 0.3 with BLOSUM62
// and gap -4), the call costs about what the log-space sweep alone does. The sources differ for scores
// from codes: the scaled one's matrix is the table of powers.
template <bool POWERS, typename Source>
void forward_scaled(const Problem& pr, const Source& scaled_source, const Source& log_source, float gap,
                    float temperature, float* scores, float* dp_table, int64_t& log_pairs) {
  std::vector<int64_t> all(pr.B);
  std::iota(all.begin(), all.end(), 0);
  forward_scaled<POWERS>(pr, all, scaled_source, log_source, gap, temperature, scores, dp_table, log_pairs);
}

template <bool POWERS, typename Source>
void forward_scaled(const Problem& pr, const std::vector<int64_t>& pairs, const Source& scaled_source,
                    const Source& log_source, float gap, float temperature, float* scores, float* dp_table,
                    int64_t& log_pairs) {
  if (pairs.empty()) return;
  std::vector<int64_t> again =
      scaled_pairs<POWERS>(pr, scaled_source, longest_first(pr, pairs), gap, temperature, scores, dp_table);
  log_pairs += static_cast<int64_t>(again.size());
  if (again.empty()) return;
  std::sort(again.begin(), again.end());  // the workers' lists come in any order: the batch's, for ties
  forward_pairs<float>(pr, log_source, longest_first(pr, std::move(again)), gap, temperature, scores, dp_table);
}

template void forward_scaled<false, DenseSource<float>>(const Problem&, const DenseSource<float>&,
                                                        const DenseSource<float>&, float, float, float*, float*,
                                                        int64_t&);
template void forward_scaled<true, CodeSource>(const Problem&, const CodeSource&, const CodeSource&, float, float,
                                               float*, float*, int64_t&);
template void forward_scaled<false, DenseSource<float>>(const Problem&, const std::vector<int64_t>&,
                                                        const DenseSource<float>&, const DenseSource<float>&, float,
                                                        float, float*, float*, int64_t&);
template void forward_scaled<true, CodeSource>(const Problem&, const std::vector<int64_t>&, const CodeSource&,
                                               const CodeSource&, float, float, float*, float*, int64_t&);

}  // namespace swcli_cpu
