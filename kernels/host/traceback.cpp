// Hard (t = 0) Smith-Waterman with a traceback, for the alignment details of the pairs swcli writes
// (swcli/details.py): one optimal alignment per pair, its ends, its counts and its operations.
//
// The recurrence and every tie are the engines' at t = 0 (design.md, sections 1 and 7), computed in
// float32 with the same additions, so the score is the engine's bit for bit and the alignment is the
// one whose match cells the t = 0 backward marks:
//
//   linear (gap g):  H = max(0, H[i-1][j-1] + S, H[i-1][j] + g, H[i][j-1] + g)
//   affine (o, e):   M = H[i-1][j-1] + S
//                    X = max(o, M[i][j-1] + o, Y[i][j-1] + o, X[i][j-1] + e)    a gap in the query
//                    Y = max(o, M[i-1][j] + o, Y[i-1][j] + e, X[i-1][j] + o)    a gap in the target
//                    H = max(0, M, Y, X)
//
// - the end: the first cell of largest H in row-major order (zero border included: score 0 is the
//   empty alignment);
// - the walk back: each state takes the first of its maximal terms in the order written above (start,
//   match, Y, X; for the linear H: start, match, up, left), and ends at a start.
//
// Operations, in the alignment's order: 'M' a query residue against a target residue, 'I' a query
// residue against a gap (the Y state), 'D' a target residue against a gap (the X state): SAM's CIGAR
// letters with the query as the read and the target as the reference.
//
// Memory: the walk needs each cell's choices (one byte), so a pair is swept twice: once for its end, with
// every `band_rows`-th row of the state kept, then band by band upwards from the end, each band swept
// again from the row kept above it, up to the end's column, with its choices. Pairs that fit one band
// (up to 16 MiB of choices) are swept once; the others cost about 8 tlen sqrt(qlen) bytes a thread.
//
// Two sweeps compute the same recurrence. The float sweep is the one written above, a cell at a time.
// The integer sweep serves the usual case, a matrix and gaps of integers whose sums stay below 2^24 in
// magnitude: there every float32 sum above is exact, so the float sweep's values are integers computed
// without rounding, and the same values computed in int32 in any order are the same numbers, with the
// same ties, choices and end. It takes a row a vector of lanes at a time (lanes.h): the match, the gap
// from above and, for affine gaps, Y depend on the row above only; the gap from the left is a running
// maximum along the row, H[j] = max(T[j], H[j-1] + g) (X[j] = max(A[j], X[j-1] + e)), taken inside a
// vector by log2(lanes) shifted maxima and carried from the vector before. Scores come from a profile
// of the target: each matrix row gathered along the target once per pair.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "lanes.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kBandBytes = int64_t(1) << 24;  // a pair's choices up to this size are kept whole

// Rows per band: the whole pair while its choices fit kBandBytes; past that, enough rows that the kept
// rows (16 bytes a cell, one every band) weigh about what a band's choices (a byte a cell) do, so a
// pair of m x n cells takes about 8 n sqrt(m) bytes.
int64_t default_band_rows(int64_t qlen, int64_t tlen) {
  const int64_t balanced = static_cast<int64_t>(std::ceil(4.0 * std::sqrt(static_cast<double>(qlen))));
  return std::max<int64_t>({1, balanced, kBandBytes / std::max<int64_t>(1, tlen)});
}

// The first of four terms that equals their max (the max is one of them): 0, 1, 2 or 3.
inline uint8_t first_max(float best, float a, float b, float c) {
  return best == a ? 0 : best == b ? 1 : best == c ? 2 : 3;
}

struct Pair {
  const uint8_t* query;
  const uint8_t* target;
  int64_t qlen, tlen;
};

