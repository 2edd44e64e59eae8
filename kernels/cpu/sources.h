// The problem description, where a cell's scores come from (dense tensor or codes into a matrix), and
// how pairs are handed to workers: shared by the forward sweeps and the backward.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <vector>

#include "simd.h"

namespace swcli_cpu {

struct Problem {
  int64_t B, M, N;
  const int64_t* qlen;  // (B,)
  const int64_t* tlen;  // (B,)
};

// Where the scores of a cell come from. A source is copied into each worker (it holds buffers) and gets
// start_pair(lane, pair) when a lane takes a pair, begin_row(lane, pair, i) before each of the lane's
// rows (i 0-based), and load(j, pack) for the scores of column j (1-based) of a pack's lanes.

// A dense (B, M, N) tensor with any strides: each row is copied into a [j][lane] buffer.
template <typename T>
struct DenseSource {
  using V = typename Lanes<T>::V;
  static constexpr int W = Lanes<T>::W, L = Lanes<T>::L;
  const T* S;
  int64_t sB, sM, sN;
  const int64_t* tlen;
  std::vector<T> rows;

  void prepare(int64_t cols) { rows.resize((cols + 1) * W); }
  void start_pair(int, int64_t) {}
  void begin_row(int l, int64_t pair, int64_t i) {
    const T* src = S + pair * sB + i * sM;
    for (int64_t j = 0; j < tlen[pair]; ++j) rows[(j + 1) * W + l] = src[j * sN];
  }
  V load(int64_t j, int k) const {
    V s;
    __builtin_memcpy(&s, &rows[j * W + k * L], sizeof(V));
    return s;
  }
};

// Sequence codes (B, M), (B, N) into a K x K matrix: the CLI path, which never builds the
// (B, M, N) scores. Target codes are transposed to [j][lane] once per pair; a cell's score is a gather
// from the matrix (a few KB, in L1) at query_code * K + target_code.
struct CodeSource {
  using V = Lanes<float>::V;
  using I = Lanes<float>::I;
  static constexpr int W = Lanes<float>::W, L = Lanes<float>::L;
  typedef uint8_t Codes __attribute__((vector_size(L)));
  const uint8_t* query;  // pair p's row at query + p * query_stride
  const uint8_t* target;
  int64_t M, N, K;
  int64_t query_stride;  // M, or 0 where every pair has the same query (a search: no copy per target)
  const int64_t* tlen;
  const float* matrix;
  std::vector<uint8_t> codes;  // target codes, [j][lane]
  I row_offset[kPacks] = {};   // query code * K of each lane's current row

  void prepare(int64_t cols) { codes.resize((cols + 1) * W); }  // zeros: valid codes
  void start_pair(int l, int64_t pair) {
    const uint8_t* src = target + pair * N;
    for (int64_t j = 0; j < tlen[pair]; ++j) codes[(j + 1) * W + l] = src[j];
  }
  void begin_row(int l, int64_t pair, int64_t i) {
    row_offset[l / L][l % L] = static_cast<int32_t>(query[pair * query_stride + i] * K);
  }
  V load(int64_t j, int k) const {
    Codes c;
    __builtin_memcpy(&c, &codes[j * W + k * L], sizeof(Codes));
    const I index = __builtin_convertvector(c, I) + row_offset[k];
#if defined(__AVX512F__)
    return (V)_mm512_i32gather_ps((__m512i)index, matrix, 4);
#elif defined(__AVX2__)
    return (V)_mm256_i32gather_ps(matrix, (__m256i)index, 4);
#else
    V s;
    for (int e = 0; e < L; ++e) s[e] = matrix[index[e]];
    return s;
#endif
  }
};

// The queue's next pair with cells, or -1 when it is empty; pairs without cells on the way get the zero
// border's score.
template <typename T>
inline int64_t next_pair(const Problem& pr, const std::vector<int64_t>& queue, std::atomic<int64_t>& next, T* scores) {
  for (int64_t n = next++; n < static_cast<int64_t>(queue.size()); n = next++) {
    const int64_t p = queue[n];
    if (pr.qlen[p] > 0 && pr.tlen[p] > 0) return p;
    scores[p] = T(0);
  }
  return -1;
}

// `pairs` (all of the batch's by default) by decreasing target length, ties in their order: the order in
// which workers' lanes take them.
inline std::vector<int64_t> longest_first(const Problem& pr, std::vector<int64_t> pairs = {}) {
  if (pairs.empty()) {
    pairs.resize(pr.B);
    std::iota(pairs.begin(), pairs.end(), 0);
  }
  std::stable_sort(pairs.begin(), pairs.end(), [&](int64_t a, int64_t b) { return pr.tlen[a] > pr.tlen[b]; });
  return pairs;
}

// work(source, next, w) in a worker per thread while there are W pairs for each (one small batch is one
// worker's): each with its own copy of the source, all taking pairs from `queue` through `next`.
// Returns the number of workers.
template <typename T, typename Source, typename Work>
int64_t in_workers(const std::vector<int64_t>& queue, const Source& prototype, Work work) {
  const int64_t pairs = static_cast<int64_t>(queue.size());
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), pairs / Lanes<T>::W));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      Source source = prototype;
      work(source, next, w);
    }
  });
  return workers;
}

}  // namespace swcli_cpu
