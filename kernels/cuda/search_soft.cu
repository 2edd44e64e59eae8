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
// Layout: a warp sweeps tiles of 32 lanes of R columns (whole segments, below) down the query's rows as a
// wavefront, lane l on row k - l at step k, so that the 32 lanes read 32 consecutive rows of the profile,
// one bank each. Its targets lie end to end in its lanes, ceil(length / R) lanes each: a tile holds the
// end of one target, whole ones and the start of the next, and a target's first lane takes the border
// where another would take its left neighbour's column. The warps take the launch's targets in order as
// their tiles need them (a counter in memory), so that each warp's last tile is all it pads and the
// warps end within about a tile of each other; a target pays under a lane of padding. A tile's right
// edge goes to the next through a buffer (staged in shared memory, stored 32
// rows at a time, read a chunk of 32 rows ahead), and each target's best cell into its key (atomicMax)
// that a last small kernel turns into its score.
//
// The profile: a warp keeps a ring of 64 rows of it (P for every letter at each query row), written 32 rows
// at a time from the matrix's table of powers, and read at slot (k mod 64) + 31 - lane with a mirror of 32
// slots below the ring, so that a lane's column reads its letter's row at a shared-memory address plus
// an offset that is the same for the whole warp (one LDS a cell, no address arithmetic). The padding
// letter K has P = 0.
//
// Scale: values are kept as float32 times 2^sigma, sigma an integer per 8 columns (a segment), the same 8
// columns of the target wherever it lies in the lanes and tiles. A segment is rescaled down where its largest value passes
// 2^U, or where its left input would, and up only where sigma > F and its cells near the floor (below): by
// a power of two, an exact multiply. A segment's input, the last column of the segment to its left (in this
// lane, the lane to the left, or the previous tile), is converted from that segment's scale by
// 2^(sigma' - sigma) in two factors (affine: in one where that is a normal float), exact wherever the
// result is a normal float (an input from the lane to the left is converted by that lane, with the same
// factors; a target's first lane takes the border's 1, converted as any input). So every cell is the same
// float computation whatever the lanes, tiles, warps and neighbouring targets: a pair's score has the
// same bits in every block it can be scored in.
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

// One warp a block: its index, and so its edge buffer's address, are then the block's, in uniform registers
// (4 warps a block spilled more and took 7% longer).
inline constexpr int kSoftWarps = 1;
inline constexpr int kSoftThreads = kSoftWarps * kWarp;
inline constexpr int kSoftBlocksPerSM = 16;  // the launch bounds: 128 registers a lane
inline constexpr int kSegment = 8;                     // columns a scale
inline constexpr int kRingRows = 64;                   // two chunks of 32 query rows
inline constexpr int kRingSlots = kRingRows + kWarp;   // a letter's slots: the ring above a mirror of 32
inline constexpr int kEdgeStage = 2 * kWarp;           // edge rows staged in shared memory, a warp

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
__device__ __forceinline__ void fill_chunk(float* __restrict__ ring, const float* __restrict__ table, int stride,
                                           int K, int m, int letter, int lane) {
  const int row = ((m & 1) << 5) + lane;  // the row's place in the ring, (32 m + lane) mod 64
  const int slot = row + kWarp - 1;
  // A lane l reads row i at step k = i + l at slot (k mod 64) + 31 - l: (i mod 64) + 31 where k mod 64 >= l,
  // else (i mod 64) - 33, which happens for i mod 64 in [33, 63] only.
  const bool mirrored = row > kWarp;
  const float* const powers = table + letter * stride;
  auto put = [&](const int a, const float p) {
    ring[a * kRingSlots + slot] = p;
    if (mirrored) ring[a * kRingSlots + slot - kRingRows] = p;
  };
  // 8 loads, then their stores: one wait on the loads for 8 letters, not one a letter.
  constexpr int kBatch = 8;
  int a = 0;
  for (; a + kBatch <= K; a += kBatch) {
    float p[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) p[j] = powers[a + j];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) put(a + j, p[j]);
  }
  for (; a < K; ++a) put(a, powers[a]);
}

template <bool AFFINE>
using Edge = std::conditional_t<AFFINE, EdgeAffine, EdgeLinear>;

