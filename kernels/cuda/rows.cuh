// The gradient of float scores at t > 0 by rows (N <= kRowsWidth): instead of keeping the DP table, the
// forward keeps every kBandRows-th row of the DP, and the backward computes each band of kBandRows rows
// again from the row above it, then runs the adjoint over the band from the bottom up. Both sweeps go a
// whole row at a time: lane k holds columns 8k .. 8k + 7, so S and the gradient move in whole rows
// (coalesced), where the wavefront kernels (forward_dense.cu, backward_table.cu) read S one row per lane,
// a skewed read far slower than a coalesced one (benchmarks/gradient_floor.py).
//
// A row from the row above is a linear recurrence along the row in scaled space (E = 2^(H c) 2^-sigma,
// sigma per lane and row, as in forward_tiles_scaled):
//     E[i][j] = a[j] + G E[i][j-1],   a[j] = P[i][j] E[i-1][j-1] + G E[i-1][j] + 1,   P = 2^(S c),
// solved by each lane over its 8 columns and across lanes by a scan (5 shuffle rounds), each lane's
// values in its own scale. The adjoint is the same recurrence, right to left: with A the derivative of
// the score by H (times the score's gradient g) and Ahat = A / E (in the lane's scale),
//     Ahat[i][j] = w[i+1][j+1] / E[i][j] + G 2^(sigma_i - sigma_i+1) Ahat[i+1][j] + G Ahat[i][j+1],
// seeded with g / E at the best cell, where w[i][j] = Ahat[i][j] Q[i][j] is the gradient of S[i][j] and
// Q = P[i][j] E[i-1][j-1] = E[i][j] - 1 - G E[i][j-1] - G E[i-1][j] is the match term, taken from E so
// that the backward reads no S beyond the band's recomputation. Every term is positive, so nothing cancels
// except Q's remainder, whose rounding is about 2^-24 E: 2^-24 A in the gradient.
//
// MASKED: per-pair lengths, or N not a multiple of 8, so that a lane may hold columns past the target
// (their S is arbitrary: they are held at 0). Without it, lanes past N (N < 256) run on S = 0, an
// extension of the matrix that no column inside it depends on, left out of the best cell. ALIGNED: rows of
// S and of the gradient in 16-byte accesses (N a multiple of 4, S 16-byte aligned); without it (always
// MASKED: three cases, not four) they move through a staging row in shared memory (Staging, below).
//
// The kernels and their launchers are in backward_rows.cu.
#pragma once

#include "forward_scaled.cuh"

namespace swcli_cuda {

inline constexpr int kRowCols = 8;                   // columns per lane
inline constexpr int kRowsWidth = kWarp * kRowCols;  // the widest N this path takes
// Longer bands take more shared memory per warp (BandRows), which leaves fewer warps per SM, and were
// slower; the next band's first loads run under the adjoint. 2 rows ahead instead of 4 take fewer
// registers but leave the loads exposed.
inline constexpr int kBandRows = 8;                  // rows per band (one kept row each)
inline constexpr int kRowsAhead = 4;                 // rows of S loaded ahead
inline constexpr int kRowsWarps = 4;                 // warps per block of the backward (shared memory: BandRows)
static_assert(kBandRows % kRowsAhead == 0, "a band holds whole groups of rows loaded ahead");
// A lane's largest value of a row at 2^kRowsTop: 8 columns spread further than 4 (kScaledTopWide,
// forward_scaled.cuh).
inline constexpr int kRowsTop = kScaledTopWide;

// A kept row in global memory: the lanes' E in two halves of 4 (whole 512-byte lines), then their sigma.
inline constexpr int kKeptRowFloats = kWarp * kRowCols + kWarp;

struct RowConsts {
  float G, c, tl;
  float g1, g8;          // log2(1 / G) and 8 log2(1 / G): G and the scan's G^8 per lane, as powers of 2
  float Gpow[kRowCols];  // G^1 .. G^8
};

// What the forward by rows does with a pair, by its values: the rows (kRowsHold), the log-space sweep
// (kRowsSoft), the exact sweep (kRowsHard, t = 0) or nothing (kRowsInvalid: NaN); all but the first are
// counted in *failed.
enum RowsCase { kRowsHold = 0, kRowsSoft = 1, kRowsHard = 2, kRowsInvalid = 3 };

// A pair's constants and case where the call reads its values on the device (PairValues, engine.h),
// derived by derive_pair_values before the sweep: the sweeps load them (one load a warp) instead of
// deriving them in double beside their own registers.
template <class K>
struct PairItem {
  K k;
  int rows_case;
};
inline constexpr int64_t kPairItemBytes = 32;  // the largest item (affine), rounded up

// The pair's values in double, as the host holds numbers: the constants come from the same consts.
struct PairRead {
  double gap, extend, t;
};
__device__ __forceinline__ PairRead read_values(const PairValues& v, int64_t b) {
  return {double(v.gap[b * v.gap_step]), v.extend ? double(v.extend[b * v.extend_step]) : 0.0,
          double(v.t[b * v.t_step])};
}

// One thread a pair: Derive::of(PairRead) -> PairItem<K>, into values.scratch.
template <class K, class Derive>
__global__ void derive_pair_values(PairValues values, int64_t B) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b < B) static_cast<PairItem<K>*>(values.scratch)[b] = Derive::of(read_values(values, b));
}

