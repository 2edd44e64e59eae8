// The gradient of affine float scores at t > 0 by rows (N <= kRowsWidth), as backward_rows.cu is for
// linear gaps (rows.cuh): the forward keeps every kBandRows-th row of the DP, and the backward computes
// each band of rows again from the row above it, then runs the adjoint over the band from the bottom up,
// a whole row at a time (lane k holds columns 8k .. 8k + 7). A pair the scaled rows cannot hold is scored
// in log space (affine_tiles), and its gradient takes the state's path (affine_backward.cu).
//
// In scaled space (affine_scaled.cuh: O = 2^(o c), E = 2^(e c), P = 2^(S c)), row i from row i-1:
//     Y[j] = O H[i-1][j] + (E - O) Y[i-1][j]               pointwise: the gap along the query, from above
//     Mt[j] = H[i-1][j-1] P[i][j],   T[j] = 1 + Mt[j]       pointwise: the match and the zero term
//     X[j] = O (T[j-1] + Y[j-1]) + E X[j-1]                a linear scan along the row with factor E,
//                                                           X[1] = O (the open term alone)
//     H[j] = T[j] + X[j] + Y[j]
// so a row is the linear rows' scan with G = E, on terms known before it. A kept row holds H and Y.
//
// The adjoint: with a(v) the derivative of the score by the scaled value v, divided by t, every edge
// carries the forward's factor backwards (the score is t log2-scaled H of the best cell):
//     a(H[i][j]) = a(T[i+1][j+1]) P[i+1][j+1]                  (+ 1 / H at the best cell)
//     a(X[i][j]) = a(H) + O a(Y[i+1][j]) + E a(X[i][j+1])      a scan along the row, right to left
//     a(T[i][j]) = a(H) + O a(Y[i+1][j]) + O a(X[i][j+1])
//     a(Y[i][j]) = a(H) + E a(Y[i+1][j]) + O a(X[i][j+1])
// and the gradient of S[i][j] is w = a(T) Mt. a(T[i+1][j+1]) P[i+1][j+1] = w[i+1][j+1] / H[i][j], so the
// adjoint of a row needs H and Mt of that row only, and from the row below w and a(Y). Values are stored
// in the lane's scale 2^-sigma and adjoints in 2^+sigma (their products are scale-free), as in rows.cuh.
// Every term is positive: nothing cancels (Mt is kept, not taken as H - X - Y - 1).
//
// SUMS (affine_backward_parameters): the band also keeps Y, and each cell adds what enters its gap states,
// a(X) X + a(Y) Y (their log-space adjoints), and what flows along the extension edges out of it,
// a(X[i][j+1]) E X + a(Y[i+1][j]) E Y, and S w; S comes again from L2, as in the linear backward
// (tests/test_parameter_sums_model.py models it). X is kept from the row's scan, not taken as
// H - 1 - Mt - Y: where X is small next to H that difference is rounding alone, and a(X) can exceed a(H)
// by E / O (2^48 at o = -11, e = -1, t = 0.3), which would carry that rounding into the sums.
#include "affine.cuh"
#include "dispatch.cuh"
#include "rows.cuh"

