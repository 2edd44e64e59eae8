// CPU engine for the soft Smith-Waterman recurrence (see GUIDE section 1).
//
// Forward: W lanes (32 floats or 16 doubles) each align one pair, one SIMD lane per pair, so that the
// serial dependency along a row (H[i][j-1]) runs in W independent chains at once. The W lanes are
// kPacks native vectors (AVX-512, AVX or SSE width), interleaved to hide latency (GCC lowers vectors
// wider than the hardware's element by element, hence the explicit packs). One worker per thread
// (at::parallel_for); a lane takes the next pair of a shared queue, sorted by target length, as soon
// as its pair is done.
// float32 at t > 0 takes the scaled sweep (below: E = 2^(H log2(e) / t), scaled per block of columns of
// a lane, two fused multiply-adds and an add a cell; the DP table gets H back by one log2 a cell), and a
// pair it cannot hold the log-space one. On 2048 real protein pairs at t = 1, 2.7x the log-space sweep's speed.
// Soft mode: a cell is m + t ln2 * log2(1 + sum of 2^((x-m) log2(e)/t) over the three other terms x),
// with m the largest of the four terms: H stays in score units, so adding the gap is exact as in the
// reference (pre-scaling S and the gap by c instead made every gap step round the same way, a drift of
// 2e-4 over 200 steps in float32). float32 uses polynomial exp2/log2 on whole vectors; float64 calls
// the C library per lane (it is the accuracy path, not the fast one).
//
// Backward (only when autograd asks): the forward also stores the DP table H, and a per-pair reverse
// sweep pushes d score / d H back through the softmax (t > 0) or argmax (t = 0) weights of every cell.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
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

// One DP cell for W pairs. x1 = match, x2 = delete, x3 = insert; the fourth term is 0.
// log2e_t = log2(e) / t and back = t * ln(2) (unused when Hard).
template <typename T, bool Hard>
inline typename Lanes<T>::V cell(typename Lanes<T>::V x1, typename Lanes<T>::V x2, typename Lanes<T>::V x3,
                                 T log2e_t, T back) {
  using V = typename Lanes<T>::V;
  const V zero = splat<V>(T(0));
  if (Hard) return nan_max(nan_max(x1, x2), nan_max(x3, zero));
  // Sort the four terms far enough to know the largest, m, and skip its exp (it is 1).
  const V a = plain_max(x1, x2), b = plain_min(x1, x2);
  const V c = plain_max(x3, zero), d = plain_min(x3, zero);
  const V m = plain_max(a, c), n = plain_min(a, c);
  const V sum = T(1) + exp2_nonpositive((n - m) * log2e_t) + exp2_nonpositive((b - m) * log2e_t) +
                exp2_nonpositive((d - m) * log2e_t);
  V h = m + log2_one_to_four(sum) * back;
  h = m == std::numeric_limits<T>::infinity() ? m : h;
  const auto has_nan = (x1 != x1) | (x2 != x2) | (x3 != x3);
  return has_nan ? x1 + x2 + x3 : h;
}

struct Problem {
  int64_t B, M, N;
  const int64_t* qlen;  // (B,)
  const int64_t* tlen;  // (B,)
};

// Where the scores of a cell come from. A source is copied into each worker (it holds buffers) and gets
// start_pair(lane, pair) when a lane takes a pair, begin_row(lane, pair, i) before each of the lane's
// rows (i 0-based), and load(j, pack) for the scores of column j (1-based) of a pack's lanes.

// A dense (B, M, N) tensor with any strides: each row is copied into a [j][lane] buffer.
template <typename T>
struct DenseSource {
  using V = typename Lanes<T>::V;
  static constexpr int W = Lanes<T>::W, L = Lanes<T>::L;
  const T* S;
  int64_t sB, sM, sN;
  const int64_t* tlen;
  std::vector<T> rows;

