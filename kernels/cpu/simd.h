// SIMD lanes and the per-cell math shared by the CPU engine's kernels.
//
// A group of W lanes (32 floats or 16 doubles) is kPacks native vectors (AVX-512, AVX or SSE width):
// GCC lowers vectors wider than the hardware's element by element, hence the explicit packs.
// Soft mode: a cell is m + t ln2 * log2(1 + sum of 2^((x-m) log2(e)/t) over the three other terms x),
// with m the largest of the four terms: H stays in score units, so adding the gap is exact as in the
// reference (pre-scaling S and the gap by log2(e)/t would round every gap step the same way and drift
// in float32). float32 uses polynomial exp2/log2 on whole vectors; float64 calls the C library per lane
// (it is the accuracy path, not the fast one).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace swcli_cpu {

#if defined(__AVX512F__)
constexpr int kNativeBytes = 64;
#elif defined(__AVX__)
constexpr int kNativeBytes = 32;
#else
constexpr int kNativeBytes = 16;
#endif
constexpr int kGroupBytes = 128;
constexpr int kPacks = kGroupBytes / kNativeBytes;  // native vectors per group

template <typename T>
struct Lanes;

template <>
struct Lanes<float> {
  typedef float V __attribute__((vector_size(kNativeBytes)));
  typedef int32_t I __attribute__((vector_size(kNativeBytes)));
  typedef int32_t Index;
  static constexpr int L = kNativeBytes / sizeof(float);  // lanes per native vector
  static constexpr int W = kGroupBytes / sizeof(float);   // lanes per group
};

template <>
struct Lanes<double> {
  typedef double V __attribute__((vector_size(kNativeBytes)));
  typedef int64_t I __attribute__((vector_size(kNativeBytes)));
  typedef int64_t Index;
  static constexpr int L = kNativeBytes / sizeof(double);
  static constexpr int W = kGroupBytes / sizeof(double);
};

template <typename V, typename T>
inline V splat(T x) {
  return V{} + x;
}

// log2(e) / t, capped at T's largest value so that a tiny t (even a denormal one) gives huge finite
// exponents, not inf * 0.
template <typename T>
inline double log2e_over(double temperature) {
  return std::min<double>(1.4426950408889634 / temperature, std::numeric_limits<T>::max());
}

// max that returns NaN when either side is NaN (plain a > b ? a : b would drop a NaN in b).
template <typename V>
inline V nan_max(V a, V b) {
  return (a > b) | (a != a) ? a : b;
}

template <typename V>
inline V plain_max(V a, V b) {
  return a > b ? a : b;
}

template <typename V>
inline V plain_min(V a, V b) {
  return a < b ? a : b;
}

// 2^x for x <= 0. Rounds x to the nearest integer r, evaluates 2^(x-r) on [-0.5, 0.5] by its degree-7
// Taylor polynomial (truncation error below 6e-9, under float32 rounding), then adds r to the exponent.
inline Lanes<float>::V exp2_nonpositive(Lanes<float>::V x) {
  using V = Lanes<float>::V;
  using I = Lanes<float>::I;
  x = x < -125.0f ? splat<V>(-125.0f) : x;
  const V rounded = (x + 12582912.0f) - 12582912.0f;  // 1.5 * 2^23: round to nearest
  const V f = (x - rounded) * 0.69314718055994531f;
  V p = splat<V>(1.0f / 5040.0f);
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const I bits = (I)p + (__builtin_convertvector(rounded, I) << 23);
  return (V)bits;
}

// log2(x) for x in [1, 4]: x = 2^e * m with m in [sqrt(1/2), sqrt(2)), then
// log2(m) = 2/ln(2) * atanh(z), z = (m-1)/(m+1), |z| < 0.172, by its series up to z^9 (error < 2e-9).
inline Lanes<float>::V log2_one_to_four(Lanes<float>::V x) {
  using V = Lanes<float>::V;
  using I = Lanes<float>::I;
  const I bits = (I)x;
  I exponent = (bits >> 23) - 127;
  const I mantissa_bits = (bits & 0x007fffff) | 0x3f800000;
  V m = (V)mantissa_bits;
  const I big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  exponent = exponent - big;  // big is -1 where true
  const V z = (m - 1.0f) / (m + 1.0f);
  const V z2 = z * z;
  V series = splat<V>(1.0f / 9.0f);
  series = series * z2 + 1.0f / 7.0f;
  series = series * z2 + 1.0f / 5.0f;
  series = series * z2 + 1.0f / 3.0f;
  series = series * z2 + 1.0f;
  return __builtin_convertvector(exponent, V) + z * series * 2.8853900817779268f;
}