namespace swcli_cuda {
namespace {

// A kept row: H and Y of the lanes (each as rows.cuh's kept row lays out 8 values), then their sigma.
inline constexpr int kAffineKeptRowFloats = 2 * kWarp * kRowCols + kWarp;
// Warps per block of the backward: its shared memory (AffineBand, 17 KB a warp; 33 KB with SUMS) stays
// under the 48 KB of a static allocation.
template <bool SUMS>
__host__ __device__ constexpr int affine_rows_warps() {
  return SUMS ? 1 : 2;
}

// The row scan's constants (RowConsts with G = E) and the open factor.
struct AffineRowConsts {
  RowConsts k;    // G = E, g1 = log2(1 / E), Gpow = E^1 .. E^8
  float O, EO;    // O and E - O
  float o1;       // log2(1 / O)
};

__device__ __forceinline__ AffineRowConsts affine_row_consts(const AffineConsts<float>& a) {
  Consts<float> lin;
  lin.gap = a.e, lin.c = a.c, lin.tl = a.tl, lin.G = a.E;
  AffineRowConsts rc;
  rc.k = row_consts(lin);
  rc.O = a.O, rc.EO = a.E - a.O;
  rc.o1 = -log2f(a.O);
  return rc;
}

// Row i of the DP from row i-1 (H and Y, this lane's stored values at scale 2^sig), in place; with
// KEEP_MT also the row's match terms Mt and its X, in the row's scale. hi: the row's largest stored H (of
// the columns inside the target). ok as in row_step (rows.cuh).
template <bool MASKED, bool KEEP_MT>
__device__ __forceinline__ void affine_row_step(float (&H)[kRowCols], float (&Y)[kRowCols], float (&Mt)[kRowCols],
                                                float (&X)[kRowCols], int& sig, float& hi_out,
                                                const float (&v)[kRowCols], int valid, int lane,
                                                const AffineRowConsts& a, bool& ok) {
  constexpr int top = kRowsTop;
  const RowConsts& k = a.k;
  const float E = k.G, O = a.O;
  const float one = __int_as_float(max(127 - sig, 0) << 23);  // 2^-sigma: the zero term (and the borders)
  // H[i-1][8 lane - 1] from the lane to the left (the border, 1, for lane 0), times P first (times_pow2)
  const float left_up = __shfl_up_sync(kFull, H[kRowCols - 1], 1);
  const int left_up_sig = __shfl_up_sync(kFull, sig, 1);
  float m[kRowCols], ty[kRowCols];  // Mt, and T + Y of each column
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    const float p = exp2_((MASKED && r >= valid ? 0.0f : v[r]) * k.c);
    if (r > 0)
      m[r] = H[r - 1] * p;
    else
      m[r] = lane == 0 ? one * p : times_pow2(left_up * p, left_up_sig - sig);
    Y[r] = fmaf(O, H[r], a.EO * Y[r]);
    ty[r] = (one + m[r]) + Y[r];
  }
  // X along the row: the lane's own scan, then across lanes as row_step's (E^8 a lane).
  const float left_ty = __shfl_up_sync(kFull, ty[kRowCols - 1], 1);  // T + Y of column 8 lane - 1
  float x[kRowCols];
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    float in;
    if (r > 0)
      in = O * ty[r - 1];
    else
      in = lane == 0 ? O * one : O * times_pow2(left_ty, left_up_sig - sig);
    x[r] = r > 0 ? fmaf(x[r - 1], E, in) : in;
  }
  float Z = x[kRowCols - 1];
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const float z = __shfl_up_sync(kFull, Z, d);
    const float fs = __shfl_up_sync(kFull, float(sig), d);
    const float f = scan_factor<MASKED>(fs, float(sig), d, k);
    if (lane >= d) Z = fmaf(z, f, Z);
  }
  const float z_left = __shfl_up_sync(kFull, Z, 1);
  const float carry = lane == 0 ? 0.0f : times_pow2(z_left, left_up_sig - sig);  // X[i][8 lane - 1]
  float hi = 0.0f, lo = FLT_MAX;
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    x[r] = fmaf(k.Gpow[r], carry, x[r]);
    const float h = x[r] + ty[r];
    const bool in = !MASKED || r < valid;
    H[r] = in ? h : 0.0f;
    if (MASKED) Y[r] = in ? Y[r] : 0.0f;
    if (in) hi = max_nan(hi, h), lo = min_nan(lo, h);
  }
  if (!MASKED || valid > 0) {  // renormalise: the row's largest H to 2^top
    const unsigned exponent = __float_as_uint(hi) & 0x7f800000u;
    const float f = __uint_as_float((unsigned(254 + top) << 23) - exponent);  // 2^(top - exponent of hi)
    sig += int(exponent >> 23) - (127 + top);
    ok = ok && lo >= kScaledFloor && lo * f >= kScaledFloor && hi <= FLT_MAX;  // false for a NaN
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) {
      H[r] *= f, Y[r] *= f;
      if (KEEP_MT) Mt[r] = MASKED && r >= valid ? 0.0f : m[r] * f;
      if (KEEP_MT) X[r] = MASKED && r >= valid ? 0.0f : x[r] * f;
    }
    hi_out = hi * f;
  } else {  // a lane past the target keeps its 0s
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) {
      H[r] = 0.0f, Y[r] = 0.0f;
      if (KEEP_MT) Mt[r] = 0.0f, X[r] = 0.0f;
    }
    hi_out = 0.0f;
  }
}

