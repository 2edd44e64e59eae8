// Soft Smith-Waterman scores of one query against many targets at t > 0, in float32 and in the engines'
// scaled exponential space (forward_scaled.cuh): with E = 2^(H c), c = log2(e) / t, a linear cell is
//
//     E = 1 + E_diag P + E_up G + E_left G,   P = 2^(S c), G = 2^(gap c)
//
// three fused multiply-adds, and the soft Gotoh cell (affine_scaled.cuh) with X~ = X / O and Y~ = Y / O,
//
//     Z = (1 + H_diag P) + O Y~,   H = Z + O X~,   X~' = H + (E - O) X~ = Z + E X~,   Y~' = H + (E - O) Y~
//
// five (O = 2^(o c), E = 2^(e c)); X~' is taken from Z, not H, so that the chain along a row is one
// multiply-add a cell. P comes from the query's profile in shared memory, one load a cell.
//
// Layout, as the exact 16-bit kernel's (search_s16.cu): a group of G lanes holds one target, R columns a
// lane, and sweeps the query's rows as a wavefront; a target wider than a tile (G R columns) is swept tile
// after tile, the tile's right edge going to the next through a buffer (in place, read a chunk of 32 rows
// ahead). A launch takes G from its widest target, and each warp R (whole segments) from its own. The
// groups of a warp are staggered so that lane l of the warp is on row k - l at step k: the 32 lanes then
// read 32 consecutive rows of the profile, one bank each.
//
// The profile: a warp keeps a ring of 64 rows of it (P for every letter at each query row), written 32 rows
// at a time from the matrix's table of powers, and read at slot (k mod 64) + 31 - lane with a mirror of 32
// slots below the ring, so that a lane's column reads its letter's row at a shared-memory address plus
// an offset that is the same for the whole warp (one LDS a cell, no address arithmetic). The padding
// letter K has P = 0.
//
// Scale: values are kept as float32 times 2^sigma, sigma an integer per 8 columns (a segment), the same 8
// columns of the target whatever the tile shape. A segment is rescaled down where its largest value passes
// 2^U, or where its left input would, and up only where sigma > F and its cells near the floor (below): by
// a power of two, an exact multiply. A segment's input, the last column of the segment to its left (in this
// lane, the lane to the left, or the previous tile), is converted from that segment's scale by
// 2^(sigma' - sigma) in two factors (affine: in one where that is a normal float), exact wherever the
// result is a normal float (an input from the lane to the left is converted by that lane, with the same
// factors). So every cell is the same float computation whatever the lanes and tiles: a pair's score has
// the same bits in every block it can be scored in.
//
// Checks (the host derives U, T, the floor F and the padding's bound from the matrix, t and the gaps:
// search.SoftSearch):
// - U leaves room for one step's growth, so nothing overflows: 1 + E_diag P + ... is at most the growth
//   factor times the segment's largest value or its input.
// - A value under 2^-126 flushes to 0. Cells are at least 2^-sigma (the 1), so where sigma <= F every cell
//   is at least 2^-F and a flushed term is under 2^-26 of any cell it enters. A segment with sigma > F has
//   each cell inside the target checked against 2^-F (by one test of its first cell where that bounds
//   them all, else cell by cell), and is rescaled up to 2^T where its first cell nears the floor; a pair
//   that fails, or whose best cell is not a finite float, is flagged: score -1, counted in *flagged.
//   The caller scores it again through the general op.
// - Columns past a target's end read the padding letter (P = 0) and are swept as the others, so the best
//   cell may be one of them. Their values are bounded: a padded cell is 1 + G (up + left) (affine: the
//   same with O and E), so they never pass max(best inside, bound), bound = 1 / (1 - 2G) (affine
//   1 / (1 - 2 O / (1 - E + O))). A pair whose best cell is at most the bound is flagged too (at BLOSUM62,
//   t = 1, gap -4 or -11/-1 no pair with a residue on each side: its first cell alone is above it).
#include <algorithm>

#include "common.cuh"
#include "engine.h"
#include "forward_scaled.cuh"

