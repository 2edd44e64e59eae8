// Hard scores inside a pair (float32, t = 0): the strips of strips.h with the max cell,
//
//     H[i][j] = max(H[i-1][j-1] + S, H[i-1][j] + gap, H[i][j-1] + gap, 0),
//
// taken as the sweep across pairs takes it (max4 in simd.h: the same adds, the same NaN-keeping max in
// the same order), so a pair's score is the same float either way.
#include "strips_hard.h"

#include <cstdint>
#include <vector>

#include "simd.h"
#include "strips.h"

namespace swcli_cpu {

namespace {

using V = Lanes<float>::V;
using VI = Lanes<float>::I;

struct HardCell {
  using Value = CellValue;  // a: H; b: unused
  using Scalar = float;
  struct Best {
    V h[kMaxPacks];
  };

  V gap;

  Value border() const { return {splat<V>(0.0f), splat<V>(0.0f)}; }
  Scalar border_scalar() const { return 0.0f; }
  Value broadcast(Scalar x) const { return {splat<V>(x), splat<V>(0.0f)}; }
  Value shift_in(Value v, Value entering) const { return {shift_lanes(v.a, entering.a), v.b}; }
  Value select(VI mask, Value x, Value y) const { return {mask ? x.a : y.a, x.b}; }
  Scalar lane(Value v, int e) const { return v.a[e]; }
  Value step(Value diag, Value up, Value left, V s) const {
    return {max4<float, true>(splat<V>(0.0f), diag.a + s, up.a + gap, left.a + gap, 0.0f, 0.0f), left.b};
  }
  Best no_best() const {
    Best b;
    for (int k = 0; k < kMaxPacks; ++k) b.h[k] = splat<V>(0.0f);
    return b;
  }
  void check(Best&, V, VI, int) const {}
  void track(Best& best, Value v, VI in, int k) const { best.h[k] = in ? nan_max(best.h[k], v.a) : best.h[k]; }
  void merge(Best& into, const Best& b) const {
    for (int k = 0; k < kMaxPacks; ++k) into.h[k] = nan_max(into.h[k], b.h[k]);
  }
  float score(const Best& b) const {
    V all = b.h[0];
    for (int k = 1; k < kMaxPacks; ++k) all = nan_max(all, b.h[k]);
    float best = all[0];
    for (int e = 1; e < Lanes<float>::L; ++e) best = (all[e] > best || all[e] != all[e]) ? all[e] : best;
    return best;
  }
  V table_value(Value v) const { return v.a; }
};

template <typename Source>
void hard_strips(const std::vector<StripPair>& pairs, const Source& prototype, float gap, float* scores) {
  HardCell cell;
  cell.gap = splat<V>(gap);
  strip_pairs<HardCell>(cell, pairs, prototype,
                                   [&](int64_t n, const HardCell::Best& best) { scores[pairs[n].pair] = cell.score(best); });
}

}  // namespace

void hard_strip_scores_codes(const Problem& pr, const CodeSource& codes, const float* matrix, const float* matrix_t,
                             const std::vector<int64_t>& pairs, float gap, float* scores, float* dp_table) {
  hard_strips(code_strip_pairs(pr, codes, pairs, matrix, matrix_t, dp_table), StripCodes{}, gap, scores);
}

void hard_strip_scores_dense(const Problem& pr, const float* S, int64_t sB, int64_t sM, int64_t sN,
                             const std::vector<int64_t>& pairs, float gap, float* scores, float* dp_table,
                             std::vector<int64_t>& across) {
  hard_strips(dense_strip_pairs(pr, S, sB, sM, sN, pairs, dp_table, across), StripDense{}, gap, scores);
}

}  // namespace swcli_cpu
