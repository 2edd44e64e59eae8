// The CUDA engine's kernels for the swcli operators (schemas in swcli/ops.py): checks, allocations, the
// current stream. The kernels behind it are declared in engine.h. Launches go on
// c10::cuda::getCurrentCUDAStream(), so the op works on side streams and inside CUDA graph capture; only
// the gradient by rows reads from the device (one int, in backward), which is why the op never takes it
// while a graph is captured.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

#include "engine.h"

// Every failed check's message is one string, built with std::string and std::to_string, never from
// several parts given to TORCH_CHECK: with torch 2.11 and CUDA 13 such a message (c10::str, which formats
// through std::ostringstream) ended the process with SIGSEGV instead of raising, while every check with a
// single string raised. The helpers below return what they found, and the entry points raise.
#define SWCLI_CHECK_CUDA(call, what)                                                                    \
  do {                                                                                                \
    const cudaError_t swcli_err = (call);                                                             \
    TORCH_CHECK(swcli_err == cudaSuccess,                                                             \
                std::string("swcli CUDA engine: ") + (what) + " failed: " + cudaGetErrorString(swcli_err)); \
  } while (0)

namespace {

// The current device's attribute, or -1 where CUDA cannot say.
int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess)
    return -1;
  return value;
}

// The value of lane_columns that asks the dense linear operators for tiles of long pairs whatever the size
// (tests, tools): see tiles_take.
constexpr int64_t kTilesLaneColumns = -1;

// What a call's lane_columns may be: 0 (automatic), 1 or 4; 8 with scores from codes; -1 (tiles) where the
// call can take tiles (the dense linear forward and backward).
bool lane_columns_allowed(int64_t requested, bool codes, bool tiles = false) {
  return requested == 0 || requested == 1 || requested == 4 || (codes && requested == 8) ||
         (tiles && requested == kTilesLaneColumns);
}

// Long pairs in small batches take tiles (long_pairs.cu): each pair's DP cut into tiles of 128 x 128 cells,
// a warp a tile, swept by anti-diagonals of tiles, so that a pair of 35,000 x 35,000 is swept by up to 274
// warps where one warp per pair gives it one. The rule, from the batch's sizes alone (so that the backward
// takes what the forward took): float32, at most kTilesMaxPairs pairs (past a few hundred, the pairs' own
// warps fill the GPU), both sides at least kTilesMinSide (a pair 2 tiles high: a thinner one would be swept
// by about one tile at a time) and M x N at least kTilesMinCells (below it the one-warp sweep is short).
// benchmarks/long_pairs.py measures both paths on both sides of these limits. lane_columns -1 asks for tiles
// at any size, 1 or 4 for one warp per pair.
constexpr int64_t kTilesMaxPairs = 256;
constexpr int64_t kTilesMinSide = 256;
constexpr int64_t kTilesMinCells = int64_t(1) << 20;

bool tiles_take(const at::Tensor& S, int64_t lane_columns) {
  if (lane_columns == kTilesLaneColumns) return true;
  const int64_t B = S.size(0), M = S.size(1), N = S.size(2);
  return lane_columns == 0 && S.scalar_type() == at::kFloat && B <= kTilesMaxPairs && std::min(M, N) >= kTilesMinSide &&
         M * N >= kTilesMinCells;
}

constexpr const char* kTilesDtypeError = "lane_columns -1 (tiles of long pairs) takes float32 scores";

// Columns per lane (requested: allowed, above): 1 keeps the critical path short when there are too few
// pairs to fill the GPU (the latency-bound small batches), 4 amortises each step's shuffle and loads at
// scale, and 8 (scores from codes) amortises them further where the scaled sweep can hold 8 (the kernel
// takes 4 where not).
int lane_columns_for(int64_t B, int64_t requested, bool codes) {
  if (requested != 0) return int(requested);
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);  // the first device's: a hint
  return B < int64_t(sms) * 8 ? 1 : (codes ? 8 : 4);
}

// Pairs of at least this many rows x column tiles share a block of warps (see Relay in forward_log.cuh):
// below it, one warp per pair finishes within the time of the rest of a typical batch.
constexpr int64_t kRelayMinWork = 2048;

struct Lengths {
  at::Tensor qlen, tlen, order;  // undefined when the pair shape is full
  at::Tensor work;               // int32 rows x column tiles of each pair, the key of `order` (B > 1)
};

// Whether the lengths given are contiguous int64 tensors of shape (B,) on the device.
bool lengths_allowed(const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen, int64_t B,
                     const at::Device& device) {
  for (const auto* x : {&qlen, &tlen})
    if (x->has_value() && !((*x)->device() == device && (*x)->scalar_type() == at::kLong && (*x)->dim() == 1 &&
                            (*x)->size(0) == B && (*x)->is_contiguous()))
      return false;
  return true;
}

// Lengths on the device (int64), and the longest-first order in which warps start the pairs: by work, each
// pair of codes oriented as the kernels of R columns per lane orient it. The work comes from one kernel,
// in int32, whose sort takes half the passes of int64: before, a dozen torch ops and the int64 sort put
// 87 us between the engine call and its kernel, of 2,684 us for 10,000 protein pairs (H200).
Lengths lengths_for(const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
                    int64_t B, int64_t M, int64_t N, const at::Device& device, int R, int64_t tile_columns,
                    bool codes) {
  Lengths l;
  if (!qlen.has_value() && !tlen.has_value()) return l;
  const auto full = [&](int64_t n) { return at::full({B}, n, at::TensorOptions().dtype(at::kLong).device(device)); };
  l.qlen = qlen.has_value() ? *qlen : full(M);
  l.tlen = tlen.has_value() ? *tlen : full(N);
  if (B > 1) {
    l.work = at::empty({B}, at::TensorOptions().dtype(at::kInt).device(device));
    const Problem unordered{B, M, N, l.qlen.data_ptr<int64_t>(), l.tlen.data_ptr<int64_t>(), nullptr};
    SWCLI_CHECK_CUDA(sw_cuda_pair_work(unordered, R, codes, tile_columns, l.work.data_ptr<int>(),
                                       c10::cuda::getCurrentCUDAStream()),
                     "ordering the pairs");
    l.order = at::argsort(l.work, /*stable=*/true, /*dim=*/0, /*descending=*/true);
  }
  return l;
}

Problem problem(int64_t B, int64_t M, int64_t N, const Lengths& l) {
  return Problem{B, M, N, l.qlen.defined() ? l.qlen.data_ptr<int64_t>() : nullptr,
                 l.tlen.defined() ? l.tlen.data_ptr<int64_t>() : nullptr,
                 l.order.defined() ? l.order.data_ptr<int64_t>() : nullptr};
}

// The per-pair buffer that carries a tile's last column to the next tile; none when one tile is enough.
at::Tensor boundary_for(int64_t B, int64_t M, int64_t N, int64_t tile_columns, const at::TensorOptions& o) {
  return N > tile_columns ? at::empty({B, M}, o) : at::Tensor();
}

// What every entry point derives from the batch: columns per lane, the lengths and the order of the
// pairs, the kernels' Problem (which points into those lengths), and the tile boundary buffer.
struct Plan {
  int R;
  int64_t tile;  // columns per tile of the lengths' work key and the boundary buffers
  Lengths lengths;
  Problem pr;
  at::Tensor boundary;
};

// What is wrong with a batch's sizes, lengths or lane_columns, or "" (for the bound functions to raise).
std::string batch_error(int64_t B, int64_t M, int64_t N, const std::optional<at::Tensor>& qlen,
                        const std::optional<at::Tensor>& tlen, const at::Device& device, int64_t lane_columns,
                        bool codes, bool tiles = false) {
  if (M >= INT32_MAX || N >= INT32_MAX)
    return "the CUDA engine takes up to 2^31 - 2 rows and columns, got " + std::to_string(M) + " x " +
           std::to_string(N);
  if (!lengths_allowed(qlen, tlen, B, device))
    return "lengths must be contiguous int64 tensors of shape (B,) on the scores' device";
  if (!lane_columns_allowed(lane_columns, codes, tiles))
    return std::string("lane_columns must be 0 (automatic), 1") +
           (codes ? ", 4 or 8" : tiles ? ", 4 or -1 (tiles of long pairs)" : " or 4") + ", got " +
           std::to_string(lane_columns);
  return "";
}

// The plan of a batch that batch_error passed.
Plan plan_for(int64_t B, int64_t M, int64_t N, const std::optional<at::Tensor>& qlen,
              const std::optional<at::Tensor>& tlen, int64_t lane_columns, const at::TensorOptions& values,
              bool codes = false) {
  Plan plan;
  plan.R = lane_columns_for(B, lane_columns, codes);
  // The tiles of 4 columns per lane also where the codes kernel takes 8: it may take 4 (see above).
  plan.tile = sw_cuda_tile_columns(std::min(plan.R, 4));
  plan.lengths = lengths_for(qlen, tlen, B, M, N, values.device(), plan.R, plan.tile, codes);
  plan.pr = problem(B, M, N, plan.lengths);
  // pairs of codes in lanes of 4 or 8 columns may be transposed: columns up to max(M, N), rows up to M
  // (see engine.h)
  plan.boundary = boundary_for(B, M, codes && plan.R >= 4 ? std::max(M, N) : N, plan.tile, values);
  return plan;
}

// Whether the counter of pairs scored in log space (see forward), if any, is a (1,) int32 tensor there.
bool counter_allowed(const std::optional<at::Tensor>& counter, const at::Tensor& like) {
  return !counter.has_value() || (counter->is_cuda() && counter->device() == like.device() &&
                                  counter->scalar_type() == at::kInt && counter->numel() == 1);
}