// One row of the DP state: H, and for affine gaps M, X, Y, at columns 0 .. tlen.
struct Row {
  std::vector<float> h, m, x, y;
  void reset(int64_t width, bool affine) {
    h.assign(width + 1, 0.0f);
    if (affine) {
      m.assign(width + 1, -kInf);
      x.assign(width + 1, -kInf);
      y.assign(width + 1, -kInf);
    }
  }
};

// The float sweep: the recurrence as written at the top, a cell at a time.
struct Sweeper {
  using Value = float;
  using State = Row;
  const float* matrix;
  int64_t alphabet;
  float open, extend;  // linear: both the gap
  bool affine;

  void start(const Pair&) {}

  // Rows first+1 .. last of `pair` over columns 1 .. width, from `row` (row `first`, updated in place to
  // row `last`). choices: null, or (last - first) x width bytes. best/bi/bj: the running end (strictly
  // larger H only, so the first in row-major order), tracked when `track`. keep_every > 0: a copy of the
  // row after every row i with i % keep_every == 0, appended to `kept`.
  void sweep(const Pair& pair, int64_t first, int64_t last, int64_t width, Row& row, uint8_t* choices,
             bool track, float& best, int64_t& bi, int64_t& bj, int64_t keep_every, std::vector<Row>* kept) const {
    const float o = open, e = extend;
    for (int64_t i = first + 1; i <= last; ++i) {
      const float* scores = matrix + pair.query[i - 1] * alphabet;
      uint8_t* choice = choices ? choices + (i - first - 1) * width - 1 : nullptr;  // choice[j], j >= 1
      float* H = row.h.data();
      float diagonal = H[0];  // H[i-1][j-1]; H[i][0] = 0
      if (!affine) {
        for (int64_t j = 1; j <= width; ++j) {
          const float up = H[j];
          const float match = diagonal + scores[pair.target[j - 1]];
          const float from_up = up + o, from_left = H[j - 1] + o;
          const float h = std::max(std::max(0.0f, match), std::max(from_up, from_left));
          if (choice) choice[j] = first_max(h, 0.0f, match, from_up);
          diagonal = up;
          H[j] = h;
          if (track && h > best) best = h, bi = i, bj = j;
        }
      } else {
        float* M = row.m.data();
        float* X = row.x.data();
        float* Y = row.y.data();
        float m_left = -kInf, x_left = -kInf, y_left = -kInf;  // M, X, Y of [i][0]
        for (int64_t j = 1; j <= width; ++j) {
          const float up = H[j];
          const float m = diagonal + scores[pair.target[j - 1]];
          const float y1 = M[j] + o, y2 = Y[j] + e, y3 = X[j] + o;
          const float y = std::max(std::max(o, y1), std::max(y2, y3));
          const float x1 = m_left + o, x2 = y_left + o, x3 = x_left + e;
          const float x = std::max(std::max(o, x1), std::max(x2, x3));
          const float h = std::max(std::max(0.0f, m), std::max(y, x));
          if (choice) {
            choice[j] = static_cast<uint8_t>(first_max(h, 0.0f, m, y) | first_max(x, o, x1, x2) << 2 |
                                             first_max(y, o, y1, y2) << 4);
          }
          diagonal = up;
          H[j] = h, M[j] = m, X[j] = x, Y[j] = y;
          m_left = m, x_left = x, y_left = y;
          if (track && h > best) best = h, bi = i, bj = j;
        }
      }
      if (kept && keep_every > 0 && i % keep_every == 0 && i < last) kept->push_back(row);
    }
  }
};

// -inf of the integer sweep: below any value by far, and no sum of it with a few scores overflows.
constexpr int32_t kMinusInfinity = -(1 << 29);
// Integer values whose sums along a pair stay below this magnitude are exact in float32 too.
constexpr double kExactFloat = 16777216.0;  // 2^24

