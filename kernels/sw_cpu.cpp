// CPU engine for the soft Smith-Waterman recurrence (see GUIDE section 1).
//
// Forward: pairs are sorted by size and processed in groups of W lanes (32 floats or 16 doubles), one
// SIMD lane per pair, so that the serial dependency along a row (H[i][j-1]) runs in W independent chains
// at once: a group is kPacks native vectors (AVX-512, AVX or SSE width), interleaved for latency hiding.
// (GCC vectors wider than the hardware's are lowered element by element, hence the explicit packs.) Groups are handed to at::parallel_for workers through an atomic counter (large groups first).
// Soft mode works in base-2 units: S and the gap are pre-scaled by log2(e)/t, a cell is
// m + log2(1 + 2^(b-m) + 2^(c-m) + 2^(d-m)) with m the largest of the four terms, and the score is
// scaled back by t*ln(2) at the end. float32 uses polynomial exp2/log2 on whole vectors; float64 calls
// the C library per lane (it is the accuracy path, not the fast one).
//
// Backward (only when autograd asks): the forward also stores the DP table H, and a per-pair reverse
// sweep pushes d score / d H back through the softmax (t > 0) or argmax (t = 0) weights of every cell.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace {

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

// One DP cell for W pairs. x1 = match, x2 = delete, x3 = insert; the fourth term is 0.
template <typename T, bool Hard>
inline typename Lanes<T>::V cell(typename Lanes<T>::V x1, typename Lanes<T>::V x2,
                                 typename Lanes<T>::V x3) {
  using V = typename Lanes<T>::V;
  const V zero = splat<V>(T(0));
  if (Hard) return nan_max(nan_max(x1, x2), nan_max(x3, zero));
  // Sort the four terms far enough to know the largest, m, and skip its exp (it is 1).
  const V a = plain_max(x1, x2), b = plain_min(x1, x2);
  const V c = plain_max(x3, zero), d = plain_min(x3, zero);
  const V m = plain_max(a, c), n = plain_min(a, c);
  const V sum = T(1) + exp2_nonpositive(n - m) + exp2_nonpositive(b - m) + exp2_nonpositive(d - m);
  V h = m + log2_one_to_four(sum);
  h = m == std::numeric_limits<T>::infinity() ? m : h;
  const auto has_nan = (x1 != x1) | (x2 != x2) | (x3 != x3);
  return has_nan ? x1 + x2 + x3 : h;
}

struct Problem {
  int64_t B, M, N;
  int64_t sB, sM, sN;        // strides of S, in elements
  const int64_t* qlen;       // (B,)
  const int64_t* tlen;       // (B,)
};

template <typename T, bool Hard>
void forward_group(const Problem& pr, const T* S, const int64_t* pairs, int count, T gap, T scale,
                   T* scores, T* dp_table, std::vector<typename Lanes<T>::V>& row, std::vector<T>& srow) {
  using V = typename Lanes<T>::V;
  using I = typename Lanes<T>::I;
  using Index = typename Lanes<T>::Index;
  constexpr int W = Lanes<T>::W, L = Lanes<T>::L;
  // Lane l of the group is element l % L of pack l / L; row[j * kPacks + k] holds H[i][j] of pack k.
  int64_t pair[W];
  I qv[kPacks], tv[kPacks];
  int64_t rows = 0, cols = 0;
  for (int l = 0; l < W; ++l) {
    pair[l] = pairs[l < count ? l : 0];  // spare lanes read pair 0's matrix and are masked out
    const int64_t q = l < count ? pr.qlen[pair[l]] : 0;
    const int64_t t = l < count ? pr.tlen[pair[l]] : 0;
    qv[l / L][l % L] = static_cast<Index>(q);
    tv[l / L][l % L] = static_cast<Index>(t);
    rows = std::max(rows, q);
    cols = std::max(cols, t);
  }
  if (static_cast<int64_t>(row.size()) < (cols + 1) * kPacks) {
    row.resize((cols + 1) * kPacks);
    srow.resize((cols + 1) * W);
  }
  const V zero = splat<V>(T(0));
  const V g = splat<V>(gap * scale);
  const int64_t stride_b = (pr.M + 1) * (pr.N + 1);
  std::fill(row.begin(), row.begin() + (cols + 1) * kPacks, zero);
  V best[kPacks];
  for (int k = 0; k < kPacks; ++k) best[k] = zero;
  for (int64_t i = 1; i <= rows; ++i) {
    for (int l = 0; l < W; ++l) {
      const T* src = S + pair[l] * pr.sB + (i - 1) * pr.sM;
      for (int64_t j = 0; j < cols; ++j) srow[(j + 1) * W + l] = src[j * pr.sN] * scale;
    }
    I row_inside[kPacks];
    V diag[kPacks], left[kPacks];
    for (int k = 0; k < kPacks; ++k) {
      row_inside[k] = splat<I>(static_cast<Index>(i)) <= qv[k];
      diag[k] = zero;
      left[k] = zero;
    }
    for (int64_t j = 1; j <= cols; ++j) {
      const I column = splat<I>(static_cast<Index>(j));
#pragma GCC unroll 8
      for (int k = 0; k < kPacks; ++k) {
        const V up = row[j * kPacks + k];
        V s;
        __builtin_memcpy(&s, &srow[j * W + k * L], sizeof(V));
        const V h = cell<T, Hard>(diag[k] + s, up + g, left[k] + g);
        row[j * kPacks + k] = h;
        diag[k] = up;
        left[k] = h;
        const I inside = row_inside[k] & (column <= tv[k]);
        best[k] = inside ? nan_max(best[k], h) : best[k];
      }
    }
    if (dp_table != nullptr) {
      for (int l = 0; l < count; ++l) {
        T* dst = dp_table + pair[l] * stride_b + i * (pr.N + 1);
        for (int64_t j = 1; j <= cols; ++j) dst[j] = row[j * kPacks + l / L][l % L] / scale;
      }
    }
  }
  for (int l = 0; l < count; ++l) scores[pair[l]] = best[l / L][l % L] / scale;
}