namespace swcli_cuda {
namespace {

inline constexpr int kSoftWarps = 4;  // warps a block
inline constexpr int kSoftThreads = kSoftWarps * kWarp;
inline constexpr int kSegment = 8;                     // columns a scale
inline constexpr int kRingRows = 64;                   // two chunks of 32 query rows
inline constexpr int kRingSlots = kRingRows + kWarp;   // a letter's slots: the ring above a mirror of 32

// A row of the next tile's left edge: the last column's value and its scale (affine: and X~ in that scale).
struct alignas(8) EdgeLinear {
  float x;
  int sig;
};
struct alignas(16) EdgeAffine {
  float x, xt;
  int sig, unused;
};

__device__ __forceinline__ float load_shared(unsigned address) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(address));
  return v;
}

// 2^d as two factors (a, b) with a b = 2^d and d clamped to [-252, 254]: x a b is exact wherever x 2^d
// is a normal float (the first product lies between x and the result), and 0 below.
__device__ __forceinline__ void split_pow2(int d, float& a, float& b) {
  d = min(max(d, -252), 254);
  const int half = d >> 1;
  a = pow2_int(half), b = pow2_int(d - half);
}

// 2^d where that is a normal float, d in [-126, 127], else a NaN: a conversion in one multiply, the same
// float as in two factors (split_pow2) wherever 2^d is one; a NaN sends the others to the input's range
// check, which converts them in two factors.
__device__ __forceinline__ float pow2_or_nan(int d) {
  return unsigned(d + 126) <= 253u ? pow2_int(d) : __int_as_float(0x7fffffff);
}

__device__ __forceinline__ int exponent_of(float x) { return int(__float_as_uint(x) >> 23) - 127; }

// The least float at or above x: a bound that stays one when rounded to float.
__device__ __forceinline__ float float_at_least(double x) {
  const float f = float(x);
  return double(f) < x ? nextafterf(f, INFINITY) : f;
}

// The largest of `first` (>= 0) and segment s's 8 values, a NaN if any is one. The cells are sums of
// products of values >= 0 (never -0), and a NaN made on the GPU is 0x7fffffff, so their bits order as
// signed integers as the values do, a NaN above all: three-way integer maxima (VIMNMX3, one instruction
// for three) take 4 instructions for these 9 values, where float maxima take 8.
template <int R>
__device__ __forceinline__ float segment_max(float first, const float (&v)[R], int s) {
  const float* const x = v + s * kSegment;
  auto bits = [](float f) { return __float_as_int(f); };
  return __int_as_float(__vimax3_s32(__vimax3_s32(bits(first), bits(x[0]), bits(x[1])),
                                     __vimax3_s32(bits(x[2]), bits(x[3]), bits(x[4])),
                                     __vimax3_s32(bits(x[5]), bits(x[6]), bits(x[7]))));
}

// One query row of the profile for every letter, 32 rows at a time: lane l writes row 32 m + l (letter
// `letter`, any letter past the query) at its ring slot and, for the upper half of the ring's odd chunks,
// at the mirror slot below.
__device__ __forceinline__ void fill_chunk(float* ring, const float* table, int stride, int K, int m, int letter,
                                           int lane) {
  const int row = ((m & 1) << 5) + lane;  // the row's place in the ring, (32 m + lane) mod 64
  const int slot = row + kWarp - 1;
  // A lane l reads row i at step k = i + l at slot (k mod 64) + 31 - l: (i mod 64) + 31 where k mod 64 >= l,
  // else (i mod 64) - 33, which happens for i mod 64 in [33, 63] only.
  const bool mirrored = row > kWarp;
  const float* const powers = table + letter * stride;
  for (int a = 0; a < K; ++a) {
    const float p = powers[a];
    ring[a * kRingSlots + slot] = p;
    if (mirrored) ring[a * kRingSlots + slot - kRingRows] = p;
  }
}

template <bool AFFINE>
using Edge = std::conditional_t<AFFINE, EdgeAffine, EdgeLinear>;

// One lane's target and what its group's sweep reads and writes: the kernel's set-up.
template <bool AFFINE>
struct SoftLane {
  const float* table;  // the matrix's powers in shared memory, rows of `stride`
  float* ring;         // the warp's profile ring
  int stride, lane, g, len;
  const uint8_t* codes;  // the target
  Edge<AFFINE>* edge;    // the group's tile edges, where its target takes several tiles
  float upper, floor_value;
  float floor_first;  // a segment whose first cell is at least this has every cell above the floor
  float middle;       // 2^T, where a rescaled segment's largest value lands
  unsigned ring_lane;  // the first slot the lane reads in its letter's rows
};