inline Lanes<double>::V exp2_nonpositive(Lanes<double>::V x) {
  Lanes<double>::V out;
  for (int l = 0; l < Lanes<double>::L; ++l) out[l] = std::exp2(x[l]);
  return out;
}

inline Lanes<double>::V log2_one_to_four(Lanes<double>::V x) {
  Lanes<double>::V out;
  for (int l = 0; l < Lanes<double>::L; ++l) out[l] = std::log2(x[l]);
  return out;
}

// The soft (logsumexp) or hard max of four terms for W pairs: x1, x2, x3 and `floor`, a finite term that
// is never NaN (0 for a linear or an affine H cell, the gap-open score for an affine gap state).
// log2e_t = log2(e) / t and back = t * ln(2) (unused when Hard).
template <typename T, bool Hard>
inline typename Lanes<T>::V max4(typename Lanes<T>::V floor, typename Lanes<T>::V x1, typename Lanes<T>::V x2,
                                 typename Lanes<T>::V x3, T log2e_t, T back) {
  using V = typename Lanes<T>::V;
  if (Hard) return nan_max(nan_max(x1, x2), nan_max(x3, floor));
  // Sort the four terms far enough to know the largest, m, and skip its exp (it is 1).
  const V a = plain_max(x1, x2), b = plain_min(x1, x2);
  const V c = plain_max(x3, floor), d = plain_min(x3, floor);
  const V m = plain_max(a, c), n = plain_min(a, c);
  const V sum = T(1) + exp2_nonpositive((n - m) * log2e_t) + exp2_nonpositive((b - m) * log2e_t) +
                exp2_nonpositive((d - m) * log2e_t);
  V h = m + log2_one_to_four(sum) * back;
  h = m == std::numeric_limits<T>::infinity() ? m : h;
  const auto has_nan = (x1 != x1) | (x2 != x2) | (x3 != x3);
  return has_nan ? x1 + x2 + x3 : h;
}

// One DP cell for W pairs. x1 = match, x2 = delete, x3 = insert; the fourth term is 0.
template <typename T, bool Hard>
inline typename Lanes<T>::V cell(typename Lanes<T>::V x1, typename Lanes<T>::V x2, typename Lanes<T>::V x3,
                                 T log2e_t, T back) {
  return max4<T, Hard>(splat<typename Lanes<T>::V>(T(0)), x1, x2, x3, log2e_t, back);
}

using VF = Lanes<float>::V;
using VI = Lanes<float>::I;

// 2^k for integers k in [-127, 128]: 0 at -127 (flushed), +inf at 128.
inline VF pow2_int(VI k) { return (VF)((k + 127) << 23); }

inline VI clamp_int(VI k, int lo, int hi) {
  k = k < lo ? splat<VI>(lo) : k;
  return k > hi ? splat<VI>(hi) : k;
}

// 2^x for any x: exp2_nonpositive's polynomial up to 127; +inf past it, which overflows the cell and
// fails the check (a clamp to 2^127 would not: times a small stored value it stays finite, and wrong);
// 0 below -125 (a -inf score contributes nothing). A NaN x gives a NaN, which fails the check too.
inline VF exp2_any(VF x) {
  const VF p = exp2_nonpositive(x > 127.0f ? splat<VF>(0.0f) : x);
  const VF inf = splat<VF>(std::numeric_limits<float>::infinity());
  return x == x ? (x > 127.0f ? inf : (x < -125.0f ? splat<VF>(0.0f) : p)) : x;
}

// The softmax weight exp((x - h) / t) of a term x of a cell h, on whole vectors, for the backward sweeps:
// float by exp2_any (0 below 2^-125, as for a -inf term; a NaN stays a NaN), float64 by the C library.
inline Lanes<float>::V softmax_weight(Lanes<float>::V x, Lanes<float>::V h, float log2e_t, float) {
  return exp2_any((x - h) * log2e_t);
}
inline Lanes<double>::V softmax_weight(Lanes<double>::V x, Lanes<double>::V h, double, double temperature) {
  Lanes<double>::V out;
  for (int l = 0; l < Lanes<double>::L; ++l) out[l] = std::exp((x[l] - h[l]) / temperature);
  return out;
}

}  // namespace swcli_cpu