int* counter_or_null(const std::optional<at::Tensor>& counter) {
  return counter.has_value() ? counter->data_ptr<int>() : nullptr;
}

constexpr const char* kCounterError = "log_pairs must be a (1,) int32 tensor on the inputs' device";

template <typename T>
T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// What is wrong with a backward's incoming gradient, or "": B values on S's device.
std::string grad_scores_error(const at::Tensor& S, const at::Tensor& grad_scores) {
  const int64_t B = S.size(0);
  if (!(grad_scores.device() == S.device() && grad_scores.numel() == B))
    return "grad_scores must hold " + std::to_string(B) + " values on the scores' device";
  return "";
}

// What is wrong with what a backward reads from its forward, or "": a flat state of `size` values of S's dtype,
// best (B,) int64 and grad_scores (B,), on S's device. `forward` names the forward they come from.
std::string saved_error(const at::Tensor& S, const at::Tensor& state, int64_t size, const at::Tensor& best,
                        const at::Tensor& grad_scores, const std::string& forward) {
  const int64_t B = S.size(0);
  if (!(state.device() == S.device() && state.dim() == 1 && state.numel() == size &&
        state.scalar_type() == S.scalar_type() && state.is_contiguous()))
    return "state does not match the score matrix: it must be the state of the " + forward + ", " +
           std::to_string(size) + " values of S's dtype on its device (from the same lane_columns)";
  if (!(best.device() == S.device() && best.numel() == B && best.scalar_type() == at::kLong))
    return "best does not match the score matrix: it must be the (B,) int64 best cells of the " + forward;
  return grad_scores_error(S, grad_scores);
}

// What is wrong with what a gradient by rows reads from its forward, or "": `floats` kept floats a pair,
// best_row (B,) int64 and the failed count (1,) int32, on S's device, then grad_scores. `forward` names the
// forward they come from.
std::string kept_rows_error(const at::Tensor& S, const at::Tensor& kept, int64_t floats, const at::Tensor& best_row,
                            const at::Tensor& failed, const at::Tensor& grad_scores, const std::string& forward) {
  const int64_t B = S.size(0);
  if (!(kept.device() == S.device() && kept.numel() == B * floats && kept.scalar_type() == at::kFloat &&
        kept.is_contiguous() && best_row.device() == S.device() && best_row.numel() == B &&
        best_row.scalar_type() == at::kLong && best_row.is_contiguous() && failed.device() == S.device() &&
        failed.numel() == 1 && failed.scalar_type() == at::kInt))
    return "kept rows do not match the score matrix (they come from " + forward + ")";
  return grad_scores_error(S, grad_scores);
}

// The Problem of a call by tiles: the lengths as given (checked by batch_error), no order.
Problem tiles_problem(int64_t B, int64_t M, int64_t N, const std::optional<at::Tensor>& qlen,
                      const std::optional<at::Tensor>& tlen) {
  return Problem{B, M, N, qlen.has_value() ? qlen->data_ptr<int64_t>() : nullptr,
                 tlen.has_value() ? tlen->data_ptr<int64_t>() : nullptr, nullptr};
}

// forward() by tiles (long_pairs.cu, engine.h): (scores, the tiles' last rows and columns (flat), best_at) with
// keep_state, else (scores, None, None).
std::vector<at::Tensor> forward_tiles(const at::Tensor& S_in, const std::optional<at::Tensor>& qlen,
                                      const std::optional<at::Tensor>& tlen, double gap, double temperature,
                                      bool keep_state, const std::optional<at::Tensor>& log_pairs) {
  TORCH_CHECK(S_in.scalar_type() == at::kFloat,
              std::string(kTilesDtypeError) + ", got " + c10::toString(S_in.scalar_type()));
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  const int64_t B = S.size(0), M = S.size(1), N = S.size(2);
  at::Tensor scores = at::empty({B}, S.options());
  at::Tensor best_at = at::empty({B}, S.options().dtype(at::kLong));
  at::Tensor state = at::empty({sw_cuda_long_state_floats(B, M, N)}, S.options());
  if (M == 0 || N == 0) {
    scores.zero_();
    best_at.fill_(-1);
  } else {
    at::Tensor tile_best = at::empty({sw_cuda_long_tiles(B, M, N)}, S.options());
    at::Tensor tile_at = at::empty({sw_cuda_long_tiles(B, M, N)}, S.options().dtype(at::kLong));
    SWCLI_CHECK_CUDA(sw_cuda_long_forward(tiles_problem(B, M, N, qlen, tlen), S.data_ptr<float>(),
                                          scores.data_ptr<float>(), best_at.data_ptr<int64_t>(), state.data_ptr<float>(),
                                          tile_best.data_ptr<float>(), tile_at.data_ptr<int64_t>(),
                                          counter_or_null(log_pairs), gap, temperature,
                                          c10::cuda::getCurrentCUDAStream()),
                     "forward by tiles");
  }
  if (!keep_state) return {scores, at::Tensor(), at::Tensor()};
  return {scores, state, best_at};
}

// backward() by tiles: grad_S (B, M, N) from forward_tiles' state and best_at.
at::Tensor backward_tiles(const at::Tensor& grad_scores, const at::Tensor& S_in, const at::Tensor& state,
                          const at::Tensor& best_at, const std::optional<at::Tensor>& qlen,
                          const std::optional<at::Tensor>& tlen, double gap, double temperature) {
  TORCH_CHECK(S_in.scalar_type() == at::kFloat,
              std::string(kTilesDtypeError) + ", got " + c10::toString(S_in.scalar_type()));
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string saved =
      saved_error(S_in, state, sw_cuda_long_state_floats(B, M, N), best_at, grad_scores, "forward by tiles");
  TORCH_CHECK(saved.empty(), saved);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  const at::Tensor grad = grad_scores.to(at::kFloat).contiguous(), best = best_at.contiguous();
  at::Tensor grad_S = at::empty({B, M, N}, S.options());  // the kernels write every element
  if (M == 0 || N == 0) return grad_S;
  at::Tensor flows = at::empty({sw_cuda_long_flow_floats(B, M, N)}, S.options());
  SWCLI_CHECK_CUDA(sw_cuda_long_backward(tiles_problem(B, M, N, qlen, tlen), grad.data_ptr<float>(), S.data_ptr<float>(),
                                         state.data_ptr<float>(), best.data_ptr<int64_t>(), grad_S.data_ptr<float>(),
                                         flows.data_ptr<float>(), gap, temperature, c10::cuda::getCurrentCUDAStream()),
                   "backward by tiles");
  return grad_S;
}

// (scores (B,), H (B, M, N) or None, best_at (B,) or None). S: float32 or float64 on a CUDA device.
// scaled: allow the scaled sweeps (float, t > 0, no DP table; with 1-column lanes, pairs of one column
// tile); log_pairs: a (1,) int32 CUDA tensor to which the kernel adds the number of pairs it scored in log
// space instead.
std::string number(double x);  // (with the affine operators' checks, below)

std::vector<at::Tensor> forward(const at::Tensor& S_in, const std::optional<at::Tensor>& qlen,
                                        const std::optional<at::Tensor>& tlen, double gap, double temperature,
                                        bool keep_dp_table, int64_t lane_columns, bool scaled,
                                        const std::optional<at::Tensor>& log_pairs) {
  TORCH_CHECK(S_in.is_cuda() && S_in.dim() == 3, "the CUDA engine needs a 3-D CUDA tensor");
  TORCH_CHECK(S_in.scalar_type() == at::kFloat || S_in.scalar_type() == at::kDouble,
              std::string("the CUDA engine takes float32 or float64, got ") + c10::toString(S_in.scalar_type()));
  TORCH_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be finite and >= 0, got " +
                                                                   number(temperature));
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), lane_columns, false, true);
  TORCH_CHECK(error.empty(), error);
  TORCH_CHECK(counter_allowed(log_pairs, S_in), kCounterError);
  if (tiles_take(S_in, lane_columns)) return forward_tiles(S_in, qlen, tlen, gap, temperature, keep_dp_table, log_pairs);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  const Plan plan = plan_for(B, M, N, qlen, tlen, lane_columns, S.options());
  const Problem& pr = plan.pr;
  const int R = plan.R;
  const at::Tensor& boundary = plan.boundary;
  at::Tensor scores = at::empty({B}, S.options());
  at::Tensor table, best_at;
  if (keep_dp_table) {
    table = at::empty({B, M, sw_cuda_table_columns(N, R)}, S.options());
    best_at = at::empty({B}, S.options().dtype(at::kLong));
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (M == 0 || N == 0) {
    scores.zero_();
    if (keep_dp_table) best_at.fill_(-1);
  } else if (S.scalar_type() == at::kFloat) {
    SWCLI_CHECK_CUDA(sw_cuda_forward_f32(pr, S.data_ptr<float>(), scores.data_ptr<float>(),
                                         ptr_or_null<float>(table), ptr_or_null<int64_t>(best_at),
                                         ptr_or_null<float>(boundary), gap, temperature, R, stream, scaled,
                                         counter_or_null(log_pairs)),
                     "forward");
  } else {
    SWCLI_CHECK_CUDA(sw_cuda_forward_f64(pr, S.data_ptr<double>(), scores.data_ptr<double>(),
                                         ptr_or_null<double>(table), ptr_or_null<int64_t>(best_at),
                                         ptr_or_null<double>(boundary), gap, temperature, R, stream),
                     "forward");
  }
  return {scores, table, best_at};  // undefined tensors reach Python as None
}