// The group sweeps `tiles` tiles of G R columns; the lane's best cells go into best_key, and a check that
// failed (an overflow, a NaN, a cell under the floor) sets failed.
template <int G, int R, bool AFFINE>
__device__ __forceinline__ void soft_sweep(const SearchSoftCall& call, const SoftLane<AFFINE>& w, int tiles,
                                           long long& best_key, bool& failed) {
  static_assert(R % kSegment == 0 && kWarp % G == 0, "lanes of whole segments, groups of whole warps");
  constexpr int S = R / kSegment;  // segments a lane
  constexpr int W = G * R;         // columns a tile
  // Only the widest groups take targets of several tiles (launch_lanes: a narrower class holds its launch's
  // widest target in one), so only they carry the edge's reads and writes through the steps.
  constexpr bool kEdges = G == kWarp;
  const int K = call.K, stride = w.stride, lane = w.lane, g = w.g, M = call.M, len = w.len;
  const float* const table = w.table;
  float* const ring = w.ring;
  const uint8_t* const codes = w.codes;
  Edge<AFFINE>* const edge = w.edge;
  const float upper = w.upper, floor_value = w.floor_value, floor_first = w.floor_first, middle = w.middle;
  // Where an input past 2^U lands: 2^T affine; linear 2^(2T - U), as far under 2^T as 2^T is under 2^U. A
  // linear segment's cells are then below 2^T, with room to grow under the strong input before the next
  // rescale. (An affine segment's first cell is only at least O times its input: landing lower would put
  // it near floor_first, and the segment would rise again at once.)
  const int landing = AFFINE ? call.middle : 2 * call.middle - call.upper;
  const float gf = call.gap_factor, ef = call.extend_factor;  // G, or O and E - O
  [[maybe_unused]] const float whole = gf + ef;                // affine: E (O + (E - O), as the model sums it)
  const unsigned ring_lane = w.ring_lane;
  Edge<AFFINE> border{};
  border.x = 1.0f, border.sig = 0;
  if constexpr (AFFINE) border.xt = 1.0f;

  for (int tile = 0; tile < tiles; ++tile) {
    const int c0 = tile * W + g * R;
    unsigned at[R];  // the shared address of slot 31 - lane in each column's letter's rows
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int c = c0 + r;
      const int letter = c < len ? min(int(codes[c]), K) : K;
      at[r] = ring_lane + 4u * unsigned(letter * kRingSlots);
    }
    const int inside = len - c0;  // this lane's columns inside the target (may be <= 0 or > R)
    float up[R], yt[AFFINE ? R : 1];  // stored E of the row above; affine: Y~ of this row's cells
#pragma unroll
    for (int r = 0; r < R; ++r) {
      up[r] = 1.0f;
      if constexpr (AFFINE) yt[r] = 1.0f;
    }
    int sig[S];
    // low: floor_first where sigma > F, else 0 (every cell is then at least 2^-sigma >= 2^-F, at any scale);
    // fa, fb: the conversion from the segment to the left (conversion() below)
    float one[S], low[S], diag[S], best[S], fa[S], fb[S];
#pragma unroll
    for (int s = 0; s < S; ++s) sig[s] = 0, one[s] = 1.0f, low[s] = 0.0f, diag[s] = 1.0f, best[s] = 0.0f, fa[s] = 1.0f, fb[s] = 1.0f;
    float x_send = 1.0f, xt_send = 1.0f;  // this lane's last column at its last row, for the lane to the right
    int sig_send = 0;
    // Between the ramps, a lane sends its last column already in the scale of the right lane's first segment
    // (x_sent, xt_sent: the conversion that lane would make, so the same floats), and the group's first lane
    // takes the border's 1 in its own first segment's scale (border_in): a step then shuffles one value, not
    // a value and its scale, and its first segment converts nothing. A step converts its last column by
    // out_a, out_b (its last segment's scale to the right lane's first's); all of these are made again
    // wherever a scale they depend on may have changed (refresh, below). A tile's left edge is still
    // converted by the lane that takes it.
    float x_sent = 1.0f, xt_sent = 1.0f, out_a = 1.0f, out_b = 1.0f, border_in = 1.0f;
    // The left edge's rows, in a tile after the target's first: lane l holds row 32 c + l of the chunk c of
    // steps being swept (edge_now) and of the next (edge_next, read a chunk ahead, at the profile's fill),
    // and lane 0 takes row k's by a shuffle at step k. The buffer is read a whole tile after it was
    // written (past the L2 for long queries): read a step ahead, the load could stall the warp at the next.
    const bool reads_edge = kEdges && tile > 0;  // the whole warp (G = 32: one group)
    const bool writes_edge = kEdges && tile + 1 < tiles && g == G - 1;
    Edge<AFFINE> edge_now = border, edge_next = border;
    if (reads_edge) edge_now = edge[min(lane, M - 1)], edge_next = edge[min(kWarp + lane, M - 1)];
    int letter_next = lane < M ? call.query[lane] : 0;
    const int steps = M + kWarp - 1;
    // Rescale segment s by 2^-shift (exact: a power of two in two factors), its best so far folded into
    // best_key first, as the key of its own scale.
    auto rescale = [&](const int s, const int shift) {
      float sa, sb;
      split_pow2(-shift, sa, sb);
      failed |= !(best[s] <= FLT_MAX);  // an overflow or a NaN
      if (best[s] > 0.0f) best_key = max(best_key, scaled_key(sig[s], best[s]));
      best[s] = 0.0f;
      sig[s] += shift;
#pragma unroll
      for (int r = 0; r < kSegment; ++r) {
        up[s * kSegment + r] = up[s * kSegment + r] * sa * sb;
        if constexpr (AFFINE) yt[s * kSegment + r] = yt[s * kSegment + r] * sa * sb;
      }
      diag[s] = diag[s] * sa * sb;
      one[s] = __int_as_float(max(127 - sig[s], 0) << 23);  // 2^-sigma, 0 past the float range
      low[s] = sig[s] > call.floor ? floor_first : 0.0f;
    };
    // The conversion of an input by 2^d, as factors fa, fb: affine in one multiply (pow2_or_nan, fb unused),
    // linear in two (split_pow2): one multiply made the affine step faster and the linear one slower.
    auto conversion = [](const int d, float& a, float& b) {
      if constexpr (AFFINE) a = pow2_or_nan(d);
      else split_pow2(d, a, b);
    };
    auto convert = [](const float x, const float a, const float b) { return AFFINE ? x * a : x * a * b; };
    // x from a scale d above the lane's, as a lane converts an input
    auto converted = [&](const float x, const int d) {
      float a, b = 1.0f;  // (b: linear only)
      conversion(d, a, b);
      return convert(x, a, b);
    };
    // The conversions of what a lane sends and what the border gives, after its or its right neighbour's
    // scales may have changed: the whole warp, converged.
    auto refresh = [&]() {
      const int right = __shfl_down_sync(kFull, sig[0], 1, G);  // (the group's last lane: unused)
      conversion(sig[S - 1] - right, out_a, out_b);
      // from x_send's scale: a settle may have rescaled its segment since
      x_sent = converted(x_send, sig_send - right);
      if constexpr (AFFINE) xt_sent = converted(xt_send, sig_send - right);
      border_in = converted(1.0f, -sig[0]);
    };
    // Whether any lane of the warp has cond: a branch the whole warp takes or skips (no divergence to
    // reconverge from), where every lane is in the step; in a ramp, the lane's own.
    auto any = [](bool cond, auto ramp) { return decltype(ramp)::value ? cond : __any_sync(kFull, cond); };
    // Inside such a branch: keeps the compiler from folding the lane's own test into the warp's (which
    // would make the branch divergent again, with its reconvergence on every step).
    auto converge = [](auto ramp) {
      if (!decltype(ramp)::value) __syncwarp();
    };
    // One step of the wavefront. RAMP: some lanes are past the query's ends (the first and the last 31
    // steps). The steps between take a copy without that test, so that no lane diverges there and the
    // ring's offset stays in a uniform register (one LDS a cell, no address arithmetic).
    // The next 32 rows of the profile, at a step that is a multiple of 32.
    auto fill = [&](const int k) {
      __syncwarp();
      fill_chunk(ring, table, stride, K, k >> 5, letter_next, lane);
      letter_next = k + kWarp + lane < M ? call.query[k + kWarp + lane] : 0;
      if (reads_edge && k > 0) edge_now = edge_next, edge_next = edge[min(k + kWarp + lane, M - 1)];
      __syncwarp();
    };
    // The rescaling after a step where a lane found a segment for it (step's `rescaling`): a segment that
    // needs none is left as it is, so every lane may take it (no flag kept across the step for it).
    auto settle = [&]() {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const float hi = segment_max(0.0f, up, s);
        const bool near_floor = up[s * kSegment] < low[s];
        if (near_floor) {  // the cells inside the target, against the floor
          float lo = FLT_MAX;
#pragma unroll
          for (int r = 0; r < kSegment; ++r)
            if (s * kSegment + r < inside) lo = min_nan(lo, up[s * kSegment + r]);
          failed |= !(lo >= floor_value);
        }
        // Past 2^U: down to 2^T. Near the floor: up to 2^T, where that raises it (a segment whose cells
        // spread past T + F bits stays, and is checked on every row). A segment that only shrinks is left at
        // its scale for as long as its cells clear the floor.
        if (hi > upper || (near_floor && hi < middle)) rescale(s, max(exponent_of(hi) - call.middle, -sig[s]));
        if (s > 0) conversion(sig[s - 1] - sig[s], fa[s], fb[s]);
      }
    };
    // One row of the lane's columns; in the ramp it settles its own lane and returns false, between the ramps
    // it returns whether any lane of the warp needs settling, which the caller then does.
    auto step = [&](const int k, auto ramp) -> bool {
      const int i = k - lane;
      const unsigned offset = unsigned(k & (kRingRows - 1)) << 2;  // the same in every lane: a uniform register
      // The input as sent (raw: x_in in the scale sig_in), where the lane converts it: in the ramps and where
      // the warp takes a tile's left edge; else (sent) as converted by its sender (lv0, xt0).
      const bool sent = !decltype(ramp)::value && !reads_edge;
      float x_in, xt_in = 0.0f, lv0, xt0 = 0.0f;
      int sig_in;
      // The raw input: the left lane's last column, or row k of the left edge (lane 0's; past the ends: a row
      // no step uses), or the border.
      auto take_raw = [&]() {
        x_in = __shfl_up_sync(kFull, x_send, 1, G);
        sig_in = __shfl_up_sync(kFull, sig_send, 1, G);
        if constexpr (AFFINE) xt_in = __shfl_up_sync(kFull, xt_send, 1, G);
        Edge<AFFINE> here = border;
        if (reads_edge) {
          here.x = __shfl_sync(kFull, edge_now.x, k & (kWarp - 1));
          here.sig = __shfl_sync(kFull, edge_now.sig, k & (kWarp - 1));
          if constexpr (AFFINE) here.xt = __shfl_sync(kFull, edge_now.xt, k & (kWarp - 1));
        }
        if (g == 0) {
          x_in = here.x, sig_in = here.sig;
          if constexpr (AFFINE) xt_in = here.xt;
        }
      };
      if (sent) {
        lv0 = __shfl_up_sync(kFull, x_sent, 1, G);
        if constexpr (AFFINE) xt0 = __shfl_up_sync(kFull, xt_sent, 1, G);
        if (g == 0) {
          lv0 = border_in;
          if constexpr (AFFINE) xt0 = border_in;
        }
      } else {
        take_raw();
        lv0 = converted(x_in, sig_in - sig[0]);
        if constexpr (AFFINE) xt0 = converted(xt_in, sig_in - sig[0]);
      }
      if (decltype(ramp)::value && unsigned(i) >= unsigned(M)) return false;
      // some segment of the lane passed 2^U, or has sigma > F and its first cell under floor_first
      bool rescaling = false;
      // The input where it is converted (segment 0: taken raw, else the segment to the left's last column).
      // Sent, segment 0's is taken only where it is read, in the branch past 2^U; never read before.
      float x_last, xt_last;
      int sig_last;
      if (!sent) x_last = x_in, xt_last = xt_in, sig_last = sig_in;
#pragma unroll
      for (int s = 0; s < S; ++s) {
        float a0 = fa[s], b0 = fb[s];
        float lv = s == 0 ? lv0 : convert(x_last, a0, b0);
        float xt = !AFFINE ? 0.0f : s == 0 ? xt0 : convert(xt_last, a0, b0);
        const bool over = !(lv <= upper);  // affine: or a conversion past one factor (a NaN)
        if (any(over, ramp)) {
          converge(ramp);
          if (s == 0 && sent) {  // the whole warp (between the ramps): the input as sent, to convert again
            take_raw();
            x_last = x_in, xt_last = xt_in, sig_last = sig_in;
          }
          const int delta = sig_last - sig[s];
          bool passes = over;
          if constexpr (AFFINE) {
            if (over) {  // converted again in two factors
              split_pow2(delta, a0, b0);
              lv = x_last * a0 * b0, xt = xt_last * a0 * b0;
              passes = !(lv <= upper);
            }
          }
          if (passes) {
          // The input passes 2^U (or overflowed in the conversion): rescale the segment first, so that
          // the input lands at 2^landing, and convert it again: a strong alignment entering from the left.
          const int shift = exponent_of(x_last) + delta - landing;
          rescale(s, shift);
          split_pow2(delta - shift, a0, b0);
          lv = x_last * a0 * b0;
          if constexpr (AFFINE) xt = xt_last * a0 * b0;
          if (s > 0) conversion(delta - shift, fa[s], fb[s]);
          if (s + 1 < S) conversion(sig[s] - sig[s + 1], fa[s + 1], fb[s + 1]);
          }
          if constexpr (!decltype(ramp)::value) refresh();  // a scale may have changed (the whole warp)
        }
        [[maybe_unused]] float left = lv;  // the linear sweep's left neighbour (affine carries xt)
        const float o = one[s];
        // The diagonal term of each cell is taken before the cell to its left overwrites up[] in place:
        // the old value is then dead once its cell is written, so no register moves between steps.
        float dp = fmaf(diag[s], load_shared(at[s * kSegment] + offset), o);
#pragma unroll
        for (int r = 0; r < kSegment; ++r) {
          const int q = s * kSegment + r;
          const float u = up[q];
          const float dp_next = r + 1 < kSegment ? fmaf(u, load_shared(at[q + 1] + offset), o) : 0.0f;
          float x;
          if constexpr (AFFINE) {
            // X~' from Z, not from H: the chain along the row is then one multiply-add a cell, not three.
            const float z = fmaf(gf, yt[q], dp);
            x = fmaf(gf, xt, z);
            xt = fmaf(whole, xt, z);
            yt[q] = fmaf(ef, yt[q], x);
          } else {
            x = fmaf(left, gf, fmaf(u, gf, dp));
            left = x;
          }
          dp = dp_next;
          up[q] = x;
        }
        // best[s] is the largest value since the segment's last rescale, which any value past 2^U brings
        // about at once: so best[s] > 2^U where this row's largest value is.
        best[s] = segment_max(best[s], up, s);
        rescaling |= best[s] > upper || up[s * kSegment] < low[s];
        diag[s] = lv;
        x_last = up[s * kSegment + kSegment - 1], xt_last = xt, sig_last = sig[s];
      }
      x_send = x_last, xt_send = xt_last, sig_send = sig_last;
      if constexpr (!decltype(ramp)::value) {  // (a ramp's steps: the refresh before the loop)
        x_sent = convert(x_last, out_a, out_b);
        if constexpr (AFFINE) xt_sent = convert(xt_last, out_a, out_b);
      }
      if (writes_edge) {
        Edge<AFFINE> e;
        e.x = x_send, e.sig = sig_send;
        if constexpr (AFFINE) e.xt = xt_send;
        edge[i] = e;
      }
      // Where a lane has a segment past 2^U, or one with sigma > F whose first cell is under floor_first
      // (each cell is at least C times its left neighbour, C: G (1 - 2^-24), affine O (1 - 2^-24) through
      // X~, which is at least the cell's H as E >= O, which the plan requires; so the segment's cells are at
      // least C^7 times its first: where that clears the floor, which long sweeps almost always do, this one
      // test stands for the 8 cells). One test on values already in registers, so that the warp settles
      // only after the steps where a lane needs it.
      if constexpr (decltype(ramp)::value) {
        if (rescaling) settle();
        return false;
      } else {
        return __any_sync(kFull, rescaling);
      }
    };
    // A step of the ramps, after the profile's fill where a chunk starts.
    auto ramp_step = [&](const int k) {
      if ((k & (kWarp - 1)) == 0) fill(k);
      step(k, std::true_type{});
    };
    int k = 0;
    for (; k < min(kWarp - 1, steps); ++k) ramp_step(k);
    // The ramp's lanes took their inputs raw and settled on their own: what they send, made once for the loop.
    refresh();
    // The steps between, a chunk of the profile at a time: the fill's test stays out of the steps' loop, whose
    // bound (the chunk's end) is then a register, not the query's length reloaded from the launch's
    // parameters; and the loop leaves to settle, so that the steps that need no rescaling (almost all) take
    // one branch, the loop's own, where jumping over the rescaling's code cost a second.
    while (k < M) {
      if ((k & (kWarp - 1)) == 0) fill(k);
      const int chunk_end = min((k | (kWarp - 1)) + 1, M);
      bool unsettled = false;
#pragma unroll 1
      do unsettled = step(k++, std::false_type{});
      while (!unsettled && k < chunk_end);
      if (unsettled) {
        __syncwarp();
        settle();
        refresh();
      }
    }
    for (; k < steps; ++k) ramp_step(k);
