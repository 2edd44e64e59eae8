// The interface between the CUDA kernels (the .cu files beside this header, compiled by nvcc) and
// their torch binding (ops.cpp): raw pointers and a stream, so the .cu files need no torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

struct Problem {
  int64_t B, M, N;        // pairs, rows and columns of the score matrices
  const int64_t* qlen;    // (B,) on the device, or null for M
  const int64_t* tlen;    // (B,) on the device, or null for N
  const int64_t* order;   // (B,) the pairs in the order to start them (longest first), or null
};

// Columns per tile: 32 lanes x lane_columns; pairs with longer targets need a boundary buffer (B, M).
int sw_cuda_tile_columns(int lane_columns);

// Columns of the DP table the forward keeps: N rounded up to lane_columns.
int64_t sw_cuda_table_columns(int64_t N, int lane_columns);

// Scores (B,); with table (B, M, sw_cuda_table_columns(N, lane_columns)) non-null, also H without its
// zero border, in the kernels' own wavefront order, and best_at (B,), the row-major index of the first
// maximal cell or -1, for the backward (which takes the same lane_columns). lane_columns is 1 or 4.
// With scaled, float scores without a table at t > 0 with 4 columns per lane are computed in scaled
// exponential space (see forward_scaled.cuh); log_pairs, if not null, counts on the device the pairs of
// such a call scored in log space instead.
cudaError_t sw_cuda_forward_f32(const Problem& pr, const float* S, float* scores, float* table,
                                int64_t* best_at, float* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream, bool scaled, int* log_pairs);
cudaError_t sw_cuda_forward_f64(const Problem& pr, const double* S, double* scores, double* table,
                                int64_t* best_at, double* boundary, double gap, double t, int lane_columns,
                                cudaStream_t stream);
// For 4 columns per lane with lengths: the longest pairs (first in pr.order) get a block of
// sw_cuda_relay_warps() warps each, which share the pair's tiles through relay buffers.
struct Relaying {
  const int64_t* coop_count;  // on the device: how many of the first pairs in pr.order get a block
  int64_t max_coop;           // an upper bound of *coop_count, known on the host
  float* relay;               // (max_coop, sw_cuda_relay_warps() + 1, M)
};
int sw_cuda_relay_warps();

// work (B,) int32: the key of the longest-first order, rows x column tiles of tile_columns, with each pair
// of codes oriented as the codes kernels of lane_columns orient it (codes), else as given.
cudaError_t sw_cuda_pair_work(const Problem& pr, int lane_columns, bool codes, int64_t tile_columns, int* work,
                              cudaStream_t stream);
// *count (on the device): how many of the first max_coop pairs in order have at least min_work.
cudaError_t sw_cuda_coop_count(const int* work, const int64_t* order, int64_t max_coop, int min_work,
                               int64_t* count, cudaStream_t stream);

// Scores (B,) of uint8 code pairs (B, M), (B, N) looked up in a K x K float32 matrix. lane_columns is
// 1, 4 or 8; with 8 and t > 0 the kernel takes 4 where the scaled sweep cannot hold 8 (see kWideLimit
// in forward_scaled.cuh), so boundary and relay buffers are sized for 4. With 4 or 8, a pair whose
// target is not longer than its query may be scored transposed, the target as the rows (see transposes
// in common.cuh): the boundary buffer (B, M) is then needed once max(M, N) exceeds a tile. relaying may
// be null (then one warp per pair); it needs lengths and an order. With allow_scaled, t > 0 and 4 or 8
// columns per lane, pairs are scored in scaled exponential space where the matrix allows it (see
// stage_matrix in forward_codes.cu); log_pairs, if not null, counts on the device the pairs of such a
// call scored in log space instead. shared_limit: the device's shared memory per block (opt-in), in bytes.
// query_stride: M, or 0 where every pair has the same query row (one query against many targets).
cudaError_t sw_cuda_forward_codes(const Problem& pr, const uint8_t* query, int64_t query_stride, const uint8_t* target,
                                  const float* matrix, int K, float* scores, float* boundary, double gap,
                                  double t, int lane_columns, cudaStream_t stream, const Relaying* relaying,
                                  bool allow_scaled, int* log_pairs, int64_t shared_limit);