// Scores (B,) float32 of uint8 code pairs (B, M), (B, N) in a K x K matrix, all on one CUDA device.
// scaled: allow the scaled sweep (t > 0, 4 columns per lane); log_pairs: a (1,) int32 CUDA tensor to
// which the kernel adds the number of such pairs it scored in log space instead (tests, bench).
at::Tensor forward_codes(const at::Tensor& query_in, const at::Tensor& target_in,
                                 const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
                                 const at::Tensor& matrix_in, double gap, double temperature, int64_t lane_columns,
                                 bool scaled, const std::optional<at::Tensor>& log_pairs) {
  TORCH_CHECK(query_in.is_cuda() && target_in.is_cuda() && matrix_in.is_cuda(),
              "the CUDA engine needs codes and matrix on a CUDA device");
  TORCH_CHECK(query_in.dim() == 2 && target_in.dim() == 2 && query_in.size(0) == target_in.size(0) &&
                  query_in.scalar_type() == at::kByte && target_in.scalar_type() == at::kByte,
              "codes must be uint8 tensors of shapes (B, M) and (B, N)");
  TORCH_CHECK(matrix_in.dim() == 2 && matrix_in.size(0) == matrix_in.size(1), "the matrix must be square");
  const int64_t B = query_in.size(0), M = query_in.size(1), N = target_in.size(1);
  const std::string error = batch_error(B, M, N, qlen, tlen, query_in.device(), lane_columns, true);
  TORCH_CHECK(error.empty(), error);
  TORCH_CHECK(counter_allowed(log_pairs, matrix_in), kCounterError);
  const c10::cuda::CUDAGuard guard(query_in.device());
  const int64_t K = matrix_in.size(0);
  const int64_t smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  TORCH_CHECK(smem_limit > 0, "swcli CUDA engine: the device's shared memory per block is unknown");
  TORCH_CHECK(K * K * int64_t(sizeof(float)) <= smem_limit,
              "a " + std::to_string(K) + " x " + std::to_string(K) + " matrix does not fit in the GPU's shared " +
                  "memory (" + std::to_string(smem_limit) + " bytes per block)");
  // One query row shared by every pair (an expanded (B, M) view, as a search passes it) is read where
  // it is, with a stride of 0: no copy of the query per target.
  const bool shared_query = B > 1 && query_in.stride(0) == 0 && (M <= 1 || query_in.stride(1) == 1);
  const at::Tensor query = shared_query ? query_in : query_in.contiguous(), target = target_in.contiguous();
  const int64_t query_stride = shared_query ? 0 : M;
  const at::Tensor matrix = matrix_in.to(at::kFloat).contiguous();
  const Plan plan = plan_for(B, M, N, qlen, tlen, lane_columns, matrix.options(), true);
  at::Tensor scores = at::empty({B}, matrix.options());
  if (M == 0 || N == 0) return scores.zero_();
  // With 4 or 8 columns per lane and lengths, the longest pairs (a prefix of the order) get a block each.
  const Lengths& l = plan.lengths;
  Relaying relaying{};
  at::Tensor coop_count, relay;
  if (plan.R >= 4 && l.order.defined() && plan.boundary.defined()) {
    const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
    TORCH_CHECK(sms > 0, "swcli CUDA engine: the device's number of SMs is unknown");
    relaying.max_coop = std::min<int64_t>(B, 2 * int64_t(sms));
    // the pairs over the threshold are a prefix of the order, which sorts by the same work
    coop_count = at::empty({1}, matrix.options().dtype(at::kLong));
    SWCLI_CHECK_CUDA(sw_cuda_coop_count(l.work.data_ptr<int>(), l.order.data_ptr<int64_t>(), relaying.max_coop,
                                        int(kRelayMinWork), coop_count.data_ptr<int64_t>(),
                                        c10::cuda::getCurrentCUDAStream()),
                     "counting the relayed pairs");
    relay = at::empty({relaying.max_coop, sw_cuda_relay_warps() + 1, M}, matrix.options());
    relaying.coop_count = coop_count.data_ptr<int64_t>();
    relaying.relay = relay.data_ptr<float>();
  }
  SWCLI_CHECK_CUDA(sw_cuda_forward_codes(plan.pr, query.data_ptr<uint8_t>(), query_stride, target.data_ptr<uint8_t>(),
                                         matrix.data_ptr<float>(), int(K), scores.data_ptr<float>(),
                                         ptr_or_null<float>(plan.boundary), gap, temperature, plan.R,
                                         c10::cuda::getCurrentCUDAStream(), relaying.relay ? &relaying : nullptr,
                                         scaled, counter_or_null(log_pairs), smem_limit),
                   "forward_codes");
  return scores;
}

// d scores / d S (B, M, N) from the forward's table and best_at; with sums (a zeroed (2, B) tensor of S's
// dtype, else undefined) also the per-pair sums of backward_parameters (engine.h).
at::Tensor backward(const at::Tensor& grad_scores, const at::Tensor& S_in, const at::Tensor& table,
                            const at::Tensor& best_at, const std::optional<at::Tensor>& qlen,
                            const std::optional<at::Tensor>& tlen, double gap, double temperature,
                            int64_t lane_columns, const at::Tensor& sums) {
  TORCH_CHECK(S_in.is_cuda() && S_in.dim() == 3, "the CUDA engine needs a 3-D CUDA tensor");
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), lane_columns, false, true);
  TORCH_CHECK(error.empty(), error);
  const std::string grad_error = grad_scores_error(S_in, grad_scores);
  TORCH_CHECK(grad_error.empty(), grad_error);
  if (tiles_take(S_in, lane_columns)) {
    if (!sums.defined()) return backward_tiles(grad_scores, S_in, table, best_at, qlen, tlen, gap, temperature);
    // The tiles' backward sums nothing for the gaps and the temperature: their gradient takes the DP
    // table's path (one warp a pair, 4 columns a lane), its table computed now: M x N floats a pair.
    std::vector<at::Tensor> r = forward(S_in, qlen, tlen, gap, temperature, true, 4, true, std::nullopt);
    return backward(grad_scores, S_in, r[1], r[2], qlen, tlen, gap, temperature, 4, sums);
  }
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  const Plan plan = plan_for(B, M, N, qlen, tlen, lane_columns, S.options());
  TORCH_CHECK(table.dim() == 3 && table.size(0) == B && table.size(1) == M &&
                  table.size(2) == sw_cuda_table_columns(N, plan.R) && table.scalar_type() == S.scalar_type() &&
                  table.is_contiguous() && best_at.numel() == B,
              "DP table does not match the score matrix (it comes from forward with the same lane_columns)");
  const Problem& pr = plan.pr;
  const int R = plan.R;
  const at::Tensor& boundary = plan.boundary;
  const at::Tensor grad = grad_scores.to(S.scalar_type()).contiguous();
  at::Tensor grad_S = at::empty({B, M, N}, S.options());  // the kernel writes every element
  if (M == 0 || N == 0) return grad_S;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (S.scalar_type() == at::kFloat)
    SWCLI_CHECK_CUDA(sw_cuda_backward_f32(pr, grad.data_ptr<float>(), S.data_ptr<float>(),
                                          table.data_ptr<float>(), best_at.data_ptr<int64_t>(),
                                          grad_S.data_ptr<float>(), ptr_or_null<float>(boundary),
                                          ptr_or_null<float>(sums), gap, temperature, R, stream),
                     "backward");
  else
    SWCLI_CHECK_CUDA(sw_cuda_backward_f64(pr, grad.data_ptr<double>(), S.data_ptr<double>(),
                                          table.data_ptr<double>(), best_at.data_ptr<int64_t>(),
                                          grad_S.data_ptr<double>(), ptr_or_null<double>(boundary),
                                          ptr_or_null<double>(sums), gap, temperature, R, stream),
                     "backward");
  return grad_S;
}

// Whether the gradient by rows (engine.h) takes this call: float32, t > 0, gap <= 0, N up to the rows'
// width (any N: rows not 16-byte aligned go through a staging row in shared memory). The op sends a
// call here only where it gains (ops._by_rows).
bool rows_take_scores(const at::Tensor& S) {
  return S.is_cuda() && S.dim() == 3 && S.scalar_type() == at::kFloat && S.size(2) <= sw_cuda_rows_width();
}
bool rows_take(const at::Tensor& S, double gap, double temperature) {
  return rows_take_scores(S) && temperature > 0 && gap <= 0;
}

// Gaps and temperature that the kernels read on the device (PairValues in engine.h), one a pair: (B,)
// float32 tensors on the scores' device, any stride (0: an expanded 0-d tensor), and the scratch where
// the kernels derive each pair's constants. The host never reads them: a launch does not wait for the
// step that computed them.
struct DeviceValues {
  PairValues values{};
  at::Tensor scratch;
};

DeviceValues device_values(const at::Tensor& S, const std::vector<std::pair<const char*, const at::Tensor*>>& named) {
  const int64_t B = S.size(0);
  for (const auto& [name, value] : named)
    TORCH_CHECK(value->dim() == 1 && value->size(0) == B && value->scalar_type() == at::kFloat &&
                    value->device() == S.device(),
                std::string(name) + " must be a float32 tensor of shape (" + std::to_string(B) +
                    ",) on the scores' device, one value per pair");
  DeviceValues d;
  auto step = [](const at::Tensor& v) { return v.size(0) > 1 ? v.stride(0) : int64_t(0); };
  const at::Tensor& first = *named.front().second;
  const at::Tensor& last = *named.back().second;
  d.values.gap = first.data_ptr<float>(), d.values.gap_step = step(first);
  d.values.t = last.data_ptr<float>(), d.values.t_step = step(last);
  if (named.size() == 3) {
    const at::Tensor& extend = *named[1].second;
    d.values.extend = extend.data_ptr<float>(), d.values.extend_step = step(extend);
  }
  d.scratch = at::empty({std::max<int64_t>(sw_cuda_pair_values_bytes(B), 1)}, S.options().dtype(at::kByte));
  d.values.scratch = d.scratch.data_ptr();
  return d;
}