// The pairs' items where the call reads its values on the device (else null), derived first.
template <class K, class Derive>
const PairItem<K>* pair_items(const PairValues* values, int64_t B, cudaStream_t stream, cudaError_t& err) {
  static_assert(sizeof(PairItem<K>) <= kPairItemBytes, "an item fits its bytes");
  if (!values) return nullptr;
  derive_pair_values<K, Derive><<<unsigned((B + 255) / 256), 256, 0, stream>>>(*values, B);
  err = cudaGetLastError();
  return static_cast<const PairItem<K>*>(values->scratch);
}

// The rules of the linear gradient by rows (rows_take in ops.cpp: t > 0, gap <= 0) and of any call.
__device__ __forceinline__ RowsCase linear_rows_case(double gap, double t) {
  if (!(isfinite(gap) && isfinite(t) && t >= 0)) return kRowsInvalid;
  if (t == 0) return kRowsHard;
  return gap <= 0 ? kRowsHold : kRowsSoft;
}

struct LinearDerive {
  __device__ static PairItem<Consts<float>> of(const PairRead& v) {
    return {consts<float>(v.gap, v.t), linear_rows_case(v.gap, v.t)};
  }
};

__device__ __forceinline__ float rcp_(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ RowConsts row_consts(const Consts<float>& k) {
  RowConsts rc;
  rc.G = k.G, rc.c = k.c, rc.tl = k.tl;
  rc.g1 = k.G > 0.0f ? -log2f(k.G) : 1e30f;
  rc.g8 = 8.0f * rc.g1;
  float g = 1.0f;
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) g *= k.G, rc.Gpow[r] = g;
  return rc;
}

// A warp's staging row for rows of S and of the gradient that are not 16-byte aligned: the warp moves such
// a row in coalesced pieces of 128 bytes, lane k holding columns k, k + 32, ..., and the staging row turns
// that into lane k's 8 adjacent columns, or back. (Each lane reading and writing its own 8 floats one at a
// time makes each access 32 sectors for 128 bytes: several times slower.)
struct Staging {
  float4 v[2 * kWarp];  // a row of 256 floats
};