#pragma unroll
    for (int s = 0; s < S; ++s) {
      failed |= !(best[s] <= FLT_MAX);
      if (best[s] > 0.0f) best_key = max(best_key, scaled_key(sig[s], best[s]));
    }
    __syncwarp();  // the last lane's edge writes are visible to the first lane in the next tile
  }
}

// Columns a lane, by warp (warp_columns in common.cuh): whole segments, 8 to 32; past one tile, the most
// or a segment fewer. (Linear tiles of 16 columns too, beside the 24 and 32 of the same launch's targets,
// slowed that launch by instruction-cache misses more than their padding saved.)
template <bool AFFINE>
inline constexpr int kMostColumns = AFFINE ? 24 : 32;  // the affine cell holds Y~ too: 32 would spill
template <bool AFFINE>
inline constexpr int kFewestColumns = kMostColumns<AFFINE> - kSegment;

template <int G, bool AFFINE>
__global__ void __launch_bounds__(kSoftThreads, 4) search_soft_kernel(const SearchSoftCall call) {
  extern __shared__ float smem[];
  const int K = call.K, stride = K | 1;  // an odd stride: the fill's lanes, at different letters, hit different banks
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  float* const table = smem;
  float* const ring = smem + K * stride + warp * (K + 1) * kRingSlots;
  for (int e = threadIdx.x; e < K * K; e += kSoftThreads) table[(e / K) * stride + e % K] = call.powers[e];
  for (int s = lane; s < kRingSlots; s += kWarp) ring[K * kRingSlots + s] = 0.0f;  // the padding letter
  __syncthreads();

  const int64_t first = (int64_t(blockIdx.x) * kSoftWarps + warp) * (kWarp / G);
  if (first >= call.B) return;  // a whole warp leaves together
  const int64_t group = first + lane / G;
  const int g = lane % G, M = call.M;
  // Groups past the batch sweep the last target again and write nothing.
  const bool writes = group < call.B;
  const int64_t b = writes ? group : call.B - 1;
  SoftLane<AFFINE> w;
  w.table = table, w.ring = ring, w.stride = stride, w.lane = lane, w.g = g;
  w.len = int(call.tlen[b]);
  w.codes = call.target + b * call.N;
  w.edge = call.boundary ? static_cast<Edge<AFFINE>*>(call.boundary) + group * int64_t(M) : nullptr;
  w.upper = pow2_int(call.upper), w.floor_value = pow2_int(-call.floor);
  const double chain = double(call.gap_factor) * (1.0 - 1e-6);  // 1 - 1e-6 < (1 - 2^-24)^7
  const double floor_first = ldexp(1.0, -call.floor) / (chain * chain * chain * chain * chain * chain * chain);
  w.floor_first = float_at_least(floor_first);  // 2^-F / C^7
  w.middle = pow2_int(call.middle);
  // The first slot a lane reads in its letter's rows: k mod 64 is then added, the same in every lane.
  w.ring_lane = unsigned(__cvta_generic_to_shared(ring)) + 4u * unsigned(kWarp - 1 - lane);
  const int widest = __reduce_max_sync(kFull, unsigned(w.len));
  const int columns = warp_columns(G, widest, kMostColumns<AFFINE>, kSegment, kFewestColumns<AFFINE>);
  const int tiles = (widest + G * columns - 1) / (G * columns);  // 0 where every target is empty
  long long best_key = scaled_key(0, 1.0f);  // the zero border, E = 1
  bool failed = false;
  sweep_by_columns<kSegment, kMostColumns<AFFINE>, kSegment>(
      columns, [&](auto R) { soft_sweep<G, decltype(R)::value, AFFINE>(call, w, tiles, best_key, failed); });
  const int len = w.len;
#pragma unroll
  for (int off = G / 2; off > 0; off /= 2) best_key = max(best_key, __shfl_xor_sync(kFull, best_key, off, G));
  const unsigned group_failed = __ballot_sync(kFull, failed) >> (lane / G * G);
  if (writes && g == 0) {
    const bool flagged = len > 0 && ((group_failed & (G == kWarp ? kFull : (1u << G) - 1u)) != 0 ||
                                     best_key <= scaled_key(0, call.bound));
    float score = 0.0f;
    if (len > 0 && !flagged) {
      const int e = int(best_key >> 23) - 127;
      score = float(call.tl * (double(e) + log2(double(mantissa_of(unsigned(best_key))))));
    }
    call.scores[b] = flagged ? -1.0f : score;
    if (flagged) atomicAdd(call.flagged, 1);
  }
}

