// The CPU kernels of the swcli operators: argument checks, tensors in and out, and the registration
// under the dispatcher's CPU key. The schemas are defined in Python (swcli/ops.py); this file only
// implements them, so a kernel's C++ signature must follow its schema's argument order.
//
// Every TORCH_CHECK message is one std::string: a message built from several parts once crashed a
// process instead of raising.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "affine.h"
#include "backward.h"
#include "forward_log.h"
#include "forward_scaled.h"
#include "simd.h"
#include "sources.h"
#include "striped.h"
#include "strips.h"
#include "strips_hard.h"
#include "strips_soft.h"

namespace swcli_cpu {
namespace {

constexpr const char* kCounterError = "log_pairs must be a (1,) int32 tensor on the inputs' device (the CPU)";

// The CUDA engine's tuning knob; the CPU engine has none, so anything but "automatic" is a mistake.
void check_lane_columns(int64_t lane_columns) {
  TORCH_CHECK(lane_columns == 0,
              "lane_columns is a CUDA setting: on the CPU it must be 0, got " + std::to_string(lane_columns));
}

// A double as printf's %g writes it (std::to_string's fixed six decimals would print 1e-9 as 0.000000).
std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", x);
  return text;
}

void check_temperature(double temperature) {
  TORCH_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be finite and >= 0, got " +
                                                                   number(temperature));
}

void check_scores(const at::Tensor& S) {
  TORCH_CHECK(S.dim() == 3, "score matrix must be 3-D (B, M, N), got " + std::to_string(S.dim()) + "-D");
  TORCH_CHECK(S.device().is_cpu(), "the CPU engine needs a CPU tensor");
  TORCH_CHECK(S.scalar_type() == at::kFloat || S.scalar_type() == at::kDouble,
              "the CPU engine takes float32 or float64, got " + std::string(c10::toString(S.scalar_type())));
}

// The lengths the kernels read: `given` as a contiguous int64 (B,) tensor whose values lie in
// [0, limit], or `limit` for every pair when absent. The kernels index S and the codes by these lengths,
// so the range is checked here, whatever the caller checked before.
at::Tensor lengths_or_full(const std::optional<at::Tensor>& given, int64_t B, int64_t limit, const std::string& name,
                           const std::string& dim) {
  if (!given.has_value()) return at::full({B}, limit, at::TensorOptions().dtype(at::kLong));
  const at::Tensor& lengths = *given;
  TORCH_CHECK(lengths.device().is_cpu() && lengths.scalar_type() == at::kLong && lengths.dim() == 1 &&
                  lengths.size(0) == B,
              name + " must be an int64 CPU tensor of shape (" + std::to_string(B) + ",)");
  at::Tensor out = lengths.contiguous();
  const int64_t* value = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(value[b] >= 0 && value[b] <= limit, name + " must lie in [0, " + dim + "] (" + dim + " = " +
                                                         std::to_string(limit) + "), got " + std::to_string(value[b]));
  }
  return out;
}

void check_counter(const std::optional<at::Tensor>& counter) {
  if (!counter.has_value()) return;
  TORCH_CHECK(counter->device().is_cpu() && counter->scalar_type() == at::kInt && counter->numel() == 1,
              kCounterError);
}

// The pairs of a call scored in log space after the scaled sweep, added to the (1,) int32 counter.
void add_log_pairs(const std::optional<at::Tensor>& counter, int64_t pairs) {
  if (!counter.has_value()) return;
  *counter->data_ptr<int32_t>() += static_cast<int32_t>(pairs);
}

template <typename T>
DenseSource<T> dense_source(const at::Tensor& S, const at::Tensor& tlen) {
  return DenseSource<T>{S.data_ptr<T>(), S.stride(0), S.stride(1), S.stride(2), tlen.data_ptr<int64_t>(),
                        {}};
}

// The pairs of `pairs` (every pair of the batch when empty) that take the strips, and the others, which
// stay with the sweeps across pairs. The rule is the pair's own (its lengths, whether its scores are
// dense), never the batch's, so that a pair gets the same bits alone or in any batch.
void split_by_strips(const Problem& pr, bool strips_allowed, bool dense, std::vector<int64_t>& strips,
                     std::vector<int64_t>& across, const std::vector<int64_t>& pairs = {}) {
  const int64_t count = pairs.empty() ? pr.B : static_cast<int64_t>(pairs.size());
  for (int64_t n = 0; n < count; ++n) {
    const int64_t b = pairs.empty() ? n : pairs[n];
    (strips_allowed && strips_take(pr.qlen[b], pr.tlen[b], dense) ? strips : across).push_back(b);
  }
}

