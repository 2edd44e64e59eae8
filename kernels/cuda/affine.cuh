// Affine gaps (soft Gotoh) on CUDA: the cell, its adjoint, and the log-space forward sweep of one warp
// over one pair (affine_tiles), laid out as the linear sweep (forward_log.cuh): lane k holds R columns
// of a tile, the warp sweeps the rows as a wavefront, and the column left of a lane's strip comes from
// lane k-1 by shuffle, or from the previous tile through a buffer (InPlace or Relay, of (H, X) pairs).
//
// With open o and extend e (o <= e <= 0), in the form of kernels/cpu/affine.h:
//
//     M[i][j] = H[i-1][j-1] + S[i-1][j-1]
//     X[i][j] = smax(o, M[i][j-1] + o, Y[i][j-1] + o, X[i][j-1] + e)
//     Y[i][j] = smax(o, M[i-1][j] + o, Y[i-1][j] + e, X[i-1][j] + o)
//     H[i][j] = smax(0, M[i][j], Y[i][j], X[i][j])
//
// X of the cell to the right and Y of the cell below depend on this cell's M, X and Y alone, so a cell
// takes its X from the left (the shuffle carries H and X of a lane's last column) and its Y from the
// row above (a register per column), and hands on Xn = X[i][j+1] and Yn = Y[i+1][j].
//
// The soft cell (t > 0) has two forms, chosen per call from o and t alone (affine_mode, on the host):
// - kShared: the four terms' powers are taken once, relative to r = max(0, M, X, Y), H's largest term:
//       H  = r + t ln2 log2(e0 + eM + eX + eY)                         e_k = 2^((k - r) c), c = log2(e) / t
//       Xn = r + t ln2 log2(O (e0 + eM + eY) + E eX)                   O = 2^(o c), E = 2^(e c)
//       Yn = r + t ln2 log2(O (e0 + eM + eX) + E eY)
//   4 ex2 and 3 lg2 a cell, where three linear cells would take 9 and 3. The sums lose the powers below
//   the float range (2^-126 relative to r); a term of Xn or Yn so small is under 2^-26 of them as long as
//   O >= 2^-100, hence the limit on |o| c (affine_shared_limit).
// - kSeparate, past that limit (small t, large |o|): three four-term cells, each relative to its own
//   largest term, as the linear cell (cell in common.cuh).
// Both are symmetric in X and Y (pairs (0, M) and (Y, X) of H, (o, M + o) and (Y + o, X + e) of Xn,
// the mirror of Yn), so a pair scored transposed (codes, see oriented in common.cuh) holds the same
// floats, and scores from codes equal dense scores bit for bit. At t = 0 the cell is exact max and
// add, the CPU engine's values bit for bit.
#pragma once

#include "forward_log.cuh"