  void prepare(int64_t cols) { rows.resize((cols + 1) * W); }
  void start_pair(int, int64_t) {}
  void begin_row(int l, int64_t pair, int64_t i) {
    const T* src = S + pair * sB + i * sM;
    for (int64_t j = 0; j < tlen[pair]; ++j) rows[(j + 1) * W + l] = src[j * sN];
  }
  V load(int64_t j, int k) const {
    V s;
    __builtin_memcpy(&s, &rows[j * W + k * L], sizeof(V));
    return s;
  }
};

// Sequence codes (B, M), (B, N) into a K x K matrix: the CLI path, which never builds the
// (B, M, N) scores. Target codes are transposed to [j][lane] once per pair; a cell's score is a gather
// from the matrix (a few KB, in L1) at query_code * K + target_code.
struct CodeSource {
  using V = Lanes<float>::V;
  using I = Lanes<float>::I;
  static constexpr int W = Lanes<float>::W, L = Lanes<float>::L;
  typedef uint8_t Codes __attribute__((vector_size(L)));
  const uint8_t* query;
  const uint8_t* target;
  int64_t M, N, K;
  const int64_t* tlen;
  const float* matrix;
  std::vector<uint8_t> codes;  // target codes, [j][lane]
  I row_offset[kPacks] = {};   // query code * K of each lane's current row

  void prepare(int64_t cols) { codes.resize((cols + 1) * W); }  // zeros: valid codes
  void start_pair(int l, int64_t pair) {
    const uint8_t* src = target + pair * N;
    for (int64_t j = 0; j < tlen[pair]; ++j) codes[(j + 1) * W + l] = src[j];
  }
  void begin_row(int l, int64_t pair, int64_t i) {
    row_offset[l / L][l % L] = static_cast<int32_t>(query[pair * M + i] * K);
  }
  V load(int64_t j, int k) const {
    Codes c;
    __builtin_memcpy(&c, &codes[j * W + k * L], sizeof(Codes));
    const I index = __builtin_convertvector(c, I) + row_offset[k];
#if defined(__AVX512F__)
    return (V)_mm512_i32gather_ps((__m512i)index, matrix, 4);
#elif defined(__AVX2__)
    return (V)_mm256_i32gather_ps(matrix, (__m256i)index, 4);
#else
    V s;
    for (int e = 0; e < L; ++e) s[e] = matrix[index[e]];
    return s;
#endif
  }
};

// The queue's next pair with cells, or -1 when it is empty; pairs without cells on the way get the zero
// border's score.
template <typename T>
int64_t next_pair(const Problem& pr, const std::vector<int64_t>& queue, std::atomic<int64_t>& next, T* scores) {
  for (int64_t n = next++; n < static_cast<int64_t>(queue.size()); n = next++) {
    const int64_t p = queue[n];
    if (pr.qlen[p] > 0 && pr.tlen[p] > 0) return p;
    scores[p] = T(0);
  }
  return -1;
}

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

// `pairs` (all of the batch's by default) by decreasing target length, ties in their order: the order in
// which workers' lanes take them.
std::vector<int64_t> longest_first(const Problem& pr, std::vector<int64_t> pairs = {}) {
  if (pairs.empty()) {
    pairs.resize(pr.B);
    std::iota(pairs.begin(), pairs.end(), 0);
  }
  std::stable_sort(pairs.begin(), pairs.end(), [&](int64_t a, int64_t b) { return pr.tlen[a] > pr.tlen[b]; });
  return pairs;
}

// work(source, next, w) in a worker per thread while there are W pairs for each (one small batch is one
// worker's): each with its own copy of the source, all taking pairs from `queue` through `next`.
// Returns the number of workers.
template <typename T, typename Source, typename Work>
int64_t in_workers(const std::vector<int64_t>& queue, const Source& prototype, Work work) {
  const int64_t pairs = static_cast<int64_t>(queue.size());
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), pairs / Lanes<T>::W));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      Source source = prototype;
      work(source, next, w);
    }
  });
  return workers;
}