// Scores (B,) of dense S, and with keep_dp_table its DP table H (B, M+1, N+1), else an empty tensor.
// scaled: allow the scaled sweep (float32 at t > 0).
std::tuple<at::Tensor, at::Tensor> dense_forward(const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
                                                 const std::optional<at::Tensor>& target_lengths, double gap,
                                                 double temperature, int64_t lane_columns, bool keep_dp_table,
                                                 bool scaled, const std::optional<at::Tensor>& log_pairs) {
  check_lane_columns(lane_columns);
  check_scores(S);
  check_temperature(temperature);
  check_counter(log_pairs);
  const at::Tensor qlen = lengths_or_full(query_lengths, S.size(0), S.size(1), "query_lengths", "M");
  const at::Tensor tlen = lengths_or_full(target_lengths, S.size(0), S.size(2), "target_lengths", "N");
  const Problem pr{S.size(0), S.size(1), S.size(2), qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
  at::Tensor scores = at::zeros({pr.B}, S.options());
  at::Tensor dp = keep_dp_table ? at::zeros({pr.B, pr.M + 1, pr.N + 1}, S.options()) : at::empty({0}, S.options());
  int64_t to_log = 0;
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "swcli_cpu_forward", [&] {
    const auto t = static_cast<scalar_t>(temperature);
    const DenseSource<scalar_t> source = dense_source<scalar_t>(S, tlen);
    if constexpr (std::is_same<scalar_t, float>::value) {
      if (temperature == 0) {  // long pairs in the hard strips, the others across pairs: the same floats
        float* table = keep_dp_table ? dp.data_ptr<float>() : nullptr;
        std::vector<int64_t> strips, across;
        split_by_strips(pr, true, true, strips, across);
        hard_strip_scores_dense(pr, S.data_ptr<float>(), S.stride(0), S.stride(1), S.stride(2), strips,
                                static_cast<float>(gap), scores.data_ptr<float>(), table, across);
        if (!across.empty()) {
          std::sort(across.begin(), across.end());
          forward_pairs<float>(pr, source, longest_first(pr, std::move(across)), static_cast<float>(gap), 0.0f,
                               scores.data_ptr<float>(), table);
        }
        return;
      }
      if (scaled_applies(scaled, gap, temperature)) {
        float* table = keep_dp_table ? dp.data_ptr<float>() : nullptr;
        std::vector<int64_t> strips, across;
        split_by_strips(pr, soft_strips_apply(gap, temperature, 0.0), true, strips, across);
        soft_strip_scores_dense(pr, S.data_ptr<float>(), S.stride(0), S.stride(1), S.stride(2), strips,
                                static_cast<float>(gap), t, scores.data_ptr<float>(), table, across);
        std::sort(across.begin(), across.end());
        forward_scaled<false>(pr, across, source, source, static_cast<float>(gap), t, scores.data_ptr<float>(), table,
                              to_log);
        return;
      }
    }
    forward_all<scalar_t>(pr, source, static_cast<scalar_t>(gap), t, scores.data_ptr<scalar_t>(),
                          keep_dp_table ? dp.data_ptr<scalar_t>() : nullptr);
  });
  add_log_pairs(log_pairs, to_log);
  return {scores, dp};
}

at::Tensor scores_cpu(const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
                      const std::optional<at::Tensor>& target_lengths, double gap, double temperature,
                      int64_t lane_columns, bool scaled, const std::optional<at::Tensor>& log_pairs) {
  return std::get<0>(dense_forward(S, query_lengths, target_lengths, gap, temperature, lane_columns, false, scaled,
                                   log_pairs));
}

// (scores, state, best, failed) as the CUDA engine returns them. The CPU backward needs only the DP
// table (state, flattened) and finds the best cell again, so best is -1 everywhere and failed is 0.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward_cpu(
    const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
    const std::optional<at::Tensor>& target_lengths, double gap, double temperature, bool by_rows,
    int64_t lane_columns, bool scaled) {
  TORCH_CHECK(!by_rows, "the gradient by rows is a CUDA scheme: on the CPU by_rows must be false");
  auto [scores, dp] =
      dense_forward(S, query_lengths, target_lengths, gap, temperature, lane_columns, true, scaled, std::nullopt);
  at::Tensor best = at::full({S.size(0)}, -1, at::TensorOptions().dtype(at::kLong));
  at::Tensor failed = at::zeros({1}, at::TensorOptions().dtype(at::kInt));
  return {scores, dp.reshape(-1), best, failed};
}

// Pairs given as uint8 codes (B, M) and (B, N) into a K x K matrix, checked, with what the sweeps read:
// the lengths, the codes, the matrix as a contiguous float32 table, and the source over them (which
// points into these tensors, kept here).
struct CodeInputs {
  at::Tensor qlen, tlen, q, t, table;
  Problem pr;
  CodeSource source;
};

CodeInputs code_inputs(const at::Tensor& query, const at::Tensor& target, const at::Tensor& matrix,
                       const std::optional<at::Tensor>& query_lengths,
                       const std::optional<at::Tensor>& target_lengths) {
  TORCH_CHECK(query.dim() == 2 && target.dim() == 2 && query.size(0) == target.size(0) &&
                  query.dtype() == at::kByte && target.dtype() == at::kByte && query.device().is_cpu() &&
                  target.device().is_cpu(),
              "codes must be uint8 CPU tensors of shapes (B, M) and (B, N)");
  TORCH_CHECK(matrix.dim() == 2 && matrix.size(0) == matrix.size(1) && matrix.size(0) <= 256 &&
                  matrix.device().is_cpu(),
              "the substitution matrix must be a square CPU tensor of at most 256 x 256");
  CodeInputs in;
  in.qlen = lengths_or_full(query_lengths, query.size(0), query.size(1), "query_lengths", "M");
  in.tlen = lengths_or_full(target_lengths, target.size(0), target.size(1), "target_lengths", "N");
  // One query row shared by every pair (an expanded (B, M) view, as a search passes it) is read where
  // it is, with a stride of 0: no copy of the query per target.
  const bool shared_query = query.size(0) > 1 && query.stride(0) == 0 && (query.size(1) <= 1 || query.stride(1) == 1);
  in.q = shared_query ? query : query.contiguous();
  in.t = target.contiguous();
  const int64_t K = matrix.size(0);
  if (in.q.numel() > 0)
    TORCH_CHECK((shared_query ? in.q[0] : in.q).max().item<int64_t>() < K, "a query code is outside the matrix");
  if (in.t.numel() > 0) TORCH_CHECK(in.t.max().item<int64_t>() < K, "a target code is outside the matrix");
  in.table = matrix.to(at::kFloat).contiguous();
  in.pr = Problem{in.q.size(0), in.q.size(1), in.t.size(1), in.qlen.data_ptr<int64_t>(), in.tlen.data_ptr<int64_t>()};
  in.source = CodeSource{in.q.data_ptr<uint8_t>(), in.t.data_ptr<uint8_t>(), in.pr.M, in.pr.N, K,
                         shared_query ? 0 : in.pr.M, in.tlen.data_ptr<int64_t>(), in.table.data_ptr<float>(), {}};
  return in;
}

