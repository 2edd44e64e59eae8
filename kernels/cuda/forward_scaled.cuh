// The scaled sweep: float at t > 0 with 4 columns per lane (or 8: below), the forward without the DP
// table. With E = 2^(H c), c = log2(e) / t, the recurrence is a sum of products:
//
//     E[i][j] = 1 + E[i-1][j-1] P[i][j] + (E[i-1][j] + E[i][j-1]) G,   P = 2^(S c), G = 2^(gap c)
//
// so a cell is 3 fused multiply-adds and one ex2 for P (dense scores), or none: scores from codes
// take P from a second table in shared memory, 2^(m c) of each entry m of the substitution matrix (the
// log-space cell takes 3 ex2 and 1 lg2). E overflows a float within a few dozen cells of a good
// alignment, so each lane keeps its values scaled: E = stored * 2^sigma, and after each step it moves
// the exponent of its largest value into sigma (an integer), which leaves the largest stored value in
// [2^top, 2^(top+1)), top = kScaledTop: 2^77 of room above, for one step's growth (P up to 2^60, G <= 1)
// and for a left neighbour larger than the lane's own cells, and 2^150 below (kScaledFloor). The left
// neighbour's value comes as a mantissa and an exponent and is rescaled by a power of 2. H in score
// units is t ln2 (sigma + log2 stored): at the tile boundary (one lg2 per row) and for the best cell
// (once per lane, at the end). Both for scores from codes and for dense float scores this is well ahead
// of the log-space sweep.
//
// The sums have no cancellation, so this is at least as accurate as the log-space cell. What it
// cannot hold is a spread of more than about 2^(top+100) between the 4 cells of a lane's row, or a
// value past the float range. Each lane checks every step that its smallest cell is at least
// kScaledFloor, before and after rescaling, and that nothing overflowed or became NaN; a pair that fails
// anywhere is scored again by the log-space sweep (forward_tiles), whose result it then is. A NaN in
// the scores fails the check, so it reaches the score through that sweep as everywhere else.
//
// Scores from codes take 8 columns per lane where kWideLimit allows: a step's overhead (the shuffles,
// the renormalisation, the checks, the loop) is then shared by 8 cells, and the lane renormalises every
// other step only (RENORM = 2: a step in between keeps the scale, and its largest and smallest cells
// wait for the next renormalisation's checks and best cell): fewer instructions per cell than with 4.
//
// A factor must not flush to 0 where its product would matter. The diagonal term of a lane's first
// column takes E[i-1][col-1] from the left neighbour, whose scale may be far from this lane's: below
// 2^-126 here, it may still be the cell's largest term times P. So it is kept with extra range (times
// 2^bias, or in two factors: above_left in forward_tiles_scaled). Without it the fuzz
// (benchmarks/fuzz_scaled.py cuda) finds scores far off on dense scores of large |S| / t, and from codes at
// small t.
#pragma once

#include "forward_log.cuh"

