// SIMD inside a pair: the anti-diagonal sweep by strips of rows, for long pairs and small batches.
//
// A strip is R = 16 kP consecutive rows of one pair, one row per lane (kP native vectors of 16 floats,
// "packs"). At step s, lane l computes cell (i0 + l, s - l): the lanes run along an anti-diagonal, so each
// lane's three inputs are ready: its own previous output (the cell to the left), the previous output of
// the lane above (the cell above), and that lane's output one step earlier (the diagonal). The cell
// above lane 0 comes from the row above the strip (the zero border, or the last row of the strip
// before). A strip takes cols + R - 1 steps; the scores come from a gather per pack and step (codes: the
// matrix at row code x K + column code; dense scores: the strip's rows, strided).
//
// The cell is a template argument (strips_soft.cpp: soft scores in scaled space with an exponent per
// cell; strips_hard.cpp: the hard max), so is where the scores come from. A pair is swept in the
// orientation that takes fewer lane steps; a long pair's strips are shared by all threads (strip r in
// thread r mod T, relayed column by column), other pairs take one thread each.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "relay.h"
#include "simd.h"
#include "sources.h"

namespace swcli_cpu {

using VI16 = Lanes<float>::I;  // 16 int32 lanes (on AVX-512; the native width elsewhere)
constexpr int kStripLanes = Lanes<float>::L;

// A pair as the strips sweep it: `rows` rows of `cols` columns, transposed where the rows are the target.
struct StripPair {
  int64_t pair = 0;
  int64_t rows = 0, cols = 0;
  bool transposed = false;
  // scores from codes: the row and column codes and the K x K table read at row code * K + column code
  const uint8_t* row_codes = nullptr;
  const uint8_t* col_codes = nullptr;
  const float* lookup = nullptr;
  int64_t K = 0;
  // dense scores: S of the cell (i, j) of the swept orientation at S + i * s_row + j * s_col
  const float* S = nullptr;
  int64_t s_row = 0, s_col = 0;
  // the DP table, where kept: H of cell (i, j) (1-based, the border at 0) at table + i * t_row + j * t_col
  float* table = nullptr;
  int64_t t_row = 0, t_col = 0;
};

// The lane steps a pair takes in strips of R rows: rows rounded up to R, times cols + R - 1.
inline int64_t strip_steps(int64_t rows, int64_t cols, int64_t R) {
  return (rows + R - 1) / R * R * (cols + R - 1);
}

// The packs of a strip: 4, 64 rows. With 2 the steps' chain of latencies set the pace (0.6x on long
// pairs), with 8 the registers ran out (0.5x).
constexpr int kMaxPacks = 4;
constexpr int kStripRows = kMaxPacks * kStripLanes;

// Pairs with at least this many cells may take all threads (when one is more than a thread's share).
constexpr int64_t kStripSplitCells = int64_t(1) << 20;

// Pair b of a batch of codes as the strips sweep it, in the orientation that takes fewer lane steps in
// its strips. lookup: the K x K table at query code * K + target code; lookup_t its transpose.
// table: the batch's DP table (B, M+1, N+1), or null.
inline StripPair strip_pair_of_codes(const Problem& pr, const CodeSource& codes, int64_t b, const float* lookup,
                                     const float* lookup_t, float* table) {
  StripPair p;
  p.pair = b;
  const int64_t q = pr.qlen[b], t = pr.tlen[b];
  const int64_t R = kStripRows;
  p.transposed = strip_steps(t, q, R) < strip_steps(q, t, R);
  const uint8_t* qc = codes.query + b * codes.query_stride;
  const uint8_t* tc = codes.target + b * codes.N;
  p.rows = p.transposed ? t : q;
  p.cols = p.transposed ? q : t;
  p.row_codes = p.transposed ? tc : qc;
  p.col_codes = p.transposed ? qc : tc;
  p.lookup = p.transposed ? lookup_t : lookup;
  p.K = codes.K;
  if (table != nullptr) {
    p.table = table + b * (pr.M + 1) * (pr.N + 1);
    p.t_row = p.transposed ? 1 : pr.N + 1;
    p.t_col = p.transposed ? pr.N + 1 : 1;
  }
  return p;
}

// Pair b of dense scores S (B, M, N) with strides (sB, sM, sN), likewise.
inline StripPair strip_pair_of_dense(const Problem& pr, const float* S, int64_t sB, int64_t sM, int64_t sN, int64_t b,
                                     float* table) {
  StripPair p;
  p.pair = b;
  const int64_t q = pr.qlen[b], t = pr.tlen[b];
  const int64_t R = kStripRows;
  p.transposed = strip_steps(t, q, R) < strip_steps(q, t, R);
  p.rows = p.transposed ? t : q;
  p.cols = p.transposed ? q : t;
  p.S = S + b * sB;
  p.s_row = p.transposed ? sN : sM;
  p.s_col = p.transposed ? sM : sN;
  if (table != nullptr) {
    p.table = table + b * (pr.M + 1) * (pr.N + 1);
    p.t_row = p.transposed ? 1 : pr.N + 1;
    p.t_col = p.transposed ? pr.N + 1 : 1;
  }
  return p;
}

// Lane e + 1 gets lane e of v, lane 0 the last lane of `entering` (the pack before, or the row above).
inline Lanes<float>::V shift_lanes(Lanes<float>::V v, Lanes<float>::V entering) {
#if defined(__AVX512F__)
  return (Lanes<float>::V)_mm512_alignr_epi32((__m512i)v, (__m512i)entering, 15);
#elif defined(__AVX__)
  return __builtin_shufflevector(entering, v, 7, 8, 9, 10, 11, 12, 13, 14);
#else
  return __builtin_shufflevector(entering, v, 3, 4, 5, 6);
#endif
}

// Whether a pair of q x t cells takes the strips rather than the sweeps across pairs: from codes, where
// at least half its lane steps are cells (a strip's first and last 63 steps are part idle, and so are
// the lanes past the rows), and any pair of 2^20 cells or more, which across pairs would hold one lane
// of its worker for all that time; across pairs a cell costs about twice a strip's (2.5 against 1.1 to
// 1.3 GCUPS on one core at t = 1). Dense scores only from 2^20 cells: the strips' gathers from 64 rows
// of S, strided, make them slower than the sweep across pairs on a batch (B = 256, 256 x 256, one
// core: 0.6 against 0.8 GCUPS at t = 1), and much faster on a pair alone.
inline bool strips_take(int64_t q, int64_t t, bool dense) {
  if (q == 0 || t == 0) return false;
  const int64_t steps = std::min(strip_steps(q, t, kStripRows), strip_steps(t, q, kStripRows));
  return q * t >= kStripSplitCells || (!dense && 2 * q * t >= steps);
}

// Lane index vector of pack k: 16 k + e.
inline VI16 lane_index(int k) {
  VI16 v;
  for (int e = 0; e < kStripLanes; ++e) v[e] = k * kStripLanes + e;
  return v;
}

// Where a strip's scores come from. start(p, i0) before a strip of p; load(s, k, in) the scores of pack
// k's lanes at step s (lane l at column s - l); `in` masks the lanes inside the pair (only they are
// read; the others get any finite value).
struct StripCodes {
  std::vector<uint8_t> reversed;  // the column codes backwards, with R zero codes on each side
  int64_t base = 0;               // reversed[base - s + 16 k + e] is the code of column s - l
  VI16 offset[kMaxPacks];                 // row code * K of each lane (0 past the pair's rows)
  const float* lookup = nullptr;

