// The scaled affine sweep: float at t > 0 with 4 columns per lane (from codes also 8), the forward
// without the state, as forward_scaled.cuh is for linear gaps. With every value v taken as 2^(v c),
// c = log2(e) / t, the soft Gotoh cell (affine.cuh) is a sum of products:
//
//     T  = 1 + H[i-1][j-1] P                     (the zero term and the match, P = 2^(S c))
//     H  = T + X + Y
//     Xn = O (T + Y) + E X = O H + (E - O) X     (X of the cell to the right)
//     Yn = O (T + X) + E Y = O H + (E - O) Y     (Y of the cell below)
//
// O = 2^(o c) and E = 2^(e c), E - O >= 0: every term is positive, nothing cancels. A cell is 3 fused
// multiply-adds, 2 multiplies and 2 adds, and no ex2 at all from codes (P from the table of powers that
// stage_matrix puts beside the matrix), where the log-space cell takes 4 ex2 and 3 lg2.
//
// Scale and checks are forward_tiles_scaled's: each lane keeps its values times 2^-sigma, the lane's
// largest H at 2^top after each renormalisation, and checks that its smallest H stays above
// kScaledFloor and nothing overflowed; a pair that fails anywhere is scored again in log space. X and Y
// are terms of H, so H bounds them, and a term of X or Y that flushes to 0 below 2^-126 is under 2^-26 of
// the H it enters (H >= kScaledFloor), as long as O >= 2^-100: the shared form's limit (affine_mode),
// which is why the sweep is taken in that mode only.
//
// The left neighbour hands on H[i][col-1] as a mantissa and an exponent, as the linear sweep does, and
// X[i][col] relative to that exponent: X[i][col] <= E H[i][col-1] <= H[i][col-1], so the ratio lies in
// [0, 2), and one that flushes is negligible beside the H it enters (>= O H[i][col-1]). Across tiles
// both go in score units, as the log-space sweep's (H, X) pairs, through the same buffers.
#pragma once

#include "affine.cuh"
#include "forward_scaled.cuh"

