// Soft scores inside a pair (float32, t > 0): the strips of strips.h with a cell in scaled space where
// every cell carries its own exponent. With c = log2(e) / t, a cell's E = 2^(H c) is m 2^sigma, m in
// [1, 2) and sigma an integer (held in a float), and
//
//     E[i][j] = 1 + E[i-1][j-1] P + (E[i-1][j] + E[i][j-1]) G,    P = 2^(S c), G = 2^(gap c)
//
// is summed relative to the left cell's exponent: each term is its mantissa times 2^(its sigma - the
// left's), one scalef (AVX-512) or an exponent add; the sum is split again into mantissa and exponent
// (getmant, getexp). Nothing is shared between cells, so no value can leave the float range and no pair
// is given up for its spread, at any length: the exponents are exact, and a cell's rounding is that of
// a few float sums (the scores are closer to float64 than the log-space sweep's).
//
// Relative to the left cell the terms are bounded (with a gap <= 0): the diagonal is at most 2^(|gap| c +
// 1) times the left (H[i][j-1] >= H[i-1][j-1] + gap), times P; the cell above at most about
// 2^((max S + 2 |gap|) c + log2 rows + 2) (map each path to the cell above onto one to the cell on the
// left through the same column). So the sum stays a normal float where max S c <= kLargestPower and
// |gap| c <= kLargestGap; elsewhere (small temperatures, positive gaps) the pairs stay with the sweeps
// across pairs. Terms under 2^-126 of the left cell flush to 0: they are under 2^-80 of the sum, whose
// term from the left is at least G times the left.
#include "strips_soft.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "simd.h"
#include "strips.h"

namespace swcli_cpu {

namespace {

using V = Lanes<float>::V;
using VI = Lanes<float>::I;

// m 2^d for an integer d (a float) and m >= 1: 0 where the result would be under 2^-126.
inline V scalef(V m, V d) {
#if defined(__AVX512F__)
  return (V)_mm512_scalef_ps((__m512)m, (__m512)d);
#else
  const VI k = __builtin_convertvector(d, VI);
  const VI clamped = k > 127 ? splat<VI>(127) : k;
  return k < -126 ? splat<V>(0.0f) : m * (V)((clamped + 127) << 23);
#endif
}

// The exponent (as a float) and the mantissa in [1, 2) of positive normal floats.
inline V exponent_of(V x) {
#if defined(__AVX512F__)
  return (V)_mm512_getexp_ps((__m512)x);
#else
  return __builtin_convertvector((((VI)x >> 23) & 0xff) - 127, V);
#endif
}

// (Bit operations rather than getmant, which shares getexp's and scalef's one port.)
inline V mantissa_of(V x) { return (V)(((VI)x & 0x007fffff) | 0x3f800000); }

// The soft cell. FromScores: the source gives S, and P = 2^(S c) is taken here (one exp2 polynomial);
// else it gives P (from codes: a table of powers).
template <bool FromScores>
struct SoftCell {
  using Value = CellValue;  // a: sigma, b: m
  struct Scalar {
    float sigma, m;
  };
  struct Best {
    V sigma[kMaxPacks], m[kMaxPacks];
    VI bad[kMaxPacks];  // a score past kLargestPower, or a NaN (FromScores)
  };

  V G, c;
  float back;  // t ln 2: H = back (sigma + log2 m)

  Value border() const { return {splat<V>(0.0f), splat<V>(1.0f)}; }
  Scalar border_scalar() const { return {0.0f, 1.0f}; }
  Value broadcast(Scalar x) const { return {splat<V>(x.sigma), splat<V>(x.m)}; }
  Value shift_in(Value v, Value entering) const {
    return {shift_lanes(v.a, entering.a), shift_lanes(v.b, entering.b)};
  }
  Value select(VI mask, Value x, Value y) const { return {mask ? x.a : y.a, mask ? x.b : y.b}; }
  Scalar lane(Value v, int e) const { return {v.a[e], v.b[e]}; }

  Value step(Value diag, Value up, Value left, V p) const {
    if (FromScores) p = exp2_any(p * c);
    const V from_up = scalef(up.b, up.a - left.a);
    const V from_diag = scalef(diag.b * p, diag.a - left.a);
    const V one = scalef(splat<V>(1.0f), -left.a);
    const V x = (from_up + left.b) * G + (from_diag + one);
    return {left.a + exponent_of(x), mantissa_of(x)};
  }

