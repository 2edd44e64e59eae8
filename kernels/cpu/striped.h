// Exact scores at t = 0 from codes with an integer matrix and integer gaps (linear or affine): Farrar's
// striped sweep in int16, SIMD inside a pair. Pairs whose scores may have saturated int16 are handed back to be scored
// again in float (the hard log-space or anti-diagonal sweeps), never given a wrong score.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sources.h"

namespace swcli_cpu {

// The matrix and the gaps as int16, where they are integers the int16 sweep can hold: every entry (as
// the float32 the engine reads) an integer in [-32767, 32767], the gaps integers with -32767 <= open <=
// extend <= 0 (a linear gap: open == extend). A positive gap or a NaN, infinite or fractional value
// leaves the call to the float sweeps.
struct IntegerScoring {
  std::vector<int16_t> matrix;  // K x K, row = query code
  int64_t K = 0;
  int16_t open = 0, extend = 0;  // a gap's first position, each further one
  int32_t limit = 0;  // a pair whose largest H reaches this may have saturated: 32767 - the largest entry
};

bool integer_scoring(const float* matrix, int64_t K, float open, float extend, IntegerScoring& out);

// Whether a pair of q x t residues takes the striped sweep rather than the float sweeps: its profile
// and its per-column work cost more than they save on short pairs. shared: the query's profile is
// built once for the batch (a search).
inline bool striped_takes(int64_t q, int64_t t, bool shared) {
  return std::min(q, t) >= (shared ? 32 : 64);
}

// scores[p] of the pairs p of `pairs` at t = 0; the pairs that may have saturated go to `wider`, their
// scores left to the caller. With a linear gap, long pairs take all threads (their rows cut into
// chunks, one per thread); the other pairs, and every pair with affine gaps, one thread each.
void striped_scores(const Problem& pr, const CodeSource& codes, const IntegerScoring& scoring,
                    const std::vector<int64_t>& pairs, float* scores, std::vector<int64_t>& wider);

}  // namespace swcli_cpu