// The pairs of `queue` (longest first) in log space.
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

template <typename T, typename Source>
void forward_all(const Problem& pr, const Source& prototype, T gap, T temperature, T* scores, T* dp_table) {
  forward_pairs<T>(pr, prototype, longest_first(pr), gap, temperature, scores, dp_table);
}

// ---------------------------------------------------------------------------------------------------
// The scaled sweep (float at t > 0). With E = 2^(H c), c = log2(e) / t,
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
constexpr int kScaledTop = 50;
constexpr int kScaledBlock = 4;
// The smallest value a block may hold: a term that flushed to 0 (below 2^-126, as the zero term 2^-sigma
// does once sigma > 126) is then under 2^-26 of every cell. At 2^-125, a tiny cell could lose half its
// value, and a large P carry that error into the best alignment.
constexpr float kScaledFloor = 0x1p-100f;

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

// Every pair through the scaled sweep, then the pairs it could not hold through the log-space one. A
// pair fails as soon as a block does, so at small temperatures, where most pairs fail (0.3 with BLOSUM62
// and gap -4), the call costs about what the log-space sweep alone does. The sources differ for scores
// from codes: the scaled one's matrix is the table of powers.
template <bool POWERS, typename Source>
void forward_scaled(const Problem& pr, const Source& scaled_source, const Source& log_source, float gap,
                    float temperature, float* scores, float* dp_table, int64_t& log_pairs) {
  std::vector<int64_t> again =
      scaled_pairs<POWERS>(pr, scaled_source, longest_first(pr), gap, temperature, scores, dp_table);
  log_pairs += static_cast<int64_t>(again.size());
  if (again.empty()) return;
  std::sort(again.begin(), again.end());  // the workers' lists come in any order: the batch's, for ties
  forward_pairs<float>(pr, log_source, longest_first(pr, std::move(again)), gap, temperature, scores, dp_table);
}

// Whether the scaled sweep takes a float call: allowed by the caller, t > 0 and gap <= 0 (each gap step
// can only shrink E).
bool scaled_applies(bool allowed, double gap, double temperature) { return allowed && temperature > 0 && gap <= 0; }

// The pairs of a call scored in log space after the scaled sweep, added to a (1,) int64 counter.
void add_log_pairs(const c10::optional<at::Tensor>& counter, int64_t pairs) {
  if (!counter.has_value()) return;
  TORCH_CHECK(counter->device().is_cpu() && counter->scalar_type() == at::kLong && counter->numel() == 1,
              "log_pairs must be a (1,) int64 CPU tensor");
  *counter->data_ptr<int64_t>() += pairs;
}

// The softmax weight exp((x - h) / t) of a term x of a cell h, on whole vectors: float by exp2_any (0
// below 2^-125, as for a -inf term; a NaN stays a NaN), float64 by the C library.
inline Lanes<float>::V softmax_weight(Lanes<float>::V x, Lanes<float>::V h, float log2e_t, float) {
  return exp2_any((x - h) * log2e_t);
}
inline Lanes<double>::V softmax_weight(Lanes<double>::V x, Lanes<double>::V h, double, double temperature) {
  Lanes<double>::V out;
  for (int l = 0; l < Lanes<double>::L; ++l) out[l] = std::exp((x[l] - h[l]) / temperature);
  return out;
}

// Per-thread rows of the reverse sweep (see backward_pair), each padded by a vector for the loads.
template <typename T>
struct BackwardRows {
  std::vector<T> w1, w2, w3, w1_below, w2_below, e, e_below, scores;
  void resize(int64_t n) {
    const size_t size = static_cast<size_t>(n + 2 + Lanes<T>::L);
    for (auto* v : {&w1, &w2, &w3, &w1_below, &w2_below, &e, &e_below, &scores}) v->assign(size, T(0));
  }
};