// A lane's 8 columns of S in row i (0 for columns past N, and past the row count), as two 16-byte loads
// that leave L2 early (S is read once here). Not ALIGNED: columns lane, lane + 32, ... (arrange_row then
// gives the lane its own). KEEP: loads that stay in L2 like any other (the backward with SUMS reads each
// row again in the band's adjoint, a few microseconds later, for <S, grad_S>).
template <bool ALIGNED, bool KEEP = false>
__device__ __forceinline__ void load_score_row(const float* Sb, int i, int rows, int N, int col, float (&v)[kRowCols]) {
  const auto load4 = [](const float* at) {
    return KEEP ? __ldcg(reinterpret_cast<const float4*>(at)) : __ldcs(reinterpret_cast<const float4*>(at));
  };
  const auto load1 = [](const float* at) { return KEEP ? __ldcg(at) : __ldcs(at); };
  if constexpr (ALIGNED) {
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (i < rows) {
      const float* at = Sb + int64_t(i) * N + col;
      if (col < N) a = load4(at);
      if (col + 4 < N) b = load4(at + 4);
    }
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const float* row = Sb + int64_t(i) * N;
    const int lane = col / kRowCols;
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) {
      const int c = r * kWarp + lane;
      v[r] = i < rows && c < N ? load1(row + c) : 0.0f;
    }
  }
}

// Not ALIGNED: a row as load_score_row loads it (columns lane, lane + 32, ...) becomes the lane's own 8.
template <bool ALIGNED>
__device__ __forceinline__ void arrange_row(float (&v)[kRowCols], Staging& st, int lane) {
  if constexpr (!ALIGNED) {
    float* f = reinterpret_cast<float*>(st.v);
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) f[r * kWarp + lane] = v[r];
    __syncwarp();
    const float4 a = st.v[2 * lane], b = st.v[2 * lane + 1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    __syncwarp();  // read by every lane before the next row overwrites it
  }
}

// A scan factor: G^(8d) 2^(s - sigma) for a lane d away whose scale is s, as one power of 2 (either
// factor alone may leave the float range while the product does not). fsig: float(sigma). MASKED caps it:
// lanes past the target hold values in no scale that matters, and inf times their 0 would be a NaN.
template <bool MASKED>
__device__ __forceinline__ float scan_factor(float fs, float fsig, int d, const RowConsts& k) {
  const float x = fmaf(-float(d), k.g8, fs - fsig);
  return exp2_(MASKED ? fminf(x, 126.0f) : x);
}

// Row i of the DP from row i-1 (U, this lane's stored values, scale 2^sig), in place: U becomes row i,
// sig its scale and hi its largest stored value (of the columns inside the target). valid: this lane's
// columns inside the target (MASKED: their E is 0 past it). ok turns false where the scale cannot hold
// the row (a value past the float range, or one so small that a flushed term could have mattered); the
// caller then takes the DP table's path.
template <bool MASKED>
__device__ __forceinline__ void row_step(float (&U)[kRowCols], int& sig, float& hi_out, const float (&v)[kRowCols],
                                         int valid, int lane, const RowConsts& k, bool& ok) {
  constexpr int top = kRowsTop;
  const float G = k.G;
  const float one = __int_as_float(max(127 - sig, 0) << 23);  // 2^-sigma: the zero term (and the borders)
  const float fsig = float(sig);
  // E[i-1][8 lane - 1] from the lane to the left (the border, E = 1, for lane 0), times P first: the
  // product may matter while the value alone is below this lane's float range (see times_pow2).
  const float left_up = __shfl_up_sync(kFull, U[kRowCols - 1], 1);
  const int left_up_sig = __shfl_up_sync(kFull, sig, 1);
  float x[kRowCols];
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    const float p = exp2_((MASKED && r >= valid ? 0.0f : v[r]) * k.c);
    float a;
    if (r > 0)
      a = fmaf(U[r - 1], p, one);
    else
      a = lane == 0 ? fmaf(one, p, one) : times_pow2(left_up * p, left_up_sig - sig) + one;
    a = fmaf(U[r], G, a);
    x[r] = r > 0 ? fmaf(x[r - 1], G, a) : a;  // the lane's own scan, with nothing coming from the left
  }
  // Across lanes: Y = sum over m >= 0 of G^(8m) x[7] of lane - m (lane 0's with the border), each in this
  // lane's scale; it is E[i][8 lane + 7], which comes into the next lane's first column.
  float Y = lane == 0 ? fmaf(k.Gpow[kRowCols - 1], one, x[kRowCols - 1]) : x[kRowCols - 1];
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const float y = __shfl_up_sync(kFull, Y, d);
    const float fs = __shfl_up_sync(kFull, fsig, d);
    const float f = scan_factor<MASKED>(fs, fsig, d, k);
    if (lane >= d) Y = fmaf(y, f, Y);
  }
  const float y_left = __shfl_up_sync(kFull, Y, 1);
  const int s_left = __shfl_up_sync(kFull, sig, 1);
  const float carry = lane == 0 ? one : times_pow2(y_left, s_left - sig);  // E[i][8 lane - 1]
  float hi = 0.0f, lo = FLT_MAX;
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    const float e = fmaf(k.Gpow[r], carry, x[r]);
    if (MASKED) {
      x[r] = r < valid ? e : 0.0f;
      if (r < valid) hi = max_nan(hi, e), lo = min_nan(lo, e);
    } else {
      x[r] = e;
      hi = max_nan(hi, e), lo = min_nan(lo, e);
    }
  }
  if (!MASKED || valid > 0) {  // renormalise: the row's largest value to 2^top
    const unsigned exponent = __float_as_uint(hi) & 0x7f800000u;
    const float f = __uint_as_float((unsigned(254 + top) << 23) - exponent);  // 2^(top - exponent of hi)
    sig += int(exponent >> 23) - (127 + top);
    ok = ok && lo >= kScaledFloor && lo * f >= kScaledFloor && hi <= FLT_MAX;  // false for a NaN
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) U[r] = x[r] * f;
    hi_out = hi * f;
  } else {  // a lane past the target keeps its 0s
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) U[r] = 0.0f;
    hi_out = 0.0f;
  }
}