  void start_pair(const StripPair& p) {
    constexpr int R = kStripRows;
    reversed.assign(p.cols + 2 * R + kStripLanes, 0);
    for (int64_t j = 0; j < p.cols; ++j) reversed[R + p.cols - 1 - j] = p.col_codes[j];
    base = R + p.cols - 1;
    lookup = p.lookup;
  }
  void start_strip(const StripPair& p, int64_t i0, int packs) {
    for (int k = 0; k < packs; ++k)
      for (int e = 0; e < kStripLanes; ++e) {
        const int64_t i = i0 + k * kStripLanes + e;
        offset[k][e] = i < p.rows ? static_cast<int32_t>(p.row_codes[i] * p.K) : 0;
      }
  }
  Lanes<float>::V load(int64_t s, int k, VI16 /*in*/) const {
    const uint8_t* codes = &reversed[base - s + k * kStripLanes];
#if defined(__AVX512F__)
    const VI16 index = (VI16)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))) + offset[k];
#else
    typedef uint8_t Codes __attribute__((vector_size(kStripLanes)));
    Codes c;
    std::memcpy(&c, codes, sizeof(Codes));
    const VI16 index = __builtin_convertvector(c, VI16) + offset[k];
#endif
#if defined(__AVX512F__)
    return (Lanes<float>::V)_mm512_i32gather_ps((__m512i)index, lookup, 4);