  Best no_best() const {
    Best b;
    for (int k = 0; k < kMaxPacks; ++k) b.sigma[k] = splat<V>(0.0f), b.m[k] = splat<V>(1.0f), b.bad[k] = VI{};
    return b;
  }
  // The scores' check rides on the best cell's: P = 2^(S c) past 2^kLargestPower (or a NaN) is bad.
  void check(Best& best, V p, VI in, int k) const {
    if (FromScores) best.bad[k] |= in & ~(p * c <= kLargestPower);
  }
  void track(Best& best, Value v, VI in, int k) const {
    const VI better = in & ((v.a > best.sigma[k]) | ((v.a == best.sigma[k]) & (v.b > best.m[k])));
    best.sigma[k] = better ? v.a : best.sigma[k];
    best.m[k] = better ? v.b : best.m[k];
  }
  void merge(Best& into, const Best& b) const {
    for (int k = 0; k < kMaxPacks; ++k) {
      track(into, Value{b.sigma[k], b.m[k]}, splat<VI>(-1), k);
      into.bad[k] |= b.bad[k];
    }
  }
  // The pair's score, or NaN where it failed a check.
  float score(const Best& b) const {
    float sigma = 0.0f, m = 1.0f;
    bool bad = false;
    for (int k = 0; k < kMaxPacks; ++k)
      for (int e = 0; e < Lanes<float>::L; ++e) {
        bad = bad || b.bad[k][e] != 0;
        if (b.sigma[k][e] > sigma || (b.sigma[k][e] == sigma && b.m[k][e] > m)) sigma = b.sigma[k][e], m = b.m[k][e];
      }
    // sigma is an integer up to 2^24 (a float holds it exactly); past 2^23 the pair leaves for the sweeps
    // across pairs
    if (bad || !(sigma < 0x1p23f)) return std::numeric_limits<float>::quiet_NaN();
    return static_cast<float>(double(back) * (double(sigma) + std::log2(double(m))));
  }

  // H for the DP table: back (sigma + log2 m).
  V table_value(Value v) const { return (v.a + log2_one_to_four(v.b)) * back; }
};

template <bool FromScores, typename Source>
void soft_strips(const std::vector<StripPair>& pairs, const Source& prototype, float gap, float temperature,
                 float* scores, std::vector<int64_t>& failed) {
  const double c = log2e_over<float>(temperature);
  SoftCell<FromScores> cell;
  cell.G = splat<V>(static_cast<float>(std::exp2(double(gap) * c)));
  cell.c = splat<V>(static_cast<float>(c));
  cell.back = static_cast<float>(double(temperature) * 0.69314718055994531);
  std::vector<char> bad(pairs.size(), 0);
  strip_pairs<SoftCell<FromScores>>(cell, pairs, prototype, [&](int64_t n, const auto& best) {
    const float score = cell.score(best);
    if (score == score)
      scores[pairs[n].pair] = score;
    else
      bad[n] = 1;
  });
  for (size_t n = 0; n < pairs.size(); ++n)
    if (bad[n]) failed.push_back(pairs[n].pair);
}

}  // namespace

bool soft_strips_apply(double gap, double temperature, double largest_score) {
  if (!(temperature > 0 && gap <= 0)) return false;
  const double c = log2e_over<float>(temperature);
  return -gap * c <= kLargestGap && largest_score * c <= kLargestPower;
}

void soft_strip_scores_codes(const Problem& pr, const CodeSource& codes, const float* powers, const float* powers_t,
                             const std::vector<int64_t>& pairs, float gap, float temperature, float* scores,
                             float* dp_table, std::vector<int64_t>& failed) {
  soft_strips<false>(code_strip_pairs(pr, codes, pairs, powers, powers_t, dp_table), StripCodes{}, gap,
                     temperature, scores, failed);
}

void soft_strip_scores_dense(const Problem& pr, const float* S, int64_t sB, int64_t sM, int64_t sN,
                             const std::vector<int64_t>& pairs, float gap, float temperature, float* scores,
                             float* dp_table, std::vector<int64_t>& failed) {
  soft_strips<true>(dense_strip_pairs(pr, S, sB, sM, sN, pairs, dp_table, failed), StripDense{}, gap,
                    temperature, scores, failed);
}

}  // namespace swcli_cpu