// grad_S (B, M, N), every element written, from the table and best_at of the forward. sums: null, or a
// zeroed (2, B) array to which each pair adds what the gradients of the gap and the temperature take:
// grad_scores[b] d score[b] / d gap (the flow along the gap edges) and <S[b], grad_S[b]> (the same for
// the backward by rows and, with (3, B) sums of gap_open, gap_extend and the inner product, the affine
// backward below).
cudaError_t sw_cuda_backward_f32(const Problem& pr, const float* grad_scores, const float* S,
                                 const float* table, const int64_t* best_at, float* grad_S, float* boundary,
                                 float* sums, double gap, double t, int lane_columns, cudaStream_t stream);
cudaError_t sw_cuda_backward_f64(const Problem& pr, const double* grad_scores, const double* S,
                                 const double* table, const int64_t* best_at, double* grad_S,
                                 double* boundary, double* sums, double gap, double t, int lane_columns,
                                 cudaStream_t stream);
// The gradient by rows (float, t > 0, gap <= 0, N <= sw_cuda_rows_width(); rows of S and of the gradient
// in 16-byte accesses where N is a multiple of 4 and S 16-byte aligned, else through a staging row in
// shared memory): the forward keeps sw_cuda_rows_kept_floats(M) floats per pair (every 8th row of the DP)
// instead of the table, and the backward computes the rows between them again. rows_forward: scores (B,),
// best_row (B,), the row of the first maximal cell in row-major order or -1 (the backward finds its
// column), kept (B, sw_cuda_rows_kept_floats(M)), and *failed (on the device, zeroed by the caller) counts
// the pairs whose rows the scaled space could not hold: those are scored in log space instead (with the
// boundary buffer (B, M) where N exceeds sw_cuda_tile_columns(4)), and their gradient needs the table's
// path. rows_backward: grad_S (B, M, N), every element written, for a call whose *failed was 0 (the binding
// reads it).
//
// values: null, or the gaps and t of each pair in device memory (tensor values: read by the kernels, so the
// host launches without waiting for them); the numbers gap and t are then not used. A pair whose values
// the rows cannot take is scored as the other paths score it and counted in *failed (t = 0 exactly, a
// gap > 0, affine outside the shared form); one whose values are not valid (not finite, t < 0, affine
// gap_open > gap_extend or gap_extend > 0) scores NaN and is counted too: the caller, which reads *failed
// before the backward anyway, then reads the values and says which pair broke which rule.
struct PairValues {
  const float* gap;     // the linear gap, or gap_open
  const float* extend;  // gap_extend (affine)
  const float* t;
  int64_t gap_step, extend_step, t_step;  // element strides: 0 where one value holds for the batch
  void* scratch;  // sw_cuda_pair_values_bytes(B) bytes: each pair's constants, derived there before the sweep
};
int64_t sw_cuda_pair_values_bytes(int64_t B);
int sw_cuda_rows_width();
int64_t sw_cuda_rows_kept_floats(int64_t M);
cudaError_t sw_cuda_rows_forward(const Problem& pr, const float* S, float* scores, int64_t* best_row, float* kept,
                                 float* boundary, int* failed, double gap, double t, cudaStream_t stream,
                                 const PairValues* values = nullptr);
cudaError_t sw_cuda_rows_backward(const Problem& pr, const float* grad_scores, const float* S, const float* kept,
                                  const int64_t* best_row, float* grad_S, float* sums, double gap, double t,
                                  cudaStream_t stream, const PairValues* values = nullptr);
// Long pairs by tiles (long_pairs.cu): float32 dense S, in log space at t > 0, the exact max at t = 0; each pair's
// DP cut into tiles of sw_cuda_long_tile_rows() x sw_cuda_long_tile_columns() cells, a warp a tile, one launch
// per anti-diagonal of tiles (pr.order is not used). long_forward: scores (B,), best_at (B,) (the row-major index
// of the first maximal cell, or -1), state (sw_cuda_long_state_floats(B, M, N): the tiles' last rows and
// columns, what the backward reads), and the scratch tile_best, tile_at (sw_cuda_long_tiles(B, M, N) each);
// log_pairs, if not null, gets the number of pairs scored at t > 0 (every one in log space). long_backward:
// grad_S (B, M, N), every element written, from the forward's state and best_at, with the scratch flows
// (sw_cuda_long_flow_floats(B, M, N)).
int sw_cuda_long_tile_rows();
int sw_cuda_long_tile_columns();
int64_t sw_cuda_long_state_floats(int64_t B, int64_t M, int64_t N);
int64_t sw_cuda_long_tiles(int64_t B, int64_t M, int64_t N);
int64_t sw_cuda_long_flow_floats(int64_t B, int64_t M, int64_t N);
cudaError_t sw_cuda_long_forward(const Problem& pr, const float* S, float* scores, int64_t* best_at, float* state,
                                 float* tile_best, int64_t* tile_at, int* log_pairs, double gap, double t,
                                 cudaStream_t stream);