namespace swcli_cuda {

struct Scaled {
  double c;      // log2(e) / t, for the P table
  float gap_bits;  // -gap c = log2(1 / G), G = Consts::G
  bool allowed;  // the caller's switch and gap <= 0 (false: every pair in log space)
};
// A fixed top, not one that leaves room for the largest P only (100 - log2(largest P)): with less room
// above, pairs went to log space whose left neighbours passed the float range.
inline constexpr int kScaledTop = 50;
// With 8 columns per lane (see kWideLimit) top is 60 (2^67 of room above, 2^160 below): there the
// failures are mostly below, as a lane's 8 cells spread further. With 8 columns forced on BLOSUM62,
// 60 sent the fewest pairs to log space: lower tops more below, higher ones more above where P is large.
inline constexpr int kScaledTopWide = 60;
// Scores from codes take 8 columns per lane in the scaled sweep, renormalised every other step, where
// log2(largest P) is at most kWideBias and log2(largest P) + 2 log2(1 / G) at most kWideLimit; else 4
// columns, renormalised every step. A lane's 8 cells spread further than 4 (the gap's share), and two
// steps grow further than one (P's), so more pairs fail their checks, and a failed pair costs a second
// sweep, in log space: for a long relayed pair, the batch's time with it. The limits come from runs with
// 8 columns forced (BLOSUM62, t 0.8 to 1.5, gap -2 to -11, top 60; docs/benchmarks/h200.md): within
// them real and related pairs practically never fail; just past them failures rise quickly, among real
// pairs too, until 8 columns are slower than 4.
inline constexpr int kWideBias = 20;
inline constexpr float kWideLimit = 32.0f;

// 2^k for an integer k in [-127, 128]: 0 at -127 (flushed), +inf at 128.
__device__ __forceinline__ float pow2_int(int k) { return __int_as_float((k + 127) << 23); }

// x 2^k in two factors that are normal floats: 2^k alone flushes to 0 past 2^-126, while x 2^k may still
// be a normal float (and, times a large P later, a cell's largest term). 0 or +inf past [-252, 254].
__device__ __forceinline__ float times_pow2(float x, int k) {
  k = min(max(k, -252), 254);
  const int half = k >> 1;
  return x * pow2_int(half) * pow2_int(k - half);
}

// E = value 2^sigma (value > 0) as one integer that orders as E: (sigma << 23) + the bits of value, as
// the bits of a positive float order as the float and adding sigma to its exponent field keeps that order
// across scales. The exponent of E is (key >> 23) - 127.
__device__ __forceinline__ long long scaled_key(int sigma, float value) {
  return (static_cast<long long>(sigma) << 23) + __float_as_uint(value);
}

// The mantissa in [1, 2) of a float's (or a scaled_key's low) bits.
__device__ __forceinline__ float mantissa_of(unsigned bits) {
  return __uint_as_float((bits & 0x007fffffu) | 0x3f800000u);
}

// The smallest value a lane may hold in the scaled sweep: a term that flushed to 0 (below 2^-126, as the
// zero term 2^-sigma does once sigma > 126, or a left neighbour far below this lane's scale) is then
// under 2^-26 of every cell.
inline constexpr float kScaledFloor = 0x1p-100f;

template <bool POWERS, int R, int RENORM, class Source, class Handoff>
__device__ bool forward_tiles_scaled(const Pair& p, Source& src, int bias, const Consts<float>& k,
                                     const Handoff& handoff, int first_tile, int stride, float& best_out) {
  const float G = k.G, tl = k.tl, c = k.c;
  constexpr int kDepth = Source::kDepth, top = R == 8 ? kScaledTopWide : kScaledTop;
  static_assert(kWarp % kDepth == 0, "a block of 32 steps holds whole groups of kDepth steps");
  static_assert((RENORM == 1 || RENORM == 2) && kDepth % RENORM == 0, "renormalise every step or every other");
  const int lane = threadIdx.x % kWarp;
  constexpr int kTileCols = kWarp * R;
  const float scale = pow2_int(top);                // E = 1 at sigma -top
  const unsigned rescale_base = unsigned(254 + top) << 23;  // minus an exponent's bits: 2^(top - exponent)
  long long best_key = scaled_key(0, 1.0f);  // the best cell (E = 1: the zero border)
  bool ok = true;
  const int tiles = (p.tn + kTileCols - 1) / kTileCols;
  for (int tile = first_tile; tile < tiles; tile += stride) {
    const TileLanes<R> at = start_tile<R>(p, src, tile, tiles, lane);
    if constexpr (POWERS) src.offs[0] += 4u * unsigned(src.K * src.K);  // the first column's P 2^-bias
    const int width = at.width, lanes = at.lanes, valid = at.valid;
    const bool active = at.active, has_next = at.has_next;
    // Row 0 is the zero border: E = 1.
    float up[R];  // stored E of the previous row, this lane's columns
#pragma unroll
    for (int r = 0; r < R; ++r) up[r] = scale;
    int sig = -top;
    float one = scale;         // 2^-sigma: the zero term
    // E[i-1][col-1], the diagonal term's factor in the lane's first column. Its product with P may be
    // the cell's largest term while the value alone, in this lane's scale, is below the float range. So
    // with scores from codes it is kept times 2^bias, against P 2^-bias from the third table (see
    // stage_matrix); with dense scores it is kept as the left neighbour handed it, with its sigma, and
    // takes this lane's scale after the product with P (times_pow2).
    float above_left = POWERS ? pow2_int(top + bias) : 1.0f;
    int above_left_sig = 0;
    // E[i][col+R-1], handed to lane+1 as a mantissa in [1, 2) and an exponent (last_sig): its rescaling
    // by a power of 2 then flushes only values below 2^-125 of the neighbour's scale, which are
    // negligible (see kScaledFloor).
    float last = 1.0f;
    int last_sig = 0;
    // Renormalisation every other step (d odd): a step in between keeps the scale, and its largest and
    // smallest cells wait here for the next renormalisation's checks and best cell.
    float hi_pending = 0.0f, lo_pending = FLT_MAX;
    const float* const bnd_in = tile > 0 ? handoff.source(tile) : nullptr;
    float* const bnd_out = has_next ? handoff.sink(tile) : nullptr;
    // The boundary's H of the block's rows (lane j: row s0 + j), as stored E and sigma: its integer
    // part of H c goes to sigma. In the first tile the zero border, E = 1 at sigma 0.
    float chunk_e = 1.0f, chunk_next = 0.0f;
    int chunk_sig = 0;
    if (tile > 0) {
      handoff.wait(tile, p.qn < kWarp ? p.qn : kWarp);
      chunk_next = lane < p.qn ? bnd_in[lane] : 0.0f;
    }
    const int steps = p.qn + lanes - 1;
    // The steps, in two versions: where the tile's width is not a multiple of R (the last tile of a
    // pair, mostly), the last lane's columns past the target copy their left neighbour, so that they
    // count neither for the lane's scale nor for the best cell.
    auto sweep = [&](auto masked) {
      for (int s0 = 0; s0 < steps; s0 += kWarp) {
        src.start_block();
        if (tile > 0) {
          const float x = chunk_next * c, whole = floorf(x);
          chunk_e = exp2_(x - whole);
          chunk_sig = int(whole);
          const int ahead = s0 + kWarp + lane;
          handoff.wait(tile, p.qn < s0 + 2 * kWarp ? p.qn : s0 + 2 * kWarp);
          chunk_next = ahead < p.qn ? bnd_in[ahead] : 0.0f;
        }
        for (int j = 0; j < kWarp && s0 + j < steps; j += kDepth) {
          src.start_group();
#pragma unroll
          for (int d = 0; d < kDepth; ++d) {
            const int i = s0 + j + d - lane;
            float left = __shfl_up_sync(kFull, last, 1);
            int left_sig = __shfl_up_sync(kFull, last_sig, 1);
            const float boundary_e = __shfl_sync(kFull, chunk_e, j + d);
            const int boundary_sig = __shfl_sync(kFull, chunk_sig, j + d);
            if (lane == 0) left = boundary_e, left_sig = boundary_sig;
            float v[R];
            src.take(d, v);
            const bool on = active && unsigned(i) < unsigned(p.qn);
            if (on) {
              const float lv = left * pow2_int(min(max(left_sig - sig, -127), 128));  // left in [1, 2)
              float e[R];
              float prev = lv;
#pragma unroll
              for (int r = 0; r < R; ++r) {
                const float power = POWERS ? v[r] : exp2_(v[r] * c);
                float x;
                if (r > 0)
                  x = fmaf(up[r - 1], power, one);
                else if (POWERS)
                  x = fmaf(above_left, power, one);
                else
                  x = times_pow2(above_left * power, above_left_sig - sig) + one;
                x = fmaf(up[r], G, x);
                x = fmaf(prev, G, x);
                if (decltype(masked)::value) x = r < valid ? x : prev;
                e[r] = x;
                prev = x;
              }
              float hi = e[0], lo = e[0];
#pragma unroll
              for (int r = 1; r < R; ++r) hi = max_nan(hi, e[r]), lo = min_nan(lo, e[r]);
              if (RENORM == 2 && d % 2 == 0) {  // keep the scale
                hi_pending = max_nan(hi_pending, hi);
                lo_pending = min_nan(lo_pending, lo);
#pragma unroll
                for (int r = 0; r < R; ++r) up[r] = e[r];
              } else {
                const float top_cell = RENORM == 2 ? max_nan(hi, hi_pending) : hi;
                const float low_cell = RENORM == 2 ? min_nan(lo, lo_pending) : lo;
                const long long key = scaled_key(sig, top_cell);
                best_key = key > best_key ? key : best_key;
                const unsigned exponent = __float_as_uint(hi) & 0x7f800000u;
                const float f = __uint_as_float(rescale_base - exponent);  // 2^(top - exponent of hi)
                sig += int(exponent >> 23) - (127 + top);
                // false for a NaN
                ok = ok && low_cell >= kScaledFloor && lo * f >= kScaledFloor && top_cell <= FLT_MAX;
#pragma unroll
                for (int r = 0; r < R; ++r) up[r] = e[r] * f;
                one = __int_as_float(max(127 - sig, 0) << 23);
                hi_pending = 0.0f, lo_pending = FLT_MAX;
              }
              if (POWERS)
                above_left = left * pow2_int(min(max(left_sig - sig + bias, -127), 128));
              else
                above_left = left, above_left_sig = left_sig;
            }
            const unsigned last_bits = __float_as_uint(up[R - 1]);
            last = mantissa_of(last_bits);
            last_sig = sig + int(last_bits >> 23) - 127;
            if (on && has_next && lane == kWarp - 1) {
              bnd_out[i] = tl * (float(last_sig) + log2_(last));  // see best, below
              if ((i + 1) % kWarp == 0 || i + 1 == p.qn) handoff.publish(tile, i + 1);
            }
            src.fetch(d, i + kDepth);
          }
        }
      }
    };
    if (width % R != 0)
      sweep(std::true_type{});
    else
      sweep(std::false_type{});
    if (RENORM == 2) {  // a lane whose last row kept the scale: its cells' checks and best cell
      ok = ok && lo_pending >= kScaledFloor && hi_pending <= FLT_MAX;
      const long long key = scaled_key(sig, hi_pending);
      best_key = hi_pending > 0.0f && key > best_key ? key : best_key;  // 0: nothing pending
    }
    __syncwarp();  // lane 31's boundary writes are visible to lane 0 in the next tile
  }
  // H of the best cell, from its exponent (an integer) and the lg2 of a mantissa in [1, 2): sigma +
  // lg2(stored) cancels where H is small (sigma near -top, lg2 near top), which leaves visible relative
  // errors at large t (benchmarks/fuzz_scaled.py cuda).
  const int best_exponent = int(best_key >> 23) - 127;
  float best = tl * (float(best_exponent) + log2_(mantissa_of(unsigned(best_key))));
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) best = fmaxf(best, __shfl_xor_sync(kFull, best, off));
  best_out = best;
  return ok;
}

