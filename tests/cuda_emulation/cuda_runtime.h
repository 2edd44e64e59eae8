// A lockstep emulation of the CUDA features kernels/cuda/long_pairs.cu and search_s16.cu use, so that the
// kernels' own source runs on the CPU (tests/test_long_pairs_emulated.py, tests/test_search_s16_emulated.py;
// tests/cuda_emulation/emulate.py builds it). Each thread of a block is a fiber (ucontext), blocks run one
// after another, and every warp primitive (shuffle, vote, __syncwarp, __syncthreads) is a round in which
// every live thread of the block arrives before any goes on. It serves code
// whose threads of a block meet the same primitives in the same order (a return is a whole block's), and says
// nothing of speed, of the memory model between blocks, or of the special functions' rounding (ex2 and lg2
// are exp2f and log2f here).
#pragma once

#include <math.h>
#include <ucontext.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static  // blocks run one at a time: a function's static is its block's
#define __align__(n) alignas(n)

using std::isfinite;
using std::max;
using std::min;

typedef int cudaError_t;
constexpr cudaError_t cudaSuccess = 0;
typedef void* cudaStream_t;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaFuncAttributePreferredSharedMemoryCarveout };
enum cudaSharedCarveout { cudaSharedmemCarveoutMaxShared = 100 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
template <class F>
cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "emulated"; }

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct uint2 {
  unsigned x, y;
};
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }

namespace emu {

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  bool done;
  int id;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  std::function<void()> body;
  std::vector<unsigned char> slots;  // 8 bytes a thread, for shuffles and votes
  std::vector<unsigned char> dynamic_shared;
};

inline Block& block() {
  static Block b;
  return b;
}

}  // namespace emu

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {

// A round: this thread waits until every live thread of the block has arrived.
inline void round() {
  Block& b = block();
  swapcontext(&b.current->ctx, &b.scheduler);
}

inline void trampoline(int id) {
  Block& b = block();
  b.body();
  b.fibers[id].done = true;
  swapcontext(&b.fibers[id].ctx, &b.scheduler);
}

// Runs body in every thread of every block, blocks in order.
inline void launch(dim3 grid, dim3 threads, size_t shared_bytes, std::function<void()> body) {
  Block& b = block();
  gridDim = grid;
  blockDim = threads;
  const unsigned n = threads.x * threads.y * threads.z;
  b.fibers.resize(n);
  b.slots.assign(8 * n, 0);
  b.body = body;
  for (unsigned bx = 0; bx < grid.x; ++bx) {
    blockIdx = {bx, 0, 0};
    b.dynamic_shared.assign(shared_bytes, 0xff);  // NaN everywhere: a read of what was never written shows
    for (unsigned t = 0; t < n; ++t) {
      Fiber& f = b.fibers[t];
      f.id = int(t);
      f.done = false;
      f.stack.resize(1 << 18);
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, reinterpret_cast<void (*)()>(trampoline), 1, int(t));
    }
    for (;;) {
      bool any = false;
      for (unsigned t = 0; t < n; ++t) {
        Fiber& f = b.fibers[t];
        if (f.done) continue;
        any = true;
        b.current = &f;
        threadIdx = {t, 0, 0};
        swapcontext(&b.scheduler, &f.ctx);
      }
      if (!any) break;
    }
  }
}

template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(block().dynamic_shared.data());
}

inline int lane() { return int(threadIdx.x % 32); }

// Every thread writes its value, then reads the one of thread `from` of its warp.
template <class T>
T exchange(T v, int from) {
  static_assert(sizeof(T) <= 8, "8 bytes a thread");
  Block& b = block();
  std::memcpy(&b.slots[8 * threadIdx.x], &v, sizeof(T));
  round();
  T r;
  std::memcpy(&r, &b.slots[8 * ((threadIdx.x / 32) * 32 + from)], sizeof(T));
  round();
  return r;
}

// Every thread writes its value, then reads all 32 of its warp's: f(values) (a vote, a reduction).
template <class T, class F>
auto gather(T v, F f) {
  static_assert(sizeof(T) <= 8, "8 bytes a thread");
  Block& b = block();
  std::memcpy(&b.slots[8 * threadIdx.x], &v, sizeof(T));
  round();
  T values[32];
  for (int l = 0; l < 32; ++l) std::memcpy(&values[l], &b.slots[8 * ((threadIdx.x / 32) * 32 + l)], sizeof(T));
  round();
  return f(values);
}

}  // namespace emu