namespace swcli_cuda {

enum AffineMode { kHard = 0, kShared = 1, kSeparate = 2 };

// The largest |o| c of the shared form: O = 2^(o c) at least 2^-100 (float) or 2^-1000 (double).
template <typename A>
__host__ __device__ constexpr double affine_shared_limit() {
  return sizeof(A) == 4 ? 100.0 : 1000.0;
}

template <typename A>
struct AffineConsts {
  A o, e;   // open and extend scores
  A c;      // log2(e) / t, capped at the largest finite value
  A tl;     // t ln 2
  A O, E;   // 2^(o c), 2^(e c): the shared form's gap factors
};

// A column's values handed on to the next lane or tile: H (.x) and X of the cell to the right (.y). In
// the backward, the adjoints of X (.x) and M (.y) of a tile's first column.
template <typename A>
struct Pair2Of;
template <>
struct Pair2Of<float> {
  using T = float2;
};
template <>
struct Pair2Of<double> {
  using T = double2;
};
template <typename A>
using Pair2 = typename Pair2Of<A>::T;

template <typename A>
__device__ __forceinline__ Pair2<A> pair2(A a, A b) {
  Pair2<A> v;
  v.x = a, v.y = b;
  return v;
}

// A four-term soft maximum in the linear cell's form: pairs (a, b) and (c, d), the largest term's power
// skipped, every other taken relative to it.
template <typename A>
__device__ __forceinline__ A smax4(A a, A b, A c, A d, const AffineConsts<A>& k) {
  const A p = max_nan(a, b), q = max_nan(c, d);
  const A m = max_nan(p, q);
  const A lo1 = min_nan(a, b), lo2 = min_nan(c, d), lo3 = min_nan(p, q);
  const A mf = fmin(m, finite_max(m));  // an infinite maximum: no inf - inf (see cell in common.cuh)
  const A s = exp2_((lo1 - mf) * k.c) + exp2_((lo2 - mf) * k.c) + exp2_((lo3 - mf) * k.c);
  return m + k.tl * log2_(A(1) + s);
}

// One cell: H, and X of the cell to the right (xn) and Y of the cell below (yn), from its M, X and Y.
template <typename A, int MODE>
__device__ __forceinline__ void affine_cell(A m, A x, A y, const AffineConsts<A>& k, A& h, A& xn, A& yn) {
  if constexpr (MODE == kHard) {
    // max(0, M) + o is max(o, M + o) exactly (rounding is monotone), the CPU's terms
    const A p = max_nan(A(0), m);
    h = max_nan(p, max_nan(y, x));
    const A po = p + k.o;
    xn = max_nan(max_nan(po, y + k.o), x + k.e);
    yn = max_nan(max_nan(po, x + k.o), y + k.e);
  } else if constexpr (MODE == kShared) {
    const A p = max_nan(A(0), m), lo = min_nan(A(0), m);
    const A r = max_nan(p, max_nan(y, x));
    const A rf = fmin(r, finite_max(r));
    const A s0m = exp2_((p - rf) * k.c) + exp2_((lo - rf) * k.c);
    const A ex = exp2_((x - rf) * k.c), ey = exp2_((y - rf) * k.c);
    h = r + k.tl * log2_(s0m + (ex + ey));
    xn = r + k.tl * log2_(k.O * (s0m + ey) + k.E * ex);
    yn = r + k.tl * log2_(k.O * (s0m + ex) + k.E * ey);
  } else {
    h = smax4(A(0), m, y, x, k);
    const A mo = m + k.o;
    xn = smax4(k.o, mo, y + k.o, x + k.e, k);
    yn = smax4(k.o, mo, x + k.o, y + k.e, k);
  }
}

// The adjoint of one cell (t > 0): from the adjoints of its H (eh), of X to its right (exn) and of Y
// below it (eyn), those of its M, X and Y, each a sum of the softmax weights of its terms. An adjoint of
// 0 passes nothing on, whatever its weights (a NaN among them included).
template <typename A>
__device__ __forceinline__ A flow(A adjoint, A weight) {
  return adjoint != A(0) ? adjoint * weight : A(0);
}

//
// extended (EXTENSIONS only): what flows along the two extension edges, from X to its right and from Y
// below, the part of d score / d gap_extend of this cell (d score / d gap_open being what enters X and Y,
// ex_out + ey_out, less it).
template <typename A, int MODE, bool EXTENSIONS = false>
__device__ __forceinline__ void affine_adjoint(A m, A x, A y, A eh, A exn, A eyn, const AffineConsts<A>& k, A& em_out,
                                               A& ex_out, A& ey_out, A* extended = nullptr) {
  if constexpr (MODE == kShared) {
    // The weights share the forward's powers: a term's weight in H is its power over H's sum, in Xn
    // its power times O or E over Xn's sum. No logarithm: 4 ex2 and 3 reciprocals.
    const A p = max_nan(A(0), m);
    const A r = max_nan(p, max_nan(y, x));
    const A rf = fmin(r, finite_max(r));
    const A e0 = exp2_(-rf * k.c), em = exp2_((m - rf) * k.c);
    const A ex = exp2_((x - rf) * k.c), ey = exp2_((y - rf) * k.c);
    const A s0m = e0 + em;
    const A a = flow(eh, A(1) / (s0m + (ex + ey)));
    const A bx = flow(exn, A(1) / (k.O * (s0m + ey) + k.E * ex));
    const A by = flow(eyn, A(1) / (k.O * (s0m + ex) + k.E * ey));
    em_out = flow(em, a + k.O * (bx + by));
    ex_out = flow(ex, a + k.E * bx + k.O * by);
    ey_out = flow(ey, a + k.O * bx + k.E * by);
    if (EXTENSIONS) *extended = flow(bx, k.E * ex) + flow(by, k.E * ey);
  } else {
    // Each soft maximum relative to its own largest term: weight 2^((term - max) c) / sum.
    const A mo = m + k.o;
    auto weights = [&](A t0, A t1, A t2, A t3, A& w1, A& w2, A& w3) {
      const A mx = max_nan(max_nan(t0, t1), max_nan(t2, t3));
      const A mf = fmin(mx, finite_max(mx));
      const A p0 = exp2_((t0 - mf) * k.c);
      w1 = exp2_((t1 - mf) * k.c), w2 = exp2_((t2 - mf) * k.c), w3 = exp2_((t3 - mf) * k.c);
      const A inv = A(1) / ((p0 + w1) + (w2 + w3));
      w1 *= inv, w2 *= inv, w3 *= inv;
    };
    A hm, hy, hx, xm, xy, xx, ym, yx, yy;
    weights(A(0), m, y, x, hm, hy, hx);
    weights(k.o, mo, y + k.o, x + k.e, xm, xy, xx);
    weights(k.o, mo, x + k.o, y + k.e, ym, yx, yy);
    em_out = flow(eh, hm) + flow(exn, xm) + flow(eyn, ym);
    ex_out = flow(eh, hx) + flow(exn, xx) + flow(eyn, yx);
    ey_out = flow(eh, hy) + flow(exn, xy) + flow(eyn, yy);
    if (EXTENSIONS) *extended = flow(exn, xx) + flow(eyn, yy);
  }
}

// Host: the mode of a call and its constants.
template <typename A>
__host__ __device__ int affine_mode(double o, double t) {
  if (!(t > 0)) return kHard;
  const double c = 1.4426950408889634 / t;
  return -o * c <= affine_shared_limit<A>() ? kShared : kSeparate;
}

template <typename A>
__host__ __device__ AffineConsts<A> affine_consts(double o, double e, double t) {
  const Consts<A> lin = consts<A>(o, t);
  AffineConsts<A> k;
  k.o = A(o), k.e = A(e), k.c = lin.c, k.tl = lin.tl;
  const double c = t > 0 ? 1.4426950408889634 / t : 0.0;
  k.O = A(t > 0 ? exp2(o * c) : 1.0);  // rounded once
  k.E = A(t > 0 ? exp2(e * c) : 1.0);
  return k;
}

// What the affine forward writes. The state (with STORE) is three planes of `plane` values each, M, X and
// Y of every cell in the wavefront order of Skewed (common.cuh): the backward takes H, Xn and Yn again
// from them (H[i-1][j-1] is in M, so S is not read again).
template <typename A>
struct AffineOut {
  A* scores;         // (B,)
  A* state;          // (3, B, M, table_columns(N, R)), or null
  int64_t plane;     // B * M * table_columns(N, R)
  int64_t* best_at;  // (B,) row-major index i*N + j of the first maximal cell, -1 for the border
  Pair2<A>* boundary;  // (B, M) (H, X) of a tile's last column for the next tile; null if one tile
};

// The best cell of a sweep: each of a lane's R columns keeps its own maximum over a tile (with STORE also
// the row of its first maximum: rows come in order, so only a strictly larger value, or a first NaN,
// replaces it), folded after the tile by row-major position, then over the warp (as forward_tiles).
template <typename A, int R, bool STORE>
struct BestCell {
  A best = A(0);
  int64_t best_at = -1;
  A lane_best[R];
  int lane_best_row[R];
  __device__ __forceinline__ BestCell() {
#pragma unroll
    for (int r = 0; r < R; ++r) lane_best[r] = A(0), lane_best_row[r] = -1;
  }
  __device__ __forceinline__ void track(A h, int r, int i) {
    if (!STORE) {
      lane_best[r] = max_nan(lane_best[r], h);
    } else if (lane_best[r] == lane_best[r] && !(h <= lane_best[r])) {  // larger, or the first NaN
      lane_best[r] = h, lane_best_row[r] = i;
    }
  }
  __device__ __forceinline__ void fold_tile(int valid, int col, int64_t N) {
#pragma unroll
    for (int r = 0; r < R; ++r) {  // columns past the target are left out
      if (!STORE) {
        if (r < valid) best = max_nan(best, lane_best[r]);
      } else if (r < valid && lane_best_row[r] >= 0) {  // a column that never passed 0 keeps the border
        const A h = lane_best[r];
        const int64_t at = int64_t(lane_best_row[r]) * N + col + r;
        const bool take = h != h ? (best == best || at < best_at)
                                 : (h > best || (h == best && best_at >= 0 && at < best_at));
        if (take) best = h, best_at = at;
      }
      lane_best[r] = A(0), lane_best_row[r] = -1;
    }
  }
  __device__ __forceinline__ void reduce_warp() {
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) {
      const A other = __shfl_xor_sync(kFull, best, off);
      if (STORE) {
        const int64_t other_at = __shfl_xor_sync(kFull, best_at, off);
        const bool other_nan = other != other, mine_nan = best != best;
        bool take;
        if (other_nan || mine_nan)
          take = other_nan && (!mine_nan || (other_at >= 0 && (best_at < 0 || other_at < best_at)));
        else
          take = other > best || (other == best && other_at >= 0 && (best_at < 0 || other_at < best_at));
        if (take) best = other, best_at = other_at;
      } else {
        best = max_nan(best, other);
      }
    }
  }
};