#elif defined(__AVX2__)
    return (Lanes<float>::V)_mm256_i32gather_ps(lookup, (__m256i)index, 4);
#else
    Lanes<float>::V out;
    for (int e = 0; e < kStripLanes; ++e) out[e] = lookup[index[e]];
    return out;
#endif
  }
};

struct StripDense {
  const float* rows = nullptr;  // the strip's first row
  int64_t s_col = 0;
  VI16 offset[kMaxPacks];  // l (s_row - s_col): lane l's score at step s is rows[offset + s s_col]

  void start_pair(const StripPair&) {}
  void start_strip(const StripPair& p, int64_t i0, int packs) {
    rows = p.S + i0 * p.s_row;
    s_col = p.s_col;
    for (int k = 0; k < packs; ++k)
      for (int e = 0; e < kStripLanes; ++e) {
        const int64_t l = k * kStripLanes + e;
        offset[k][e] = static_cast<int32_t>(l * (p.s_row - p.s_col));
      }
  }
  // Masked always: the lanes of the last strip past the pair's rows may lie past the tensor.
  Lanes<float>::V load(int64_t s, int k, VI16 in) const {
    const VI16 index = offset[k] + static_cast<int32_t>(s * s_col);
#if defined(__AVX512F__)
    return (Lanes<float>::V)_mm512_mask_i32gather_ps(_mm512_setzero_ps(), _mm512_movepi32_mask((__m512i)in),
                                                      (__m512i)index, rows, 4);
#else
    Lanes<float>::V out;
    for (int e = 0; e < kStripLanes; ++e) out[e] = in[e] ? rows[index[e]] : 0.0f;
    return out;
#endif
  }
};

// Denormal results flushed to zero (and denormal inputs read as zero) while alive, in this thread. The
// cells' terms under 2^-126 of their sum are negligible (strips_soft.cpp), and each one that underflowed
// cost a microcode assist: without this the soft strips ran 1.4x slower on long pairs.
class FlushDenormals {
 public:
  FlushDenormals() {
#if defined(__SSE__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040);  // FTZ (bit 15) and DAZ (bit 6)
#endif
  }
  ~FlushDenormals() {
#if defined(__SSE__)
    _mm_setcsr(saved_);
#endif
  }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned int saved_ = 0;
};

// A cell's value on one pack: two vectors (the soft cell's exponent and mantissa; the hard cell's H and
// an unused one).
struct CellValue {
  Lanes<float>::V a, b;
};

// Whether a dense pair's strided offsets fit the gathers' int32 indices.
inline bool dense_offsets_fit(const StripPair& p) {
  const int64_t R = kStripRows;
  const int64_t reach = (R + 1) * std::max<int64_t>(p.s_row, 1) + (p.cols + R + 1) * std::max<int64_t>(p.s_col, 1);
  return p.s_row >= 0 && p.s_col >= 0 && reach < (int64_t(1) << 31);
}