// The scaled sweep of a float pair of one column tile in 1-column lanes (the latency-bound small batches,
// dense scores: the seed), whose time is the length of the step's dependent chain. One scale 2^sigma for
// the whole warp instead of one per lane, and no boundary: the chain is the left neighbour's shuffle,
// lane 0's select of the border and one fused multiply-add (cell_from_up's: 2 ex2, 1 lg2 and the adds
// between them); P = 2^(S c) of a step is computed a step ahead.
//
// A stored value past 2^kOneScaleTop in any lane turns every lane's values (and the zero term 2^-sigma)
// down by 2^kOneScaleStep at the next step, decided by a vote taken with that step's shuffle: values grow
// by at most P + 2G a step, which leaves 2^27 of room for P. Every stored value is at least the zero
// term, which stays a normal float while sigma <= 126, so no term that matters is lost. Past that (a
// best E past about 2^196: H above about 136 t), at an overflow or at a NaN, the sweep gives up, in every
// lane as soon as it knows, and the caller scores the pair in log space. One scale cannot serve a wider
// pair: its lanes' values spread further apart (by up to 2^300 within a warp at 256 x 256, t = 1).
inline constexpr float kOneScaleTop = 0x1p100f;
inline constexpr int kOneScaleStep = 32;

__device__ inline bool forward_one_scale(const Pair& p, DenseBlocks<float>& src, const Consts<float>& k,
                                         float& best_out) {
  const float G = k.G, tl = k.tl, c = k.c;
  const int lane = threadIdx.x % kWarp;
  const TileLanes<1> at = start_tile<1>(p, src, 0, 1, lane);
  const bool active = at.active;
  const float down = pow2_int(-kOneScaleStep);
  int sig = 0;
  float one = 1.0f;        // 2^-sigma: the zero term, and E = 1 of the borders
  float lane_best = 1.0f;  // the best cell of this lane's column (E = 1: the zero border)
  float up = 1.0f, diag = 1.0f, last = 1.0f;  // E[i-1][lane], E[i-1][lane-1], E[i][lane] (to lane + 1)
  bool big = false;        // this lane's value of the previous step is past kOneScaleTop, or NaN
  // Before a step uses its values, where a lane's previous value was big: the rescaling, applied to
  // everything this lane holds in the scale. False where the sweep gives up.
  auto settle = [&](int i, float& left, float& rest) {
    const bool was_on = active && unsigned(i - 1) < unsigned(p.qn);
    if (__any_sync(kFull, was_on && !(last <= FLT_MAX)) || sig + kOneScaleStep > 126) return false;
    up *= down, diag *= down, left *= down, rest *= down, lane_best *= down, one *= down;
    sig += kOneScaleStep;
    return true;
  };
  const int steps = p.qn + at.lanes - 1;
  for (int s0 = 0; s0 < steps; s0 += kWarp) {
    src.start_block();
    float v[1];
    src.take(0, v);
    float power_next = exp2_(v[0] * c);
#pragma unroll
    for (int d = 0; d < kWarp; ++d) {
      if (d % 8 == 0 && s0 + d >= steps) break;  // the last block's tail, up to 7 idle steps
      const int i = s0 + d - lane;
      const float power = power_next;
      float left = __shfl_up_sync(kFull, last, 1);
      if (d + 1 < kWarp) {  // the next step's P, while the shuffle is in flight
        src.take(d + 1, v);
        power_next = exp2_(v[0] * c);
      }
      float rest = fmaf(diag, power, fmaf(up, G, one));
      if (lane == 0) left = one;
      if (__any_sync(kFull, big) && !settle(i, left, rest)) return false;  // the previous step's vote
      const float x = fmaf(left, G, rest);
      const bool on = active && unsigned(i) < unsigned(p.qn);
      last = x;
      up = on ? x : up;
      diag = on ? left : diag;
      lane_best = on ? max_nan(lane_best, x) : lane_best;
      big = on && !(x <= kOneScaleTop);  // also a NaN
    }
  }
  float unused = 0.0f, unused_rest = 0.0f;
  if (__any_sync(kFull, big) && !settle(steps, unused, unused_rest)) return false;  // the last step's values
  float best = lane_best;
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) best = max_nan(best, __shfl_xor_sync(kFull, best, off));
  const unsigned bits = __float_as_uint(best);
  best_out = tl * (float(sig + int(bits >> 23) - 127) + log2_(mantissa_of(bits)));
  return best <= FLT_MAX;  // false for a NaN
}

