// Soft scores inside a pair (float32, t > 0): the strips' anti-diagonal sweep with an exponent per cell
// (strips_soft.cpp), for long pairs and small batches.
#pragma once

#include <cstdint>
#include <vector>

#include "sources.h"

namespace swcli_cpu {

// The largest S c and |gap| c the cell's sums hold (c = log2(e) / t): see strips_soft.cpp.
constexpr double kLargestPower = 50.0;
constexpr double kLargestGap = 40.0;

// Whether the soft strips take scores at this gap and temperature, with scores up to largest_score.
bool soft_strips_apply(double gap, double temperature, double largest_score);

// scores[b] of the pairs b of `pairs` (each with cells) from codes: powers is the K x K table of
// 2^(m c), powers_t its transpose. With dp_table (else null) each pair's H goes to the table (B, M+1,
// N+1), as the log-space sweep writes it. A pair with a score past the cell's range goes to `failed`,
// its score left for the sweeps across pairs.
void soft_strip_scores_codes(const Problem& pr, const CodeSource& codes, const float* powers, const float* powers_t,
                             const std::vector<int64_t>& pairs, float gap, float temperature, float* scores,
                             float* dp_table, std::vector<int64_t>& failed);

// The same from dense scores S (B, M, N) with strides sB, sM, sN; a pair with a NaN, or a score past
// the cell's range, or too large for the gathers' int32 offsets, goes to `failed`.
void soft_strip_scores_dense(const Problem& pr, const float* S, int64_t sB, int64_t sM, int64_t sN,
                             const std::vector<int64_t>& pairs, float gap, float temperature, float* scores,
                             float* dp_table, std::vector<int64_t>& failed);

}  // namespace swcli_cpu