// H of pack k's cells at step s into the pair's DP table, where `in` (the lanes inside the pair): lane
// e at row i0 + 16 k + e, column s - 16 k - e, offsets linear in e (a scatter), in 32 bits where they fit.
inline void write_cells(const StripPair& p, int64_t i0, int64_t s, int k, Lanes<float>::V h, VI16 in) {
  const int64_t row = i0 + k * kStripLanes + 1, col = s - k * kStripLanes + 1;
  float* base = p.table + row * p.t_row;
  const int64_t step = p.t_row - p.t_col, reach = (p.cols + kStripRows + 1) * p.t_col + kStripLanes * std::abs(step);
#if defined(__AVX512F__)
  if (reach < (int64_t(1) << 31)) {
    const VI16 index = lane_index(0) * static_cast<int32_t>(step) + static_cast<int32_t>(col * p.t_col);
    _mm512_mask_i32scatter_ps(base, _mm512_movepi32_mask((__m512i)in), (__m512i)index, (__m512)h, 4);
    return;
  }
#endif
  for (int e = 0; e < kStripLanes; ++e)
    if (in[e]) base[e * step + col * p.t_col] = h[e];
}

// The pairs of `pairs` from codes as the strips sweep them.
inline std::vector<StripPair> code_strip_pairs(const Problem& pr, const CodeSource& codes, const std::vector<int64_t>& pairs,
                                               const float* lookup, const float* lookup_t, float* table) {
  std::vector<StripPair> strips;
  for (int64_t b : pairs) strips.push_back(strip_pair_of_codes(pr, codes, b, lookup, lookup_t, table));
  return strips;
}

// The pairs of `pairs` from dense scores as the strips sweep them; those whose offsets do not fit the
// gathers' int32 indices go to `across`.
inline std::vector<StripPair> dense_strip_pairs(const Problem& pr, const float* S, int64_t sB, int64_t sM, int64_t sN,
                                                const std::vector<int64_t>& pairs, float* table,
                                                std::vector<int64_t>& across) {
  std::vector<StripPair> strips;
  for (int64_t b : pairs) {
    const StripPair p = strip_pair_of_dense(pr, S, sB, sM, sN, b, table);
    if (dense_offsets_fit(p))
      strips.push_back(p);
    else
      across.push_back(b);
  }
  return strips;
}