cudaError_t sw_cuda_long_backward(const Problem& pr, const float* grad_scores, const float* S, const float* state,
                                  const int64_t* best_at, float* grad_S, float* flows, double gap, double t,
                                  cudaStream_t stream);
// Affine gaps (soft Gotoh, affine.cuh), in log space: open gap_open and extend gap_extend, gap_open <=
// gap_extend <= 0. Dense S (lane_columns 1 or 4): scores (B,), and with state non-null also the state the
// backward reads, sw_cuda_affine_state_size values (M, X and Y of every cell in wavefront order), and
// best_at (B,) as in sw_cuda_forward_f32. boundary: (B, M, 2) values where N exceeds
// sw_cuda_tile_columns(lane_columns), else null.
int64_t sw_cuda_affine_state_size(int64_t B, int64_t M, int64_t N, int lane_columns);
cudaError_t sw_cuda_affine_forward_f32(const Problem& pr, const float* S, float* scores, float* state,
                                       int64_t* best_at, float* boundary, double gap_open, double gap_extend,
                                       double t, int lane_columns, cudaStream_t stream);
cudaError_t sw_cuda_affine_forward_f64(const Problem& pr, const double* S, double* scores, double* state,
                                       int64_t* best_at, double* boundary, double gap_open, double gap_extend,
                                       double t, int lane_columns, cudaStream_t stream);
// Scores (B,) of code pairs as sw_cuda_forward_codes takes them (lane_columns 1, 4 or 8; with 4 or 8 a pair
// may be scored transposed, so boundary (B, M, 2) is needed once max(M, N) exceeds a tile). relaying, if
// not null, gives the longest pairs a block of sw_cuda_affine_relay_warps() warps each; its relay buffer
// holds (max_coop, sw_cuda_affine_relay_warps() + 1, M, 2) floats. At t > 0 pairs take the scaled sweep
// where the matrix's tables of powers fit shared_limit bytes (3 K^2 floats), as in sw_cuda_forward_codes.
int sw_cuda_affine_relay_warps();
cudaError_t sw_cuda_affine_forward_codes(const Problem& pr, const uint8_t* query, int64_t query_stride,
                                         const uint8_t* target, const float* matrix, int K, float* scores,
                                         float* boundary, double gap_open, double gap_extend, double t,
                                         int lane_columns, cudaStream_t stream, const Relaying* relaying,
                                         int64_t shared_limit);
// grad_S (B, M, N), every element written, from the state and best_at of the affine forward (the same
// lane_columns). boundary: (B, M, 2) values where N exceeds a tile, else null (t > 0 only). sums: null, or
// a zeroed (3, B) array (see sw_cuda_backward_f32), which needs S (else unread: null).
cudaError_t sw_cuda_affine_backward_f32(const Problem& pr, const float* grad_scores, const float* state,
                                        const int64_t* best_at, float* grad_S, float* boundary, const float* S,
                                        float* sums, double gap_open, double gap_extend, double t, int lane_columns,
                                        cudaStream_t stream);
cudaError_t sw_cuda_affine_backward_f64(const Problem& pr, const double* grad_scores, const double* state,
                                        const int64_t* best_at, double* grad_S, double* boundary, const double* S,
                                        double* sums, double gap_open, double gap_extend, double t,
                                        int lane_columns, cudaStream_t stream);
// The affine gradient by rows, as the linear one (float, t > 0 in the shared form: |gap_open| log2(e) / t <=
// 100, N <= sw_cuda_rows_width()): a kept row holds H and Y, sw_cuda_affine_rows_kept_floats(M) floats per
// pair; *failed counts the pairs scored in log space instead (with boundary (B, M, 2) where N exceeds
// sw_cuda_tile_columns(4)), whose gradient needs the state's path. values: as the linear rows' (gap_open in
// gap, gap_extend in extend).
bool sw_cuda_affine_shared_form(double gap_open, double t);
int64_t sw_cuda_affine_rows_kept_floats(int64_t M);
cudaError_t sw_cuda_affine_rows_forward(const Problem& pr, const float* S, float* scores, int64_t* best_row,
                                        float* kept, float* boundary, int* failed, double gap_open,
                                        double gap_extend, double t, cudaStream_t stream,
                                        const PairValues* values = nullptr);