// (scores (B,), kept (B, kept floats), best_row (B,), failed (1,) int32): the forward of the gradient by rows
// (engine.h). failed counts on the device the pairs that need the DP table's path instead.
std::vector<at::Tensor> forward_rows(const at::Tensor& S_in, const std::optional<at::Tensor>& qlen,
                                     const std::optional<at::Tensor>& tlen, double gap, double temperature,
                                     const PairValues* values = nullptr) {
  TORCH_CHECK(values ? rows_take_scores(S_in) : rows_take(S_in, gap, temperature),
              "the gradient by rows takes float32 CUDA scores (B, M, N) with N <= " +
                  std::to_string(sw_cuda_rows_width()) + ", t > 0 and gap <= 0");
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), 0, false);
  TORCH_CHECK(error.empty(), error);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  // 4 columns per lane: the longest-first order's tiles, and the boundary of the log-space fallback
  const Plan plan = plan_for(B, M, N, qlen, tlen, 4, S.options());
  at::Tensor scores = at::empty({B}, S.options());
  at::Tensor kept = at::empty({B, sw_cuda_rows_kept_floats(M)}, S.options());
  at::Tensor best_row = at::empty({B}, S.options().dtype(at::kLong));
  at::Tensor failed = at::zeros({1}, S.options().dtype(at::kInt));
  if (M == 0 || N == 0) {
    scores.zero_();
    best_row.fill_(-1);
  } else {
    SWCLI_CHECK_CUDA(sw_cuda_rows_forward(plan.pr, S.data_ptr<float>(), scores.data_ptr<float>(),
                                          best_row.data_ptr<int64_t>(), kept.data_ptr<float>(),
                                          ptr_or_null<float>(plan.boundary), failed.data_ptr<int>(), gap, temperature,
                                          c10::cuda::getCurrentCUDAStream(), values),
                     "forward by rows");
  }
  return {scores, kept, best_row, failed};
}

// grad_S (B, M, N) from forward_rows' kept rows, best_row and failed count; or, where that count is not 0
// (some pair's rows left the scaled range), an undefined tensor (None): the caller then takes the DP
// table's path. The count is read from the device last, just before the launch, with everything else
// queued: the host's time between the forward's end and the backward's start is then the launch alone.
// (Read first, in ops.py, it left 80 to 215 us between the two kernels on the H200, under torch.profiler.)
at::Tensor backward_rows(const at::Tensor& grad_scores, const at::Tensor& S_in, const at::Tensor& kept,
                         const at::Tensor& best_row, const at::Tensor& failed, const std::optional<at::Tensor>& qlen,
                         const std::optional<at::Tensor>& tlen, double gap, double temperature,
                         const at::Tensor& sums, const PairValues* values = nullptr) {
  TORCH_CHECK(values ? rows_take_scores(S_in) : rows_take(S_in, gap, temperature),
              "the gradient by rows does not take these scores");
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), 0, false);
  TORCH_CHECK(error.empty(), error);
  const std::string saved =
      kept_rows_error(S_in, kept, sw_cuda_rows_kept_floats(M), best_row, failed, grad_scores, "forward_rows");
  TORCH_CHECK(saved.empty(), saved);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  const Lengths lengths = lengths_for(qlen, tlen, B, M, N, S.device(), 4, sw_cuda_tile_columns(4), false);
  const Problem pr = problem(B, M, N, lengths);
  const at::Tensor grad = grad_scores.to(at::kFloat).contiguous();
  at::Tensor grad_S = at::empty({B, M, N}, S.options());  // the kernel writes every element
  if (M == 0 || N == 0) return grad_S;
  if (failed.item<int>() != 0) return at::Tensor();
  SWCLI_CHECK_CUDA(sw_cuda_rows_backward(pr, grad.data_ptr<float>(), S.data_ptr<float>(), kept.data_ptr<float>(),
                                         best_row.data_ptr<int64_t>(), grad_S.data_ptr<float>(),
                                         ptr_or_null<float>(sums), gap, temperature, c10::cuda::getCurrentCUDAStream(),
                                         values),
                   "backward by rows");
  return grad_S;
}

// The yardstick of `swcli bench`: allocate a (B,) result like the forward does, and launch an empty kernel.
at::Tensor empty_launch(const at::Tensor& S) {
  TORCH_CHECK(S.is_cuda() && S.dim() == 3, "needs a 3-D CUDA tensor");
  at::Tensor out = at::empty({S.size(0)}, S.options());
  SWCLI_CHECK_CUDA(sw_cuda_empty(c10::cuda::getCurrentCUDAStream()), "empty launch");
  return out;
}


// ---------------------------------------------------------------------------------------------------
// Affine gaps (affine.cuh, engine.h): log space, dense float32/float64 with or without the state for the
// backward, and float32 scores from codes.

// A double as printf's %g writes it, as the CPU engine's messages do.
std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", x);
  return text;
}

// What is wrong with the gaps or the temperature of an affine call, or "": the operators can be called
// past the Python checks, and the recurrence is defined for finite gap_open <= gap_extend <= 0 only.
std::string affine_settings_error(double gap_open, double gap_extend, double temperature) {
  if (!(std::isfinite(gap_open) && std::isfinite(gap_extend) && gap_open <= gap_extend && gap_extend <= 0))
    return "affine gaps need finite scores with gap_open <= gap_extend <= 0, got gap_open = " + number(gap_open) +
           ", gap_extend = " + number(gap_extend);
  if (!(std::isfinite(temperature) && temperature >= 0))
    return "temperature must be finite and >= 0, got " + number(temperature);
  return "";
}

// The per-pair buffer of (H, X) pairs (forward) or of two adjoints (backward) that carries a tile's
// column to the next tile: (B, M, 2) values where a pair's columns pass one tile of R columns per lane.
at::Tensor affine_boundary(int64_t B, int64_t M, int64_t columns, int R, const at::TensorOptions& o) {
  return columns > sw_cuda_tile_columns(R) ? at::empty({B, M, 2}, o) : at::Tensor();
}

// (scores (B,), state (flat), best_at (B,) or undefined) of dense S; the state is empty unless keep_state.
std::vector<at::Tensor> affine_dense_forward(const at::Tensor& S_in, const std::optional<at::Tensor>& qlen,
                                             const std::optional<at::Tensor>& tlen, double gap_open,
                                             double gap_extend, double temperature, int64_t lane_columns,
                                             bool keep_state) {
  TORCH_CHECK(S_in.is_cuda() && S_in.dim() == 3, "the CUDA engine needs a 3-D CUDA tensor");
  TORCH_CHECK(S_in.scalar_type() == at::kFloat || S_in.scalar_type() == at::kDouble,
              std::string("the CUDA engine takes float32 or float64, got ") + c10::toString(S_in.scalar_type()));
  const std::string settings = affine_settings_error(gap_open, gap_extend, temperature);
  TORCH_CHECK(settings.empty(), settings);
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), lane_columns, false);
  TORCH_CHECK(error.empty(), error);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  const int R = lane_columns_for(B, lane_columns, false);
  const Lengths lengths = lengths_for(qlen, tlen, B, M, N, S.device(), R, sw_cuda_tile_columns(R), false);
  const Problem pr = problem(B, M, N, lengths);
  const at::Tensor boundary = affine_boundary(B, M, N, R, S.options());
  at::Tensor scores = at::empty({B}, S.options());
  at::Tensor state = at::empty({keep_state ? sw_cuda_affine_state_size(B, M, N, R) : 0}, S.options());
  at::Tensor best_at;
  if (keep_state) best_at = at::empty({B}, S.options().dtype(at::kLong));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (M == 0 || N == 0) {
    scores.zero_();
    if (keep_state) best_at.fill_(-1);
  } else if (S.scalar_type() == at::kFloat) {
    SWCLI_CHECK_CUDA(sw_cuda_affine_forward_f32(pr, S.data_ptr<float>(), scores.data_ptr<float>(),
                                                keep_state ? state.data_ptr<float>() : nullptr,
                                                ptr_or_null<int64_t>(best_at), ptr_or_null<float>(boundary), gap_open,
                                                gap_extend, temperature, R, stream),
                     "affine forward");
  } else {
    SWCLI_CHECK_CUDA(sw_cuda_affine_forward_f64(pr, S.data_ptr<double>(), scores.data_ptr<double>(),
                                                keep_state ? state.data_ptr<double>() : nullptr,
                                                ptr_or_null<int64_t>(best_at), ptr_or_null<double>(boundary),
                                                gap_open, gap_extend, temperature, R, stream),
                     "affine forward");
  }
  return {scores, state, best_at};
}

at::Tensor op_affine_scores(const at::Tensor& S, const std::optional<at::Tensor>& qlen,
                            const std::optional<at::Tensor>& tlen, double gap_open, double gap_extend,
                            double temperature, int64_t lane_columns) {
  return affine_dense_forward(S, qlen, tlen, gap_open, gap_extend, temperature, lane_columns, false)[0];
}