// One strip of rows [i0, i0 + 16 kP) of pair p: the cells of the sweep's Cell (see strips_soft.cpp for
// what a Cell provides), the row above read from `above`, the strip's last row written to `below`, the
// best cell folded into `best`.
template <typename Cell, int kP, bool Table, typename Source>
void sweep_strip(const Cell& cell, const StripPair& p, int64_t i0, Source& source, RowAbove<typename Cell::Scalar>& above,
                 RowBelow<typename Cell::Scalar>& below, typename Cell::Best& best) {
  using Value = typename Cell::Value;
  constexpr int R = kP * kStripLanes;
  const int64_t cols = p.cols, steps = cols + R - 1;
  const FlushDenormals flush;
  source.start_strip(p, i0, kP);
  VI16 lanes[kP], row_in[kP];
  // The previous step's output of each lane and the cell above it, each value's two vectors in arrays
  // of their own: arrays of the two-vector struct stayed in memory (a copy through the stack each step).
  Lanes<float>::V out_a[kP], out_b[kP], up_a[kP], up_b[kP];
  for (int k = 0; k < kP; ++k) {
    lanes[k] = lane_index(k);
    row_in[k] = lanes[k] < static_cast<int32_t>(p.rows - i0);
    const Value border = cell.border();
    out_a[k] = up_a[k] = border.a;
    out_b[k] = up_b[k] = border.b;
  }
  const int64_t last_row = std::min<int64_t>(R, p.rows - i0) - 1;  // the lane of the strip's last row
  const int last_pack = static_cast<int>(last_row / kStripLanes), last_lane = static_cast<int>(last_row % kStripLanes);
  typename Cell::Best local = best;  // in registers while the strip is swept
  // Three phases: the first R - 1 steps, where some lanes have not started; the steps where every lane
  // is inside the columns; the last steps, where lanes have passed the last column.
  const bool partial = p.rows - i0 < R;  // the last strip, with lanes past the pair's rows
  auto step = [&](auto edge_type, auto partial_type, int64_t s) __attribute__((always_inline)) {
    constexpr bool edge = decltype(edge_type)::value, masked = edge || decltype(partial_type)::value;
    // the row above lane 0, at column s (the border past the last column)
    const typename Cell::Scalar top = (above.border() || s >= cols) ? cell.border_scalar() : above.at(s);
    Value entering = cell.broadcast(top);
#pragma GCC unroll 8
    for (int k = 0; k < kP; ++k) {
      // pack k's lanes take the lanes above: lane e - 1, and for e = 0 the last lane of pack k-1 (its
      // output of the previous step, read before it is overwritten: hence `entering`)
      const Value out_k{out_a[k], out_b[k]};
      const Value above_k = cell.shift_in(out_k, entering);
      entering = out_k;
      VI16 in = masked ? row_in[k] : splat<VI16>(-1);
      if (edge) {
        const VI16 col = static_cast<int32_t>(s) - lanes[k];
        in = in & (col >= 0) & (col < static_cast<int32_t>(cols));
      }
      const auto scores = source.load(s, k, in);
      cell.check(local, scores, in, k);
      Value h = cell.step(Value{up_a[k], up_b[k]}, above_k, out_k, scores);
      if (edge) {
        const VI16 started = static_cast<int32_t>(s) >= lanes[k];
        h = cell.select(started, h, cell.border());  // lanes before their first column keep the border
      }
      out_a[k] = h.a, out_b[k] = h.b;
      up_a[k] = above_k.a, up_b[k] = above_k.b;
      cell.track(local, h, in, k);
      if (Table) write_cells(p, i0, s, k, cell.table_value(h), in);
    }
    const int64_t j = s - last_row;  // the column the strip's last row reached
    if (below.wanted() && j >= 0 && j < cols) below.put(j, cell.lane(Value{out_a[last_pack], out_b[last_pack]}, last_lane), cols);
  };
  const int64_t ramp = std::min<int64_t>(R - 1, steps);
  const int64_t tail = std::max<int64_t>(cols, ramp);
  int64_t s = 0;
  for (; s < ramp; ++s) step(std::true_type{}, std::true_type{}, s);
  if (partial) {
    for (; s < tail; ++s) step(std::false_type{}, std::true_type{}, s);
  } else {
    for (; s < tail; ++s) step(std::false_type{}, std::false_type{}, s);
  }
  for (; s < steps; ++s) step(std::true_type{}, std::true_type{}, s);
  best = local;
}

// The strips of one pair in one thread, top to bottom.
template <typename Cell, int kP, typename Source>
void sweep_pair(const Cell& cell, const StripPair& p, Source& source, std::vector<typename Cell::Scalar>& rows_a,
                std::vector<typename Cell::Scalar>& rows_b, typename Cell::Best& best) {
  constexpr int R = kP * kStripLanes;
  source.start_pair(p);
  rows_a.resize(p.cols);
  rows_b.resize(p.cols);
  Relay relay(1);  // not waited on: a strip reads the row the previous one wrote in full
  for (int64_t i0 = 0; i0 < p.rows; i0 += R) {
    RowAbove<typename Cell::Scalar> above;
    if (i0 > 0) above = RowAbove<typename Cell::Scalar>{&relay, 0, rows_a.data(), p.cols};
    RowBelow<typename Cell::Scalar> below;
    if (i0 + R < p.rows) below = RowBelow<typename Cell::Scalar>{&relay, 0, rows_b.data()};
    if (p.table != nullptr)
      sweep_strip<Cell, kP, true>(cell, p, i0, source, above, below, best);
    else
      sweep_strip<Cell, kP, false>(cell, p, i0, source, above, below, best);
    std::swap(rows_a, rows_b);
  }
}