// Scores (B,) float32 of pairs given as uint8 codes (B, M) and (B, N) into a K x K matrix.
at::Tensor scores_codes_cpu(const at::Tensor& query, const at::Tensor& target, const at::Tensor& matrix,
                            const std::optional<at::Tensor>& query_lengths,
                            const std::optional<at::Tensor>& target_lengths, double gap, double temperature,
                            int64_t lane_columns, bool scaled, const std::optional<at::Tensor>& log_pairs) {
  check_lane_columns(lane_columns);
  check_temperature(temperature);
  check_counter(log_pairs);
  const CodeInputs in = code_inputs(query, target, matrix, query_lengths, target_lengths);
  const Problem& pr = in.pr;
  const int64_t K = in.table.size(0);
  at::Tensor scores = at::zeros({pr.B}, matrix.options().dtype(at::kFloat));
  // The scaled sweep's table of powers 2^(m c), rounded once, where every one is at most 2^60 (a NaN
  // or a huge entry keeps the whole call in log space).
  std::vector<float> powers;
  if (scaled_applies(scaled, gap, temperature)) {
    const double c = log2e_over<float>(temperature);
    const float* m = in.table.data_ptr<float>();
    powers.resize(K * K);
    for (int64_t x = 0; x < K * K; ++x) {
      powers[x] = static_cast<float>(std::exp2(double(m[x]) * c));
      if (!(powers[x] <= 0x1p60f)) {
        powers.clear();
        break;
      }
    }
  }
  int64_t to_log = 0;
  IntegerScoring integers;
  if (temperature == 0) {
    // Exact in int16 where the matrix and the gap are integers; the pairs that may have saturated, or
    // every pair where they are not, in float: long pairs in the hard strips, the others across pairs.
    std::vector<int64_t> strips, across;
    if (integer_scoring(in.table.data_ptr<float>(), K, static_cast<float>(gap), static_cast<float>(gap), integers)) {
      std::vector<int64_t> striped, in_float;
      const bool shared = in.source.query_stride == 0;
      for (int64_t b = 0; b < pr.B; ++b)
        (striped_takes(pr.qlen[b], pr.tlen[b], shared) ? striped : in_float).push_back(b);
      striped_scores(pr, in.source, integers, striped, scores.data_ptr<float>(), in_float);
      std::sort(in_float.begin(), in_float.end());
      if (!in_float.empty()) split_by_strips(pr, true, false, strips, across, in_float);
    } else {
      split_by_strips(pr, true, false, strips, across);
    }
    if (!strips.empty()) {
      const float* m = in.table.data_ptr<float>();
      std::vector<float> transposed(K * K);
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < K; ++b) transposed[b * K + a] = m[a * K + b];
      hard_strip_scores_codes(pr, in.source, m, transposed.data(), strips, static_cast<float>(gap),
                              scores.data_ptr<float>(), nullptr);
    }
    if (!across.empty())
      forward_pairs<float>(pr, in.source, longest_first(pr, std::move(across)), static_cast<float>(gap), 0.0f,
                           scores.data_ptr<float>(), nullptr);
  } else if (scaled_applies(scaled, gap, temperature)) {
    // Long pairs in the strips where the matrix is finite and in their range, the rest across pairs:
    // scaled where every power is at most 2^60, else in log space.
    const float* m = in.table.data_ptr<float>();
    float largest = -std::numeric_limits<float>::infinity();
    bool finite = true;
    for (int64_t x = 0; x < K * K; ++x) finite = finite && std::isfinite(m[x]), largest = std::max(largest, m[x]);
    std::vector<int64_t> strips, across;
    split_by_strips(pr, finite && soft_strips_apply(gap, temperature, largest), false, strips, across);
    if (!strips.empty()) {
      const double c = log2e_over<float>(temperature);
      std::vector<float> all_powers(K * K), transposed(K * K);
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < K; ++b)
          transposed[b * K + a] = all_powers[a * K + b] = static_cast<float>(std::exp2(double(m[a * K + b]) * c));
      soft_strip_scores_codes(pr, in.source, all_powers.data(), transposed.data(), strips, static_cast<float>(gap),
                              static_cast<float>(temperature), scores.data_ptr<float>(), nullptr, across);
      std::sort(across.begin(), across.end());
    }
    if (!powers.empty()) {
      CodeSource with_powers = in.source;
      with_powers.matrix = powers.data();
      forward_scaled<true>(pr, across, with_powers, in.source, static_cast<float>(gap),
                           static_cast<float>(temperature), scores.data_ptr<float>(), nullptr, to_log);
    } else if (!across.empty()) {
      forward_pairs<float>(pr, in.source, longest_first(pr, std::move(across)), static_cast<float>(gap),
                           static_cast<float>(temperature), scores.data_ptr<float>(), nullptr);
    }
  } else {
    forward_all<float>(pr, in.source, static_cast<float>(gap), static_cast<float>(temperature),
                       scores.data_ptr<float>(), nullptr);
  }
  add_log_pairs(log_pairs, to_log);
  return scores;
}