// The sweep of one warp over tiles first_tile, first_tile + stride, ... of one pair (stride > 1: the
// warps of a block relay the tiles through Relay). Returns, in every lane, the best cell value and
// (with STORE) its row-major position, -1 for the zero border; with STORE it also writes the state.
//
// Each lane keeps, for its R columns, H of the row above (the diagonal of the next column) and Y of the
// cell below it (the next row's Y). Steps run in blocks of 32, the next 32 rows of the tile's left
// boundary loaded a block ahead (lane j: row s0 + 32 + j) and taken by lane 0 by shuffle. In the first
// tile the boundary is H = 0 and X[i][1] = o (the open term alone: the border's M, X, Y are -inf).
template <typename A, int R, int MODE, bool STORE, class Source, class Handoff>
__device__ void affine_tiles(const Pair& p, Source& src, const AffineConsts<A>& k, const AffineOut<A>& out, int64_t M,
                             int64_t N, const Handoff& handoff, int first_tile, int stride, A& best_out,
                             int64_t& best_at_out) {
  constexpr int kDepth = Source::kDepth;
  static_assert(kWarp % kDepth == 0, "a block of 32 steps holds whole groups of kDepth steps");
  const int lane = threadIdx.x % kWarp;
  constexpr int kTileCols = kWarp * R;
  BestCell<A, R, STORE> best;
  const int tiles = (p.tn + kTileCols - 1) / kTileCols;
  const int64_t cols = table_columns(N, R);
  const Skewed<A, R> table{STORE ? out.state + p.b * M * cols : nullptr, int(M), cols};
  const Pair2<A> border = pair2(A(0), k.o);
  for (int tile = first_tile; tile < tiles; tile += stride) {
    const TileLanes<R> at = start_tile<R>(p, src, tile, tiles, lane);
    const int col = at.col, lanes = at.lanes, valid = at.valid;
    const bool active = at.active, has_next = at.has_next;
    typename Skewed<A, R>::Cursor row_out{};
    if (STORE) row_out = table.cursor(tile, lane);
    A up[R], y_in[R];  // H[i-1][col + r] and Y[i][col + r]
#pragma unroll
    for (int r = 0; r < R; ++r) up[r] = A(0), y_in[r] = k.o;  // row 0: H = 0, and Y[1][j] = o
    A left_above = A(0);          // H[i-1][col-1]
    A last_h = A(0), last_x = k.o;  // H[i][col+R-1] and X[i][col+R], handed to lane+1
    const Pair2<A>* const bnd_in = tile > 0 ? handoff.source(tile) : nullptr;
    Pair2<A>* const bnd_out = has_next ? handoff.sink(tile) : nullptr;
    Pair2<A> chunk = border, chunk_next = border;
    if (tile > 0) {
      handoff.wait(tile, p.qn < kWarp ? p.qn : kWarp);
      chunk_next = lane < p.qn ? bnd_in[lane] : border;
    }
    const int steps = p.qn + lanes - 1;
    for (int s0 = 0; s0 < steps; s0 += kWarp) {
      src.start_block();
      if (tile > 0) {  // the same for the whole warp
        chunk = chunk_next;
        const int ahead = s0 + kWarp + lane;
        handoff.wait(tile, p.qn < s0 + 2 * kWarp ? p.qn : s0 + 2 * kWarp);
        chunk_next = ahead < p.qn ? bnd_in[ahead] : border;
      }
      for (int j = 0; j < kWarp && s0 + j < steps; j += kDepth) {
        src.start_group();
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          if (kDepth == kWarp && s0 + d >= steps) break;  // a block source: the last block's tail
          const int i = s0 + j + d - lane;
          A left_h = __shfl_up_sync(kFull, last_h, 1);
          A left_x = __shfl_up_sync(kFull, last_x, 1);
          const A from_h = __shfl_sync(kFull, chunk.x, j + d), from_x = __shfl_sync(kFull, chunk.y, j + d);
          if (lane == 0) left_h = from_h, left_x = from_x;
          A v[R];
          src.take(d, v);
          const bool on = active && unsigned(i) < unsigned(p.qn);
          if (on) {
            A diag = left_above, x = left_x;
            A mv[R], xv[R], yv[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
              const A m = diag + v[r];
              A h, xn, yn;
              affine_cell<A, MODE>(m, x, y_in[r], k, h, xn, yn);
              if (STORE) mv[r] = m, xv[r] = x, yv[r] = y_in[r];
              diag = up[r];
              up[r] = h;
              y_in[r] = yn;
              x = xn;
              best.track(h, r, i);
            }
            last_x = x;
            if (STORE) {  // whole lanes: the table's rows are R-aligned, the backward reads no column past the target
              store_row<A, R>(row_out.at, mv, R, true);
              store_row<A, R>(row_out.at + out.plane, xv, R, true);
              store_row<A, R>(row_out.at + 2 * out.plane, yv, R, true);
            }
            left_above = left_h;
          }
          last_h = up[R - 1];
          if (on && has_next && lane == kWarp - 1) {
            bnd_out[i] = pair2(up[R - 1], last_x);
            if ((i + 1) % kWarp == 0 || i + 1 == p.qn) handoff.publish(tile, i + 1);
          }
          if (STORE) row_out.step(+1);
          src.fetch(d, i + kDepth);
        }
      }
    }
    best.fold_tile(valid, col, N);
    __syncwarp();  // lane 31's boundary writes are visible to lane 0 in the next tile
  }
  best.reduce_warp();
  best_out = best.best;
  best_at_out = best.best_at;
}

// One warp, all the tiles of one pair, the score (and with STORE the best cell's position) written by lane 0.
template <typename A, int R, int MODE, bool STORE, class Source>
__device__ void affine_pair(const Pair& p, Source& src, const AffineConsts<A>& k, const AffineOut<A>& out, int64_t M,
                            int64_t N) {
  A best;
  int64_t best_at;
  const InPlace<Pair2<A>> handoff{out.boundary ? out.boundary + p.b * M : nullptr};
  affine_tiles<A, R, MODE, STORE>(p, src, k, out, M, N, handoff, 0, 1, best, best_at);
  if (threadIdx.x % kWarp == 0) {
    out.scores[p.b] = best;
    if (STORE) out.best_at[p.b] = best_at;
  }
}

}  // namespace swcli_cuda