// A row of the integer sweep, with room for a vector of lanes past column width.
struct IntRow {
  std::vector<int32_t> h, m, x, y;
  void reset(int64_t width, bool affine) {
    const size_t size = static_cast<size_t>(width + 1 + Lanes::kCount);
    h.assign(size, 0);
    if (affine) {
      m.assign(size, kMinusInfinity);
      x.assign(size, kMinusInfinity);
      y.assign(size, kMinusInfinity);
    }
  }
};

// The integer sweep (see the top): the same interface as Sweeper, on a profile of the pair's target.
struct IntSweeper {
  using Value = int32_t;
  using State = IntRow;
  using V = Lanes;
  using T = Lanes::T;
  const float* matrix;
  int64_t alphabet;
  int32_t open, extend;
  bool affine;
  std::vector<int32_t> profile;  // profile[a * stride + j - 1]: the score of code a against target residue j
  int64_t stride = 0;

  // The profile of pair's target, its rows padded by a vector of lanes (never read into a result).
  void start(const Pair& pair) {
    stride = pair.tlen + Lanes::kCount;
    profile.resize(static_cast<size_t>(alphabet * stride));
    for (int64_t a = 0; a < alphabet; ++a) {
      const float* scores = matrix + a * alphabet;
      int32_t* out = profile.data() + a * stride;
      for (int64_t j = 0; j < pair.tlen; ++j) out[j] = static_cast<int32_t>(scores[pair.target[j]]);
      std::fill(out + pair.tlen, out + stride, kMinusInfinity);
    }
  }

  // The first of four terms equal to their max, in lanes: first_max of each lane.
  static T first_max(T best, T a, T b, T c) {
    T code = V::where_equal(best, c, V::set1(2), V::set1(3));
    code = V::where_equal(best, b, V::set1(1), code);
    return V::where_equal(best, a, V::set1(0), code);
  }

  // H[j] = max(t[j], H[j-1] + g) along a vector, H[j0-1] being every lane of `carry`: log2(lanes)
  // shifted maxima, then the carry; ramp is lane l's (l + 1) g.
  static T running_max(T t, T carry, int32_t g, T ramp) {
    const T minus_infinity = V::set1(kMinusInfinity);
    if constexpr (V::kCount > 1) t = V::max(t, V::add(V::shift_in<1>(t, minus_infinity), V::set1(g)));
    if constexpr (V::kCount > 2) t = V::max(t, V::add(V::shift_in<2>(t, minus_infinity), V::set1(2 * g)));
    if constexpr (V::kCount > 4) t = V::max(t, V::add(V::shift_in<4>(t, minus_infinity), V::set1(4 * g)));
    if constexpr (V::kCount > 8) t = V::max(t, V::add(V::shift_in<8>(t, minus_infinity), V::set1(8 * g)));
    return V::max(t, V::add(carry, ramp));
  }