// grad_S (B, M, N) from forward_cpu's state (the DP table, flattened), and with grad_gap (B,) (else
// null) grad_scores[b] * d score[b] / d gap as well.
at::Tensor dense_backward(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                          const std::optional<at::Tensor>& query_lengths,
                          const std::optional<at::Tensor>& target_lengths, double gap, double temperature,
                          at::Tensor* grad_gap) {
  check_scores(S);
  check_temperature(temperature);
  const int64_t B = S.size(0), M = S.size(1), N = S.size(2);
  const at::Tensor qlen = lengths_or_full(query_lengths, B, M, "query_lengths", "M");
  const at::Tensor tlen = lengths_or_full(target_lengths, B, N, "target_lengths", "N");
  TORCH_CHECK(state.device().is_cpu() && state.scalar_type() == S.scalar_type() &&
                  state.numel() == B * (M + 1) * (N + 1),
              "state does not match the score matrix: it must be the forward's DP table of " +
                  std::to_string(B * (M + 1) * (N + 1)) + " values of S's dtype on the CPU");
  TORCH_CHECK(grad_scores.device().is_cpu() && grad_scores.numel() == B,
              "grad_scores must be a CPU tensor of " + std::to_string(B) + " values");
  const Problem pr{B, M, N, qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
  const at::Tensor dp = state.contiguous().view({B, M + 1, N + 1});
  const at::Tensor grad = grad_scores.to(S.scalar_type()).contiguous();
  at::Tensor grad_S = at::zeros({B, M, N}, S.options());
  if (grad_gap != nullptr) *grad_gap = at::zeros({B}, S.options());
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "swcli_cpu_backward", [&] {
    backward<scalar_t>(pr, dense_source<scalar_t>(S, tlen), dp.data_ptr<scalar_t>(), grad.data_ptr<scalar_t>(),
                       static_cast<scalar_t>(gap), static_cast<scalar_t>(temperature), grad_S.data_ptr<scalar_t>(),
                       grad_gap != nullptr ? grad_gap->data_ptr<scalar_t>() : nullptr);
  });
  return grad_S;
}

// grad_S (B, M, N) from forward_cpu's state; best and failed are the CUDA engine's and unused here.
at::Tensor backward_cpu(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                        const at::Tensor& /*best*/, const at::Tensor& /*failed*/,
                        const std::optional<at::Tensor>& query_lengths,
                        const std::optional<at::Tensor>& target_lengths, double gap, double temperature,
                        bool by_rows, int64_t lane_columns) {
  TORCH_CHECK(!by_rows, "the gradient by rows is a CUDA scheme: on the CPU by_rows must be false");
  check_lane_columns(lane_columns);
  return dense_backward(grad_scores, S, state, query_lengths, target_lengths, gap, temperature, nullptr);
}

