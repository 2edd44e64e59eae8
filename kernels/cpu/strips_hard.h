// Hard scores inside a pair (float32, t = 0): the strips' anti-diagonal sweep with the max cell
// (strips_hard.cpp), the same floats as the sweep across pairs, for long pairs and small batches.
#pragma once

#include <cstdint>
#include <vector>

#include "sources.h"

namespace swcli_cpu {

// scores[b] of the pairs b of `pairs` (each with cells) from codes at t = 0: matrix is the K x K float
// table, matrix_t its transpose. With dp_table (else null) each pair's H goes to the table.
void hard_strip_scores_codes(const Problem& pr, const CodeSource& codes, const float* matrix, const float* matrix_t,
                             const std::vector<int64_t>& pairs, float gap, float* scores, float* dp_table);

// The same from dense scores S (B, M, N) with strides sB, sM, sN; a pair too large for the gathers'
// int32 offsets goes to `across`, its score left for the sweep across pairs.
void hard_strip_scores_dense(const Problem& pr, const float* S, int64_t sB, int64_t sM, int64_t sN,
                             const std::vector<int64_t>& pairs, float gap, float* scores, float* dp_table,
                             std::vector<int64_t>& across);

}  // namespace swcli_cpu