// width: the warp in segments of `width` lanes, each shuffling within itself (a power of two up to 32).
template <class T>
T __shfl_up_sync(unsigned, T v, int d, int width = 32) {
  const int l = emu::lane();
  return emu::exchange(v, l % width >= d ? l - d : l);
}
template <class T>
T __shfl_down_sync(unsigned, T v, int d, int width = 32) {
  const int l = emu::lane();
  return emu::exchange(v, l % width + d < width ? l + d : l);
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
  const int l = emu::lane();
  return emu::exchange(v, (l ^ m) / width == l / width ? l ^ m : l);
}
template <class T>
T __shfl_sync(unsigned, T v, int from) {
  return emu::exchange(v, from & 31);
}
inline unsigned __ballot_sync(unsigned, bool p) {
  return emu::gather(p, [](const bool* v) {
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) bits |= unsigned(v[l]) << l;
    return bits;
  });
}
inline bool __all_sync(unsigned mask, bool p) { return __ballot_sync(mask, p) == 0xffffffffu; }
inline bool __any_sync(unsigned mask, bool p) { return __ballot_sync(mask, p) != 0u; }
template <class T>
T __reduce_max_sync(unsigned, T v) {
  return emu::gather(v, [](const T* values) { return *std::max_element(values, values + 32); });
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::round(); }
inline void __syncthreads() { emu::round(); }
inline int __syncthreads_and(int p) {
  emu::round();
  return p;  // single-warp use only
}
inline void __threadfence_block() {}
inline void __nanosleep(unsigned) {}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p += v;
  return old;
}
inline int atomicExch(int* p, int v) {
  const int old = *p;
  *p = v;
  return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = std::max(old, v);
  return old;
}
inline long long atomicMax(long long* p, long long v) {
  const long long old = *p;
  *p = std::max(old, v);
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p += v;
  return old;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
// A shared-memory address: the offset into the block's dynamic shared memory (emu::load_shared_u32 reads it).
inline size_t __cvta_generic_to_shared(const void* p) {
  return size_t(static_cast<const unsigned char*>(p) - emu::block().dynamic_shared.data());
}

template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}
template <class T>
T __ldcs(const T* p) {
  return *p;
}
template <class T>
void __stcg(T* p, T v) {
  *p = v;
}
template <class T>
void __stcs(T* p, T v) {
  *p = v;
}
namespace emu {
template <class To, class From>
To bits(From x) {
  static_assert(sizeof(To) == sizeof(From), "a reinterpretation of the same bits");
  To to;
  std::memcpy(&to, &x, sizeof(To));
  return to;
}
}  // namespace emu
inline float __int_as_float(int x) { return emu::bits<float>(x); }
inline float __uint_as_float(unsigned x) { return emu::bits<float>(x); }
inline unsigned __float_as_uint(float x) { return emu::bits<unsigned>(x); }
inline int __float_as_int(float x) { return emu::bits<int>(x); }

// Hopper's SIMD and DPX intrinsics on the two signed 16-bit halves of 32-bit values, adds wrapping.
namespace emu {
inline int half(unsigned v, int h) { return int(short(v >> (16 * h))); }
template <class F>
unsigned halves(F f) {
  return (unsigned(f(0)) & 0xffffu) | (unsigned(f(1)) << 16);
}
}  // namespace emu
inline unsigned __vadd2(unsigned a, unsigned b) {
  return emu::halves([&](int h) { return emu::half(a, h) + emu::half(b, h); });
}
inline unsigned __vmaxs2(unsigned a, unsigned b) {
  return emu::halves([&](int h) { return std::max(emu::half(a, h), emu::half(b, h)); });
}
inline unsigned __viaddmax_s16x2(unsigned a, unsigned b, unsigned c) {  // max(a + b, c), the add wrapping
  return emu::halves([&](int h) { return std::max(int(short(emu::half(a, h) + emu::half(b, h))), emu::half(c, h)); });
}
inline unsigned __viaddmax_s16x2_relu(unsigned a, unsigned b, unsigned c) {  // max(a + b, c, 0)
  return emu::halves([&](int h) {
    return std::max({int(short(emu::half(a, h) + emu::half(b, h))), emu::half(c, h), 0});
  });
}
// (The soft kernel takes maxima of non-negative floats on their bits, linear and affine, where the GPU's
// NaN, 0x7fffffff, is the largest; x86's is 0xffc00000, negative as an int, so a NaN through them is not
// emulated.)
inline int __vimax3_s32(int a, int b, int c) { return std::max({a, b, c}); }
inline unsigned __vimax3_s16x2_relu(unsigned a, unsigned b, unsigned c) {  // max(a, b, c, 0)
  return emu::halves([&](int h) { return std::max({emu::half(a, h), emu::half(b, h), emu::half(c, h), 0}); });
}

// The kernels' PTX, as the preprocessing (emulate.py) rewrites it.
namespace emu {
inline unsigned load_shared_u32(unsigned address) {
  unsigned v;
  std::memcpy(&v, block().dynamic_shared.data() + address, sizeof(v));
  return v;
}
inline float load_shared_f32(unsigned address) {
  float v;
  std::memcpy(&v, block().dynamic_shared.data() + address, sizeof(v));
  return v;
}
inline float max_nan(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
inline float min_nan(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
inline float ex2(float x) { return exp2f(x); }
inline float lg2(float x) { return log2f(x); }
}  // namespace emu