// The row above the first, the border: H = 1 and Y = 0 (H = 0 past the target with MASKED).
template <bool MASKED>
__device__ __forceinline__ void affine_border_row(float (&H)[kRowCols], float (&Y)[kRowCols], int& sig, int valid) {
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) H[r] = !MASKED || r < valid ? pow2_int(kRowsTop) : 0.0f, Y[r] = 0.0f;
  sig = -kRowsTop;
}

__device__ __forceinline__ void store_affine_kept_row(float* kept, const float (&H)[kRowCols],
                                                      const float (&Y)[kRowCols], int sig, int lane) {
  float4* at = reinterpret_cast<float4*>(kept);
  __stcg(at + lane, make_float4(H[0], H[1], H[2], H[3]));
  __stcg(at + kWarp + lane, make_float4(H[4], H[5], H[6], H[7]));
  __stcg(at + 2 * kWarp + lane, make_float4(Y[0], Y[1], Y[2], Y[3]));
  __stcg(at + 3 * kWarp + lane, make_float4(Y[4], Y[5], Y[6], Y[7]));
  __stcg(reinterpret_cast<int*>(kept) + 2 * kWarp * kRowCols + lane, sig);
}

__device__ __forceinline__ void load_affine_kept_row(const float* kept, float (&H)[kRowCols], float (&Y)[kRowCols],
                                                     int& sig, int lane) {
  const float4* at = reinterpret_cast<const float4*>(kept);
  const float4 a = __ldcg(at + lane), b = __ldcg(at + kWarp + lane);
  const float4 c = __ldcg(at + 2 * kWarp + lane), d = __ldcg(at + 3 * kWarp + lane);
  H[0] = a.x, H[1] = a.y, H[2] = a.z, H[3] = a.w, H[4] = b.x, H[5] = b.y, H[6] = b.z, H[7] = b.w;
  Y[0] = c.x, Y[1] = c.y, Y[2] = c.z, Y[3] = c.w, Y[4] = d.x, Y[5] = d.y, Y[6] = d.z, Y[7] = d.w;
  sig = __ldcg(reinterpret_cast<const int*>(kept) + 2 * kWarp * kRowCols + lane);
}

// Shared memory of the backward, per warp: a band's rows of H and Mt, and their sigma (16-byte accesses
// in halves of 4 values, as BandRows in rows.cuh); with SUMS also of X and Y.
struct AffineBand {
  float4 h[kBandRows][2][kWarp];
  float4 m[kBandRows][2][kWarp];
  int sig[kBandRows][kWarp];
};
struct AffineBandWithGaps : AffineBand {
  float4 x[kBandRows][2][kWarp];
  float4 y[kBandRows][2][kWarp];
};