// The strips of one pair shared by `threads` workers: each takes the next strip in order, reading the
// last row of the strip before as it is published. Handed out in order, a strip waits only for strips
// already handed out, so the workers cannot deadlock even where at::parallel_for runs them one after
// the other (a nested call); a fixed strip r for worker r mod threads would, there. A strip writes its
// last row into one of threads + 2 rows in turn, once the strip that read what that row held is done.
template <typename Cell, int kP, typename Source>
void sweep_pair_threaded(const Cell& cell, const StripPair& p, const Source& prototype, int64_t threads,
                         std::vector<typename Cell::Best>& bests) {
  using Scalar = typename Cell::Scalar;
  constexpr int R = kP * kStripLanes;
  const int64_t strips = (p.rows + R - 1) / R;
  threads = std::max<int64_t>(1, std::min(threads, strips));
  const int64_t ring = threads + 2;
  std::vector<std::vector<Scalar>> last_rows(ring, std::vector<Scalar>(p.cols));
  Relay relay(strips);
  bests.assign(threads, cell.no_best());
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      Source source = prototype;
      source.start_pair(p);
      for (int64_t r = next++; r < strips; r = next++) {
        if (r + 1 < strips && r - ring + 1 >= 0) relay.wait(r - ring + 1, p.cols);  // its row read in full
        RowAbove<Scalar> above;
        if (r > 0) above = RowAbove<Scalar>{&relay, r - 1, last_rows[(r - 1) % ring].data(), 0};
        RowBelow<Scalar> below;
        if (r + 1 < strips) below = RowBelow<Scalar>{&relay, r, last_rows[r % ring].data()};
        if (p.table != nullptr)
          sweep_strip<Cell, kP, true>(cell, p, r * R, source, above, below, bests[w]);
        else
          sweep_strip<Cell, kP, false>(cell, p, r * R, source, above, below, bests[w]);
        if (r + 1 >= strips || below.row == nullptr) relay.publish(r, p.cols);
      }
    }
  });
}

// Every pair of `pairs` through the strips: finish(n, best) for pairs[n] once swept (from any thread).
// The longest pairs, each more than a thread's share of the batch, take every thread, one after the
// other; the others one thread each, longest first.
template <typename Cell, typename Source, typename Finish>
void strip_pairs(const Cell& cell, const std::vector<StripPair>& pairs, const Source& prototype, Finish finish) {
  using Best = typename Cell::Best;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  std::vector<int64_t> order(pairs.size());
  int64_t total = 0;
  for (size_t n = 0; n < pairs.size(); ++n) {
    order[n] = static_cast<int64_t>(n);
    total += pairs[n].rows * pairs[n].cols;
  }
  auto cells = [&](int64_t n) { return pairs[n].rows * pairs[n].cols; };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cells(a) > cells(b); });
  size_t first = 0;
  for (; first < order.size() && threads > 1; ++first) {
    const int64_t n = order[first];
    if (cells(n) < kStripSplitCells || cells(n) * threads <= total) break;
    std::vector<Best> bests;
    sweep_pair_threaded<Cell, kMaxPacks>(cell, pairs[n], prototype, threads, bests);
    Best best = cell.no_best();
    for (const Best& b : bests) cell.merge(best, b);
    finish(n, best);
  }
  const int64_t rest = static_cast<int64_t>(order.size() - first);
  if (rest == 0) return;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, rest), 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      Source source = prototype;
      std::vector<typename Cell::Scalar> rows_a, rows_b;
      for (int64_t m = next++; m < rest; m = next++) {
        const int64_t n = order[first + m];
        Best best = cell.no_best();
        sweep_pair<Cell, kMaxPacks>(cell, pairs[n], source, rows_a, rows_b, best);
        finish(n, best);
      }
    }
  });
}

}  // namespace swcli_cpu