// The scaled sweep of scores from codes: the source reads the tables of powers (P, then P 2^-bias: see
// stage_matrix) during the sweep, and the matrix again after it, for a log-space sweep of the pair.
template <int R, class Source, class Handoff>
__device__ bool codes_tiles_scaled(const Pair& p, Source& src, const float* powers, int bias,
                                   const Consts<float>& k, const Handoff& handoff, int first_tile, int stride,
                                   float& best) {
  const float* const matrix = src.matrix;
  src.matrix = powers;
  const bool ok = forward_tiles_scaled<true, R, R == 8 ? 2 : 1>(p, src, bias, k, handoff, first_tile, stride, best);
  src.matrix = matrix;
  return ok;
}

// One warp, all the tiles of one pair, float at t > 0 with R = 4 or 8 columns per lane: the scaled sweep (if
// bias >= 0), and the log-space sweep where it is not taken or where the pair fails its check (counted in
// *log_pairs). POWERS: the source is Codes, whose matrix pointer the scaled sweep points at `powers`
// (P, then P 2^-bias: see stage_matrix).
template <bool POWERS, int R, class Source>
__device__ void scaled_pair(const Pair& p, Source& src, const float* powers, int bias, const Consts<float>& k,
                            const Outputs<float>& out, int64_t M, int64_t N, int* log_pairs) {
  const InPlace<float> handoff{out.boundary ? out.boundary + p.b * M : nullptr};
  float best;
  bool done = false;
  if (bias >= 0) {
    if constexpr (POWERS)
      done = codes_tiles_scaled<R>(p, src, powers, bias, k, handoff, 0, 1, best);
    else
      done = forward_tiles_scaled<false, R, 1>(p, src, 0, k, handoff, 0, 1, best);
    done = __all_sync(kFull, done);
  }
  if (!done) {
    int64_t unused;
    if constexpr (R == 4) {
      forward_tiles<float, 4, true, false>(p, src, k, out, M, N, handoff, 0, 1, best, unused);
    } else {  // 4 columns per lane in log space
      Codes<4> narrow = src.template columns<4>();
      forward_tiles<float, 4, true, false>(p, narrow, k, out, M, N, handoff, 0, 1, best, unused);
    }
    if (log_pairs && threadIdx.x % kWarp == 0) atomicAdd(log_pairs, 1);
  }
  if (threadIdx.x % kWarp == 0) out.scores[p.b] = best;
}