// One pair's part of the backward: its H (rows of ld values), S and gradient, and its best cell (bi, bj),
// the first maximal cell of H in row-major order, as torch.max picks it (a NaN first).
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

// The reverse sweep at t = 0: E[i][j] = d score / d H[i][j] is 0 but on the best alignment, so each cell
// with E pushes it to the one term that was maximal, the first in the reference's order (zero, match,
// delete, insert), and every other cell is skipped.
template <typename T>
void backward_pair_hard(const Problem& pr, const DenseSource<T>& S, const T* H, int64_t b, T grad, T gap,
                        T* grad_S, std::vector<T>& E) {
  const PairGradient<T> p(pr, S, H, grad_S, b);
  const int64_t q = p.q, n = p.n, ld = p.ld, bi = p.bi, bj = p.bj;
  const T *Hb = p.H, *Sb = p.S;
  T* Gb = p.G;
  E.assign((q + 1) * (n + 1), T(0));
  E[bi * (n + 1) + bj] = grad;
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
    }
  }
}

// The reverse sweep at t > 0: E[i][j] = d score / d H[i][j]; each cell hands E on to the cells it was
// computed from, weighted by the softmax of its terms. Row by row from the best cell's up, each cell pulls
// what it receives:
//
//     E[i][j] = E[i+1][j+1] w_match(i+1, j+1) + E[i+1][j] w_delete(i+1, j) + E[i][j+1] w_insert(i, j+1)
//
// A row's weights depend on H and S alone, so they are computed for the whole row on vectors (the 3
// exponentials of a cell were most of the time when each cell pushed its share one at a time); what is
// left along the row is one multiply-add a cell. A cell whose E is 0 passes nothing on, whatever its
// weights (a NaN among them included), and the sums are added in the order in which cells pushed them
// one at a time before (3 exponentials a cell, one cell at a time: 131 against 86 ms for 256 pairs of
// 256 x 256 on 2 cores).
template <typename T>
void backward_pair_soft(const Problem& pr, const DenseSource<T>& S, const T* H, int64_t b, T grad, T gap,
                        T temperature, T* grad_S, BackwardRows<T>& rows) {
  using V = typename Lanes<T>::V;
  constexpr int L = Lanes<T>::L;
  const PairGradient<T> p(pr, S, H, grad_S, b);
  const int64_t ld = p.ld, bi = p.bi, bj = p.bj;
  const T *Hb = p.H, *Sb = p.S;
  T* Gb = p.G;
  if (bi == 0 || bj == 0) return;  // the zero border: nothing flows into S
  const T log2e_t = static_cast<T>(log2e_over<T>(temperature));
  rows.resize(bj);
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
    std::swap(rows.e, rows.e_below), std::swap(rows.w1, rows.w1_below), std::swap(rows.w2, rows.w2_below);
    w1 = rows.w1.data(), w2 = rows.w2.data(), e = rows.e.data();
    w1_below = rows.w1_below.data(), w2_below = rows.w2_below.data(), e_below = rows.e_below.data();
  }
}

void check_lengths(const at::Tensor& qlen, const at::Tensor& tlen, int64_t B) {
  TORCH_CHECK(qlen.device().is_cpu() && tlen.device().is_cpu() && qlen.dtype() == at::kLong &&
                  tlen.dtype() == at::kLong && qlen.is_contiguous() && tlen.is_contiguous() &&
                  qlen.numel() == B && tlen.numel() == B,
              "lengths must be contiguous int64 CPU tensors of shape (B,)");
}

void check_scores(const at::Tensor& S) {
  TORCH_CHECK(S.dim() == 3, "score matrix must be 3-D (B, M, N), got ", S.dim(), "-D");
  TORCH_CHECK(S.device().is_cpu(), "the CPU engine needs a CPU tensor");
  TORCH_CHECK(S.scalar_type() == at::kFloat || S.scalar_type() == at::kDouble,
              "the CPU engine takes float32 or float64, got ", S.scalar_type());
}

