// One pair shared by several threads: its rows are cut into chunks, chunk k sweeps its rows over every
// column, and reads the last row of chunk k-1 as that chunk publishes it, a few columns behind. Each
// chunk waits only for chunks before it, so the chunks cannot deadlock as long as no thread takes a
// chunk before an earlier one is taken: at::parallel_for gives each thread a range in increasing order,
// and runs the whole range in order where it runs serially (a nested call).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif


#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

namespace swcli_cpu {

class Relay {
 public:
  explicit Relay(int64_t chunks) : count_(chunks), progress_(new Counter[chunks > 0 ? chunks : 1]) {
    for (int64_t k = 0; k < count_; ++k) progress_[k].columns.store(0, std::memory_order_relaxed);
  }

  // Chunk `chunk` has written its last row up to column `columns` (exclusive).
  void publish(int64_t chunk, int64_t columns) { progress_[chunk].columns.store(columns, std::memory_order_release); }

  // Waits until chunk `chunk` has published at least `columns` columns; returns what it has published.
  int64_t wait(int64_t chunk, int64_t columns) const {
    int64_t have = progress_[chunk].columns.load(std::memory_order_acquire);
    for (int spins = 0; have < columns; ++spins) {
      // A short spin while the chunk above is a few columns ahead; past it, give the core away: on a
      // shared machine the thread we wait for may need it.
      if (spins < 4096) {
#if defined(__x86_64__)
        _mm_pause();
#endif
      } else {
        std::this_thread::yield();
      }
      have = progress_[chunk].columns.load(std::memory_order_acquire);
    }
    return have;
  }

 private:
  struct alignas(64) Counter {  // one cache line each: the chunks' counters are written by different threads
    std::atomic<int64_t> columns;
  };
  int64_t count_;
  std::unique_ptr<Counter[]> progress_;
};

// The reader side of a relay for one chunk: the row above it (null for the first chunk) and how far it
// is known to be written, read from the relay only when the sweep catches up with it.
template <typename Value>
struct RowAbove {
  const Relay* relay = nullptr;
  int64_t chunk = -1;  // the chunk that writes the row; -1: the zero border
  const Value* row = nullptr;
  int64_t ready = 0;

  bool border() const { return row == nullptr; }
  const Value& at(int64_t j) {  // the value at column j (0-based), once written
    if (j >= ready) ready = relay->wait(chunk, j + 1);
    return row[j];
  }
};

// The writer side: the chunk's last row, published every kEvery columns and at the end.
template <typename Value>
struct RowBelow {
  static constexpr int64_t kEvery = 16;
  Relay* relay = nullptr;
  int64_t chunk = -1;  // -1: no chunk below, nothing to write
  Value* row = nullptr;

  bool wanted() const { return row != nullptr; }
  void put(int64_t j, const Value& v, int64_t columns) {
    row[j] = v;
    if ((j + 1) % kEvery == 0 || j + 1 == columns) relay->publish(chunk, j + 1);
  }
};

}  // namespace swcli_cpu