// Whether the affine gradient by rows (engine.h) takes this call: float32, t > 0 in the shared form, N up
// to the rows' width. The op sends a call here only where it gains (ops.gradient_by_rows).
bool affine_rows_take(const at::Tensor& S, double gap_open, double temperature) {
  return rows_take_scores(S) && temperature > 0 && sw_cuda_affine_shared_form(gap_open, temperature);
}

// (scores (B,), kept (B * kept floats), best_row (B,), failed (1,) int32) of the affine forward by rows.
std::vector<at::Tensor> affine_forward_rows(const at::Tensor& S_in, const std::optional<at::Tensor>& qlen,
                                            const std::optional<at::Tensor>& tlen, double gap_open,
                                            double gap_extend, double temperature,
                                            const PairValues* values = nullptr) {
  TORCH_CHECK(values ? rows_take_scores(S_in) : affine_rows_take(S_in, gap_open, temperature),
              "the affine gradient by rows takes float32 CUDA scores (B, M, N) with N <= " +
                  std::to_string(sw_cuda_rows_width()) + ", t > 0 and |gap_open| log2(e) / t <= 100");
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), 0, false);
  TORCH_CHECK(error.empty(), error);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  // 4 columns per lane: the longest-first order, and the boundary of the log-space fallback
  const Lengths lengths = lengths_for(qlen, tlen, B, M, N, S.device(), 4, sw_cuda_tile_columns(4), false);
  const Problem pr = problem(B, M, N, lengths);
  const at::Tensor boundary = affine_boundary(B, M, N, 4, S.options());
  at::Tensor scores = at::empty({B}, S.options());
  at::Tensor kept = at::empty({B * sw_cuda_affine_rows_kept_floats(M)}, S.options());
  at::Tensor best_row = at::empty({B}, S.options().dtype(at::kLong));
  at::Tensor failed = at::zeros({1}, S.options().dtype(at::kInt));
  if (M == 0 || N == 0) {
    scores.zero_();
    best_row.fill_(-1);
  } else {
    SWCLI_CHECK_CUDA(sw_cuda_affine_rows_forward(pr, S.data_ptr<float>(), scores.data_ptr<float>(),
                                                 best_row.data_ptr<int64_t>(), kept.data_ptr<float>(),
                                                 ptr_or_null<float>(boundary), failed.data_ptr<int>(), gap_open,
                                                 gap_extend, temperature, c10::cuda::getCurrentCUDAStream(), values),
                     "affine forward by rows");
  }
  return {scores, kept, best_row, failed};
}

// grad_S (B, M, N) from affine_forward_rows' kept rows and best rows; or, where its failed count is not 0,
// an undefined tensor: the caller then takes the state's path (read last, as in backward_rows).
at::Tensor affine_backward_rows(const at::Tensor& grad_scores, const at::Tensor& S_in, const at::Tensor& kept,
                                const at::Tensor& best_row, const at::Tensor& failed,
                                const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
                                double gap_open, double gap_extend, double temperature, const at::Tensor& sums,
                                const PairValues* values = nullptr) {
  TORCH_CHECK(values ? rows_take_scores(S_in) : affine_rows_take(S_in, gap_open, temperature),
              "the affine gradient by rows does not take these scores");
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), 0, false);
  TORCH_CHECK(error.empty(), error);
  const std::string saved = kept_rows_error(S_in, kept, sw_cuda_affine_rows_kept_floats(M), best_row, failed,
                                            grad_scores, "affine_forward with by_rows");
  TORCH_CHECK(saved.empty(), saved);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const at::Tensor S = S_in.contiguous();
  const Lengths lengths = lengths_for(qlen, tlen, B, M, N, S.device(), 4, sw_cuda_tile_columns(4), false);
  const Problem pr = problem(B, M, N, lengths);
  const at::Tensor grad = grad_scores.to(at::kFloat).contiguous();
  at::Tensor grad_S = at::empty({B, M, N}, S.options());  // the kernel writes every element
  if (M == 0 || N == 0) return grad_S;
  if (failed.item<int>() != 0) return at::Tensor();
  SWCLI_CHECK_CUDA(sw_cuda_affine_rows_backward(pr, grad.data_ptr<float>(), S.data_ptr<float>(),
                                                kept.data_ptr<float>(), best_row.data_ptr<int64_t>(),
                                                grad_S.data_ptr<float>(), ptr_or_null<float>(sums), gap_open,
                                                gap_extend, temperature, c10::cuda::getCurrentCUDAStream(), values),
                   "affine backward by rows");
  return grad_S;
}

// (scores, state, best, failed): by rows, state is the kept rows, best the best cell's row and failed the
// count of pairs that need the state's path; else the state is M, X and Y of every cell in the kernels'
// wavefront order (its size depends on the columns per lane: only the engine reads it), best the
// row-major index of each pair's first maximal cell, -1 for the zero border, and failed 0.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> op_affine_forward(
    const at::Tensor& S, const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
    double gap_open, double gap_extend, double temperature, bool by_rows, int64_t lane_columns) {
  if (by_rows) {
    TORCH_CHECK(lane_columns == 0, "the gradient by rows takes lane_columns 0 (its lanes hold 8 columns)");
    const std::string settings = affine_settings_error(gap_open, gap_extend, temperature);
    TORCH_CHECK(settings.empty(), settings);
    std::vector<at::Tensor> r = affine_forward_rows(S, qlen, tlen, gap_open, gap_extend, temperature);
    return {r[0], r[1], r[2], r[3]};
  }
  std::vector<at::Tensor> r =
      affine_dense_forward(S, qlen, tlen, gap_open, gap_extend, temperature, lane_columns, true);
  return {r[0], r[1], r[2], at::zeros({1}, S.options().dtype(at::kInt))};
}

// Scores (B,) float32 of uint8 code pairs with affine gaps, as forward_codes takes them.
at::Tensor op_affine_scores_codes(const at::Tensor& query_in, const at::Tensor& target_in, const at::Tensor& matrix_in,
                                  const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
                                  double gap_open, double gap_extend, double temperature, int64_t lane_columns) {
  TORCH_CHECK(query_in.is_cuda() && target_in.is_cuda() && matrix_in.is_cuda(),
              "the CUDA engine needs codes and matrix on a CUDA device");
  TORCH_CHECK(query_in.dim() == 2 && target_in.dim() == 2 && query_in.size(0) == target_in.size(0) &&
                  query_in.scalar_type() == at::kByte && target_in.scalar_type() == at::kByte,
              "codes must be uint8 tensors of shapes (B, M) and (B, N)");
  TORCH_CHECK(matrix_in.dim() == 2 && matrix_in.size(0) == matrix_in.size(1), "the matrix must be square");
  const std::string settings = affine_settings_error(gap_open, gap_extend, temperature);
  TORCH_CHECK(settings.empty(), settings);
  const int64_t B = query_in.size(0), M = query_in.size(1), N = target_in.size(1);
  const std::string error = batch_error(B, M, N, qlen, tlen, query_in.device(), lane_columns, true);
  TORCH_CHECK(error.empty(), error);
  const c10::cuda::CUDAGuard guard(query_in.device());
  const int64_t K = matrix_in.size(0);
  const int64_t smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  TORCH_CHECK(smem_limit > 0, "swcli CUDA engine: the device's shared memory per block is unknown");
  TORCH_CHECK(K * K * int64_t(sizeof(float)) + 128 <= smem_limit,
              "a " + std::to_string(K) + " x " + std::to_string(K) + " matrix does not fit in the GPU's shared " +
                  "memory (" + std::to_string(smem_limit) + " bytes per block)");
  // one query row shared by every pair (stride 0) is read in place, as in forward_codes
  const bool shared_query = B > 1 && query_in.stride(0) == 0 && (M <= 1 || query_in.stride(1) == 1);
  const at::Tensor query = shared_query ? query_in : query_in.contiguous(), target = target_in.contiguous();
  const int64_t query_stride = shared_query ? 0 : M;
  const at::Tensor matrix = matrix_in.to(at::kFloat).contiguous();
  const int R = lane_columns_for(B, lane_columns, true);
  const Lengths l = lengths_for(qlen, tlen, B, M, N, matrix.device(), R, sw_cuda_tile_columns(std::min(R, 4)), true);
  const Problem pr = problem(B, M, N, l);
  // pairs in lanes of 4 or 8 columns may be transposed: columns up to max(M, N), rows up to M
  const at::Tensor boundary = affine_boundary(B, M, R >= 4 ? std::max(M, N) : N, R, matrix.options());
  at::Tensor scores = at::empty({B}, matrix.options());
  if (M == 0 || N == 0) return scores.zero_();
  Relaying relaying{};
  at::Tensor coop_count, relay;
  if (R >= 4 && l.order.defined() && boundary.defined()) {
    const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
    TORCH_CHECK(sms > 0, "swcli CUDA engine: the device's number of SMs is unknown");
    relaying.max_coop = std::min<int64_t>(B, 2 * int64_t(sms));
    coop_count = at::empty({1}, matrix.options().dtype(at::kLong));
    SWCLI_CHECK_CUDA(sw_cuda_coop_count(l.work.data_ptr<int>(), l.order.data_ptr<int64_t>(), relaying.max_coop,
                                        int(kRelayMinWork), coop_count.data_ptr<int64_t>(),
                                        c10::cuda::getCurrentCUDAStream()),
                     "counting the relayed pairs");
    relay = at::empty({relaying.max_coop, sw_cuda_affine_relay_warps() + 1, M, 2}, matrix.options());
    relaying.coop_count = coop_count.data_ptr<int64_t>();
    relaying.relay = relay.data_ptr<float>();
  }
  SWCLI_CHECK_CUDA(sw_cuda_affine_forward_codes(pr, query.data_ptr<uint8_t>(), query_stride, target.data_ptr<uint8_t>(),
                                                matrix.data_ptr<float>(), int(K), scores.data_ptr<float>(),
                                                ptr_or_null<float>(boundary), gap_open, gap_extend, temperature, R,
                                                c10::cuda::getCurrentCUDAStream(), relaying.relay ? &relaying : nullptr,
                                                smem_limit),
                   "affine forward_codes");
  return scores;
}