// The launch's scratch memory: the count of targets taken, each target's key (B), then each warp's tile
// edge (M rows a warp).
struct Scratch {
  unsigned long long* taken;
  long long* keys;
  void* edge_rows;
  __host__ __device__ static int64_t edges_offset(int64_t B) {
    return ((B + 1) * int64_t(sizeof(long long)) + 15) / 16 * 16;
  }
  static int64_t bytes(int64_t B, int64_t M, int64_t warps, size_t edge) {
    return edges_offset(B) + warps * M * int64_t(edge);
  }
  template <bool AFFINE>
  __device__ __forceinline__ Edge<AFFINE>* edges() const { return static_cast<Edge<AFFINE>*>(edge_rows); }
};

__device__ __forceinline__ Scratch scratch_of(const SearchSoftCall& call) {
  char* const base = static_cast<char*>(call.scratch);
  return Scratch{reinterpret_cast<unsigned long long*>(base), reinterpret_cast<long long*>(base) + 1,
                 base + Scratch::edges_offset(call.B)};
}

// One lane's set-up: what its warp's sweep reads and writes.
template <bool AFFINE>
struct SoftLane {
  const float* table;  // the matrix's powers in shared memory, rows of `stride`
  float* ring;         // the warp's profile ring
  int stride, lane;
  unsigned long long* taken;  // the launch's targets taken so far, in order, by all its warps
  Edge<AFFINE>* edge;  // the warp's tile edges, a row each
  Edge<AFFINE>* staged;  // the warp's ring of rows on their way there (kEdgeStage), in shared memory
  long long* keys;     // the targets' best cells (scaled_key), kFlaggedKey where a check failed
  float upper, floor_value;
  float floor_first;  // a segment whose first cell is at least this has every cell above the floor
  float middle;       // 2^T, where a rescaled segment's largest value lands
  unsigned ring_lane;  // the first slot the lane reads in its letters' rows
};

// A target's key where one of its checks failed: above every scaled_key.
inline constexpr long long kFlaggedKey = 0x7fffffffffffffffll;