__device__ __forceinline__ void put4(float4 (&dst)[2][kWarp], const float (&v)[kRowCols], int lane) {
  dst[0][lane] = make_float4(v[0], v[1], v[2], v[3]);
  dst[1][lane] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void get4(const float4 (&src)[2][kWarp], float (&v)[kRowCols], int lane) {
  const float4 a = src[0][lane], b = src[1][lane];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// The adjoint's carry from one row to the row above: w (the gradient) and a(Y) of the row below, and its
// sigma.
struct AffineBelow {
  float w[kRowCols], y[kRowCols];
  int sig;
};

// One row i of the adjoint (its H and Mt), from the row below: writes the gradient row and makes `below`
// row i. SEED: the best cell's row (nothing comes from below it), the seed g entering as g / H at column
// seed_col of this lane (or -1). SUMS: adds the row's gap flows and <S, w> to sum (see the top), from X and
// Y of the row and S read again from Sb (row i).
template <bool MASKED, bool ALIGNED, bool SEED, bool SUMS = false>
__device__ __forceinline__ void affine_adjoint_row(const float (&H)[kRowCols], const float (&Mt)[kRowCols], int sig_r,
                                                   AffineBelow& below, float seed, int seed_col, int valid, int lane,
                                                   const AffineRowConsts& a, float* grad_row, int col, int N,
                                                   Staging& st, PairSums<float, 3>* sum = nullptr,
                                                   const float (*Xr)[kRowCols] = nullptr,
                                                   const float (*Yr)[kRowCols] = nullptr, const float* Sb = nullptr,
                                                   int i = 0) {
  float s[kRowCols];  // SUMS: the row's scores, loaded first: their latency runs under the scan
  if (SUMS) {
    load_score_row<ALIGNED>(Sb, i, i + 1, N, col, s);
    arrange_row<ALIGNED>(s, st, lane);
  }
  const RowConsts& k = a.k;
  const float E = k.G, O = a.O;
  const float fsig = float(sig_r);
  const float w_right = SEED ? 0.0f : __shfl_down_sync(kFull, below.w[0], 1);
  // O 2^(sigma_r - sigma_below) and E 2^(...), each as one power of 2, capped where what they multiply is 0
  const float Od = SEED ? 0.0f : exp2_(fminf(fsig - float(below.sig) - a.o1, 126.0f));
  const float Ed = SEED ? 0.0f : exp2_(fminf(fsig - float(below.sig) - k.g1, 126.0f));
  float h[kRowCols], ob[kRowCols], eb[kRowCols], xs[kRowCols];
#pragma unroll
  for (int r = kRowCols - 1; r >= 0; --r) {
    float hr;
    if (SEED) {
      hr = r == seed_col ? seed * rcp_(H[r]) : 0.0f;
      ob[r] = 0.0f, eb[r] = 0.0f;
    } else {
      const float from_diag = r + 1 < kRowCols ? below.w[r + 1] : (lane + 1 < kWarp ? w_right : 0.0f);
      hr = from_diag * rcp_(H[r]);
      ob[r] = Od * below.y[r], eb[r] = Ed * below.y[r];
    }
    if (MASKED && r >= valid) hr = 0.0f, ob[r] = 0.0f, eb[r] = 0.0f;
    h[r] = hr;
    const float base = hr + ob[r];
    xs[r] = r + 1 < kRowCols ? fmaf(E, xs[r + 1], base) : base;  // the lane's own scan, nothing from the right
  }
  // Across lanes, right to left, as adjoint_row's (rows.cuh).
  float Z = xs[0];
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const float z = __shfl_down_sync(kFull, Z, d);
    const float fs = __shfl_down_sync(kFull, fsig, d);
    const float f = scan_factor<MASKED>(fsig, fs, d, k);  // E^(8d) 2^(sigma - s)
    if (lane + d < kWarp) Z = fmaf(z, f, Z);
  }
  const float z_right = __shfl_down_sync(kFull, Z, 1);
  const int s_right = __shfl_down_sync(kFull, sig_r, 1);
  const float carry = lane + 1 < kWarp ? times_pow2(z_right, sig_r - s_right) : 0.0f;  // a(X[i][8 lane + 8])
  float x_right = carry;
#pragma unroll
  for (int r = kRowCols - 1; r >= 0; --r) {
    const float ox = O * x_right;
    float t = h[r] + ox + ob[r];
    float y = h[r] + ox + eb[r];
    if (MASKED && r >= valid) t = 0.0f, y = 0.0f;
    below.w[r] = t * Mt[r], below.y[r] = y;
    const float x_here = fmaf(k.Gpow[kRowCols - 1 - r], carry, xs[r]);  // a(X[i][8 lane + r])
    if (SUMS) {
      const float xv = (*Xr)[r], yv = (*Yr)[r];  // X and Y of the cell
      sum->add_flow(0, x_here, xv);  // into the gap states
      sum->add_flow(0, y, yv);
      sum->add_flow(1, x_right, E * xv);  // along the extension edges, to X on the right and Y below
      sum->add_flow(1, eb[r], yv);
      sum->add_inner(2, below.w[r], s[r]);
    }
    x_right = x_here;
  }
  below.sig = sig_r;
  store_gradient_row<ALIGNED>(grad_row, below.w, col, N, st);
}

// The rules of the affine gradient by rows (affine_rows_take in ops.cpp: t > 0 in the shared form) and
// of any call (gap_open <= gap_extend <= 0), for values read on the device (RowsCase in rows.cuh; the
// separate form takes the log-space sweep as kRowsSoft).
__device__ __forceinline__ RowsCase affine_rows_case(double o, double e, double t) {
  if (!(isfinite(o) && isfinite(e) && isfinite(t) && t >= 0 && o <= e && e <= 0)) return kRowsInvalid;
  if (t == 0) return kRowsHard;
  return affine_mode<float>(o, t) == kShared ? kRowsHold : kRowsSoft;
}

struct AffineDerive {
  __device__ static PairItem<AffineConsts<float>> of(const PairRead& v) {
    return {affine_consts<float>(v.gap, v.extend, v.t), affine_rows_case(v.gap, v.extend, v.t)};
  }
};

template <bool MASKED, bool ALIGNED, bool PER_PAIR>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    affine_rows_forward_kernel(const float* S, const int64_t* qlen, const int64_t* tlen, const int64_t* order,
                               float* scores, int64_t* best_row, float* kept, Pair2<float>* boundary, int* failed,
                               AffineConsts<float> k, const PairItem<AffineConsts<float>>* items, int64_t B, int M,
                               int N) {
  __shared__ Staging staging_rows[ALIGNED ? 1 : kWarpsPerBlock];  // ALIGNED: unused
  const int64_t slot = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  Staging& staging = staging_rows[ALIGNED ? 0 : threadIdx.x / kWarp];
  const RowsLane where(b, qlen, tlen, M, N);
  const int lane = where.lane, qn = where.qn, tn = where.tn, col = where.col, valid = where.valid;
  RowsCase pair_case = kRowsHold;
  if constexpr (PER_PAIR) {
    const PairItem<AffineConsts<float>> item = items[b];
    k = item.k, pair_case = RowsCase(item.rows_case);
  }
  const AffineRowConsts rc = affine_row_consts(k);
  const float* Sb = S + b * int64_t(M) * N;
  float* kept_b = kept + b * kept_rows(M) * kAffineKeptRowFloats;
  float H[kRowCols], Y[kRowCols], unused[kRowCols];
  int sig;
  affine_border_row<MASKED>(H, Y, sig, valid);
  bool ok = pair_case == kRowsHold;  // the same in every lane
  long long best_key = scaled_key(0, 1.0f);  // the border
  int best_i = -1;  // the first row that holds best_key (its column: best_column, in the backward)
  const int rows = tn > 0 && ok ? qn : 0;
  float ring[kRowsAhead][kRowCols];
#pragma unroll
  for (int u = 0; u < kRowsAhead; ++u) load_score_row<ALIGNED>(Sb, u, rows, N, col, ring[u]);
  for (int i0 = 0; i0 < rows; i0 += kRowsAhead) {
#pragma unroll
    for (int u = 0; u < kRowsAhead; ++u) {
      const int i = i0 + u;
      if (i >= rows) break;  // the same for the whole warp
      float hi;
      arrange_row<ALIGNED>(ring[u], staging, lane);
      affine_row_step<MASKED, false>(H, Y, unused, unused, sig, hi, ring[u], valid, lane, rc, ok);
      load_score_row<ALIGNED>(Sb, i + kRowsAhead, rows, N, col, ring[u]);
      const long long key = scaled_key(sig, hi);
      if (valid > 0 && key > best_key) best_key = key, best_i = i;
      if ((i + 1) % kBandRows == 0 && i + 1 < rows)
        store_affine_kept_row(kept_b + int64_t((i + 1) / kBandRows - 1) * kAffineKeptRowFloats, H, Y, sig, lane);
    }
  }
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const long long pk = __shfl_xor_sync(kFull, best_key, off);
    const int pi = __shfl_xor_sync(kFull, best_i, off);
    if (pk > best_key || (pk == best_key && pi < best_i)) best_key = pk, best_i = pi;
  }
  if (__all_sync(kFull, ok)) {
    if (lane == 0) {
      const int exponent = int(best_key >> 23) - 127;
      scores[b] = best_i < 0 ? 0.0f : k.tl * (float(exponent) + log2_(mantissa_of(unsigned(best_key))));
      best_row[b] = best_i;
    }
    return;
  }
  if (PER_PAIR && pair_case == kRowsInvalid) {
    if (lane == 0) {
      scores[b] = __int_as_float(0x7fc00000), best_row[b] = -1;
      atomicAdd(failed, 1);
    }
    return;
  }
  // The scaled rows could not hold this pair: its score in log space (affine_tiles, as the scores
  // without the state), and the caller takes the state's path for the batch (its forward finds the best
  // cells again). Values read on the device may take the other forms (at t = 0, the exact sweep).
  using Source = std::conditional_t<ALIGNED, DenseGroups<8>, DenseDirect<float, 4>>;
  Source src;
  src.S = S, src.M = M, src.N = N;
  const AffineOut<float> out{scores, nullptr, 0, nullptr, boundary};
  const InPlace<Pair2<float>> handoff{boundary ? boundary + b * M : nullptr};
  float best;
  int64_t unused_at;
  const Pair p{b, qn, tn};
  if constexpr (PER_PAIR) {
    if (pair_case == kRowsHard)
      affine_tiles<float, 4, kHard, false>(p, src, k, out, M, N, handoff, 0, 1, best, unused_at);
    else if (pair_case == kRowsSoft)
      affine_tiles<float, 4, kSeparate, false>(p, src, k, out, M, N, handoff, 0, 1, best, unused_at);
    else
      affine_tiles<float, 4, kShared, false>(p, src, k, out, M, N, handoff, 0, 1, best, unused_at);
  } else {
    affine_tiles<float, 4, kShared, false>(p, src, k, out, M, N, handoff, 0, 1, best, unused_at);
  }
  if (lane == 0) {
    scores[b] = best, best_row[b] = -1;
    atomicAdd(failed, 1);
  }
}