// grad_S (B, M, N) from the state and best of op_affine_forward without by_rows (the same lane_columns); with
// sums (a zeroed (3, B) tensor of S's dtype, else undefined) also affine_backward_parameters' sums.
at::Tensor affine_backward_state(const at::Tensor& grad_scores, const at::Tensor& S_in, const at::Tensor& state,
                                 const at::Tensor& best, const std::optional<at::Tensor>& qlen,
                                 const std::optional<at::Tensor>& tlen, double gap_open, double gap_extend,
                                 double temperature, int64_t lane_columns, const at::Tensor& sums) {
  TORCH_CHECK(S_in.is_cuda() && S_in.dim() == 3, "the CUDA engine needs a 3-D CUDA tensor");
  TORCH_CHECK(S_in.scalar_type() == at::kFloat || S_in.scalar_type() == at::kDouble,
              std::string("the CUDA engine takes float32 or float64, got ") + c10::toString(S_in.scalar_type()));
  const std::string settings = affine_settings_error(gap_open, gap_extend, temperature);
  TORCH_CHECK(settings.empty(), settings);
  const int64_t B = S_in.size(0), M = S_in.size(1), N = S_in.size(2);
  const std::string error = batch_error(B, M, N, qlen, tlen, S_in.device(), lane_columns, false);
  TORCH_CHECK(error.empty(), error);
  const int R = lane_columns_for(B, lane_columns, false);
  const std::string saved =
      saved_error(S_in, state, sw_cuda_affine_state_size(B, M, N, R), best, grad_scores, "affine forward");
  TORCH_CHECK(saved.empty(), saved);
  const c10::cuda::CUDAGuard guard(S_in.device());
  const Lengths lengths = lengths_for(qlen, tlen, B, M, N, S_in.device(), R, sw_cuda_tile_columns(R), false);
  const Problem pr = problem(B, M, N, lengths);
  const at::Tensor grad = grad_scores.to(S_in.scalar_type()).contiguous();
  const at::Tensor best_at = best.contiguous();
  const at::Tensor boundary = affine_boundary(B, M, N, R, S_in.options());
  at::Tensor grad_S = at::empty({B, M, N}, S_in.options());  // the kernels write every element
  if (M == 0 || N == 0) return grad_S;
  const at::Tensor S = sums.defined() ? S_in.contiguous() : at::Tensor();  // the sums' <S, grad_S> reads S
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (S_in.scalar_type() == at::kFloat)
    SWCLI_CHECK_CUDA(sw_cuda_affine_backward_f32(pr, grad.data_ptr<float>(), state.data_ptr<float>(),
                                                 best_at.data_ptr<int64_t>(), grad_S.data_ptr<float>(),
                                                 ptr_or_null<float>(boundary), ptr_or_null<float>(S),
                                                 ptr_or_null<float>(sums), gap_open, gap_extend, temperature, R,
                                                 stream),
                     "affine backward");
  else
    SWCLI_CHECK_CUDA(sw_cuda_affine_backward_f64(pr, grad.data_ptr<double>(), state.data_ptr<double>(),
                                                 best_at.data_ptr<int64_t>(), grad_S.data_ptr<double>(),
                                                 ptr_or_null<double>(boundary), ptr_or_null<double>(S),
                                                 ptr_or_null<double>(sums), gap_open, gap_extend, temperature, R,
                                                 stream),
                     "affine backward");
  return grad_S;
}

// grad_S (B, M, N) from op_affine_forward's (state, best, failed) with the same by_rows and lane_columns, and
// with sums (zeroed, (3, B)) affine_backward_parameters' sums.
at::Tensor affine_backward_any(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                               const at::Tensor& best, const at::Tensor& failed, const std::optional<at::Tensor>& qlen,
                               const std::optional<at::Tensor>& tlen, double gap_open, double gap_extend,
                               double temperature, bool by_rows, int64_t lane_columns, const at::Tensor& sums) {
  if (by_rows) {
    TORCH_CHECK(lane_columns == 0, "the gradient by rows takes lane_columns 0 (its lanes hold 8 columns)");
    const std::string settings = affine_settings_error(gap_open, gap_extend, temperature);
    TORCH_CHECK(settings.empty(), settings);
    at::Tensor grad_S = affine_backward_rows(grad_scores, S, state, best, failed, qlen, tlen, gap_open, gap_extend,
                                             temperature, sums);
    if (grad_S.defined()) return grad_S;
    // Some pair's rows left the scaled range (its score came from log space): the state's path for the
    // batch, its state computed now.
    std::vector<at::Tensor> r = affine_dense_forward(S, qlen, tlen, gap_open, gap_extend, temperature, 0, true);
    return affine_backward_state(grad_scores, S, r[1], r[2], qlen, tlen, gap_open, gap_extend, temperature, 0, sums);
  }
  return affine_backward_state(grad_scores, S, state, best, qlen, tlen, gap_open, gap_extend, temperature,
                               lane_columns, sums);
}

at::Tensor op_affine_backward(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                              const at::Tensor& best, const at::Tensor& failed, const std::optional<at::Tensor>& qlen,
                              const std::optional<at::Tensor>& tlen, double gap_open, double gap_extend,
                              double temperature, bool by_rows, int64_t lane_columns) {
  return affine_backward_any(grad_scores, S, state, best, failed, qlen, tlen, gap_open, gap_extend, temperature,
                             by_rows, lane_columns, at::Tensor());
}

// The per-pair sums of the parameters' gradients: a zeroed (K, B) tensor of S's dtype on its device.
at::Tensor zeroed_sums(const at::Tensor& S, int64_t K) {
  TORCH_CHECK(S.is_cuda() && S.dim() == 3, "the CUDA engine needs a 3-D CUDA tensor");
  const c10::cuda::CUDAGuard guard(S.device());
  return at::zeros({K, S.size(0)}, S.options());
}

// (grad_S, sums (3, B)): affine_backward and, per pair, grad_scores times d score / d gap_open and
// d score / d gap_extend, and <S, grad_S> (the gradients of the gaps and the temperature, ops.py).
std::tuple<at::Tensor, at::Tensor> op_affine_backward_parameters(
    const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state, const at::Tensor& best,
    const at::Tensor& failed, const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
    double gap_open, double gap_extend, double temperature, bool by_rows, int64_t lane_columns) {
  at::Tensor sums = zeroed_sums(S, 3);
  at::Tensor grad_S = affine_backward_any(grad_scores, S, state, best, failed, qlen, tlen, gap_open, gap_extend,
                                          temperature, by_rows, lane_columns, sums);
  return {grad_S, sums};
}

// ---------------------------------------------------------------------------------------------------
// The search kernels: one query against a block of padded targets.

// What is wrong with a search kernel's inputs ("" if nothing): the query, targets, their lengths and the
// kernel's table on one CUDA device, a (M,) uint8 query, (B, N) uint8 targets and (B,) int64 lengths.
std::string search_inputs_error(const char* kind, const at::Tensor& query, const at::Tensor& target,
                                const at::Tensor& tlen, const at::Tensor& table) {
  const std::string what = std::string("the ") + kind + " search";
  if (!(query.is_cuda() && target.device() == query.device() && tlen.device() == query.device() &&
        table.device() == query.device()))
    return what + " needs the query, targets, lengths and its table on one CUDA device";
  if (!(query.dim() == 1 && query.scalar_type() == at::kByte && target.dim() == 2 && target.scalar_type() == at::kByte))
    return what + " takes a (M,) uint8 query and (B, N) uint8 targets";
  if (!(tlen.dim() == 1 && tlen.size(0) == target.size(0) && tlen.scalar_type() == at::kLong))
    return "target_lengths must be (B,) int64";
  return "";
}

// Exact search scores in 16-bit lanes (search_s16.cu, engine.h).