template <typename T>
DenseSource<T> dense_source(const at::Tensor& S, const at::Tensor& tlen) {
  return DenseSource<T>{S.data_ptr<T>(), S.stride(0), S.stride(1), S.stride(2), tlen.data_ptr<int64_t>(),
                        {}};
}

}  // namespace

// Returns (scores (B,), H (B, M+1, N+1) when keep_dp_table, else an empty tensor). scaled: allow the
// scaled sweep (float32 at t > 0); log_pairs: a (1,) int64 CPU tensor to which the
// number of pairs it sent to the log-space sweep is added (tests, bench).
std::vector<at::Tensor> sw_forward(const at::Tensor& S, const at::Tensor& qlen, const at::Tensor& tlen,
                                   double gap, double temperature, bool keep_dp_table, bool scaled,
                                   const c10::optional<at::Tensor>& log_pairs) {
  check_scores(S);
  check_lengths(qlen, tlen, S.size(0));
  TORCH_CHECK(temperature >= 0, "temperature must be >= 0");
  const Problem pr{S.size(0), S.size(1), S.size(2), qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
  at::Tensor scores = at::zeros({pr.B}, S.options());
  at::Tensor dp = keep_dp_table ? at::zeros({pr.B, pr.M + 1, pr.N + 1}, S.options())
                                : at::empty({0}, S.options());
  int64_t to_log = 0;
  {
    pybind11::gil_scoped_release no_gil;  // pure C++ from here: let other Python threads run
    AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "sw_forward", [&] {
      const auto t = static_cast<scalar_t>(temperature);
      const DenseSource<scalar_t> source = dense_source<scalar_t>(S, tlen);
      if constexpr (std::is_same<scalar_t, float>::value) {
        if (scaled_applies(scaled, gap, temperature)) {
          forward_scaled<false>(pr, source, source, static_cast<float>(gap), t, scores.data_ptr<float>(),
                                keep_dp_table ? dp.data_ptr<float>() : nullptr, to_log);
          return;
        }
      }
      forward_all<scalar_t>(pr, source, static_cast<scalar_t>(gap), t, scores.data_ptr<scalar_t>(),
                            keep_dp_table ? dp.data_ptr<scalar_t>() : nullptr);
    });
  }
  add_log_pairs(log_pairs, to_log);
  return {scores, dp};
}

