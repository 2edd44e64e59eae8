// The log-space forward sweep: every cell in score units, at any temperature and in both precisions.
// It is the general path, and the one the scaled sweep hands the pairs it cannot hold.
#pragma once

#include <cstdint>
#include <vector>

#include "sources.h"

namespace swcli_cpu {

// The pairs of `queue` (longest first) in log space: scores[p] for each, and with dp_table (else null)
// the table H (B, M+1, N+1) of each, whose zero border the caller provides. Instantiated in
// forward_log.cpp for DenseSource<float>, DenseSource<double> and CodeSource.
template <typename T, typename Source>
void forward_pairs(const Problem& pr, const Source& prototype, const std::vector<int64_t>& queue, T gap,
                   T temperature, T* scores, T* dp_table);

// Every pair of the batch in log space.
template <typename T, typename Source>
void forward_all(const Problem& pr, const Source& prototype, T gap, T temperature, T* scores, T* dp_table) {
  forward_pairs<T>(pr, prototype, longest_first(pr), gap, temperature, scores, dp_table);
}

}  // namespace swcli_cpu