// One warp, all the tiles of one pair, float at t > 0 with 1-column lanes and no DP table: the sweep with
// one scale per warp where allowed and the pair has one column tile, else or where it gives up the
// log-space one (each counted in *log_pairs).
__device__ inline void one_scale_pair(const Pair& p, DenseBlocks<float>& src, const Scaled& sc,
                                      const Consts<float>& k, const Outputs<float>& out, int64_t M, int64_t N,
                                      int* log_pairs) {
  float best;
  if (sc.allowed && p.tn <= kWarp && forward_one_scale(p, src, k, best)) {
    if (threadIdx.x % kWarp == 0) out.scores[p.b] = best;
    return;
  }
  if (log_pairs && threadIdx.x % kWarp == 0) atomicAdd(log_pairs, 1);
  forward_pair<float, 1, true, false>(p, src, k, out, M, N);
}

// The codes kernels (linear and affine) first stage the matrix in shared memory (all warps of the block
// share it), and for the scaled sweep (soft, 4 or 8 columns per lane) two tables behind it: P = 2^(m c)
// of each entry m, and P 2^-bias, where 2^bias is the power of 2 above the largest P. The second is for the lanes' first column,
// whose diagonal factor is kept times 2^bias (forward_tiles_scaled). A block scales only if every P is
// at most 2^60 and every P 2^-bias a normal float (the same test in every block: it depends on the
// matrix and t alone); otherwise, or where the caller disallows it, every pair takes the log-space
// sweep. Returns the bias, or -1 for the log-space sweep.
template <bool SCALED>
__device__ int stage_matrix(float* shared, const float* matrix, int K, const Scaled& sc) {
  const bool scaling = SCALED && sc.allowed;  // else the shared memory holds the matrix alone
  __shared__ unsigned largest;  // the bits of the largest P (positive floats order as their bits)
  if (scaling) {
    if (threadIdx.x == 0) largest = 0;
    __syncthreads();
  }
  bool in_range = scaling;
  unsigned mine = 0;
  for (int x = threadIdx.x; x < K * K; x += blockDim.x) {
    const float m = matrix[x];
    shared[x] = m;
    if (scaling) {
      const float p = float(exp2(double(m) * sc.c));  // rounded once
      shared[K * K + x] = p;
      in_range = in_range && p <= 0x1p60f;  // false for a NaN
      mine = max(mine, __float_as_uint(p));
    }
  }
  if (scaling) atomicMax(&largest, mine);
  if (!__syncthreads_and(in_range)) return -1;
  const int bias = max(int(largest >> 23) - 127 + 1, 0);
  const float down = pow2_int(-bias);
  for (int x = threadIdx.x; x < K * K; x += blockDim.x) {
    const float p = shared[K * K + x] * down;
    shared[2 * K * K + x] = p;
    in_range = in_range && p >= 0x1p-126f;
  }
  return __syncthreads_and(in_range) ? bias : -1;
}

// The settings of the scaled sweep for a call at gap and t; allowed only where the caller allows it and
// the kernel can take it (float, t > 0, 1 or 4 columns per lane, no DP table kept, gap <= 0).
inline Scaled scaled_settings(double gap, double t, bool allowed) {
  Scaled sc{};
  sc.c = t > 0 ? 1.4426950408889634 / t : 0.0;
  sc.gap_bits = float(-gap * sc.c);
  sc.allowed = allowed && t > 0 && gap <= 0;
  return sc;
}

}  // namespace swcli_cuda