  void sweep(const Pair& pair, int64_t first, int64_t last, int64_t width, IntRow& row, uint8_t* choices,
             bool track, int32_t& best, int64_t& bi, int64_t& bj, int64_t keep_every,
             std::vector<IntRow>* kept) const {
    const T zero = V::set1(0), minus_infinity = V::set1(kMinusInfinity), o = V::set1(open), e = V::set1(extend);
    const T ramp_open = V::ramp(open), ramp_extend = V::ramp(extend);
    for (int64_t i = first + 1; i <= last; ++i) {
      const int32_t* scores = profile.data() + pair.query[i - 1] * stride - 1;  // scores[j], j >= 1
      uint8_t* choice = choices ? choices + (i - first - 1) * width - 1 : nullptr;  // choice[j], j >= 1
      int32_t* H = row.h.data();
      T previous_up = zero;  // its last lane: H[i-1][0] = 0, the diagonal of column 1
      T row_best = minus_infinity;
      if (!affine) {
        T left = zero;  // every lane: H[i][j0-1], the carry into the vector at j0 (H[i][0] = 0)
        for (int64_t j = 1; j <= width; j += V::kCount) {
          const T up = V::load(H + j);
          const T match = V::add(V::shift_in<1>(up, previous_up), V::load(scores + j));
          const T from_up = V::add(up, o);
          const T h = running_max(V::max(V::max(zero, match), from_up), left, open, ramp_open);
          previous_up = up;
          left = V::last(h);
          V::store(H + j, h);
          if (choice) V::store_bytes(choice + j, first_max(h, zero, match, from_up));
          if (track) row_best = V::max(row_best, V::first(h, width - j + 1, minus_infinity));
        }
      } else {
        int32_t* M = row.m.data();
        int32_t* X = row.x.data();
        int32_t* Y = row.y.data();
        T previous_m = minus_infinity, previous_y = minus_infinity, left_x = minus_infinity;  // of [i][0]
        for (int64_t j = 1; j <= width; j += V::kCount) {
          const T up = V::load(H + j);
          const T m = V::add(V::shift_in<1>(up, previous_up), V::load(scores + j));
          const T y1 = V::add(V::load(M + j), o), y2 = V::add(V::load(Y + j), e), y3 = V::add(V::load(X + j), o);
          const T y = V::max(V::max(o, y1), V::max(y2, y3));
          const T x1 = V::add(V::shift_in<1>(m, previous_m), o), x2 = V::add(V::shift_in<1>(y, previous_y), o);
          const T x = running_max(V::max(V::max(o, x1), x2), left_x, extend, ramp_extend);
          const T h = V::max(V::max(zero, m), V::max(y, x));
          previous_up = up, previous_m = m, previous_y = y;
          left_x = V::last(x);
          V::store(H + j, h), V::store(M + j, m), V::store(X + j, x), V::store(Y + j, y);
          if (choice) {
            const T code = V::bit_or(first_max(h, zero, m, y), V::bit_or(V::shift_left_bits<2>(first_max(x, o, x1, x2)),
                                                                     V::shift_left_bits<4>(first_max(y, o, y1, y2))));
            V::store_bytes(choice + j, code);
          }
          if (track) row_best = V::max(row_best, V::first(h, width - j + 1, minus_infinity));
        }
      }
      if (track) {
        const int32_t top = V::reduce_max(row_best);
        if (top > best) {  // the row's first cell of its largest H: the first in row-major order
          int64_t j = 1;
          while (H[j] != top) ++j;
          best = top, bi = i, bj = j;
        }
      }
      if (kept && keep_every > 0 && i % keep_every == 0 && i < last) kept->push_back(row);
    }
  }
};

// The largest magnitude among the matrix's scores and the gaps.
double largest_magnitude(const float* matrix, int64_t alphabet, float gap_open, float gap_extend) {
  double largest = std::max(std::fabs(gap_open), std::fabs(gap_extend));
  for (int64_t k = 0; k < alphabet * alphabet; ++k) largest = std::max(largest, std::fabs(double(matrix[k])));
  return largest;
}

// Whether every score and gap is a whole number (the integer sweep's first condition; the second, sums
// below 2^24 in magnitude, is checked per pair).
bool integral(const float* matrix, int64_t alphabet, float gap_open, float gap_extend) {
  auto whole = [](float v) { return std::isfinite(v) && v == std::nearbyint(v); };
  for (int64_t k = 0; k < alphabet * alphabet; ++k) {
    if (!whole(matrix[k])) return false;
  }
  return whole(gap_open) && whole(gap_extend);
}

struct Result {
  float score;
  int64_t qstart, qend, tstart, tend;
  int64_t length;  // operations written
  int64_t identities, mismatches, gap_opens, gaps;
};

// The counts of an alignment's operations: identical codes, other matches, gap runs (a run of 'I'
// next to a run of 'D' is two gaps, as in BLAST), gap positions.
void count(const Pair& pair, const char* ops, Result& r) {
  int64_t i = r.qstart - 1, j = r.tstart - 1;
  char previous = 'M';
  for (int64_t k = 0; k < r.length; ++k) {
    const char op = ops[k];
    if (op == 'M') {
      if (pair.query[i] == pair.target[j]) ++r.identities;
      else ++r.mismatches;
      ++i, ++j;
    } else {
      ++r.gaps;
      if (op != previous) ++r.gap_opens;
      if (op == 'I') ++i;
      else ++j;
    }
    previous = op;
  }
}