size_t shared_bytes(int K) {
  return sizeof(float) * (size_t(K) * (K | 1) + size_t(kSoftWarps) * (K + 1) * kRingSlots);
}

template <int G, bool AFFINE>
cudaError_t launch_soft(const SearchSoftCall& call, cudaStream_t stream) {
  const int64_t warps = (call.B + kWarp / G - 1) / (kWarp / G);
  const int64_t blocks = (warps + kSoftWarps - 1) / kSoftWarps;
  const size_t shared = shared_bytes(call.K);
  cudaError_t err = cudaFuncSetAttribute(search_soft_kernel<G, AFFINE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(shared));
  if (err != cudaSuccess) return err;
  search_soft_kernel<G, AFFINE><<<unsigned(blocks), kSoftThreads, shared, stream>>>(call);
  return cudaGetLastError();
}

template <bool AFFINE>
cudaError_t search_any(const SearchSoftCall& call, cudaStream_t stream) {
  return launch_by_lanes(call.width, kMostColumns<AFFINE>,
                         [&](auto G) { return launch_soft<decltype(G)::value, AFFINE>(call, stream); });
}

template <bool AFFINE>
int64_t edge_bytes(int64_t B, int64_t M, int64_t N) {
  const int G = launch_lanes(N, kMostColumns<AFFINE>);
  if (N <= int64_t(G) * kMostColumns<AFFINE>) return 0;  // one tile
  const int64_t per_warp = kWarp / G;
  const int64_t groups = (B + per_warp - 1) / per_warp * per_warp;  // the groups past the batch have rows too
  return groups * M * int64_t(sizeof(Edge<AFFINE>));
}

}  // namespace
}  // namespace swcli_cuda

int64_t sw_cuda_search_soft_edge_bytes(int64_t B, int64_t M, int64_t width, bool affine) {
  using namespace swcli_cuda;
  return affine ? edge_bytes<true>(B, M, width) : edge_bytes<false>(B, M, width);
}

int64_t sw_cuda_search_soft_shared_bytes(int K) { return int64_t(swcli_cuda::shared_bytes(K)); }

cudaError_t sw_cuda_search_soft(const SearchSoftCall& call, cudaStream_t stream) {
  using namespace swcli_cuda;
  if (call.B == 0) return cudaSuccess;
  return call.affine ? search_any<true>(call, stream) : search_any<false>(call, stream);
}