namespace swcli_cuda {

// Scores from codes take 8 columns per lane in the scaled affine sweep where log2(largest P) is at most
// kWideBias and log2(largest P) + log2(1 / O) + log2(1 / E) at most kAffineWideLimit; else 4. A row of
// 8 cells spreads by at most one gap opening and 6 extensions (H[j+1] >= X[j+1] >= O H[j], then E a
// column), far less than 8 linear gaps; the limit keeps two steps' growth and that spread in the room.
inline constexpr float kAffineWideLimit = 40.0f;

__host__ __device__ __forceinline__ bool affine_wide_scaled(int bias, float gap_bits) {
  return bias >= 0 && bias <= kWideBias && float(bias) + gap_bits <= kAffineWideLimit;
}

template <bool POWERS, int R, int RENORM, class Source, class Handoff>
__device__ bool affine_tiles_scaled(const Pair& p, Source& src, int bias, const AffineConsts<float>& k,
                                    const Handoff& handoff, int first_tile, int stride, float& best_out) {
  const float O = k.O, EO = k.E - k.O, tl = k.tl, c = k.c;
  constexpr int kDepth = Source::kDepth, top = R == 8 ? kScaledTopWide : kScaledTop;
  static_assert(kWarp % kDepth == 0, "a block of 32 steps holds whole groups of kDepth steps");
  static_assert((RENORM == 1 || RENORM == 2) && kDepth % RENORM == 0, "renormalise every step or every other");
  const int lane = threadIdx.x % kWarp;
  constexpr int kTileCols = kWarp * R;
  const float scale = pow2_int(top);                        // 1 at sigma -top
  const unsigned rescale_base = unsigned(254 + top) << 23;  // minus an exponent's bits: 2^(top - exponent)
  long long best_key = scaled_key(0, 1.0f);                 // the zero border
  bool ok = true;
  const int tiles = (p.tn + kTileCols - 1) / kTileCols;
  const Pair2<float> border = pair2(0.0f, k.o);  // H = 0 and X[i][1] = o, in score units
  for (int tile = first_tile; tile < tiles; tile += stride) {
    const TileLanes<R> at = start_tile<R>(p, src, tile, tiles, lane);
    if constexpr (POWERS) src.offs[0] += 4u * unsigned(src.K * src.K);  // the first column's P 2^-bias
    const int width = at.width, lanes = at.lanes, valid = at.valid;
    const bool active = at.active, has_next = at.has_next;
    // Row 0 is the border: H = 1, and Y of row 1 is O H = O.
    float up[R], y_in[R];  // stored H[i-1][col + r] and Y[i][col + r]
#pragma unroll
    for (int r = 0; r < R; ++r) up[r] = scale, y_in[r] = O * scale;
    int sig = -top;
    float one = scale;  // 2^-sigma: the zero term
    // H[i-1][col-1], the diagonal factor of the lane's first column (see forward_tiles_scaled).
    float above_left = POWERS ? pow2_int(top + bias) : 1.0f;
    int above_left_sig = 0;
    // H[i][col+R-1] handed to lane + 1 as a mantissa in [1, 2) and an exponent, and X[i][col+R] relative
    // to 2^that exponent.
    float last = 1.0f, last_x = O;
    int last_sig = 0;
    float x_out = O * scale;  // X[i][col+R], stored
    float hi_pending = 0.0f, lo_pending = FLT_MAX;
    const Pair2<float>* const bnd_in = tile > 0 ? handoff.source(tile) : nullptr;
    Pair2<float>* const bnd_out = has_next ? handoff.sink(tile) : nullptr;
    // The left boundary of the block's rows (lane j: row s0 + j): H as a mantissa and sigma, X relative
    // to 2^sigma. In the first tile the border.
    float chunk_e = 1.0f, chunk_x = O;
    int chunk_sig = 0;
    Pair2<float> chunk_next = border;
    if (tile > 0) {
      handoff.wait(tile, p.qn < kWarp ? p.qn : kWarp);
      chunk_next = lane < p.qn ? bnd_in[lane] : border;
    }
    const int steps = p.qn + lanes - 1;
    auto sweep = [&](auto masked) {
      for (int s0 = 0; s0 < steps; s0 += kWarp) {
        src.start_block();
        if (tile > 0) {
          const float xh = chunk_next.x * c, whole = floorf(xh);
          chunk_e = exp2_(xh - whole);
          chunk_x = exp2_(chunk_next.y * c - whole);
          chunk_sig = int(whole);
          const int ahead = s0 + kWarp + lane;
          handoff.wait(tile, p.qn < s0 + 2 * kWarp ? p.qn : s0 + 2 * kWarp);
          chunk_next = ahead < p.qn ? bnd_in[ahead] : border;
        }
        for (int j = 0; j < kWarp && s0 + j < steps; j += kDepth) {
          src.start_group();
#pragma unroll
          for (int d = 0; d < kDepth; ++d) {
            const int i = s0 + j + d - lane;
            float left = __shfl_up_sync(kFull, last, 1);
            float left_x = __shfl_up_sync(kFull, last_x, 1);
            int left_sig = __shfl_up_sync(kFull, last_sig, 1);
            const float boundary_e = __shfl_sync(kFull, chunk_e, j + d);
            const float boundary_x = __shfl_sync(kFull, chunk_x, j + d);
            const int boundary_sig = __shfl_sync(kFull, chunk_sig, j + d);
            if (lane == 0) left = boundary_e, left_x = boundary_x, left_sig = boundary_sig;
            float v[R];
            src.take(d, v);
            const bool on = active && unsigned(i) < unsigned(p.qn);
            if (on) {
              const float shift = pow2_int(min(max(left_sig - sig, -127), 128));
              const float lv = left * shift;  // H[i][col-1]
              float x = left_x * shift;       // X[i][col]
              float h[R], yn[R];
              float prev = lv;
#pragma unroll
              for (int r = 0; r < R; ++r) {
                const float power = POWERS ? v[r] : exp2_(v[r] * c);
                float t;
                if (r > 0)
                  t = fmaf(up[r - 1], power, one);
                else if (POWERS)
                  t = fmaf(above_left, power, one);
                else
                  t = times_pow2(above_left * power, above_left_sig - sig) + one;
                float hv = (t + x) + y_in[r];
                float xn = fmaf(O, hv, EO * x), ynv = fmaf(O, hv, EO * y_in[r]);
                if (decltype(masked)::value && r >= valid) hv = prev, xn = 0.0f, ynv = 0.0f;
                h[r] = hv, yn[r] = ynv, x = xn, prev = hv;
              }
              float hi = h[0], lo = h[0];
#pragma unroll
              for (int r = 1; r < R; ++r) hi = max_nan(hi, h[r]), lo = min_nan(lo, h[r]);
              if (RENORM == 2 && d % 2 == 0) {  // keep the scale
                hi_pending = max_nan(hi_pending, hi);
                lo_pending = min_nan(lo_pending, lo);
#pragma unroll
                for (int r = 0; r < R; ++r) up[r] = h[r], y_in[r] = yn[r];
                x_out = x;
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
                for (int r = 0; r < R; ++r) up[r] = h[r] * f, y_in[r] = yn[r] * f;
                x_out = x * f;
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
            last_x = x_out * pow2_int(127 - int(last_bits >> 23));
            if (on && has_next && lane == kWarp - 1) {
              bnd_out[i] = pair2(tl * (float(last_sig) + log2_(last)), tl * (float(last_sig) + log2_(last_x)));
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
  const int best_exponent = int(best_key >> 23) - 127;
  float best = tl * (float(best_exponent) + log2_(mantissa_of(unsigned(best_key))));
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) best = fmaxf(best, __shfl_xor_sync(kFull, best, off));
  best_out = best;
  return ok;
}

// The scaled affine sweep of scores from codes over tiles first_tile, first_tile + stride, ...: the
// source reads the tables of powers (P, then P 2^-bias: see stage_matrix) during the sweep, and the
// matrix again after it.
template <int R, class Source, class Handoff>
__device__ bool affine_codes_scaled(const Pair& p, Source& src, const float* powers, int bias,
                                    const AffineConsts<float>& k, const Handoff& handoff, int first_tile, int stride,
                                    float& best) {
  const float* const matrix = src.matrix;
  src.matrix = powers;
  const bool ok = affine_tiles_scaled<true, R, R == 8 ? 2 : 1>(p, src, bias, k, handoff, first_tile, stride, best);
  src.matrix = matrix;
  return ok;
}

// One warp, all the tiles of one pair, float at t > 0 in the shared form, R = 4 or 8 columns per lane: the
// scaled sweep (if bias >= 0), and the log-space sweep where it is not taken or where the pair fails its
// check. POWERS: the source is Codes, whose matrix pointer the scaled sweep points at `powers`.
template <bool POWERS, int R, class Source>
__device__ void affine_scaled_pair(const Pair& p, Source& src, const float* powers, int bias,
                                   const AffineConsts<float>& k, const AffineOut<float>& out, int64_t M, int64_t N) {
  const InPlace<Pair2<float>> handoff{out.boundary ? out.boundary + p.b * M : nullptr};
  float best;
  bool done = false;
  if (bias >= 0) {
    if constexpr (POWERS)
      done = affine_codes_scaled<R>(p, src, powers, bias, k, handoff, 0, 1, best);
    else
      done = affine_tiles_scaled<false, R, 1>(p, src, 0, k, handoff, 0, 1, best);
    done = __all_sync(kFull, done);
  }
  if (!done) {
    int64_t unused;
    affine_tiles<float, R, kShared, false>(p, src, k, out, M, N, handoff, 0, 1, best, unused);
  }
  if (threadIdx.x % kWarp == 0) out.scores[p.b] = best;
}

}  // namespace swcli_cuda