template <bool MASKED, bool ALIGNED, bool SUMS, bool PER_PAIR>
__global__ void __launch_bounds__(kWarp* affine_rows_warps<SUMS>())
    affine_rows_backward_kernel(const float* grad_scores, const float* S, const float* kept, const int64_t* best_row,
                                const int64_t* qlen, const int64_t* tlen, const int64_t* order, float* grad_S,
                                float* sums, AffineConsts<float> k, const PairItem<AffineConsts<float>>* items,
                                int64_t B, int M, int N) {
  constexpr int kWarps = affine_rows_warps<SUMS>();
  using Band = std::conditional_t<SUMS, AffineBandWithGaps, AffineBand>;
  __shared__ Band bands[kWarps];
  __shared__ Staging staging_rows[ALIGNED ? 1 : kWarps];  // ALIGNED: unused
  const int64_t slot = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (slot >= B) return;
  const int64_t b = order ? order[slot] : slot;
  Band& sh = bands[threadIdx.x / kWarp];
  Staging& staging = staging_rows[ALIGNED ? 0 : threadIdx.x / kWarp];
  const RowsLane where(b, qlen, tlen, M, N);
  const int lane = where.lane, qn = where.qn, tn = where.tn, col = where.col, valid = where.valid;
  if constexpr (PER_PAIR) k = items[b].k;  // every pair's case is kRowsHold: the forward counted no failure
  const AffineRowConsts rc = affine_row_consts(k);
  const float* Sb = S + b * int64_t(M) * N;
  const float* kept_b = kept + b * kept_rows(M) * kAffineKeptRowFloats;
  float* Gb = grad_S + b * int64_t(M) * N + col;
  const bool border = best_row[b] < 0 || qn == 0 || tn == 0;
  const int bi = border ? -1 : int(best_row[b]);
  {  // rows below the best cell's take nothing (all rows where the score is the border)
    const float zeros[kRowCols] = {};
    for (int i = bi + 1; i < M; ++i) store_gradient_row<ALIGNED>(Gb + int64_t(i) * N, zeros, col, N, staging);
  }
  if (border) return;
  AffineBelow below;
  PairSums<float, 3> sum;  // SUMS: into the gap states, the extension flow, <S, grad_S> (times g: the seed)
  float ring[kRowsAhead][kRowCols];
  float H[kRowCols], Y[kRowCols];
  int sig;
  auto load_band = [&](int band) {
    const int r0 = band * kBandRows, r1 = min(r0 + kBandRows, bi + 1);
    if (band == 0)
      affine_border_row<MASKED>(H, Y, sig, valid);
    else
      load_affine_kept_row(kept_b + int64_t(band - 1) * kAffineKeptRowFloats, H, Y, sig, lane);
#pragma unroll
    for (int u = 0; u < kRowsAhead; ++u) load_score_row<ALIGNED, SUMS>(Sb, r0 + u, r1, N, col, ring[u]);
  };
  load_band(bi / kBandRows);
  for (int band = bi / kBandRows; band >= 0; --band) {
    const int r0 = band * kBandRows, r1 = min(r0 + kBandRows, bi + 1);
    // ---- The band's rows again, from the row above it (kept, or the border): H and Mt of each.
    bool ok = true;  // as in the forward, which passed
    for (int i0 = r0; i0 < r1; i0 += kRowsAhead) {
#pragma unroll
      for (int u = 0; u < kRowsAhead; ++u) {
        const int i = i0 + u;
        if (i >= r1) break;
        float hi, Mt[kRowCols], X[kRowCols];
        arrange_row<ALIGNED>(ring[u], staging, lane);
        affine_row_step<MASKED, true>(H, Y, Mt, X, sig, hi, ring[u], valid, lane, rc, ok);
        load_score_row<ALIGNED, SUMS>(Sb, i + kRowsAhead, r1, N, col, ring[u]);
        put4(sh.h[i - r0], H, lane);
        put4(sh.m[i - r0], Mt, lane);
        if constexpr (SUMS) put4(sh.x[i - r0], X, lane), put4(sh.y[i - r0], Y, lane);
        sh.sig[i - r0][lane] = sig;
      }
    }
    if (band > 0) load_band(band - 1);
    // ---- The adjoint over the band, bottom up (each lane reads only its own slots: no barrier).
    for (int i = r1 - 1; i >= r0; --i) {
      float Hr[kRowCols], Mr[kRowCols];
      get4(sh.h[i - r0], Hr, lane);
      get4(sh.m[i - r0], Mr, lane);
      const int sig_r = sh.sig[i - r0][lane];
      float Xr[kRowCols], Yr[kRowCols];
      if constexpr (SUMS) get4(sh.x[i - r0], Xr, lane), get4(sh.y[i - r0], Yr, lane);
      if (i == bi) {
        const int seed_col = best_column<MASKED>(Hr, sig_r, valid, lane) - col;  // in [0, 8) in its lane only
        affine_adjoint_row<MASKED, ALIGNED, true, SUMS>(Hr, Mr, sig_r, below, grad_scores[b], seed_col, valid, lane,
                                                        rc, Gb + int64_t(i) * N, col, N, staging, &sum, &Xr, &Yr,
                                                        Sb, i);
      } else {
        affine_adjoint_row<MASKED, ALIGNED, false, SUMS>(Hr, Mr, sig_r, below, 0.0f, -1, valid, lane, rc,
                                                         Gb + int64_t(i) * N, col, N, staging, &sum, &Xr, &Yr, Sb, i);
      }
    }
  }
  if (SUMS) {  // openings: what entered the gap states less what extended them
    sum.part[0] -= sum.part[1];
    sum.add_to(sums, B, b);
  }
}