// Scores (B,) float32 of pairs given as uint8 codes (B, M) and (B, N) into a K x K matrix. scaled and
// log_pairs: as for sw_forward.
at::Tensor sw_forward_codes(const at::Tensor& query, const at::Tensor& target, const at::Tensor& qlen,
                            const at::Tensor& tlen, const at::Tensor& matrix, double gap, double temperature,
                            bool scaled, const c10::optional<at::Tensor>& log_pairs) {
  TORCH_CHECK(query.dim() == 2 && target.dim() == 2 && query.size(0) == target.size(0) &&
                  query.dtype() == at::kByte && target.dtype() == at::kByte && query.device().is_cpu() &&
                  target.device().is_cpu(),
              "codes must be uint8 CPU tensors of shapes (B, M) and (B, N)");
  TORCH_CHECK(matrix.dim() == 2 && matrix.size(0) == matrix.size(1) && matrix.size(0) <= 256 &&
                  matrix.device().is_cpu(),
              "the substitution matrix must be a square CPU tensor of at most 256 x 256");
  TORCH_CHECK(temperature >= 0, "temperature must be >= 0");
  check_lengths(qlen, tlen, query.size(0));
  const at::Tensor q = query.contiguous(), t = target.contiguous();
  const int64_t K = matrix.size(0);
  if (q.numel() > 0) TORCH_CHECK(q.max().item<int64_t>() < K, "a query code is outside the matrix");
  if (t.numel() > 0) TORCH_CHECK(t.max().item<int64_t>() < K, "a target code is outside the matrix");
  const at::Tensor table = matrix.to(at::kFloat).contiguous();
  const Problem pr{q.size(0), q.size(1), t.size(1), qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
  at::Tensor scores = at::zeros({pr.B}, matrix.options().dtype(at::kFloat));
  const CodeSource source{q.data_ptr<uint8_t>(), t.data_ptr<uint8_t>(), pr.M, pr.N, K,
                          tlen.data_ptr<int64_t>(), table.data_ptr<float>(), {}};
  // The scaled sweep's table of powers 2^(m c), rounded once, where every one is at most 2^60 (a NaN
  // or a huge entry keeps the whole call in log space).
  std::vector<float> powers;
  if (scaled_applies(scaled, gap, temperature)) {
    const double c = log2e_over<float>(temperature);
    const float* m = table.data_ptr<float>();
    powers.resize(K * K);
    for (int64_t x = 0; x < K * K; ++x) {
      powers[x] = static_cast<float>(std::exp2(double(m[x]) * c));
      if (!(powers[x] <= 0x1p60f)) {
        powers.clear();
        break;
      }
    }
  }
  int64_t to_log = 0;
  {
    pybind11::gil_scoped_release no_gil;
    if (!powers.empty()) {
      CodeSource with_powers = source;
      with_powers.matrix = powers.data();
      forward_scaled<true>(pr, with_powers, source, static_cast<float>(gap), static_cast<float>(temperature),
                           scores.data_ptr<float>(), nullptr, to_log);
    } else {
      forward_all<float>(pr, source, static_cast<float>(gap), static_cast<float>(temperature),
                         scores.data_ptr<float>(), nullptr);
    }
  }
  add_log_pairs(log_pairs, to_log);
  return scores;
}

at::Tensor sw_backward(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& dp,
                       const at::Tensor& qlen, const at::Tensor& tlen, double gap, double temperature) {
  check_scores(S);
  check_lengths(qlen, tlen, S.size(0));
  const Problem pr{S.size(0), S.size(1), S.size(2), qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
  TORCH_CHECK(dp.is_contiguous() && dp.dim() == 3 && dp.size(0) == pr.B && dp.size(1) == pr.M + 1 &&
                  dp.size(2) == pr.N + 1 && dp.scalar_type() == S.scalar_type(),
              "DP table does not match the score matrix");
  const at::Tensor grad = grad_scores.to(S.scalar_type()).contiguous();
  at::Tensor grad_S = at::zeros({pr.B, pr.M, pr.N}, S.options());
  pybind11::gil_scoped_release no_gil;
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "sw_backward", [&] {
    const scalar_t* g = grad.data_ptr<scalar_t>();
    const DenseSource<scalar_t> rows = dense_source<scalar_t>(S, tlen);
    const auto t = static_cast<scalar_t>(temperature), gp = static_cast<scalar_t>(gap);
    at::parallel_for(0, pr.B, 1, [&](int64_t begin, int64_t end) {
      BackwardRows<scalar_t> buffers;
      std::vector<scalar_t> E;
      for (int64_t b = begin; b < end; ++b) {
        if (g[b] == scalar_t(0)) continue;
        if (t == scalar_t(0))
          backward_pair_hard<scalar_t>(pr, rows, dp.data_ptr<scalar_t>(), b, g[b], gp, grad_S.data_ptr<scalar_t>(), E);
        else
          backward_pair_soft<scalar_t>(pr, rows, dp.data_ptr<scalar_t>(), b, g[b], gp, t, grad_S.data_ptr<scalar_t>(),
                                       buffers);
      }
    });
  });
  return grad_S;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &sw_forward, "soft Smith-Waterman scores (and the DP table for backward)");
  m.def("forward_codes", &sw_forward_codes, "scores of code pairs looked up in a substitution matrix");
  m.def("backward", &sw_backward, "gradient of the scores with respect to the score matrix");
}