// (scores (B,) int32, overflows (1,) int32): one query's exact scores against padded targets at t = 0,
// -1 where int16 could not hold the pair (counted in overflows: the caller scores those again wider).
std::tuple<at::Tensor, at::Tensor> op_search_scores_s16(const at::Tensor& query_in, const at::Tensor& target_in,
                                                        const at::Tensor& tlen_in, const at::Tensor& table_in,
                                                        int64_t gap_open, int64_t gap_extend, int64_t limit) {
  const std::string inputs = search_inputs_error("exact", query_in, target_in, tlen_in, table_in);
  TORCH_CHECK(inputs.empty(), inputs);
  const int64_t M = query_in.size(0), B = target_in.size(0), N = target_in.size(1);
  TORCH_CHECK(table_in.dim() == 3 && table_in.scalar_type() == at::kInt && table_in.size(1) == table_in.size(0) + 1 &&
                  table_in.size(2) == table_in.size(0) + 1,
              "the table must be (K, K + 1, K + 1) int32");
  TORCH_CHECK(gap_open <= gap_extend && gap_extend <= 0 && gap_open >= -16000,
              "the exact search takes integer gaps with -16000 <= gap_open <= gap_extend <= 0, got " +
                  std::to_string(gap_open) + " and " + std::to_string(gap_extend));
  TORCH_CHECK(limit > 0 && limit <= 32767, "limit must be in [1, 32767], got " + std::to_string(limit));
  TORCH_CHECK(M < (int64_t(1) << 30) && N < (int64_t(1) << 30), "the exact search takes at most 2^30 residues a sequence");
  const int64_t K = table_in.size(0);
  const int64_t smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  TORCH_CHECK(K * (K + 1) * (K + 1) * 4 <= smem_limit,
              "a " + std::to_string(K) + "-letter table does not fit in the GPU's shared memory (" +
                  std::to_string(smem_limit) + " bytes per block)");
  const c10::cuda::CUDAGuard guard(query_in.device());
  const at::Tensor query = query_in.contiguous(), target = target_in.contiguous(), tlen = tlen_in.contiguous(),
                   table = table_in.contiguous();
  at::Tensor scores = at::empty({B}, query.options().dtype(at::kInt));
  at::Tensor overflows = at::zeros({1}, query.options().dtype(at::kInt));
  if (B == 0) return {scores, overflows};
  if (M == 0 || N == 0) return {scores.zero_(), overflows};
  at::Tensor boundary;
  const int64_t edge_bytes = sw_cuda_search_s16_edge_bytes(B, M, N, gap_open != gap_extend);
  if (edge_bytes > 0) boundary = at::empty({edge_bytes}, query.options());
  const SearchS16Call call{query.data_ptr<uint8_t>(), int(M), target.data_ptr<uint8_t>(), N, B,
                           tlen.data_ptr<int64_t>(), reinterpret_cast<const unsigned*>(table.data_ptr<int>()), int(K),
                           int(gap_open), int(gap_extend), int(limit), scores.data_ptr<int>(),
                           boundary.defined() ? boundary.data_ptr() : nullptr, overflows.data_ptr<int>()};
  SWCLI_CHECK_CUDA(sw_cuda_search_s16(call, c10::cuda::getCurrentCUDAStream()), "exact search");
  return {scores, overflows};
}

// Soft search scores in scaled space (search_soft.cu, engine.h).

// (scores (B,) float32, flagged (1,) int32): one query's soft scores against padded targets at t > 0, -1
// where the kernel's checks did not hold (counted in flagged: the caller scores those again through the
// general op). The settings come from search.SoftSearch, which derives them from the matrix, t and the
// gaps. warps: the warps that share the targets (0: as many as the GPU holds at once; at most B); a
// score has the same bits whatever their number. Targets sorted longest first share them best. The
// lengths must be in [0, N] (the search's blocks are, by construction).
std::tuple<at::Tensor, at::Tensor> op_search_scores_soft(const at::Tensor& query_in, const at::Tensor& target_in,
                                                         const at::Tensor& tlen_in, const at::Tensor& powers_in,
                                                         int64_t warps_in, bool affine, double gap_factor,
                                                         double extend_factor, double temperature, int64_t upper,
                                                         int64_t middle, int64_t floor, double bound) {
  const std::string inputs = search_inputs_error("soft", query_in, target_in, tlen_in, powers_in);
  TORCH_CHECK(inputs.empty(), inputs);
  const int64_t M = query_in.size(0), B = target_in.size(0), N = target_in.size(1);
  TORCH_CHECK(powers_in.dim() == 2 && powers_in.size(0) == powers_in.size(1) && powers_in.size(0) >= 1 &&
                  powers_in.scalar_type() == at::kFloat,
              "the powers must be a (K, K) float32 table");
  TORCH_CHECK(temperature > 0 && std::isfinite(temperature), "the soft search takes a temperature > 0, got " +
                                                                   std::to_string(temperature));
  TORCH_CHECK(std::isfinite(gap_factor) && gap_factor > 0 && std::isfinite(extend_factor) && extend_factor >= 0 &&
                  std::isfinite(bound) && bound >= 1,
              "the soft search's gap factors must be finite and positive, and its bound at least 1");
  // Where a segment lands when its input passes 2^upper (search_soft.cu): 2^middle, linear 2^(2 middle - upper)
  const int64_t landing = affine ? middle : 2 * middle - upper;
  TORCH_CHECK(-126 <= landing && middle < upper && upper <= 126 && 0 <= floor && floor <= 126,
              std::string("the soft search's exponents must be -126 <= ") + (affine ? "middle" : "2 middle - upper") +
                  ", middle < upper <= 126 and floor in [0, 126], got middle " + std::to_string(middle) +
                  ", upper " + std::to_string(upper) + ", floor " + std::to_string(floor));
  TORCH_CHECK(M < (int64_t(1) << 30) && N < (int64_t(1) << 30), "the soft search takes at most 2^30 residues a sequence");
  TORCH_CHECK(warps_in >= 0, "warps must be at least 0 (0: as many as the GPU holds), got " + std::to_string(warps_in));
  const int64_t K = powers_in.size(0);
  TORCH_CHECK(K <= 255, "the soft search takes at most 255 letters (uint8 codes and a padding letter)");
  const int64_t smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  TORCH_CHECK(sw_cuda_search_soft_shared_bytes(int(K)) <= smem_limit,
              "a " + std::to_string(K) + "-letter matrix's profile rings do not fit in the GPU's shared memory (" +
                  std::to_string(smem_limit) + " bytes per block)");
  const c10::cuda::CUDAGuard guard(query_in.device());
  const at::Tensor query = query_in.contiguous(), target = target_in.contiguous(), tlen = tlen_in.contiguous(),
                   powers = powers_in.contiguous();
  at::Tensor scores = at::empty({B}, query.options().dtype(at::kFloat));
  at::Tensor flagged = at::zeros({1}, query.options().dtype(at::kInt));
  if (B == 0) return {scores, flagged};
  if (M == 0 || N == 0) return {scores.zero_(), flagged};
  const int64_t resident = sw_cuda_search_soft_resident_warps(device_attribute(cudaDevAttrMultiProcessorCount));
  const int64_t warps = std::min(std::min<int64_t>(warps_in > 0 ? warps_in : resident, B), int64_t(1) << 30);
  const at::Tensor scratch =
      at::empty({sw_cuda_search_soft_scratch_bytes(B, M, warps, affine)}, query.options());  // (16-byte aligned)
  const SearchSoftCall call{query.data_ptr<uint8_t>(), int(M), target.data_ptr<uint8_t>(), N, B,
                            tlen.data_ptr<int64_t>(), powers.data_ptr<float>(), int(K), affine, float(gap_factor),
                            float(extend_factor), int(upper), int(middle), int(floor), float(bound),
                            temperature * 0.6931471805599453, scores.data_ptr<float>(), scratch.data_ptr(),
                            flagged.data_ptr<int>(), int(warps)};
  SWCLI_CHECK_CUDA(sw_cuda_search_soft(call, c10::cuda::getCurrentCUDAStream()), "soft search");
  return {scores, flagged};
}

// ---------------------------------------------------------------------------------------------------
// The registered entry points (schemas in swcli/ops.py).

// scores and scores_codes, and their counted variants, which return the number of pairs the scaled sweep
// handed to log space (tests, tools) instead of writing it into an argument: an operator that mutates an
// argument is not functional, and torch.compile's lowering of such an operator failed.
at::Tensor op_scores(const at::Tensor& S, const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
                     double gap, double temperature, int64_t lane_columns, bool scaled) {
  return forward(S, qlen, tlen, gap, temperature, false, lane_columns, scaled, std::nullopt)[0];
}

std::tuple<at::Tensor, at::Tensor> op_scores_counted(const at::Tensor& S, const std::optional<at::Tensor>& qlen,
                                                     const std::optional<at::Tensor>& tlen, double gap,
                                                     double temperature, int64_t lane_columns, bool scaled) {
  TORCH_CHECK(S.is_cuda(), "the CUDA engine needs a 3-D CUDA tensor");
  const c10::cuda::CUDAGuard guard(S.device());
  at::Tensor log_pairs = at::zeros({1}, S.options().dtype(at::kInt));
  at::Tensor scores = forward(S, qlen, tlen, gap, temperature, false, lane_columns, scaled, log_pairs)[0];
  return {scores, log_pairs};
}