bool rows_aligned(const Problem& pr, const float* S) {
  return pr.N % 4 == 0 && reinterpret_cast<uintptr_t>(S) % 16 == 0;
}
bool rows_masked(const Problem& pr) { return pr.qlen || pr.tlen || pr.N % kRowCols != 0; }

}  // namespace
}  // namespace swcli_cuda

bool sw_cuda_affine_shared_form(double gap_open, double t) {
  return t > 0 && swcli_cuda::affine_mode<float>(gap_open, t) == swcli_cuda::kShared;
}

int64_t sw_cuda_affine_rows_kept_floats(int64_t M) {
  return swcli_cuda::kept_rows(M) * swcli_cuda::kAffineKeptRowFloats;
}

cudaError_t sw_cuda_affine_rows_forward(const Problem& pr, const float* S, float* scores, int64_t* best_row,
                                        float* kept, float* boundary, int* failed, double gap_open,
                                        double gap_extend, double t, cudaStream_t stream,
                                        const PairValues* values) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  const AffineConsts<float> k = affine_consts<float>(gap_open, gap_extend, t);
  cudaError_t err = cudaSuccess;
  const auto* items = pair_items<AffineConsts<float>, AffineDerive>(values, pr.B, stream, err);
  if (err != cudaSuccess) return err;
  return SWCLI_MASKED_ALIGNED_SWITCH(rows_masked(pr), rows_aligned(pr, S), MASKED, ALIGNED, [&] {
    return SWCLI_BOOL_SWITCH(items != nullptr, PER_PAIR, [&] {
      affine_rows_forward_kernel<MASKED, ALIGNED, PER_PAIR><<<blocks_for(pr.B), kWarp * kWarpsPerBlock, 0, stream>>>(
          S, pr.qlen, pr.tlen, pr.order, scores, best_row, kept, reinterpret_cast<Pair2<float>*>(boundary), failed,
          k, items, pr.B, int(pr.M), int(pr.N));
      return cudaGetLastError();
    });
  });
}