// The warp sweeps its targets in tiles of 32 R columns: each target takes whole lanes, ceil(length / R) of
// them, one after another, so a tile holds the end of one target, whole ones and the start of another
// (a lane past the last target's lanes sweeps padding). A lane's best cells go into its target's key.
template <int R, bool AFFINE>
__device__ __forceinline__ void soft_sweep(const SearchSoftCall& call, const SoftLane<AFFINE>& w) {
  static_assert(R % kSegment == 0, "lanes of whole segments");
  constexpr int S = R / kSegment;  // segments a lane
  const int K = call.K, stride = w.stride, lane = w.lane, M = call.M;
  const float* const table = w.table;
  float* const ring = w.ring;
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

  // The warp's queue: lane l holds its l-th target (-1: none), in the order taken from the launch's.
  int64_t mine = -1;
  int queued = 0;          // targets in the queue
  bool exhausted = false;  // the launch has no target left to take
  int used = 0;            // the first's lanes in the tiles before
  while (true) {
    // The queue's lanes, a prefix sum across it: each target's end, as a lane of this tile. Where they
    // leave lanes of the tile free, the warp takes more targets: a warp takes targets only as it gets to
    // them, so the launch's warps end within about a tile of each other.
    int span, end;
    for (;;) {
      span = mine >= 0 ? int((call.tlen[mine] + R - 1) / R) : 0;  // its lanes
      end = span;
#pragma unroll
      for (int d = 1; d < kWarp; d *= 2) {
        const int before = __shfl_up_sync(kFull, end, d);
        if (lane >= d) end += before;
      }
      end -= used;
      const int filled = __shfl_sync(kFull, end, kWarp - 1);
      if (filled >= kWarp || exhausted || queued == kWarp) break;
      // One into an empty queue; else as many as the free lanes hold where each takes as many lanes as the
      // queue's last (the caller's targets come longest first: where a later one is longer, or the queue's
      // last is empty, the warp may hold more than its next tile, which balances the warps less).
      const int last = queued > 0 ? max(__shfl_sync(kFull, span, queued - 1), 1) : kWarp;
      const int take = min(kWarp - queued, max((kWarp - filled) / last, 1));
      unsigned long long first = 0;
      if (lane == 0) first = atomicAdd(w.taken, static_cast<unsigned long long>(take));
      first = __shfl_sync(kFull, first, 0);
      const int64_t left = first < static_cast<unsigned long long>(call.B) ? call.B - int64_t(first) : 0;
      const int got = int(min(int64_t(take), left));
      if (lane >= queued && lane < queued + got) mine = int64_t(first) + (lane - queued);
      queued += got;
      exhausted = got < take;
    }
    if (queued == 0) break;  // (exhausted)
    // The lane's target: the first whose lanes end past it (none past the queue's last).
    int t = 0;
#pragma unroll
    for (int half = kWarp / 2; half > 0; half /= 2)
      if (__shfl_sync(kFull, end, t + half - 1) <= lane) t += half;
    const int t_end = __shfl_sync(kFull, end, t), t_span = __shfl_sync(kFull, span, t);
    const int64_t b = __shfl_sync(kFull, mine, t);
    const bool has = t_end > lane;  // a lane of a target (else padding past the queue's last)
    const int first_lane = t_end - t_span;  // the target's first lane in this tile (< 0: in a tile before)
    // The next tile: past the targets that end in this one; the last lane's target, if it goes on, first.
    const int done = min(__popc(__ballot_sync(kFull, end <= kWarp)), queued);
    const bool goes_on = __shfl_sync(kFull, has && t_end > kWarp, kWarp - 1);
    const int last_first = __shfl_sync(kFull, first_lane, kWarp - 1);
    const bool reads_edge = used > 0;  // the first lane goes on with a target from the tile before
    const bool writes_edge = goes_on && lane == kWarp - 1;
    mine = __shfl_down_sync(kFull, mine, done);
    if (lane >= kWarp - done) mine = -1;
    queued -= done;
    used = goes_on ? kWarp - last_first : 0;
    if (!__any_sync(kFull, has)) continue;  // targets without residues (their score: the finish's)

    const int len = has ? int(call.tlen[b]) : 0;
    const int c0 = (lane - first_lane) * R;  // the lane's first column in its target
    const bool starts = has && c0 == 0;      // takes the border, not its left neighbour's column
    const uint8_t* const codes = call.target + (has ? b : 0) * call.N;
    unsigned at[R];  // the shared address of slot 31 - lane in each column's letter's rows
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int c = c0 + r;
      const int letter = c < len ? min(int(codes[c]), K) : K;
      at[r] = ring_lane + 4u * unsigned(letter * kRingSlots);
    }
    const int inside = len - c0;  // this lane's columns inside the target (may be <= 0 or > R)
    long long best_key = scaled_key(0, 1.0f);  // the zero border, E = 1
    bool failed = false;
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
    // (x_sent, xt_sent: the conversion that lane would make, so the same floats), and a target's first lane
    // takes the border's 1 in its own first segment's scale (border_in): a step then shuffles one value, not
    // a value and its scale, and its first segment converts nothing. A step converts its last column by
    // out_a, out_b (its last segment's scale to the right lane's first's); all of these are made again
    // wherever a scale they depend on may have changed (refresh, below). A tile's left edge is converted
    // into lane 0's scale a chunk of rows at a time (edge_x, edge_xt, below).
    float x_sent = 1.0f, xt_sent = 1.0f, out_a = 1.0f, out_b = 1.0f, out_c = 0.0f, border_in = 1.0f;
    // The left edge's rows, where the first lane goes on with a target: lane l holds row 32 c + l of the
    // chunk c of steps being swept (edge_now) and of the next (edge_next, read a chunk ahead, at the
    // profile's fill), and lane 0 takes row k's by a shuffle at step k. The buffer is read a whole tile
    // after it was written (past the L2 for long queries): read a step ahead, the load could stall the warp
    // at the next.
    Edge<AFFINE> edge_now = border, edge_next = border;
    if (reads_edge) edge_now = edge[min(lane, M - 1)], edge_next = edge[min(kWarp + lane, M - 1)];
    // Between the ramps, edge_now's row already in the scale of lane 0's first segment, as lane 0 would
    // convert it (made again where that scale or the chunk changes): lane 0 then takes it as sent.
    float edge_x = 1.0f, edge_xt = 1.0f;
    // Rows for the next tile: the last lane stages its row k - 31 at step k in shared memory (a ring of
    // 64 rows, at an address the same for the whole warp), and the fill stores each whole chunk of 32.
    Edge<AFFINE>* const staged = w.staged;
    int stored = 0;  // the rows stored so far
    auto store_rows = [&](const int end) {  // up to row `end`, the whole warp
      for (int row = stored + lane; row < end; row += kWarp) edge[row] = staged[row & (kEdgeStage - 1)];
      stored = max(stored, end);
    };
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
    // scales may have changed: the whole warp, converged. A lane whose right neighbour starts a target
    // sends that lane's border instead, as the multiply-add x 0 + border (out_a 0, out_c the border): the
    // same instructions as the conversion.
    auto refresh = [&]() {
      const int right = __shfl_down_sync(kFull, sig[0], 1);  // (the last lane: unused)
      const bool right_starts = __shfl_down_sync(kFull, starts, 1);
      conversion(sig[S - 1] - right, out_a, out_b);
      out_c = right_starts ? converted(1.0f, -right) : 0.0f;
      if (right_starts) out_a = 0.0f;
      // from x_send's scale: a settle may have rescaled its segment since
      x_sent = right_starts ? out_c : converted(x_send, sig_send - right);
      if constexpr (AFFINE) xt_sent = right_starts ? out_c : converted(xt_send, sig_send - right);
      border_in = converted(1.0f, -sig[0]);
      if (reads_edge) {
        const int first = __shfl_sync(kFull, sig[0], 0);
        edge_x = converted(edge_now.x, edge_now.sig - first);
        if constexpr (AFFINE) edge_xt = converted(edge_now.xt, edge_now.sig - first);
      } else {  // lane 0's target starts in this tile: it takes its border where it would take the edge
        edge_x = edge_xt = __shfl_sync(kFull, border_in, 0);
      }
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
      if (goes_on && k >= 2 * kWarp) store_rows(min(k - kWarp, M));  // rows staged at steps before k
      if (reads_edge && k > 0) {
        edge_now = edge_next, edge_next = edge[min(k + kWarp + lane, M - 1)];
        const int first = __shfl_sync(kFull, sig[0], 0);
        edge_x = converted(edge_now.x, edge_now.sig - first);
        if constexpr (AFFINE) edge_xt = converted(edge_now.xt, edge_now.sig - first);
      }
      __syncwarp();
    };
    // The rescaling after a step where a lane found a segment for it (step's `rescaling`): a segment that
    // needs none is left as it is, so every lane may take it (no flag kept across the step for it).
    auto settle = [&]() {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const float hi = segment_max(0.0f, up, s);
        // (the step's float test, here on the bits, which order as the values do: the compiler would
        // otherwise keep the step's result for it in a register through every step)
        const bool near_floor = __float_as_int(up[s * kSegment]) < __float_as_int(low[s]);
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
      // The input as sent (raw: x_in in the scale sig_in), where the lane converts it: in the ramps; else
      // (sent) as converted by its sender (lv0, xt0).
      const bool sent = !decltype(ramp)::value;
      // The profile's P of a segment's columns, loaded a segment ahead (p_next: during the segment before),
      // so that a segment's first cells do not wait on its loads: the branch on its input keeps the
      // compiler from moving them above it.
      float p[kSegment], p_next[kSegment];
#pragma unroll
      for (int r = 0; r < kSegment; ++r) p[r] = load_shared(at[r] + offset);
      float x_in, xt_in = 0.0f, lv0, xt0 = 0.0f;
      int sig_in;
      // The raw input: the left lane's last column, or row k of the left edge (lane 0's, where it goes on
      // with a target; past the ends: a row no step uses), or the border (a target's first lane).
      auto take_raw = [&]() {
        x_in = __shfl_up_sync(kFull, x_send, 1);
        sig_in = __shfl_up_sync(kFull, sig_send, 1);
        if constexpr (AFFINE) xt_in = __shfl_up_sync(kFull, xt_send, 1);
        Edge<AFFINE> here = border;
        if (reads_edge) {
          here.x = __shfl_sync(kFull, edge_now.x, k & (kWarp - 1));
          here.sig = __shfl_sync(kFull, edge_now.sig, k & (kWarp - 1));
          if constexpr (AFFINE) here.xt = __shfl_sync(kFull, edge_now.xt, k & (kWarp - 1));
        }
        if (starts) here = border;
        if (starts || lane == 0) {
          x_in = here.x, sig_in = here.sig;
          if constexpr (AFFINE) xt_in = here.xt;
        }
      };
      if (sent) {
        lv0 = __shfl_up_sync(kFull, x_sent, 1);
        if constexpr (AFFINE) xt0 = __shfl_up_sync(kFull, xt_sent, 1);
        // Lane 0 takes row k of the edge, converted (or its border: refresh); another lane whose target
        // starts here got its border from its left neighbour.
        const float x = __shfl_sync(kFull, edge_x, k & (kWarp - 1));
        [[maybe_unused]] const float xt = AFFINE ? __shfl_sync(kFull, edge_xt, k & (kWarp - 1)) : 0.0f;
        if (lane == 0) {
          lv0 = x;
          if constexpr (AFFINE) xt0 = xt;
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
          // Affine: converted again in two factors. Linear, the first segment's input as sent: converted
          // again too, the same float, but for a border sent as x 0 + border where x was not finite.
          if (AFFINE ? over : s == 0 && sent) {
            split_pow2(delta, a0, b0);
            lv = x_last * a0 * b0;
            if constexpr (AFFINE) xt = xt_last * a0 * b0;
            passes = !(lv <= upper);
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
#pragma unroll
        for (int r = 0; r < kSegment; ++r)
          if (s + 1 < S) p_next[r] = load_shared(at[(s + 1) * kSegment + r] + offset);
        [[maybe_unused]] float left = lv;  // the linear sweep's left neighbour (affine carries xt)
        const float o = one[s];
        // The diagonal term of each cell is taken before the cell to its left overwrites up[] in place:
        // the old value is then dead once its cell is written, so no register moves between steps.
        float dp = fmaf(diag[s], p[0], o);
#pragma unroll
        for (int r = 0; r < kSegment; ++r) {
          const int q = s * kSegment + r;
          const float u = up[q];
          const float dp_next = r + 1 < kSegment ? fmaf(u, p[r + 1], o) : 0.0f;
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
#pragma unroll
        for (int r = 0; r < kSegment; ++r) p[r] = p_next[r];
      }
      x_send = x_last, xt_send = xt_last, sig_send = sig_last;
      if constexpr (!decltype(ramp)::value) {  // (a ramp's steps: the refresh before the loop)
        x_sent = AFFINE ? fmaf(x_last, out_a, out_c) : fmaf(x_last * out_a, out_b, out_c);
        if constexpr (AFFINE) xt_sent = fmaf(xt_last, out_a, out_c);
      }
      if (writes_edge) {
        Edge<AFFINE> e;
        e.x = x_send, e.sig = sig_send;
        if constexpr (AFFINE) e.xt = xt_send;
        staged[(k - (kWarp - 1)) & (kEdgeStage - 1)] = e;
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
    if (goes_on) {
      __syncwarp();
      store_rows(M);
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      failed |= !(best[s] <= FLT_MAX);
      if (best[s] > 0.0f) best_key = max(best_key, scaled_key(sig[s], best[s]));
    }
    if (has) atomicMax(w.keys + b, failed ? kFlaggedKey : best_key);  // (lanes past the last target: none)
    __syncwarp();  // the stored edge rows are visible to the whole warp in the next tile
  }
}

// The powers' table, then each warp's profile ring, then each warp's staged edge rows (16-byte aligned).
__host__ __device__ size_t rings_end(int K) { return sizeof(float) * (size_t(K) * (K | 1) + size_t(kSoftWarps) * (K + 1) * kRingSlots); }
size_t shared_bytes(int K) { return (rings_end(K) + 15) / 16 * 16 + kSoftWarps * kEdgeStage * sizeof(EdgeAffine); }

// Columns a lane: the affine cell holds Y~ too, where 32 would spill. (Fewer columns would pad each
// target less but repeat the step's fixed cost more often.)
template <bool AFFINE>
inline constexpr int kColumns = AFFINE ? 24 : 32;

template <bool AFFINE>
__global__ void __launch_bounds__(kSoftThreads, kSoftBlocksPerSM) search_soft_kernel(const SearchSoftCall call) {
  extern __shared__ float smem[];
  const int K = call.K, stride = K | 1;  // an odd stride: the fill's lanes, at different letters, hit different banks
  const int warp = kSoftWarps == 1 ? 0 : int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  float* const table = smem;
  float* const ring = smem + K * stride + warp * (K + 1) * kRingSlots;
  for (int e = threadIdx.x; e < K * K; e += kSoftThreads) table[(e / K) * stride + e % K] = call.powers[e];
  for (int s = lane; s < kRingSlots; s += kWarp) ring[K * kRingSlots + s] = 0.0f;  // the padding letter
  __syncthreads();

  const int64_t warp_index = int64_t(blockIdx.x) * kSoftWarps + warp;
  if (warp_index >= call.warps) return;  // a whole warp leaves together
  const Scratch scratch = scratch_of(call);
  SoftLane<AFFINE> w;
  w.table = table, w.ring = ring, w.stride = stride, w.lane = lane;
  w.taken = scratch.taken;
  w.edge = scratch.edges<AFFINE>() + warp_index * call.M;
  w.staged = reinterpret_cast<Edge<AFFINE>*>(reinterpret_cast<char*>(smem) + (rings_end(K) + 15) / 16 * 16) +
             warp * kEdgeStage;
  w.keys = scratch.keys;
  w.upper = pow2_int(call.upper), w.floor_value = pow2_int(-call.floor);
  const double chain = double(call.gap_factor) * (1.0 - 1e-6);  // 1 - 1e-6 < (1 - 2^-24)^7
  const double floor_first = ldexp(1.0, -call.floor) / (chain * chain * chain * chain * chain * chain * chain);
  w.floor_first = float_at_least(floor_first);  // 2^-F / C^7
  w.middle = pow2_int(call.middle);
  // The first slot a lane reads in its letter's rows: k mod 64 is then added, the same in every lane.
  w.ring_lane = unsigned(__cvta_generic_to_shared(ring)) + 4u * unsigned(kWarp - 1 - lane);
  soft_sweep<kColumns<AFFINE>, AFFINE>(call, w);
}

// Every target's key at the zero border's (E = 1), before the warps fold their best cells into them; none
// taken yet.
__global__ void search_soft_keys_kernel(const SearchSoftCall call) {
  const Scratch scratch = scratch_of(call);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scratch.taken = 0;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < call.B; b += int64_t(gridDim.x) * blockDim.x)
    scratch.keys[b] = scaled_key(0, 1.0f);
}

// The scores from the keys: a target's best cell, or -1 where a check failed or the best cell is at most the
// padding's bound (it may then be one of the padding's; the header says why), counted in flagged.
__global__ void search_soft_scores_kernel(const SearchSoftCall call) {
  const Scratch scratch = scratch_of(call);
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < call.B; b += int64_t(gridDim.x) * blockDim.x) {
    const long long key = scratch.keys[b];
    const bool flagged = call.tlen[b] > 0 && (key == kFlaggedKey || key <= scaled_key(0, call.bound));
    float score = 0.0f;
    if (call.tlen[b] > 0 && !flagged) {
      const int e = int(key >> 23) - 127;
      score = float(call.tl * (double(e) + log2(double(mantissa_of(unsigned(key))))));
    }
    call.scores[b] = flagged ? -1.0f : score;
    if (flagged) atomicAdd(call.flagged, 1);
  }
}


template <bool AFFINE>
cudaError_t launch_soft(const SearchSoftCall& call, cudaStream_t stream) {
  constexpr int kFinishThreads = 256;
  const unsigned finish_blocks = unsigned(std::min<int64_t>((call.B + kFinishThreads - 1) / kFinishThreads, 1024));
  search_soft_keys_kernel<<<finish_blocks, kFinishThreads, 0, stream>>>(call);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const size_t shared = shared_bytes(call.K);
  err = cudaFuncSetAttribute(search_soft_kernel<AFFINE>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
  if (err != cudaSuccess) return err;
  // The blocks of an SM hold kSoftBlocksPerSM copies of the table and rings: all the shared memory there is.
  err = cudaFuncSetAttribute(search_soft_kernel<AFFINE>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             int(cudaSharedmemCarveoutMaxShared));
  if (err != cudaSuccess) return err;
  const unsigned blocks = unsigned((call.warps + kSoftWarps - 1) / kSoftWarps);
  search_soft_kernel<AFFINE><<<blocks, kSoftThreads, shared, stream>>>(call);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  search_soft_scores_kernel<<<finish_blocks, kFinishThreads, 0, stream>>>(call);
  return cudaGetLastError();
}

}  // namespace
}  // namespace swcli_cuda

int64_t sw_cuda_search_soft_scratch_bytes(int64_t B, int64_t M, int64_t warps, bool affine) {
  using namespace swcli_cuda;
  return Scratch::bytes(B, M, warps, affine ? sizeof(Edge<true>) : sizeof(Edge<false>));
}

int64_t sw_cuda_search_soft_resident_warps(int sms) { return int64_t(sms) * swcli_cuda::kSoftBlocksPerSM * swcli_cuda::kSoftWarps; }

int64_t sw_cuda_search_soft_shared_bytes(int K) { return int64_t(swcli_cuda::shared_bytes(K)); }

cudaError_t sw_cuda_search_soft(const SearchSoftCall& call, cudaStream_t stream) {
  using namespace swcli_cuda;
  if (call.B == 0) return cudaSuccess;
  return call.affine ? launch_soft<true>(call, stream) : launch_soft<false>(call, stream);
}
