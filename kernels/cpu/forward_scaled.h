// The scaled forward sweep (float32 at t > 0): E = 2^(H log2(e) / t), scaled per block of columns of a
// lane, two fused multiply-adds and an add a cell instead of the log-space cell's polynomials. The pairs
// it cannot hold go through the log-space sweep (forward_log.h).
#pragma once

#include <cstdint>
#include <vector>

#include "sources.h"

namespace swcli_cpu {

// Every pair through the scaled sweep, then those it could not hold through the log-space one, whose
// count is added to log_pairs. POWERS: scaled_source's matrix is the table of 2^(m log2(e) / t) (scores
// from codes); else the source gives S. Instantiated in forward_scaled.cpp for <false, DenseSource<float>>
// and <true, CodeSource>.
template <bool POWERS, typename Source>
void forward_scaled(const Problem& pr, const Source& scaled_source, const Source& log_source, float gap,
                    float temperature, float* scores, float* dp_table, int64_t& log_pairs);

// The same for the pairs `pairs` of the batch only.
template <bool POWERS, typename Source>
void forward_scaled(const Problem& pr, const std::vector<int64_t>& pairs, const Source& scaled_source,
                    const Source& log_source, float gap, float temperature, float* scores, float* dp_table,
                    int64_t& log_pairs);

// Whether the scaled sweep takes a float call: allowed by the caller, t > 0 and gap <= 0 (each gap step
// can only shrink E).
inline bool scaled_applies(bool allowed, double gap, double temperature) {
  return allowed && temperature > 0 && gap <= 0;
}

}  // namespace swcli_cpu