cudaError_t sw_cuda_affine_rows_backward(const Problem& pr, const float* grad_scores, const float* S,
                                         const float* kept, const int64_t* best_row, float* grad_S, float* sums,
                                         double gap_open, double gap_extend, double t, cudaStream_t stream,
                                         const PairValues* values) {
  using namespace swcli_cuda;
  if (pr.B == 0) return cudaSuccess;
  const AffineConsts<float> k = affine_consts<float>(gap_open, gap_extend, t);
  cudaError_t err = cudaSuccess;
  const auto* items = pair_items<AffineConsts<float>, AffineDerive>(values, pr.B, stream, err);
  if (err != cudaSuccess) return err;
  if (items && !sums) return cudaErrorInvalidValue;  // values read on the device come with their sums
  return SWCLI_MASKED_ALIGNED_SWITCH(rows_masked(pr), rows_aligned(pr, S), MASKED, ALIGNED, [&] {
    auto launch = [&](auto sums_flag, auto per_pair) {
      constexpr bool SUMS = decltype(sums_flag)::value;
      constexpr int warps = affine_rows_warps<SUMS>();
      const unsigned blocks = unsigned((pr.B + warps - 1) / warps);
      affine_rows_backward_kernel<MASKED, ALIGNED, SUMS, decltype(per_pair)::value><<<blocks, kWarp * warps, 0,
                                                                                       stream>>>(
          grad_scores, S, kept, best_row, pr.qlen, pr.tlen, pr.order, grad_S, sums, k, items, pr.B, int(pr.M),
          int(pr.N));
      return cudaGetLastError();
    };
    if (items) return launch(std::true_type{}, std::true_type{});
    return sums ? launch(std::true_type{}, std::false_type{}) : launch(std::false_type{}, std::false_type{});
  });
}