at::Tensor op_scores_codes(const at::Tensor& query, const at::Tensor& target, const at::Tensor& matrix,
                           const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen, double gap,
                           double temperature, int64_t lane_columns, bool scaled) {
  return forward_codes(query, target, qlen, tlen, matrix, gap, temperature, lane_columns, scaled, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> op_scores_codes_counted(const at::Tensor& query, const at::Tensor& target,
                                                           const at::Tensor& matrix,
                                                           const std::optional<at::Tensor>& qlen,
                                                           const std::optional<at::Tensor>& tlen, double gap,
                                                           double temperature, int64_t lane_columns, bool scaled) {
  TORCH_CHECK(matrix.is_cuda(), "the CUDA engine needs codes and matrix on a CUDA device");
  const c10::cuda::CUDAGuard guard(matrix.device());
  at::Tensor log_pairs = at::zeros({1}, matrix.options().dtype(at::kInt));
  at::Tensor scores = forward_codes(query, target, qlen, tlen, matrix, gap, temperature, lane_columns, scaled, log_pairs);
  return {scores, log_pairs};
}

// (scores, state, best, failed): by rows, state is the kept rows, best the best cell's row and failed the
// count of pairs that need the table; by the table, state is the DP table, best the best cell's index
// and failed 0. The state is flat: its size depends on the plan (columns per lane), which only the engine
// knows, and only the engine's backward reads it.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> op_forward(
    const at::Tensor& S, const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen, double gap,
    double temperature, bool by_rows, int64_t lane_columns, bool scaled) {
  (void)scaled;  // the forward that keeps a table is computed in log space (engine.h)
  if (by_rows) {
    TORCH_CHECK(lane_columns == 0, "the gradient by rows takes lane_columns 0 (its lanes hold 8 columns)");
    std::vector<at::Tensor> r = forward_rows(S, qlen, tlen, gap, temperature);
    return {r[0], r[1].reshape({-1}), r[2], r[3]};
  }
  std::vector<at::Tensor> r = forward(S, qlen, tlen, gap, temperature, true, lane_columns, true, std::nullopt);
  return {r[0], r[1].reshape({-1}), r[2], at::zeros({1}, S.options().dtype(at::kInt))};
}

// grad_S from op_forward's (state, best, failed) with the same by_rows and lane_columns, and with sums
// (zeroed, (2, B)) backward_parameters' sums.
at::Tensor backward_any(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                        const at::Tensor& best, const at::Tensor& failed, const std::optional<at::Tensor>& qlen,
                        const std::optional<at::Tensor>& tlen, double gap, double temperature, bool by_rows,
                        int64_t lane_columns, const at::Tensor& sums) {
  TORCH_CHECK(S.is_cuda() && S.dim() == 3, "the CUDA engine needs a 3-D CUDA tensor");
  const int64_t B = S.size(0), M = S.size(1), N = S.size(2);
  if (by_rows) {
    TORCH_CHECK(lane_columns == 0, "the gradient by rows takes lane_columns 0 (its lanes hold 8 columns)");
    TORCH_CHECK(state.dim() == 1 && state.numel() == B * sw_cuda_rows_kept_floats(M),
                "kept rows do not match the score matrix (they come from forward with by_rows)");
    at::Tensor grad_S = backward_rows(grad_scores, S, state.view({B, sw_cuda_rows_kept_floats(M)}), best, failed,
                                      qlen, tlen, gap, temperature, sums);
    if (grad_S.defined()) return grad_S;
    // Some pair's rows left the scaled range (its score came from log space): the DP table's path for
    // the batch, its table computed now.
    std::vector<at::Tensor> r = forward(S, qlen, tlen, gap, temperature, true, 0, true, std::nullopt);
    return backward(grad_scores, S, r[1], r[2], qlen, tlen, gap, temperature, 0, sums);
  }
  TORCH_CHECK(lane_columns_allowed(lane_columns, false, true),
              "lane_columns must be 0 (automatic), 1, 4 or -1 (tiles of long pairs), got " + std::to_string(lane_columns));
  if (tiles_take(S, lane_columns))  // the state is the tiles' last rows and columns (flat)
    return backward(grad_scores, S, state, best, qlen, tlen, gap, temperature, lane_columns, sums);
  const int R = lane_columns_for(B, lane_columns, false);
  const int64_t columns = sw_cuda_table_columns(N, R);
  TORCH_CHECK(state.dim() == 1 && state.numel() == B * M * columns,
              "the DP table does not match the score matrix (it comes from forward with the same lane_columns)");
  return backward(grad_scores, S, state.view({B, M, columns}), best, qlen, tlen, gap, temperature, lane_columns,
                  sums);
}

at::Tensor op_backward(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                       const at::Tensor& best, const at::Tensor& failed, const std::optional<at::Tensor>& qlen,
                       const std::optional<at::Tensor>& tlen, double gap, double temperature, bool by_rows,
                       int64_t lane_columns) {
  return backward_any(grad_scores, S, state, best, failed, qlen, tlen, gap, temperature, by_rows, lane_columns,
                      at::Tensor());
}

// (grad_S, sums (2, B)): backward and, per pair, grad_scores times d score / d gap and <S, grad_S> (the
// gradients of the gap and the temperature, ops.py).
std::tuple<at::Tensor, at::Tensor> op_backward_parameters(
    const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state, const at::Tensor& best,
    const at::Tensor& failed, const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen, double gap,
    double temperature, bool by_rows, int64_t lane_columns) {
  at::Tensor sums = zeroed_sums(S, 2);
  at::Tensor grad_S =
      backward_any(grad_scores, S, state, best, failed, qlen, tlen, gap, temperature, by_rows, lane_columns, sums);
  return {grad_S, sums};
}

// The gradient by rows with the gaps and t read on the device (ops.py: _RowsPerPair), for a learned gap or
// temperature: the forward (scores, kept, best_row, failed) and the backward (grad_S, sums) of the call's
// operators without a host copy of the values. Where the forward counted a failed pair (the rows could
// not hold it, its values are outside the rows' rules, or not valid) grad_S is a (0,) tensor: the caller
// then reads the values, checks them and takes the DP table's path by groups.
using ForwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

ForwardOutputs op_forward_per_pair(const at::Tensor& S, const std::optional<at::Tensor>& qlen,
                                   const std::optional<at::Tensor>& tlen, const at::Tensor& gap,
                                   const at::Tensor& temperature) {
  TORCH_CHECK(rows_take_scores(S), "forward_per_pair takes float32 CUDA scores (B, M, N) with N <= " +
                                       std::to_string(sw_cuda_rows_width()));
  const DeviceValues d = device_values(S, {{"gap", &gap}, {"temperature", &temperature}});
  const std::vector<at::Tensor> out = forward_rows(S, qlen, tlen, 0.0, 1.0, &d.values);
  return {out[0], out[1].view({-1}), out[2], out[3]};  // the state flat, as op_forward's
}

std::tuple<at::Tensor, at::Tensor> op_backward_parameters_per_pair(
    const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state, const at::Tensor& best,
    const at::Tensor& failed, const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
    const at::Tensor& gap, const at::Tensor& temperature) {
  TORCH_CHECK(rows_take_scores(S), "backward_parameters_per_pair takes the scores of forward_per_pair");
  const DeviceValues d = device_values(S, {{"gap", &gap}, {"temperature", &temperature}});
  const int64_t B = S.size(0), M = S.size(1);
  at::Tensor sums = zeroed_sums(S, 2);
  at::Tensor grad_S = backward_rows(grad_scores, S, state.view({B, sw_cuda_rows_kept_floats(M)}), best, failed, qlen,
                                    tlen, 0.0, 1.0, sums, &d.values);
  return {grad_S.defined() ? grad_S : at::empty({0}, S.options()), sums};
}

ForwardOutputs op_affine_forward_per_pair(const at::Tensor& S, const std::optional<at::Tensor>& qlen,
                                          const std::optional<at::Tensor>& tlen, const at::Tensor& gap_open,
                                          const at::Tensor& gap_extend, const at::Tensor& temperature) {
  TORCH_CHECK(rows_take_scores(S), "affine_forward_per_pair takes float32 CUDA scores (B, M, N) with N <= " +
                                       std::to_string(sw_cuda_rows_width()));
  const DeviceValues d =
      device_values(S, {{"gap_open", &gap_open}, {"gap_extend", &gap_extend}, {"temperature", &temperature}});
  const std::vector<at::Tensor> out = affine_forward_rows(S, qlen, tlen, -1.0, -1.0, 1.0, &d.values);
  return {out[0], out[1], out[2], out[3]};
}

std::tuple<at::Tensor, at::Tensor> op_affine_backward_parameters_per_pair(
    const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state, const at::Tensor& best,
    const at::Tensor& failed, const std::optional<at::Tensor>& qlen, const std::optional<at::Tensor>& tlen,
    const at::Tensor& gap_open, const at::Tensor& gap_extend, const at::Tensor& temperature) {
  TORCH_CHECK(rows_take_scores(S), "affine_backward_parameters_per_pair takes the scores of affine_forward_per_pair");
  const DeviceValues d =
      device_values(S, {{"gap_open", &gap_open}, {"gap_extend", &gap_extend}, {"temperature", &temperature}});
  at::Tensor sums = zeroed_sums(S, 3);
  at::Tensor grad_S = affine_backward_rows(grad_scores, S, state, best, failed, qlen, tlen, -1.0, -1.0, 1.0, sums,
                                           &d.values);
  return {grad_S.defined() ? grad_S : at::empty({0}, S.options()), sums};
}

}  // namespace

TORCH_LIBRARY_IMPL(swcli, CUDA, m) {
  m.impl("forward_per_pair", &op_forward_per_pair);
  m.impl("backward_parameters_per_pair", &op_backward_parameters_per_pair);
  m.impl("affine_forward_per_pair", &op_affine_forward_per_pair);
  m.impl("affine_backward_parameters_per_pair", &op_affine_backward_parameters_per_pair);
  m.impl("scores", &op_scores);
  m.impl("scores_counted", &op_scores_counted);
  m.impl("scores_codes", &op_scores_codes);
  m.impl("scores_codes_counted", &op_scores_codes_counted);
  m.impl("forward", &op_forward);
  m.impl("backward", &op_backward);
  m.impl("empty_launch", &empty_launch);
  m.impl("affine_scores", &op_affine_scores);
  m.impl("affine_scores_codes", &op_affine_scores_codes);
  m.impl("affine_forward", &op_affine_forward);
  m.impl("affine_backward", &op_affine_backward);
  m.impl("backward_parameters", &op_backward_parameters);
  m.impl("affine_backward_parameters", &op_affine_backward_parameters);
  m.impl("search_scores_s16", &op_search_scores_s16);
  m.impl("search_scores_soft", &op_search_scores_soft);
}
