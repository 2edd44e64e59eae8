// The log-space forward sweep of one warp over one pair (forward_tiles), in H's own units with the cell
// of common.cuh, and what it shares with the scaled sweep (forward_scaled.cuh): how a tile's last column
// reaches the next tile (InPlace, Relay) and where a lane stands in a tile (TileLanes). It is the sweep
// of every kernel that keeps the DP table, of t = 0, of double, and of the pairs the scaled sweeps
// cannot hold.
#pragma once

#include "sources.cuh"

namespace swcli_cuda {

// How a tile's last column reaches the next tile. One warp walking all the tiles of a pair keeps it
// in one buffer per pair, overwritten in place (lane 31 writes row i long after lane 0 read it).
template <typename A>
struct InPlace {
  A* bnd;  // (M,) for this pair, or null when the pair has one tile
  __device__ __forceinline__ const A* source(int64_t) const { return bnd; }
  __device__ __forceinline__ A* sink(int64_t) const { return bnd; }
  __device__ __forceinline__ void wait(int64_t, int64_t) const {}
  __device__ __forceinline__ void publish(int64_t, int64_t) const {}
};

// The W warps of a block taking turns over the tiles of one long pair (warp w: tiles w, w + W, ...):
// tile t writes its column into buffer t % (W + 1), tile t + 1 reads it. Buffer t % (W + 1) is written
// again by tile t + W + 1, which its warp starts only after finishing tile t + 1 itself (the reader),
// so W + 1 buffers are enough. done[w] counts the rows warp w has published over all its tiles; it only
// grows, so a reader never sees a count that was reset. Warps of one block are resident together, so
// waiting on another cannot deadlock. The counters are read and written only by atomics, fenced on
// both sides: the protocol is then visible as such to compute-sanitizer's racecheck, which reported
// the plain volatile accesses as hazards.
template <typename A, int W>
struct Relay {
  A* base;  // (W + 1, M) for this block
  int64_t M, qn;
  int* done;  // shared memory, W counters
  __device__ __forceinline__ const A* source(int64_t tile) const { return base + ((tile - 1) % (W + 1)) * M; }
  __device__ __forceinline__ A* sink(int64_t tile) const { return base + (tile % (W + 1)) * M; }
  // Until tile - 1 has published `rows` rows of its column (the whole warp calls it; lane 0 polls, so
  // that a poll is one atomic and not 32 on one address).
  __device__ __forceinline__ void wait(int64_t tile, int64_t rows) const {
    const int64_t producer = (tile - 1) % W, target = ((tile - 1) / W) * qn + rows;
    if (threadIdx.x % kWarp == 0)
      while (atomicAdd(done + producer, 0) < target) __nanosleep(32);
    __syncwarp();
    __threadfence_block();  // the column's rows are read only after the count that covers them
  }
  // Called by lane 31 of the warp that runs `tile`, after writing `rows` rows of its column.
  __device__ __forceinline__ void publish(int64_t tile, int64_t rows) const {
    __threadfence_block();
    atomicExch(done + tile % W, int((tile / W) * qn + rows));
  }
};

// Where lane `lane` stands in column tile `tile` of a pair (both sweeps): the tile's first column of the
// lane, the tile's width inside the target, its lanes that hold columns, and how many of this lane's R
// columns lie inside the target.
template <int R>
struct TileLanes {
  int col, width, lanes, valid;
  bool active, has_next;
  __device__ __forceinline__ TileLanes(const Pair& p, int tile, int tiles, int lane) {
    constexpr int kTileCols = kWarp * R;
    const int c0 = tile * kTileCols;
    col = c0 + lane * R;
    width = p.tn - c0 < kTileCols ? p.tn - c0 : kTileCols;
    lanes = (width + R - 1) / R;
    valid = p.tn - col >= R ? R : (p.tn - col > 0 ? p.tn - col : 0);
    active = lane < lanes;
    has_next = tile + 1 < tiles;
  }
};

// The same, with the score source started on the tile: its first kDepth rows fetched.
template <int R, class Source>
__device__ __forceinline__ TileLanes<R> start_tile(const Pair& p, Source& src, int tile, int tiles, int lane) {
  const TileLanes<R> at(p, tile, tiles, lane);
  src.begin_tile(p, lane, at.col);
#pragma unroll
  for (int d = 0; d < Source::kDepth; ++d) src.fetch(d, d - lane);
  return at;
}

// The sweep of one warp over tiles first_tile, first_tile + stride, ... of one pair. Returns, in every
// lane, the best cell value and (with STORE) its row-major position, -1 for the zero border.
//
// Each lane keeps, for its R columns, H of the previous row and H + gap: a cell's H + gap is both the
// insert term of its right neighbour and the delete term of the cell below, added once. Steps run in
// blocks of 32: at the start of a block the warp loads the next 32 rows of the tile's left boundary
// (lane j: row s0 + 32 + j), and lane 0 takes its value of step s by shuffle, so no load latency lies
// on the wavefront. In the first tile the boundary is the zero border.
template <typename A, int R, bool SOFT, bool STORE, class Source, class Handoff, bool FROM_UP = false,
          bool TABLE = STORE>
__device__ void forward_tiles(const Pair& p, Source& src, const Consts<A>& k, const Outputs<A>& out, int64_t M,
                              int64_t N, const Handoff& handoff, int first_tile, int stride, A& best_out,
                              int64_t& best_at_out) {
  constexpr int kDepth = Source::kDepth;
  static_assert(kWarp % kDepth == 0, "a block of 32 steps holds whole groups of kDepth steps");
  const int lane = threadIdx.x % kWarp;
  constexpr int kTileCols = kWarp * R;
  A best = A(0);
  int64_t best_at = -1;
  // Each of a lane's R columns keeps its own maximum over a tile, folded into `best` after the tile, so
  // that a step tests no column against the target's end. With STORE, the column also keeps the row of
  // its first maximum (rows come in order, so only a strictly larger value, or a first NaN, replaces
  // it), and the fold compares row-major positions. TABLE: STORE also writes the DP table (without it,
  // the best cell's position alone: the fallback of rows_forward_kernel, in backward_rows.cu).
  A lane_best[R];
  int lane_best_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) lane_best[r] = A(0), lane_best_row[r] = -1;
  const int tiles = (p.tn + kTileCols - 1) / kTileCols;
  const int64_t cols = table_columns(N, R);
  const Skewed<A, R> table{TABLE ? out.table + p.b * M * cols : nullptr, int(M), cols};
  for (int tile = first_tile; tile < tiles; tile += stride) {
    const TileLanes<R> at = start_tile<R>(p, src, tile, tiles, lane);
    const int col = at.col, width = at.width, lanes = at.lanes, valid = at.valid;
    const bool active = at.active, has_next = at.has_next;
    // With STORE, where this lane's row of step s goes: row s mod M of the tile (row s - lane of the
    // pair), the same row of the tile for the whole warp. It moves one row down per step.
    typename Skewed<A, R>::Cursor row_out{};
    if (TABLE) row_out = table.cursor(tile, lane);
    A up[R], up_gap[R];  // H[i-1][col + r], and that + gap
#pragma unroll
    for (int r = 0; r < R; ++r) up[r] = A(0), up_gap[r] = k.gap;
    A left_above = A(0);  // H[i-1][col-1]
    A last = A(0);        // H[i][col+R-1], handed to lane+1
    const A* const bnd_in = tile > 0 ? handoff.source(tile) : nullptr;
    A* const bnd_out = has_next ? handoff.sink(tile) : nullptr;
    A chunk = A(0), chunk_next = A(0);
    if (tile > 0) {
      handoff.wait(tile, p.qn < kWarp ? p.qn : kWarp);
      chunk_next = lane < p.qn ? bnd_in[lane] : A(0);
    }
    const int steps = p.qn + lanes - 1;
    for (int s0 = 0; s0 < steps; s0 += kWarp) {
      src.start_block();
      if (tile > 0) {  // the same for the whole warp
        chunk = chunk_next;
        const int ahead = s0 + kWarp + lane;
        handoff.wait(tile, p.qn < s0 + 2 * kWarp ? p.qn : s0 + 2 * kWarp);
        chunk_next = ahead < p.qn ? bnd_in[ahead] : A(0);
      }
      // Steps past `steps` (at most kDepth - 1; a block source leaves the block at `steps`) compute
      // nothing: every active lane is past its rows.
      for (int j = 0; j < kWarp && s0 + j < steps; j += kDepth) {
        src.start_group();
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          if (kDepth == kWarp && s0 + d >= steps) break;  // a block source: the last block's tail
          const int i = s0 + j + d - lane;
          A left = __shfl_up_sync(kFull, last, 1);
          const A from_boundary = __shfl_sync(kFull, chunk, j + d);
          if (lane == 0) left = from_boundary;
          A v[R];
          src.take(d, v);
          const bool on = active && unsigned(i) < unsigned(p.qn);
          auto track_best = [&](A h, int r) {
            if (!STORE) {
              lane_best[r] = max_nan(lane_best[r], h);
            } else if (lane_best[r] == lane_best[r] && !(h <= lane_best[r])) {  // larger, or the first NaN
              lane_best[r] = h, lane_best_row[r] = i;
            }
          };
          if constexpr (R == 1) {
            // Latency-bound: the cell is computed in every lane, so that no branch lies between it and
            // the next step's shuffle. A lane off its rows sends a value nobody uses: its right
            // neighbour is then off the same row.
            A h;
            if constexpr (FROM_UP)
              h = cell_from_up(left_above + v[0], up[0], left, k);
            else
              h = cell<A, SOFT>(left_above + v[0], up_gap[0], left + k.gap, k);
            last = h;
            up[0] = on ? h : up[0];
            up_gap[0] = on ? h + k.gap : up_gap[0];
            left_above = on ? left : left_above;
            if (on) {
              track_best(h, 0);
              if (TABLE) store_row<A, R>(row_out.at, up, valid, true);
            }
          } else {
            if (on) {
              A diag = left_above, left_gap = left + k.gap;
#pragma unroll
              for (int r = 0; r < R; ++r) {
                const A h = cell<A, SOFT>(diag + v[r], up_gap[r], left_gap, k);
                diag = up[r];
                up[r] = h;
                left_gap = h + k.gap;
                up_gap[r] = left_gap;
                track_best(h, r);
              }
              // All R values, 16-byte aligned: the table's rows are whole lanes wide, and the backward
              // reads no column past the target.
              if (TABLE) store_row<A, R>(row_out.at, up, R, true);
              left_above = left;
            }
            last = up[R - 1];
          }
          // Outside the branch above: inside it, the compiler copied the step's registers once per path.
          if (on && has_next && lane == kWarp - 1) {
            bnd_out[i] = up[R - 1];
            if ((i + 1) % kWarp == 0 || i + 1 == p.qn) handoff.publish(tile, i + 1);
          }
          if (TABLE) row_out.step(+1);
          // Refill the slot only now that its values are used: the load can then land in the same
          // registers, and the loop carries no copy of a value still in flight.
          src.fetch(d, i + kDepth);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {  // columns past the target are left out
      if (!STORE) {
        if (r < valid) best = max_nan(best, lane_best[r]);
      } else if (r < valid && lane_best_row[r] >= 0) {  // a column that never passed 0 keeps the border
        // Tiles run one after another, so compare positions: the first in row-major wins.
        const A h = lane_best[r];
        const int64_t at = int64_t(lane_best_row[r]) * N + col + r;
        const bool take = h != h ? (best == best || at < best_at)
                                 : (h > best || (h == best && best_at >= 0 && at < best_at));
        if (take) best = h, best_at = at;
      }
      lane_best[r] = A(0), lane_best_row[r] = -1;
    }
    __syncwarp();  // lane 31's boundary writes are visible to lane 0 in the next tile
  }
  // Reduce over the lanes: the largest value; for the backward, among equals the first in row-major.
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
  best_out = best;
  best_at_out = best_at;
}

// One warp, all the tiles of one pair: the log-space sweep, with the score (and with STORE the best
// cell's position) written by lane 0.
template <typename A, int R, bool SOFT, bool STORE, class Source>
__device__ void forward_pair(const Pair& p, Source& src, const Consts<A>& k, const Outputs<A>& out,
                             int64_t M, int64_t N) {
  A best;
  int64_t best_at;
  const InPlace<A> handoff{out.boundary ? out.boundary + p.b * M : nullptr};
  bool scored = false;
  if constexpr (std::is_same<A, float>::value && R == 1 && SOFT) {  // see cell_from_up
    forward_tiles<A, R, SOFT, STORE, Source, InPlace<A>, true>(p, src, k, out, M, N, handoff, 0, 1, best, best_at);
    scored = isfinite(best);  // the same in every lane
  }
  if (!scored) forward_tiles<A, R, SOFT, STORE>(p, src, k, out, M, N, handoff, 0, 1, best, best_at);
  if (threadIdx.x % kWarp == 0) {
    out.scores[p.b] = best;
    if (STORE) out.best_at[p.b] = best_at;
  }
}

}  // namespace swcli_cuda