// The registered scores and scores_codes (no counter) and their counted variants, which return the
// number of pairs the scaled sweep handed to log space (tests, tools) instead of writing it into an
// argument: an operator that mutates an argument is not functional, and torch.compile's lowering of such
// an operator failed.
at::Tensor op_scores(const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
                     const std::optional<at::Tensor>& target_lengths, double gap, double temperature,
                     int64_t lane_columns, bool scaled) {
  return scores_cpu(S, query_lengths, target_lengths, gap, temperature, lane_columns, scaled, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> op_scores_counted(const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
                                                     const std::optional<at::Tensor>& target_lengths, double gap,
                                                     double temperature, int64_t lane_columns, bool scaled) {
  at::Tensor log_pairs = at::zeros({1}, at::TensorOptions().dtype(at::kInt));
  at::Tensor scores = scores_cpu(S, query_lengths, target_lengths, gap, temperature, lane_columns, scaled, log_pairs);
  return {scores, log_pairs};
}

at::Tensor op_scores_codes(const at::Tensor& query, const at::Tensor& target, const at::Tensor& matrix,
                           const std::optional<at::Tensor>& query_lengths,
                           const std::optional<at::Tensor>& target_lengths, double gap, double temperature,
                           int64_t lane_columns, bool scaled) {
  return scores_codes_cpu(query, target, matrix, query_lengths, target_lengths, gap, temperature, lane_columns, scaled,
                          std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> op_scores_codes_counted(const at::Tensor& query, const at::Tensor& target,
                                                           const at::Tensor& matrix,
                                                           const std::optional<at::Tensor>& query_lengths,
                                                           const std::optional<at::Tensor>& target_lengths, double gap,
                                                           double temperature, int64_t lane_columns, bool scaled) {
  at::Tensor log_pairs = at::zeros({1}, at::TensorOptions().dtype(at::kInt));
  at::Tensor scores = scores_codes_cpu(query, target, matrix, query_lengths, target_lengths, gap, temperature,
                                       lane_columns, scaled, log_pairs);
  return {scores, log_pairs};
}

// ------------------------------------------------------------------------------------------------
// Affine gaps (affine.h): log space at every temperature, float32 and float64.

// The engine checks the gaps itself, as it does the lengths, since the operators can be called past the
// Python checks: the affine op is defined for finite gap_open <= gap_extend <= 0 only.
void check_affine_gaps(double gap_open, double gap_extend) {
  TORCH_CHECK(std::isfinite(gap_open) && std::isfinite(gap_extend) && gap_open <= gap_extend && gap_extend <= 0,
              "affine gaps need finite scores with gap_open <= gap_extend <= 0, got gap_open = " + number(gap_open) +
                  ", gap_extend = " + number(gap_extend));
}

// Scores (B,) of dense S with affine gaps, and with keep_tables the state the backward reads: the tables
// H, X and Y (B, M+1, N+1) one after the other, flattened, with their borders (H = 0, X = Y = -inf).
std::tuple<at::Tensor, at::Tensor> affine_dense_forward(const at::Tensor& S,
                                                        const std::optional<at::Tensor>& query_lengths,
                                                        const std::optional<at::Tensor>& target_lengths,
                                                        double gap_open, double gap_extend, double temperature,
                                                        int64_t lane_columns, bool keep_tables) {
  check_lane_columns(lane_columns);
  check_scores(S);
  check_temperature(temperature);
  check_affine_gaps(gap_open, gap_extend);
  const at::Tensor qlen = lengths_or_full(query_lengths, S.size(0), S.size(1), "query_lengths", "M");
  const at::Tensor tlen = lengths_or_full(target_lengths, S.size(0), S.size(2), "target_lengths", "N");
  const Problem pr{S.size(0), S.size(1), S.size(2), qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
  at::Tensor scores = at::zeros({pr.B}, S.options());
  const int64_t cells = pr.B * (pr.M + 1) * (pr.N + 1);
  at::Tensor state = at::empty({keep_tables ? 3 * cells : 0}, S.options());
  if (keep_tables) {
    state.narrow(0, 0, cells).zero_();
    state.narrow(0, cells, 2 * cells).fill_(-std::numeric_limits<double>::infinity());
  }
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "swcli_cpu_affine_forward", [&] {
    AffineTables<scalar_t> tables{};
    if (keep_tables) {
      scalar_t* base = state.data_ptr<scalar_t>();
      tables = AffineTables<scalar_t>{base, base + cells, base + 2 * cells};
    }
    affine_forward<scalar_t>(pr, dense_source<scalar_t>(S, tlen),
                             AffineGaps<scalar_t>{static_cast<scalar_t>(gap_open), static_cast<scalar_t>(gap_extend)},
                             static_cast<scalar_t>(temperature), scores.data_ptr<scalar_t>(),
                             keep_tables ? &tables : nullptr);
  });
  return {scores, state};
}

at::Tensor op_affine_scores(const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
                            const std::optional<at::Tensor>& target_lengths, double gap_open, double gap_extend,
                            double temperature, int64_t lane_columns) {
  return std::get<0>(affine_dense_forward(S, query_lengths, target_lengths, gap_open, gap_extend, temperature,
                                          lane_columns, false));
}

// (scores, state, best, failed) as the CUDA engine returns them: best is its record of each pair's best
// cell; the CPU backward finds that cell again in H (the first maximal cell in row-major order), so here
// it is -1 everywhere, and failed is 0.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> op_affine_forward(
    const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
    const std::optional<at::Tensor>& target_lengths, double gap_open, double gap_extend, double temperature,
    bool by_rows, int64_t lane_columns) {
  TORCH_CHECK(!by_rows, "the gradient by rows is a CUDA scheme: on the CPU by_rows must be false");
  auto [scores, state] = affine_dense_forward(S, query_lengths, target_lengths, gap_open, gap_extend, temperature,
                                              lane_columns, true);
  at::Tensor best = at::full({S.size(0)}, -1, at::TensorOptions().dtype(at::kLong));
  at::Tensor failed = at::zeros({1}, at::TensorOptions().dtype(at::kInt));
  return {scores, state, best, failed};
}

// Scores (B,) float32 of code pairs with affine gaps.
at::Tensor op_affine_scores_codes(const at::Tensor& query, const at::Tensor& target, const at::Tensor& matrix,
                                  const std::optional<at::Tensor>& query_lengths,
                                  const std::optional<at::Tensor>& target_lengths, double gap_open,
                                  double gap_extend, double temperature, int64_t lane_columns) {
  check_lane_columns(lane_columns);
  check_temperature(temperature);
  check_affine_gaps(gap_open, gap_extend);
  const CodeInputs in = code_inputs(query, target, matrix, query_lengths, target_lengths);
  at::Tensor scores = at::zeros({in.pr.B}, matrix.options().dtype(at::kFloat));
  const AffineGaps<float> gaps{static_cast<float>(gap_open), static_cast<float>(gap_extend)};
  IntegerScoring integers;
  if (temperature == 0 && integer_scoring(in.table.data_ptr<float>(), in.table.size(0), gaps.open, gaps.extend,
                                          integers)) {
    // Exact in int16 (pairs long enough for it), the others and the pairs that may have saturated across
    // pairs, in float.
    std::vector<int64_t> striped, across;
    const bool shared = in.source.query_stride == 0;
    for (int64_t b = 0; b < in.pr.B; ++b)
      (striped_takes(in.pr.qlen[b], in.pr.tlen[b], shared) ? striped : across).push_back(b);
    striped_scores(in.pr, in.source, integers, striped, scores.data_ptr<float>(), across);
    if (!across.empty()) {
      std::sort(across.begin(), across.end());
      affine_forward<float>(in.pr, in.source, gaps, 0.0f, scores.data_ptr<float>(), nullptr, &across);
    }
    return scores;
  }
  affine_forward<float>(in.pr, in.source, gaps, static_cast<float>(temperature), scores.data_ptr<float>(), nullptr);
  return scores;
}

// grad_S (B, M, N) from op_affine_forward's state, and with grad_open and grad_extend (B,) (else null)
// grad_scores[b] times d score[b] / d gap_open and d gap_extend as well.
at::Tensor affine_dense_backward(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                                 const std::optional<at::Tensor>& query_lengths,
                                 const std::optional<at::Tensor>& target_lengths, double gap_open, double gap_extend,
                                 double temperature, at::Tensor* grad_open, at::Tensor* grad_extend) {
  check_scores(S);
  check_temperature(temperature);
  check_affine_gaps(gap_open, gap_extend);
  const int64_t B = S.size(0), M = S.size(1), N = S.size(2);
  const at::Tensor qlen = lengths_or_full(query_lengths, B, M, "query_lengths", "M");
  const at::Tensor tlen = lengths_or_full(target_lengths, B, N, "target_lengths", "N");
  const int64_t cells = B * (M + 1) * (N + 1);
  TORCH_CHECK(state.device().is_cpu() && state.scalar_type() == S.scalar_type() && state.numel() == 3 * cells,
              "state does not match the score matrix: it must be the affine forward's tables H, X and Y, " +
                  std::to_string(3 * cells) + " values of S's dtype on the CPU");
  TORCH_CHECK(grad_scores.device().is_cpu() && grad_scores.numel() == B,
              "grad_scores must be a CPU tensor of " + std::to_string(B) + " values");
  const Problem pr{B, M, N, qlen.data_ptr<int64_t>(), tlen.data_ptr<int64_t>()};
  const at::Tensor tables = state.contiguous();
  const at::Tensor grad = grad_scores.to(S.scalar_type()).contiguous();
  at::Tensor grad_S = at::zeros({B, M, N}, S.options());
  const bool count_gaps = grad_open != nullptr && grad_extend != nullptr;
  AT_DISPATCH_FLOATING_TYPES(S.scalar_type(), "swcli_cpu_affine_backward", [&] {
    std::vector<AffineGapFlow<scalar_t>> flows(count_gaps ? B : 0);
    const scalar_t* base = tables.data_ptr<scalar_t>();
    affine_backward<scalar_t>(pr, dense_source<scalar_t>(S, tlen),
                              AffineTables<const scalar_t>{base, base + cells, base + 2 * cells},
                              grad.data_ptr<scalar_t>(),
                              AffineGaps<scalar_t>{static_cast<scalar_t>(gap_open), static_cast<scalar_t>(gap_extend)},
                              static_cast<scalar_t>(temperature), grad_S.data_ptr<scalar_t>(),
                              count_gaps ? flows.data() : nullptr);
    if (count_gaps) {
      *grad_open = at::empty({B}, S.options());
      *grad_extend = at::empty({B}, S.options());
      for (int64_t b = 0; b < B; ++b) {
        grad_open->data_ptr<scalar_t>()[b] = flows[b].open;
        grad_extend->data_ptr<scalar_t>()[b] = flows[b].extend;
      }
    }
  });
  return grad_S;
}

// <S[b], grad_S[b]> (B,) over the cells where grad_S is not 0: S outside the lengths (arbitrary, NaN
// included) or a -inf where nothing flows never meets a 0.
at::Tensor inner_products(const at::Tensor& S, const at::Tensor& grad_S) {
  return at::where(grad_S != 0, S * grad_S, at::zeros({}, S.options())).sum({1, 2});
}

// (grad_S, sums (2, B)): backward_cpu and, per pair, grad_scores times d score / d gap and <S, grad_S>,
// what the gradients of the gap and the temperature take (swcli/ops.py).
std::tuple<at::Tensor, at::Tensor> op_backward_parameters(const at::Tensor& grad_scores, const at::Tensor& S,
                                                          const at::Tensor& state, const at::Tensor& /*best*/,
                                                          const at::Tensor& /*failed*/,
                                                          const std::optional<at::Tensor>& query_lengths,
                                                          const std::optional<at::Tensor>& target_lengths,
                                                          double gap, double temperature, bool by_rows,
                                                          int64_t lane_columns) {
  TORCH_CHECK(!by_rows, "the gradient by rows is a CUDA scheme: on the CPU by_rows must be false");
  check_lane_columns(lane_columns);
  at::Tensor grad_gap;
  at::Tensor grad_S = dense_backward(grad_scores, S, state, query_lengths, target_lengths, gap, temperature, &grad_gap);
  return {grad_S, at::stack({grad_gap, inner_products(S, grad_S)})};
}

// grad_S (B, M, N) from op_affine_forward's state; best and failed are the CUDA engine's and unused here.
at::Tensor op_affine_backward(const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state,
                              const at::Tensor& /*best*/, const at::Tensor& /*failed*/,
                              const std::optional<at::Tensor>& query_lengths,
                              const std::optional<at::Tensor>& target_lengths, double gap_open, double gap_extend,
                              double temperature, bool by_rows, int64_t lane_columns) {
  TORCH_CHECK(!by_rows, "the gradient by rows is a CUDA scheme: on the CPU by_rows must be false");
  check_lane_columns(lane_columns);
  return affine_dense_backward(grad_scores, S, state, query_lengths, target_lengths, gap_open, gap_extend,
                               temperature, nullptr, nullptr);
}

// (grad_S, sums (3, B)): op_affine_backward and, per pair, grad_scores times d score / d gap_open and
// d score / d gap_extend, and <S, grad_S>.
std::tuple<at::Tensor, at::Tensor> op_affine_backward_parameters(
    const at::Tensor& grad_scores, const at::Tensor& S, const at::Tensor& state, const at::Tensor& /*best*/,
    const at::Tensor& /*failed*/, const std::optional<at::Tensor>& query_lengths,
    const std::optional<at::Tensor>& target_lengths, double gap_open, double gap_extend, double temperature,
    bool by_rows, int64_t lane_columns) {
  TORCH_CHECK(!by_rows, "the gradient by rows is a CUDA scheme: on the CPU by_rows must be false");
  check_lane_columns(lane_columns);
  at::Tensor grad_open, grad_extend;
  at::Tensor grad_S = affine_dense_backward(grad_scores, S, state, query_lengths, target_lengths, gap_open, gap_extend,
                                            temperature, &grad_open, &grad_extend);
  return {grad_S, at::stack({grad_open, grad_extend, inner_products(S, grad_S)})};
}

// ------------------------------------------------------------------------------------------------
// Per-pair gaps and temperatures (tensors, for model builders who learn them), and the posterior.
//
// The sweeps take one gap and one temperature for the whole batch (a register splat across lanes that
// align different pairs), so a batch is scored in groups of pairs that share their (gaps, temperature)
// values: one group, at the sweeps' full speed, when the values are one number expanded to (B,); a pair
// alone in its group when every value differs (one lane of a worker: slower, documented).
//
// The posterior ops run the forward that keeps the tables and, at once, the backward from a gradient of
// 1 per pair: d score[b] / d S[b] (the soft alignment) and d score[b] / d gaps (the expected gap counts).
// The autograd formula then only scales them by the incoming gradient (swcli/ops.py), and
// d score / d temperature follows from them (the score is homogeneous of degree 1).

// The (B,) values of a per-pair tensor as doubles, checked: a floating CPU tensor of shape (B,) whose
// values are finite, and at most `high` (gaps of the affine op: 0) and at least 0 (temperature).
at::Tensor per_pair_values(const at::Tensor& given, int64_t B, const std::string& name, bool nonnegative,
                           bool nonpositive) {
  TORCH_CHECK(given.device().is_cpu() && at::isFloatingType(given.scalar_type()) && given.dim() == 1 &&
                  given.size(0) == B,
              name + " must be a floating-point CPU tensor of shape (" + std::to_string(B) + ",), one per pair");
  at::Tensor values = given.to(at::kDouble).contiguous();
  const double* v = values.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(std::isfinite(v[b]) && !(nonnegative && v[b] < 0) && !(nonpositive && v[b] > 0),
                name + "[" + std::to_string(b) + "] must be a finite number" + (nonnegative ? " >= 0" : "") +
                    (nonpositive ? " <= 0" : "") + ", got " + number(v[b]));
  }
  return values;
}

// The pairs grouped by equal rows of `keys` (B, K doubles): each group's pair indices, in batch order.
std::vector<std::vector<int64_t>> groups_of_equal_keys(const at::Tensor& keys) {
  const int64_t B = keys.size(0), K = keys.size(1);
  const double* k = keys.data_ptr<double>();
  std::vector<int64_t> order(B);
  for (int64_t b = 0; b < B; ++b) order[b] = b;
  auto less = [&](int64_t a, int64_t b) {
    return std::lexicographical_compare(k + a * K, k + (a + 1) * K, k + b * K, k + (b + 1) * K);
  };
  std::stable_sort(order.begin(), order.end(), less);
  std::vector<std::vector<int64_t>> groups;
  for (int64_t n = 0; n < B; ++n) {
    if (n == 0 || less(order[n - 1], order[n])) groups.emplace_back();
    groups.back().push_back(order[n]);
  }
  return groups;
}

// run(S, qlen, tlen, key) -> outputs, whose first dimension is the pair, for each group of pairs with equal
// keys (a row of `keys` holds the values run reads); the outputs of the groups put back in batch order.
// One group runs on the tensors as given, without a copy.
template <typename Run>
std::vector<at::Tensor> by_groups(const at::Tensor& S, const std::optional<at::Tensor>& query_lengths,
                                  const std::optional<at::Tensor>& target_lengths, const at::Tensor& keys, Run run) {
  const std::vector<std::vector<int64_t>> groups = groups_of_equal_keys(keys);
  const double* k = keys.data_ptr<double>();
  const int64_t K = keys.size(1);
  if (groups.size() <= 1) {  // an empty batch reads no key
    const double* first = groups.empty() ? nullptr : k + groups[0][0] * K;
    return run(S, query_lengths, target_lengths,
               first ? std::vector<double>(first, first + K) : std::vector<double>(K, 0.0));
  }
  std::vector<at::Tensor> outputs;
  for (const std::vector<int64_t>& group : groups) {
    const at::Tensor index = at::tensor(group, at::TensorOptions().dtype(at::kLong));
    auto select = [&](const std::optional<at::Tensor>& t) -> std::optional<at::Tensor> {
      if (!t.has_value()) return std::nullopt;
      return t->index_select(0, index);
    };
    const std::vector<double> key(k + group[0] * K, k + (group[0] + 1) * K);
    const std::vector<at::Tensor> part = run(S.index_select(0, index), select(query_lengths),
                                             select(target_lengths), key);
    if (outputs.empty()) {
      for (const at::Tensor& t : part) {
        std::vector<int64_t> shape = t.sizes().vec();
        shape[0] = S.size(0);
        outputs.push_back(at::zeros(shape, t.options()));
      }
    }
    for (size_t o = 0; o < part.size(); ++o) outputs[o].index_copy_(0, index, part[o]);
  }
  return outputs;
}

// The keys of the linear per-pair ops, (gap, temperature) per pair.
at::Tensor linear_keys(const at::Tensor& S, const at::Tensor& gap, const at::Tensor& temperature) {
  check_scores(S);
  const int64_t B = S.size(0);
  return at::stack({per_pair_values(gap, B, "gap", false, false),
                    per_pair_values(temperature, B, "temperature", true, false)}, 1);
}

at::Tensor affine_keys(const at::Tensor& S, const at::Tensor& gap_open, const at::Tensor& gap_extend,
                       const at::Tensor& temperature) {
  check_scores(S);
  const int64_t B = S.size(0);
  at::Tensor keys = at::stack({per_pair_values(gap_open, B, "gap_open", false, true),
                               per_pair_values(gap_extend, B, "gap_extend", false, true),
                               per_pair_values(temperature, B, "temperature", true, false)}, 1);
  const double* k = keys.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(k[3 * b] <= k[3 * b + 1], "gap_open[" + std::to_string(b) + "] must be <= gap_extend[" +
                                              std::to_string(b) + "], got " + number(k[3 * b]) + " > " +
                                              number(k[3 * b + 1]));
  }
  return keys;
}

using Lengths = std::optional<at::Tensor>;

at::Tensor op_scores_per_pair(const at::Tensor& S, const Lengths& query_lengths, const Lengths& target_lengths,
                              const at::Tensor& gap, const at::Tensor& temperature) {
  return by_groups(S, query_lengths, target_lengths, linear_keys(S, gap, temperature),
                   [](const at::Tensor& s, const Lengths& q, const Lengths& t, const std::vector<double>& key) {
                     return std::vector<at::Tensor>{scores_cpu(s, q, t, key[0], key[1], 0, true, std::nullopt)};
                   })[0];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> op_posterior_per_pair(const at::Tensor& S, const Lengths& query_lengths,
                                                                     const Lengths& target_lengths,
                                                                     const at::Tensor& gap,
                                                                     const at::Tensor& temperature) {
  auto out = by_groups(
      S, query_lengths, target_lengths, linear_keys(S, gap, temperature),
      [](const at::Tensor& s, const Lengths& q, const Lengths& t, const std::vector<double>& key) {
        auto [scores, dp] = dense_forward(s, q, t, key[0], key[1], 0, true, true, std::nullopt);
        at::Tensor gap_count;
        at::Tensor posterior = dense_backward(at::ones({s.size(0)}, s.options()), s, dp, q, t, key[0], key[1],
                                              &gap_count);
        return std::vector<at::Tensor>{scores, posterior, gap_count};
      });
  return {out[0], out[1], out[2]};
}

at::Tensor op_affine_scores_per_pair(const at::Tensor& S, const Lengths& query_lengths, const Lengths& target_lengths,
                                     const at::Tensor& gap_open, const at::Tensor& gap_extend,
                                     const at::Tensor& temperature) {
  return by_groups(S, query_lengths, target_lengths, affine_keys(S, gap_open, gap_extend, temperature),
                   [](const at::Tensor& s, const Lengths& q, const Lengths& t, const std::vector<double>& key) {
                     return std::vector<at::Tensor>{
                         std::get<0>(affine_dense_forward(s, q, t, key[0], key[1], key[2], 0, false))};
                   })[0];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> op_affine_posterior_per_pair(
    const at::Tensor& S, const Lengths& query_lengths, const Lengths& target_lengths, const at::Tensor& gap_open,
    const at::Tensor& gap_extend, const at::Tensor& temperature) {
  auto out = by_groups(
      S, query_lengths, target_lengths, affine_keys(S, gap_open, gap_extend, temperature),
      [](const at::Tensor& s, const Lengths& q, const Lengths& t, const std::vector<double>& key) {
        auto [scores, state] = affine_dense_forward(s, q, t, key[0], key[1], key[2], 0, true);
        at::Tensor open_count, extend_count;
        at::Tensor posterior = affine_dense_backward(at::ones({s.size(0)}, s.options()), s, state, q, t, key[0],
                                                     key[1], key[2], &open_count, &extend_count);
        return std::vector<at::Tensor>{scores, posterior, open_count, extend_count};
      });
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace
}  // namespace swcli_cpu

TORCH_LIBRARY_IMPL(swcli, CPU, m) {
  m.impl("scores", &swcli_cpu::op_scores);
  m.impl("scores_counted", &swcli_cpu::op_scores_counted);
  m.impl("scores_codes", &swcli_cpu::op_scores_codes);
  m.impl("scores_codes_counted", &swcli_cpu::op_scores_codes_counted);
  m.impl("forward", &swcli_cpu::forward_cpu);
  m.impl("backward", &swcli_cpu::backward_cpu);
  m.impl("affine_scores", &swcli_cpu::op_affine_scores);
  m.impl("affine_scores_codes", &swcli_cpu::op_affine_scores_codes);
  m.impl("affine_forward", &swcli_cpu::op_affine_forward);
  m.impl("affine_backward", &swcli_cpu::op_affine_backward);
  m.impl("backward_parameters", &swcli_cpu::op_backward_parameters);
  m.impl("affine_backward_parameters", &swcli_cpu::op_affine_backward_parameters);
  m.impl("scores_per_pair", &swcli_cpu::op_scores_per_pair);
  m.impl("posterior_per_pair", &swcli_cpu::op_posterior_per_pair);
  m.impl("affine_scores_per_pair", &swcli_cpu::op_affine_scores_per_pair);
  m.impl("affine_posterior_per_pair", &swcli_cpu::op_affine_posterior_per_pair);
}