__device__ __forceinline__ void store_kept_row(float* kept, const float (&U)[kRowCols], int sig, int lane) {
  float4* at = reinterpret_cast<float4*>(kept);
  __stcg(at + lane, make_float4(U[0], U[1], U[2], U[3]));
  __stcg(at + kWarp + lane, make_float4(U[4], U[5], U[6], U[7]));
  __stcg(reinterpret_cast<int*>(kept) + kWarp * kRowCols + lane, sig);
}

__device__ __forceinline__ void load_kept_row(const float* kept, float (&U)[kRowCols], int& sig, int lane) {
  const float4* at = reinterpret_cast<const float4*>(kept);
  const float4 a = __ldcg(at + lane), b = __ldcg(at + kWarp + lane);
  U[0] = a.x, U[1] = a.y, U[2] = a.z, U[3] = a.w, U[4] = b.x, U[5] = b.y, U[6] = b.z, U[7] = b.w;
  sig = __ldcg(reinterpret_cast<const int*>(kept) + kWarp * kRowCols + lane);
}

// Where a lane of the rows kernels stands in its pair: the pair's rows and columns, the lane's first
// column, and how many of its 8 lie inside the target.
struct RowsLane {
  int qn, tn, lane, col, valid;
  __device__ __forceinline__ RowsLane(int64_t b, const int64_t* qlen, const int64_t* tlen, int M, int N)
      : qn(int(qlen ? qlen[b] : M)), tn(int(tlen ? tlen[b] : N)), lane(int(threadIdx.x % kWarp)), col(lane * kRowCols),
        valid(min(max(tn - col, 0), kRowCols)) {}
};

// Kept rows per pair: the row above each band but the first.
__host__ __device__ __forceinline__ int64_t kept_rows(int64_t M) {
  return M > 0 ? (M + kBandRows - 1) / kBandRows - 1 : 0;
}

// The row above the first: the border, E = 1 (0 past the target with MASKED).
template <bool MASKED>
__device__ __forceinline__ void border_row(float (&U)[kRowCols], int& sig, int valid) {
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) U[r] = !MASKED || r < valid ? pow2_int(kRowsTop) : 0.0f;
  sig = -kRowsTop;
}

// Shared memory of the backward by rows, per warp: a band's rows of E (the row above it first), each in
// two halves of the warp's 4 values (16-byte accesses without bank conflicts), and their sigma.
struct BandRows {
  float4 e[kBandRows + 1][2][kWarp];
  int sig[kBandRows + 1][kWarp];
};

