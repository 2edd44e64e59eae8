// int32 lanes for the integer sweep of traceback.cpp: AVX-512 (16 lanes), AVX2 (8) or one plain int32,
// chosen at compile time (the host library is built with -march=native). Every operation is exact
// integer arithmetic, so the lanes' results do not depend on their count.
#pragma once

#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)

struct Lanes {
  static constexpr int kCount = 16;
  using T = __m512i;
  static T set1(int32_t v) { return _mm512_set1_epi32(v); }
  static T load(const int32_t* p) { return _mm512_loadu_si512(p); }
  static void store(int32_t* p, T v) { _mm512_storeu_si512(p, v); }
  static T add(T a, T b) { return _mm512_add_epi32(a, b); }
  static T max(T a, T b) { return _mm512_max_epi32(a, b); }
  static T bit_or(T a, T b) { return _mm512_or_si512(a, b); }
  template <int S>
  static T shift_left_bits(T a) { return _mm512_slli_epi32(a, S); }
  // Lanes moved up by S: lane l takes v[l - S], lanes below S take fill's top S lanes.
  template <int S>
  static T shift_in(T v, T fill) { return _mm512_alignr_epi32(v, fill, kCount - S); }
  static T last(T v) { return _mm512_permutexvar_epi32(_mm512_set1_epi32(kCount - 1), v); }
  static T where_equal(T a, T b, T then, T otherwise) {
    return _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(a, b), otherwise, then);
  }
  // The first `count` lanes of v, the others fill's.
  static T first(T v, int64_t count, T fill) {
    const __mmask16 keep = count >= kCount ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
    return _mm512_mask_blend_epi32(keep, fill, v);
  }
  static int32_t reduce_max(T v) { return _mm512_reduce_max_epi32(v); }
  // Lane l as the byte p[l] (values 0 .. 255): kCount bytes written.
  static void store_bytes(uint8_t* p, T v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
  }
  static T ramp(int32_t step) {  // lane l: (l + 1) * step
    return _mm512_mullo_epi32(_mm512_set1_epi32(step),
                              _mm512_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16));
  }
};

#elif defined(__AVX2__)

struct Lanes {
  static constexpr int kCount = 8;
  using T = __m256i;
  static T set1(int32_t v) { return _mm256_set1_epi32(v); }
  static T load(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(int32_t* p, T v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
  static T add(T a, T b) { return _mm256_add_epi32(a, b); }
  static T max(T a, T b) { return _mm256_max_epi32(a, b); }
  static T bit_or(T a, T b) { return _mm256_or_si256(a, b); }
  template <int S>
  static T shift_left_bits(T a) { return _mm256_slli_epi32(a, S); }
  template <int S>
  static T shift_in(T v, T fill) {
    // one rotation by S of both, then fill's rotated top lanes blended into lanes 0 .. S-1
    const __m256i rotate = _mm256_setr_epi32((0 - S) & 7, (1 - S) & 7, (2 - S) & 7, (3 - S) & 7, (4 - S) & 7,
                                             (5 - S) & 7, (6 - S) & 7, (7 - S) & 7);
    return _mm256_blend_epi32(_mm256_permutevar8x32_epi32(v, rotate), _mm256_permutevar8x32_epi32(fill, rotate),
                              (1 << S) - 1);
  }
  static T last(T v) { return _mm256_permutevar8x32_epi32(v, _mm256_set1_epi32(kCount - 1)); }
  static T where_equal(T a, T b, T then, T otherwise) {
    return _mm256_blendv_epi8(otherwise, then, _mm256_cmpeq_epi32(a, b));
  }
  static T first(T v, int64_t count, T fill) {
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(count < kCount ? count : kCount)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_blendv_epi8(fill, v, keep);
  }
  static int32_t reduce_max(T v) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xB1));
    return _mm_cvtsi128_si32(m);
  }
  static void store_bytes(uint8_t* p, T v) {
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
  }
  static T ramp(int32_t step) {
    return _mm256_mullo_epi32(_mm256_set1_epi32(step), _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 8));
  }
};

#else

struct Lanes {
  static constexpr int kCount = 1;
  using T = int32_t;
  static T set1(int32_t v) { return v; }
  static T load(const int32_t* p) { return *p; }
  static void store(int32_t* p, T v) { *p = v; }
  static T add(T a, T b) { return a + b; }
  static T max(T a, T b) { return a > b ? a : b; }
  static T bit_or(T a, T b) { return a | b; }
  template <int S>
  static T shift_left_bits(T a) { return a << S; }
  template <int S>
  static T shift_in(T, T fill) { return fill; }
  static T last(T v) { return v; }
  static T where_equal(T a, T b, T then, T otherwise) { return a == b ? then : otherwise; }
  static T first(T v, int64_t count, T fill) { return count >= 1 ? v : fill; }
  static int32_t reduce_max(T v) { return v; }
  static void store_bytes(uint8_t* p, T v) { *p = static_cast<uint8_t>(v); }
  static T ramp(int32_t step) { return step; }
};

#endif