cudaError_t sw_cuda_affine_rows_backward(const Problem& pr, const float* grad_scores, const float* S,
                                         const float* kept, const int64_t* best_row, float* grad_S, float* sums,
                                         double gap_open, double gap_extend, double t, cudaStream_t stream,
                                         const PairValues* values = nullptr);
// Exact scores of one query against many targets at t = 0 with an integer matrix and integer gaps, in
// 16-bit lanes with DPX instructions (search_s16.cu): query (M,) codes below K, targets (B, N) padded
// codes with lengths tlen (B,) int64, table (K, K+1, K+1) 32-bit entries (S[q][a], S[q][b]) as int16
// halves (low: a), letter K the padding's score (<= 0). gap_open == gap_extend: linear gaps; else affine,
// gap_open <= gap_extend <= 0. scores (B,) int32: the score, or -1 where a cell reached `limit` (32767 -
// the largest score: int16 could not hold the pair), such pairs counted in *overflows (zeroed by the
// caller). boundary: sw_cuda_search_s16_edge_bytes(B, M, N, affine) bytes (N past the widest single
// tile), or null where that is 0.
struct SearchS16Call {
  const uint8_t* query;
  int M;
  const uint8_t* target;
  int64_t N, B;
  const int64_t* tlen;
  const unsigned* table;
  int K, gap_open, gap_extend, limit;
  int* scores;
  void* boundary;
  int* overflows;
};
int64_t sw_cuda_search_s16_edge_bytes(int64_t B, int64_t M, int64_t N, bool affine);
cudaError_t sw_cuda_search_s16(const SearchS16Call& call, cudaStream_t stream);
// Soft scores of one query against many targets at t > 0 in float32, in scaled exponential space
// (search_soft.cu): query (M,) codes below K, targets (B, N) padded codes with lengths tlen (B,) int64 at
// most N, swept by `warps` warps, each taking targets in order as it needs them, end to end (0 < warps <= B),
// powers (K, K) float32, 2^(S c) with c = log2(e) / t. Linear gaps (affine false): gap_factor = 2^(gap c).
// Affine: gap_factor = O = 2^(gap_open c), extend_factor = 2^(gap_extend c) - O. upper, middle: the
// exponents U, T of the rescaling (a segment's largest value is rescaled to 2^T once it passes 2^U, and a
// segment with an input past 2^U lands at 2^T, linear 2^(2T - U)); floor: F, the cells of a segment scaled
// by more than 2^F must stay above 2^-F (such a segment near it is rescaled up to 2^T); bound: the
// padding's bound (a best cell at most it is flagged); tl: t ln 2. scores (B,) float32: the score, or -1
// for a flagged pair, counted in *flagged (zeroed by the caller). scratch:
// sw_cuda_search_soft_scratch_bytes(B, M, warps, affine) bytes, 16-byte aligned. Dynamic shared memory:
// sw_cuda_search_soft_shared_bytes(K) per block.
struct SearchSoftCall {
  const uint8_t* query;
  int M;
  const uint8_t* target;
  int64_t N, B;
  const int64_t* tlen;
  const float* powers;
  int K;
  bool affine;
  float gap_factor, extend_factor;
  int upper, middle, floor;
  float bound;
  double tl;
  float* scores;
  void* scratch;
  int* flagged;
  int warps;
};
int64_t sw_cuda_search_soft_scratch_bytes(int64_t B, int64_t M, int64_t warps, bool affine);
// The soft search's warps that a GPU with `sms` SMs holds at once, its warps by default.
int64_t sw_cuda_search_soft_resident_warps(int sms);
int64_t sw_cuda_search_soft_shared_bytes(int K);
cudaError_t sw_cuda_search_soft(const SearchSoftCall& call, cudaStream_t stream);
// An empty kernel: the launch-overhead yardstick of `swcli bench`.
cudaError_t sw_cuda_empty(cudaStream_t stream);
