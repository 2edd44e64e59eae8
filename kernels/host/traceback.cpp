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
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

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

struct Sweeper {
  const float* matrix;
  int64_t alphabet;
  float open, extend;  // linear: both the gap
  bool affine;

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

// One pair: its end, then the walk back band by band. ops: room for qlen + tlen operations.
Result align_pair(const Sweeper& sweeper, const Pair& pair, int64_t band_rows, char* ops, Row& row,
                  std::vector<Row>& kept, std::vector<uint8_t>& choices) {
  Result result{};
  if (pair.qlen == 0 || pair.tlen == 0) return result;
  const bool one_band = pair.qlen <= band_rows;
  float best = 0.0f;
  int64_t bi = 0, bj = 0;
  row.reset(pair.tlen, sweeper.affine);
  kept.clear();
  kept.push_back(row);  // row 0: the border
  if (one_band) choices.resize(static_cast<size_t>(pair.qlen * pair.tlen));
  sweeper.sweep(pair, 0, pair.qlen, pair.tlen, row, one_band ? choices.data() : nullptr, true, best, bi, bj,
                one_band ? 0 : band_rows, &kept);
  result.score = best;
  if (bi == 0) return result;  // score 0: the empty alignment
  // The choices of rows band_first+1 .. band_first+band_rows (capped by the end's row), columns 1 .. width.
  int64_t width = one_band ? pair.tlen : bj;
  int64_t band_first = one_band ? 0 : -1;
  auto load_band = [&](int64_t i) {
    const int64_t first = (i - 1) / band_rows * band_rows;
    const int64_t last = std::min(first + band_rows, bi);
    Row start = kept[first / band_rows];
    choices.resize(static_cast<size_t>((last - first) * width));
    float unused = 0.0f;
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
// ops[op_offsets[k] ..] its operations (room for qlen + tlen), op_lengths[k] how many. band_rows <= 0: chosen from the band budget. Runs on `threads` threads, pairs taken in turn.
extern "C" void swcli_traceback(int64_t pairs, const uint8_t* query_codes, const int64_t* query_starts,
                                const int64_t* query_lengths, const uint8_t* target_codes,
                                const int64_t* target_starts, const int64_t* target_lengths, const float* matrix,
                                int64_t alphabet, float gap_open, float gap_extend, int64_t band_rows,
                                int64_t threads, float* scores, int64_t* ends, int64_t* counts, char* ops,
                                const int64_t* op_offsets, int64_t* op_lengths) {
  const Sweeper sweeper{matrix, alphabet, gap_open, gap_extend, gap_open != gap_extend};
  std::atomic<int64_t> next{0};
  auto work = [&]() {
    Row row;
    std::vector<Row> kept;
    std::vector<uint8_t> choices;
    for (int64_t k; (k = next.fetch_add(1)) < pairs;) {
      const Pair pair{query_codes + query_starts[k], target_codes + target_starts[k], query_lengths[k],
                      target_lengths[k]};
      const int64_t rows = band_rows > 0 ? band_rows : default_band_rows(pair.qlen, pair.tlen);
      const Result r = align_pair(sweeper, pair, rows, ops + op_offsets[k], row, kept, choices);
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