// One pair: its end, then the walk back band by band, by either sweep. ops: room for qlen + tlen
// operations. choices get a vector of lanes of slack: the integer sweep writes whole vectors.
template <class Sweeper>
Result align_pair(Sweeper& sweeper, const Pair& pair, int64_t band_rows, char* ops, typename Sweeper::State& row,
                  std::vector<typename Sweeper::State>& kept, std::vector<uint8_t>& choices) {
  using Value = typename Sweeper::Value;
  Result result{};
  if (pair.qlen == 0 || pair.tlen == 0) return result;
  sweeper.start(pair);
  const bool one_band = pair.qlen <= band_rows;
  Value best = 0;
  int64_t bi = 0, bj = 0;
  row.reset(pair.tlen, sweeper.affine);
  kept.clear();
  kept.push_back(row);  // row 0: the border
  if (one_band) choices.resize(static_cast<size_t>(pair.qlen * pair.tlen + Lanes::kCount));
  sweeper.sweep(pair, 0, pair.qlen, pair.tlen, row, one_band ? choices.data() : nullptr, true, best, bi, bj,
                one_band ? 0 : band_rows, &kept);
  result.score = static_cast<float>(best);
  if (bi == 0) return result;  // score 0: the empty alignment
  // The choices of rows band_first+1 .. band_first+band_rows (capped by the end's row), columns 1 .. width.
  int64_t width = one_band ? pair.tlen : bj;
  int64_t band_first = one_band ? 0 : -1;
  auto load_band = [&](int64_t i) {
    const int64_t first = (i - 1) / band_rows * band_rows;
    const int64_t last = std::min(first + band_rows, bi);
    typename Sweeper::State start = kept[first / band_rows];
    choices.resize(static_cast<size_t>((last - first) * width + Lanes::kCount));
    Value unused = 0;
    int64_t ui = 0, uj = 0;
    sweeper.sweep(pair, first, last, width, start, choices.data(), false, unused, ui, uj, 0, nullptr);
    band_first = first;
  };
  auto choice = [&](int64_t i, int64_t j) {
    if (band_first < 0 || i <= band_first || i > band_first + band_rows) load_band(i);
    return choices[(i - band_first - 1) * width + (j - 1)];
  };
  enum State { kH, kX, kY };
  State state = kH;
  int64_t i = bi, j = bj, n = 0;
  while (i >= 1 && j >= 1) {
    const uint8_t c = choice(i, j);
    if (!sweeper.affine) {
      const uint8_t h = c & 3;
      if (h == 0) break;
      if (h == 1) ops[n++] = 'M', --i, --j;
      else if (h == 2) ops[n++] = 'I', --i;
      else ops[n++] = 'D', --j;
      continue;
    }
    if (state == kH) {
      const uint8_t h = c & 3;
      if (h == 0) break;
      if (h == 1) ops[n++] = 'M', --i, --j;
      else state = h == 2 ? kY : kX;
    } else if (state == kX) {  // X[i][j]: target residue j against a gap; from column j-1
      const uint8_t from = (c >> 2) & 3;
      ops[n++] = 'D', --j;
      if (from == 0) break;  // a gap from the start: not on an optimal path of positive score
      if (from == 1) {
        if (j < 1) break;
        ops[n++] = 'M', --i, --j, state = kH;  // the match state at [i][j], then H above-left of it
      } else {
        state = from == 2 ? kY : kX;
      }
    } else {  // Y[i][j]: query residue i against a gap; from row i-1
      const uint8_t from = (c >> 4) & 3;
      ops[n++] = 'I', --i;
      if (from == 0) break;
      if (from == 1) {
        if (i < 1) break;
        ops[n++] = 'M', --i, --j, state = kH;
      } else {
        state = from == 2 ? kY : kX;
      }
    }
  }
  std::reverse(ops, ops + n);
  result.qstart = i + 1, result.tstart = j + 1, result.qend = bi, result.tend = bj, result.length = n;
  count(pair, ops, result);
  return result;
}

}  // namespace