template <typename T>
void forward_all(const Problem& pr, const T* S, T gap, T temperature, T* scores, T* dp_table) {
  constexpr int W = Lanes<T>::W;
  const bool hard = temperature == T(0);
  const T scale = hard ? T(1) : T(1.4426950408889634) / temperature;  // log2(e) / t
  // Largest pairs first, so similar sizes share a group and the longest work starts early.
  std::vector<int64_t> order(pr.B);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const int64_t ca = pr.qlen[a] * pr.tlen[a], cb = pr.qlen[b] * pr.tlen[b];
    return ca != cb ? ca > cb : pr.tlen[a] > pr.tlen[b];
  });
  const int64_t groups = (pr.B + W - 1) / W;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(groups, at::get_num_threads());
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    std::vector<typename Lanes<T>::V> row;
    std::vector<T> srow;  // one row of S, scaled, laid out [j][lane]
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t gi = next++; gi < groups; gi = next++) {
        const int64_t first = gi * W;
        const int count = static_cast<int>(std::min<int64_t>(W, pr.B - first));
        if (hard)
          forward_group<T, true>(pr, S, order.data() + first, count, gap, scale, scores, dp_table, row, srow);
        else
          forward_group<T, false>(pr, S, order.data() + first, count, gap, scale, scores, dp_table, row, srow);
      }
    }
  });
}

// Reverse sweep for one pair. E[i][j] = d score / d H[i][j]; each cell hands E on to the cells it was
// computed from, weighted by softmax (t > 0) or the first maximal term, in the reference's order
// (zero, match, delete, insert), at t = 0.
template <typename T>
void backward_pair(const Problem& pr, const T* S, const T* H, int64_t b, T grad, T gap, T temperature,
                   T* grad_S, std::vector<T>& E) {
  const int64_t q = pr.qlen[b], n = pr.tlen[b], ld = pr.N + 1;
  const T* Hb = H + b * (pr.M + 1) * ld;
  const T* Sb = S + b * pr.sB;
  T* Gb = grad_S + b * pr.M * pr.N;
  // The score is the first maximal cell in row-major order, as torch.max picks it.
  int64_t bi = 0, bj = 0;
  for (int64_t i = 0; i <= q; ++i)
    for (int64_t j = 0; j <= n; ++j) {
      const T h = Hb[i * ld + j], cur = Hb[bi * ld + bj];
      if (h > cur || (h != h && cur == cur)) bi = i, bj = j;
    }
  E.assign((q + 1) * (n + 1), T(0));
  E[bi * (n + 1) + bj] = grad;
  const bool hard = temperature == T(0);
  for (int64_t i = bi; i >= 1; --i) {
    for (int64_t j = bj; j >= 1; --j) {  // nothing flows to larger i or j
      const T e = E[i * (n + 1) + j];
      if (e == T(0)) continue;
      const T h = Hb[i * ld + j];
      const T s = Sb[(i - 1) * pr.sM + (j - 1) * pr.sN];
      const T x1 = Hb[(i - 1) * ld + j - 1] + s;
      const T x2 = Hb[(i - 1) * ld + j] + gap;
      const T x3 = Hb[i * ld + j - 1] + gap;
      T w1, w2, w3;
      if (hard) {
        const bool take1 = h != T(0) && x1 == h;
        const bool take2 = h != T(0) && !take1 && x2 == h;
        const bool take3 = h != T(0) && !take1 && !take2 && x3 == h;
        w1 = take1, w2 = take2, w3 = take3;
      } else {
        w1 = std::exp((x1 - h) / temperature);
        w2 = std::exp((x2 - h) / temperature);
        w3 = std::exp((x3 - h) / temperature);
      }
      Gb[(i - 1) * pr.N + (j - 1)] = e * w1;
      E[(i - 1) * (n + 1) + j - 1] += e * w1;
      E[(i - 1) * (n + 1) + j] += e * w2;
      E[i * (n + 1) + j - 1] += e * w3;
    }
  }
}