__device__ __forceinline__ void put_row(BandRows& sh, int slot, const float (&U)[kRowCols], int sig, int lane) {
  sh.e[slot][0][lane] = make_float4(U[0], U[1], U[2], U[3]);
  sh.e[slot][1][lane] = make_float4(U[4], U[5], U[6], U[7]);
  sh.sig[slot][lane] = sig;
}
__device__ __forceinline__ void get_row(const BandRows& sh, int slot, float (&U)[kRowCols], int& sig, int lane) {
  const float4 a = sh.e[slot][0][lane], b = sh.e[slot][1][lane];
  U[0] = a.x, U[1] = a.y, U[2] = a.z, U[3] = a.w, U[4] = b.x, U[5] = b.y, U[6] = b.z, U[7] = b.w;
  sig = sh.sig[slot][lane];
}

// The lane's 8 columns of a gradient row, at = the row + col. Not ALIGNED: through the staging row, and
// stored in coalesced pieces (columns lane, lane + 32, ...).
template <bool ALIGNED>
__device__ __forceinline__ void store_gradient_row(float* at, const float (&g)[kRowCols], int col, int N,
                                                   Staging& st) {
  if constexpr (ALIGNED) {
    if (col < N) __stcs(reinterpret_cast<float4*>(at), make_float4(g[0], g[1], g[2], g[3]));
    if (col + 4 < N) __stcs(reinterpret_cast<float4*>(at + 4), make_float4(g[4], g[5], g[6], g[7]));
  } else {
    const int lane = col / kRowCols;
    st.v[2 * lane] = make_float4(g[0], g[1], g[2], g[3]);
    st.v[2 * lane + 1] = make_float4(g[4], g[5], g[6], g[7]);
    __syncwarp();
    const float* f = reinterpret_cast<const float*>(st.v);
    float* row = at - col;
#pragma unroll
    for (int r = 0; r < kRowCols; ++r) {
      const int c = r * kWarp + lane;
      if (c < N) __stcs(row + c, f[c]);
    }
    __syncwarp();  // read by every lane before the next row overwrites it
  }
}

// The adjoint's carry from one row to the row above: Ahat and w of the row below, and its sigma.
struct Below {
  float A[kRowCols], w[kRowCols];
  int sig;
};