// Pairs k = 0 .. pairs-1: query codes query_codes[query_starts[k] .. + query_lengths[k]), target likewise;
// matrix: alphabet x alphabet float32, row = query code. gap_open == gap_extend: linear gaps.
// Outputs per pair k: scores[k]; ends[4k .. 4k+3] = qstart, qend, tstart, tend (1-based, inclusive; 0 for
// the empty alignment); counts[4k .. 4k+3] = identities, mismatches, gap opens, gap positions;
// ops[op_offsets[k] ..] its operations (room for qlen + tlen), op_lengths[k] how many. band_rows <= 0:
// chosen from the band budget. integer_sweep: 0 keeps every pair on the float sweep (the tests compare
// the two), else the integer sweep takes the pairs where it is exact. Runs on `threads` threads, pairs
// taken in turn.
extern "C" void swcli_traceback(int64_t pairs, const uint8_t* query_codes, const int64_t* query_starts,
                                const int64_t* query_lengths, const uint8_t* target_codes,
                                const int64_t* target_starts, const int64_t* target_lengths, const float* matrix,
                                int64_t alphabet, float gap_open, float gap_extend, int64_t band_rows,
                                int64_t integer_sweep, int64_t threads, float* scores, int64_t* ends,
                                int64_t* counts, char* ops, const int64_t* op_offsets, int64_t* op_lengths) {
  const bool affine = gap_open != gap_extend;
  const bool integers = integer_sweep != 0 && integral(matrix, alphabet, gap_open, gap_extend);
  const double largest = integers ? largest_magnitude(matrix, alphabet, gap_open, gap_extend) : 0.0;
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    Sweeper sweeper{matrix, alphabet, gap_open, gap_extend, affine};
    IntSweeper integer{matrix, alphabet, static_cast<int32_t>(gap_open), static_cast<int32_t>(gap_extend), affine, {}, 0};
    Row row;
    IntRow int_row;
    std::vector<Row> kept;
    std::vector<IntRow> int_kept;
    std::vector<uint8_t> choices;
    for (int64_t k; (k = next.fetch_add(1)) < pairs;) {
      const Pair pair{query_codes + query_starts[k], target_codes + target_starts[k], query_lengths[k],
                      target_lengths[k]};
      const int64_t rows = band_rows > 0 ? band_rows : default_band_rows(pair.qlen, pair.tlen);
      // sums along the pair: at most qlen + tlen steps and a few terms, each of at most `largest`
      const bool exact = integers && largest * static_cast<double>(pair.qlen + pair.tlen + 3) < kExactFloat;
      const Result r = exact ? align_pair(integer, pair, rows, ops + op_offsets[k], int_row, int_kept, choices)
                             : align_pair(sweeper, pair, rows, ops + op_offsets[k], row, kept, choices);
      scores[k] = r.score;
      ends[4 * k] = r.qstart, ends[4 * k + 1] = r.qend, ends[4 * k + 2] = r.tstart, ends[4 * k + 3] = r.tend;
      op_lengths[k] = r.length;
      counts[4 * k] = r.identities, counts[4 * k + 1] = r.mismatches;
      counts[4 * k + 2] = r.gap_opens, counts[4 * k + 3] = r.gaps;
    }
  };
  const int64_t count = std::max<int64_t>(1, std::min(threads, pairs));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < count; ++t) pool.emplace_back(work);
  work();
  for (auto& thread : pool) thread.join();
}