Problem make_problem(const at::Tensor& S, const at::Tensor& qlen, const at::Tensor& tlen) {
  TORCH_CHECK(S.dim() == 3, "score matrix must be 3-D (B, M, N), got ", S.dim(), "-D");
  TORCH_CHECK(S.device().is_cpu(), "the CPU engine needs a CPU tensor");
  TORCH_CHECK(S.scalar_type() == at::kFloat || S.scalar_type() == at::kDouble,
              "the CPU engine takes float32 or float64, got ", S.scalar_type());
  TORCH_CHECK(qlen.dtype() == at::kLong && tlen.dtype() == at::kLong && qlen.is_contiguous() &&
                  tlen.is_contiguous() && qlen.numel() == S.size(0) && tlen.numel() == S.size(0),
              "lengths must be contiguous int64 tensors of shape (B,)");
  return Problem{S.size(0), S.size(1), S.size(2), S.stride(0), S.stride(1), S.stride(2),
                 qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
}

}  // namespace

// Returns (scores (B,), H (B, M+1, N+1) when keep_dp_table, else an empty tensor).
std::vector<at::Tensor> sw_forward(const at::Tensor& S, const at::Tensor& qlen, const at::Tensor& tlen,
                                   double gap, double temperature, bool keep_dp_table) {
  const Problem pr = make_problem(S, qlen, tlen);
  TORCH_CHECK(temperature >= 0, "temperature must be >= 0");
  at::Tensor scores = at::zeros({pr.B}, S.options());
  at::Tensor dp = keep_dp_table ? at::zeros({pr.B, pr.M + 1, pr.N + 1}, S.options()) : at::empty({0}, S.options());
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "sw_forward", [&] {
    forward_all<scalar_t>(pr, S.data_ptr<scalar_t>(), static_cast<scalar_t>(gap),
                          static_cast<scalar_t>(temperature), scores.data_ptr<scalar_t>(),
                          keep_dp_table ? dp.data_ptr<scalar_t>() : nullptr);
  });
  return {scores, dp};
}

at::Tensor sw_backward(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& dp,
                       const at::Tensor& qlen, const at::Tensor& tlen, double gap, double temperature) {
  const Problem pr = make_problem(S, qlen, tlen);
  TORCH_CHECK(dp.is_contiguous() && dp.dim() == 3 && dp.size(0) == pr.B && dp.size(1) == pr.M + 1 &&
                  dp.size(2) == pr.N + 1 && dp.scalar_type() == S.scalar_type(),
              "DP table does not match the score matrix");
  const at::Tensor grad = grad_scores.to(S.scalar_type()).contiguous();
  at::Tensor grad_S = at::zeros({pr.B, pr.M, pr.N}, S.options());
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "sw_backward", [&] {
    const scalar_t* g = grad.data_ptr<scalar_t>();
    at::parallel_for(0, pr.B, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> E;
      for (int64_t b = begin; b < end; ++b) {
        if (g[b] == scalar_t(0)) continue;
        backward_pair<scalar_t>(pr, S.data_ptr<scalar_t>(), dp.data_ptr<scalar_t>(), b, g[b],
                                static_cast<scalar_t>(gap), static_cast<scalar_t>(temperature),
                                grad_S.data_ptr<scalar_t>(), E);
      }
    });
  });
  return grad_S;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &sw_forward, "soft Smith-Waterman scores (and the DP table for backward)");
  m.def("backward", &sw_backward, "gradient of the scores with respect to the score matrix");
}
