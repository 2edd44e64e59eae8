// Farrar's striped Smith-Waterman (Bioinformatics 23:156, 2007) in int16, linear or affine gaps, t = 0.
//
// One sequence, the rows, is cut into L lanes of seg consecutive positions each: vector s holds rows
// s, seg + s, 2 seg + s, ... (lane l has row l seg + s). A column (one position of the other sequence)
// is then seg vectors, swept in order: H[i-1][j] of lane l comes from vector s-1 of the same lane, and the
// scores of a column are one load from the query profile (for each code of the column sequence, its
// score against every row, in that striped order). What a lane's last row hands down to the next lane's
// first row is taken afterwards ("lazy F"): shifted by one lane, it is pushed down while it still beats
// some lane's H, which at t = 0 rarely lasts more than a few vectors.
//
// The adds saturate, and a pair whose largest H reaches 32767 minus the largest matrix entry may have
// saturated: it is handed back to be scored in float. The rows past a sequence's end (the last lanes'
// tail) score INT16_MIN against everything, so with gaps <= 0 they never exceed a real cell.
#include "striped.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "relay.h"

namespace swcli_cpu {

namespace {

#if defined(__AVX512BW__)
constexpr int kShortBytes = 64;
#elif defined(__AVX2__)
constexpr int kShortBytes = 32;
#else
constexpr int kShortBytes = 16;
#endif
typedef int16_t VS __attribute__((vector_size(kShortBytes)));
constexpr int kShorts = kShortBytes / 2;  // lanes
constexpr int16_t kLowest = std::numeric_limits<int16_t>::min();

inline VS splat16(int16_t x) { return VS{} + x; }

inline VS adds(VS a, VS b) {
#if defined(__AVX512BW__)
  return (VS)_mm512_adds_epi16((__m512i)a, (__m512i)b);
#elif defined(__AVX2__)
  return (VS)_mm256_adds_epi16((__m256i)a, (__m256i)b);
#elif defined(__SSE2__)
  return (VS)_mm_adds_epi16((__m128i)a, (__m128i)b);
#else
  typedef int32_t VW __attribute__((vector_size(2 * kShortBytes)));
  VW w = __builtin_convertvector(a, VW) + __builtin_convertvector(b, VW);
  w = w > 32767 ? VW{} + 32767 : w;
  w = w < -32768 ? VW{} - 32768 : w;
  return __builtin_convertvector(w, VS);
#endif
}

inline VS max16(VS a, VS b) { return a > b ? a : b; }

inline bool any_greater(VS a, VS b) {
#if defined(__AVX512BW__)
  return _mm512_cmpgt_epi16_mask((__m512i)a, (__m512i)b) != 0;
#elif defined(__AVX2__)
  return _mm256_movemask_epi8(_mm256_cmpgt_epi16((__m256i)a, (__m256i)b)) != 0;
#elif defined(__SSE2__)
  return _mm_movemask_epi8(_mm_cmpgt_epi16((__m128i)a, (__m128i)b)) != 0;
#else
  for (int l = 0; l < kShorts; ++l)
    if (a[l] > b[l]) return true;
  return false;
#endif
}

// Lane l+1 gets lane l; lane 0 gets `first` (the last lane's value leaves).
inline VS shift_in(VS v, int16_t first) {
#if defined(__AVX512BW__)
  const __m512i up = _mm512_set_epi16(30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11,
                                      10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0);
  return (VS)_mm512_mask_set1_epi16(_mm512_permutexvar_epi16(up, (__m512i)v), 1, first);
#elif defined(__AVX2__)
  const __m256i low_to_high = _mm256_permute2x128_si256((__m256i)v, (__m256i)v, 0x08);  // (0, low half)
  return (VS)_mm256_insert_epi16(_mm256_alignr_epi8((__m256i)v, low_to_high, 14), first, 0);
#elif defined(__SSE2__)
  return (VS)_mm_insert_epi16(_mm_slli_si128((__m128i)v, 2), first, 0);
#else
  VS out;
  out[0] = first;
  for (int l = 1; l < kShorts; ++l) out[l] = v[l - 1];
  return out;
#endif
}

// Through memory, so that the vector it is given stays in a register in the loops (an element read of a
// vector variable made GCC keep the running maximum on the stack, a store and a load every step).
inline int16_t lane_max(VS v) {
  int16_t lanes[kShorts];
  std::memcpy(lanes, &v, sizeof(v));
  return *std::max_element(lanes, lanes + kShorts);
}

// A thread's buffers: the profile of the rows it sweeps and two columns of H.
struct StripedBuffers {
  std::vector<VS> profile, previous, current, from_left;  // from_left: the affine E of the column before
};

// The number of vectors a column of `rows` rows takes.
inline int64_t segments(int64_t rows) { return std::max<int64_t>(1, (rows + kShorts - 1) / kShorts); }

// The profile of rows[0 .. count): for each code a of the column sequence, its score against every row,
// in striped order (vector a * seg + s, lane l: row l seg + s). rows_are_query: the score of row code r
// against a is matrix[r][a]; else matrix[a][r] (the pair transposed).
void build_profile(const uint8_t* rows, int64_t count, const IntegerScoring& sc, bool rows_are_query,
                   std::vector<VS>& profile) {
  const int64_t seg = segments(count), K = sc.K;
  profile.resize(K * seg);
  int16_t* out = reinterpret_cast<int16_t*>(profile.data());
  const int16_t* m = sc.matrix.data();
  for (int64_t a = 0; a < K; ++a) {
    int16_t* column = out + a * seg * kShorts;
    for (int64_t s = 0; s < seg; ++s) {
      for (int l = 0; l < kShorts; ++l) {
        const int64_t i = l * seg + s;
        column[s * kShorts + l] = i >= count ? kLowest : (rows_are_query ? m[rows[i] * K + a] : m[a * K + rows[i]]);
      }
    }
  }
}

// The striped sweep of `rows` rows (their profile built) over the columns cols[0 .. ncols), with the row
// above (its H per column, or the zero border) and, where below is wanted, H of the last row written per
// column. Returns the largest H of the rows.
int32_t striped_sweep(const VS* profile, int64_t rows, const uint8_t* cols, int64_t ncols, int16_t gap,
                      StripedBuffers& buf, RowAbove<int16_t>& above, RowBelow<int16_t>& below) {
  const int64_t seg = segments(rows);
  buf.previous.assign(seg, VS{});  // column 0: the zero border
  buf.current.resize(seg);
  VS* hp = buf.previous.data();
  VS* hc = buf.current.data();
  const VS vgap = splat16(gap), zero = VS{};
  VS best = zero;
  const int64_t last_s = (rows - 1) % seg, last_l = (rows - 1) / seg;  // where the last row sits
  int16_t above_left = 0;  // H of the row above, one column to the left (the border at column 0)
  for (int64_t j = 0; j < ncols; ++j) {
    const int16_t above_here = above.border() ? int16_t(0) : above.at(j);
    const VS* p = profile + cols[j] * seg;
    VS h = shift_in(hp[seg - 1], above_left);  // the diagonal of each lane's first row
    const int16_t from_above = static_cast<int16_t>(std::max(int32_t(above_here) + gap, int32_t(kLowest)));
    VS f = shift_in(splat16(kLowest), from_above);
    for (int64_t s = 0; s < seg; ++s) {
      const VS left = hp[s];
      h = adds(h, p[s]);
      h = max16(max16(h, adds(left, vgap)), zero);
      h = max16(h, f);  // last: the chain from one vector to the next is this max and the add below
      hc[s] = h;
      best = max16(best, h);
      f = adds(h, vgap);
      h = left;
    }
    // Lazy F: what each lane's last row hands down to the next lane, pushed on while it beats an H.
    f = shift_in(f, kLowest);
    for (int64_t s = 0;;) {
      VS h_here = hc[s];
      if (!any_greater(f, h_here)) break;
      h_here = max16(h_here, f);
      hc[s] = h_here;
      best = max16(best, h_here);
      f = adds(f, vgap);
      if (++s == seg) {
        s = 0;
        f = shift_in(f, kLowest);
      }
    }
    if (below.wanted()) {
      int16_t last;
      std::memcpy(&last, reinterpret_cast<const int16_t*>(hc + last_s) + last_l, sizeof(last));
      below.put(j, last, ncols);
    }
    above_left = above_here;
    std::swap(hp, hc);
  }
  return lane_max(best);
}

// The same with affine gaps (affine.h at t = 0: a gap's first position scores `open`, each further one
// `extend`): E, the gap from the left, kept per row for the next column; F, the gap from above, carried
// down the lanes. What a carry c adds past row s is c + extend at row s + 1, and the first pass already
// gave that row at least H[s] + open: so the lazy loop goes on while some lane has c + extend > H[s] +
// open (with open == extend, the linear sweep's test). One thread per pair.
int32_t striped_sweep_affine(const VS* profile, int64_t rows, const uint8_t* cols, int64_t ncols, int16_t open,
                             int16_t extend, StripedBuffers& buf) {
  const int64_t seg = segments(rows);
  buf.previous.assign(seg, VS{});  // column 0: H = 0
  buf.current.resize(seg);
  buf.from_left.assign(seg, splat16(kLowest));  // E = -inf before column 1
  VS* hp = buf.previous.data();
  VS* hc = buf.current.data();
  VS* e_row = buf.from_left.data();
  const VS vopen = splat16(open), vextend = splat16(extend), zero = VS{};
  VS best = zero;
  for (int64_t j = 0; j < ncols; ++j) {
    const VS* p = profile + cols[j] * seg;
    VS h = shift_in(hp[seg - 1], 0);           // the diagonal of each lane's first row (the border's 0)
    VS f = shift_in(splat16(kLowest), open);   // F of the first row: the border's H = 0 plus open
    for (int64_t s = 0; s < seg; ++s) {
      const VS left = hp[s];
      const VS e = max16(adds(left, vopen), adds(e_row[s], vextend));
      e_row[s] = e;
      h = max16(max16(adds(h, p[s]), e), zero);
      h = max16(h, f);
      hc[s] = h;
      best = max16(best, h);
      f = max16(adds(h, vopen), adds(f, vextend));
      h = left;
    }
    VS carry = shift_in(f, kLowest);  // F leaving each lane's last row, into the next lane's first
    for (int64_t s = 0;;) {
      const VS h_old = hc[s];
      const VS h_new = max16(h_old, carry);
      hc[s] = h_new;
      best = max16(best, h_new);
      carry = adds(carry, vextend);
      if (!any_greater(carry, adds(h_old, vopen))) break;
      if (++s == seg) {
        s = 0;
        carry = shift_in(carry, kLowest);
      }
    }
    std::swap(hp, hc);
  }
  return lane_max(best);
}

// Pairs with at least this many cells may take all threads (when one is more than a thread's share).
constexpr int64_t kSplitCells = int64_t(1) << 20;

struct PairView {
  const uint8_t* rows;
  const uint8_t* cols;
  int64_t nrows, ncols;
  bool rows_are_query;
};

// A pair's orientation: the rows are the longer sequence (fewer, longer columns: less per-column work),
// or the query where its profile is shared.
PairView view_of(const CodeSource& codes, int64_t p, int64_t qlen, int64_t tlen, bool shared_rows) {
  const uint8_t* q = codes.query + p * codes.query_stride;
  const uint8_t* t = codes.target + p * codes.N;
  if (shared_rows || qlen >= tlen) return PairView{q, t, qlen, tlen, true};
  return PairView{t, q, tlen, qlen, false};
}

}  // namespace

bool integer_scoring(const float* matrix, int64_t K, float open, float extend, IntegerScoring& out) {
  const bool integers = std::nearbyint(open) == open && std::nearbyint(extend) == extend;
  if (!(integers && open >= -32767 && open <= extend && extend <= 0)) return false;
  out.K = K;
  out.open = static_cast<int16_t>(open);
  out.extend = static_cast<int16_t>(extend);
  out.matrix.resize(K * K);
  int32_t largest = 0;
  for (int64_t x = 0; x < K * K; ++x) {
    const float m = matrix[x];
    if (!(m >= -32767 && m <= 32767 && std::nearbyint(m) == m)) return false;
    out.matrix[x] = static_cast<int16_t>(m);
    largest = std::max<int32_t>(largest, out.matrix[x]);
  }
  out.limit = 32767 - largest;
  return true;
}

void striped_scores(const Problem& pr, const CodeSource& codes, const IntegerScoring& scoring,
                    const std::vector<int64_t>& pairs, float* scores, std::vector<int64_t>& wider) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  std::vector<int64_t> order;
  int64_t total = 0;
  for (int64_t p : pairs) {
    const int64_t cells = pr.qlen[p] * pr.tlen[p];
    scores[p] = 0.0f;
    if (cells == 0) continue;
    order.push_back(p);
    total += cells;
  }
  auto cells_of = [&](int64_t p) { return pr.qlen[p] * pr.tlen[p]; };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cells_of(a) > cells_of(b); });
  auto finish = [&](int64_t p, int32_t best) {
    if (best >= scoring.limit) {
      wider.push_back(p);
    } else {
      scores[p] = static_cast<float>(best);
    }
  };

  // Long pairs first, each with every thread: chunk k of its rows in thread k, relayed (linear gaps).
  const bool affine = scoring.open != scoring.extend;
  size_t next_pair = 0;
  for (; next_pair < order.size() && threads > 1 && !affine; ++next_pair) {
    const int64_t p = order[next_pair];
    if (cells_of(p) < kSplitCells || cells_of(p) * threads <= total) break;
    const PairView v = view_of(codes, p, pr.qlen[p], pr.tlen[p], false);
    const int64_t chunks = std::min<int64_t>(threads, std::max<int64_t>(1, v.nrows / kShorts));
    Relay relay(chunks);
    std::vector<std::vector<int16_t>> last_rows(chunks - 1, std::vector<int16_t>(v.ncols));
    std::vector<int32_t> best(chunks, 0);
    at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
      StripedBuffers buf;
      for (int64_t k = begin; k < end; ++k) {
        const int64_t r0 = v.nrows * k / chunks, r1 = v.nrows * (k + 1) / chunks;
        build_profile(v.rows + r0, r1 - r0, scoring, v.rows_are_query, buf.profile);
        RowAbove<int16_t> above;
        if (k > 0) above = RowAbove<int16_t>{&relay, k - 1, last_rows[k - 1].data(), 0};
        RowBelow<int16_t> below;
        if (k + 1 < chunks) below = RowBelow<int16_t>{&relay, k, last_rows[k].data()};
        best[k] = striped_sweep(buf.profile.data(), r1 - r0, v.cols, v.ncols, scoring.extend, buf, above, below);
      }
    });
    finish(p, *std::max_element(best.begin(), best.end()));
  }

  // The rest, a pair per thread at a time, longest first. A query shared by every pair (a search) has
  // one profile, built once.
  const int64_t rest = static_cast<int64_t>(order.size() - next_pair);
  if (rest == 0) return;
  bool shared = codes.query_stride == 0;
  for (size_t n = next_pair; n < order.size() && shared; ++n) shared = pr.qlen[order[n]] == pr.qlen[order[next_pair]];
  std::vector<VS> shared_profile;
  if (shared) build_profile(codes.query, pr.qlen[order[next_pair]], scoring, true, shared_profile);
  std::atomic<int64_t> next{0};
  std::vector<std::vector<int64_t>> widened(threads);
  at::parallel_for(0, std::min(threads, rest), 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      StripedBuffers buf;
      RowAbove<int16_t> above;
      RowBelow<int16_t> below;
      for (int64_t n = next++; n < rest; n = next++) {
        const int64_t p = order[next_pair + n];
        const PairView v = view_of(codes, p, pr.qlen[p], pr.tlen[p], shared);
        if (!shared) build_profile(v.rows, v.nrows, scoring, v.rows_are_query, buf.profile);
        const VS* profile = shared ? shared_profile.data() : buf.profile.data();
        const int32_t best =
            affine ? striped_sweep_affine(profile, v.nrows, v.cols, v.ncols, scoring.open, scoring.extend, buf)
                   : striped_sweep(profile, v.nrows, v.cols, v.ncols, scoring.extend, buf, above, below);
        if (best >= scoring.limit)
          widened[w].push_back(p);
        else
          scores[p] = static_cast<float>(best);
      }
    }
  });
  for (const auto& list : widened) wider.insert(wider.end(), list.begin(), list.end());
}

}  // namespace swcli_cpu