// One row i of the adjoint (E of it and of the row above), from the row below: writes the gradient row and
// makes `below` row i. SEED: the best cell's row, the first (nothing comes from below it): the seed g
// enters as w from below-right of the best cell, at column seed_col of this lane (or -1).
//
// SUMS: adds to sum the flow along the row's gap edges, Ahat (G E_left + G 2^(sigma_u - sigma_r) E_up) a cell
// (A times the two gap terms' weights, each over E: scale-free), and <S, w> over the row, S read again from
// Sb (row i) where the band's loads left it in L2.
template <bool MASKED, bool ALIGNED, bool SEED, bool SUMS = false>
__device__ __forceinline__ void adjoint_row(const float (&Er)[kRowCols], int sig_r, const float (&Eu)[kRowCols],
                                            int sig_u, Below& below, float seed, int seed_col, int valid, int lane,
                                            const RowConsts& k, float* grad_row, int col, int N, Staging& st,
                                            PairSums<float, 2>* sum = nullptr, const float* Sb = nullptr,
                                            int i = 0) {
  float s[kRowCols];  // SUMS: the row's scores, loaded first: their latency runs under the scans
  if (SUMS) {
    load_score_row<ALIGNED>(Sb, i, i + 1, N, col, s);
    arrange_row<ALIGNED>(s, st, lane);
  }
  const float G = k.G;
  const float one = __int_as_float(max(127 - sig_r, 0) << 23);
  const float fsig = float(sig_r);
  // E[i][8 lane - 1] in this lane's scale (the border, 1, for lane 0), and w[i+1][8 lane + 8]
  const float left_e = __shfl_up_sync(kFull, Er[kRowCols - 1], 1);
  const int left_sig = __shfl_up_sync(kFull, sig_r, 1);
  const float left = lane == 0 ? one : times_pow2(left_e, left_sig - sig_r);
  const float w_right = SEED ? 0.0f : __shfl_down_sync(kFull, below.w[0], 1);
  // G 2^(sigma_u - sigma_r) and G 2^(sigma_r - sigma_b), as one power of 2 each (G alone may be far below
  // 2^-126 while the product is not); capped where the value it multiplies is 0
  const float Gu = exp2_(fminf(float(sig_u) - fsig - k.g1, 126.0f));
  const float Gd = SEED ? 0.0f : exp2_(fminf(fsig - float(below.sig) - k.g1, 126.0f));
  float y[kRowCols], Q[kRowCols];
#pragma unroll
  for (int r = kRowCols - 1; r >= 0; --r) {
    const float e_left = r > 0 ? Er[r - 1] : left;
    Q[r] = max_nan(Er[r] - fmaf(G, e_left, fmaf(Gu, Eu[r], one)), 0.0f);
    float x;
    if (SEED) {
      x = r == seed_col ? seed * rcp_(Er[r]) : 0.0f;
    } else {
      const float from_diag = r + 1 < kRowCols ? below.w[r + 1] : (lane + 1 < kWarp ? w_right : 0.0f);
      x = fmaf(from_diag, rcp_(Er[r]), Gd * below.A[r]);
    }
    if (MASKED) x = r < valid ? x : 0.0f;
    y[r] = r + 1 < kRowCols ? fmaf(G, y[r + 1], x) : x;  // the lane's own scan, nothing from the right
  }
  // Across lanes, right to left: Z = sum over m >= 0 of G^(8m) y[0] of lane + m, in this lane's scale.
  float Z = y[0];
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const float z = __shfl_down_sync(kFull, Z, d);
    const float fs = __shfl_down_sync(kFull, fsig, d);
    const float f = scan_factor<MASKED>(fsig, fs, d, k);  // G^(8d) 2^(sigma - s)
    if (lane + d < kWarp) Z = fmaf(z, f, Z);
  }
  const float z_right = __shfl_down_sync(kFull, Z, 1);
  const int s_right = __shfl_down_sync(kFull, sig_r, 1);
  const float carry = lane + 1 < kWarp ? times_pow2(z_right, sig_r - s_right) : 0.0f;  // Ahat[i][8 lane + 8]
#pragma unroll
  for (int r = 0; r < kRowCols; ++r) {
    float a = fmaf(k.Gpow[kRowCols - 1 - r], carry, y[r]);
    if (MASKED) a = r < valid ? a : 0.0f;
    below.A[r] = a, below.w[r] = a * Q[r];
    if (SUMS) {
      sum->add_flow(0, a, fmaf(G, r > 0 ? Er[r - 1] : left, Gu * Eu[r]));
      sum->add_inner(1, below.w[r], s[r]);
    }
  }
  below.sig = sig_r;
  store_gradient_row<ALIGNED>(grad_row, below.w, col, N, st);
}

// The first column of a row (this lane's E and sigma) that holds the row's largest value: the best cell's,
// in the row the forward found (no cell anywhere is larger, and the backward computes the row bit for bit).
template <bool MASKED>
__device__ __forceinline__ int best_column(const float (&E)[kRowCols], int sig, int valid, int lane) {
  float hi = 0.0f;
  int at = kRowCols;
#pragma unroll
  for (int r = kRowCols - 1; r >= 0; --r) {
    const bool in = !MASKED || r < valid;
    if (in && E[r] >= hi) hi = E[r], at = r;  // the first of equals, going left
  }
  long long key = valid > 0 ? scaled_key(sig, hi) : LLONG_MIN;
  int column = lane * kRowCols + at;
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const long long pk = __shfl_xor_sync(kFull, key, off);
    const int pc = __shfl_xor_sync(kFull, column, off);
    if (pk > key || (pk == key && pc < column)) key = pk, column = pc;
  }
  return column;
}

}  // namespace swcli_cuda
