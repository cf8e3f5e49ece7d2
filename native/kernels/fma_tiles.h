// Building blocks of the FMA kernels (fma_gemm.cpp, fma_attention.cpp): the 6 x 16 f32
// micro-kernel over packed micro-panels, in-register transposes and widening loads. Everything
// here carries a target attribute and may run only where fma_gemm_cpu() is true.
//
// A product C [6][16] = A [6][kc] B [kc][16] takes A as a micro-panel a[k][6] (six rows'
// values per k) and B as a micro-panel b[k][16] (16 columns per k, 32-byte aligned).
#pragma once

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define SDPLAN_FMA_X86 1
#define SDPLAN_FMA __attribute__((target("avx2,fma,f16c")))
#endif

#include <cstdint>
#include <vector>

#include "kernels/buffers.h"

#ifdef SDPLAN_FMA_X86

namespace sdplan::fma {

constexpr int64_t MR = 6, NR = 16;  // the micro-kernel's rows and columns

using kernels::aligned;
using kernels::round_up;
using kernels::split_work;

// In-register transpose of 8 rows of 8 floats: r[i] becomes column i.
SDPLAN_FMA inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// 2^x: 2^n p(f) with n = round(x) (at least -126), f = x - n (exact, |f| <= 1/2), p the
// degree-5 polynomial of least largest relative error of 2^f on |f| <= 1/2 (2.4e-7 with f32
// Horner steps, fitted by iterated weighted least squares); x below -126, -inf and NaN give 0.
SDPLAN_FMA inline __m256 exp2_256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-126.0f);
    const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(0.001327647129073739f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.009675541892647743f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.05550713464617729f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24022120237350464f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931469440460205f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000001192092896f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_and_ps(_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e)), keep);
}

// 8 values from element i of a row-major matrix of f16 (F16) or f32, widened to f32.
template <bool F16>
SDPLAN_FMA inline __m256 load8(const void *m, int64_t i) {
    if (F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)m + i)));
    return _mm256_loadu_ps((const float *)m + i);
}

template <bool F16>
SDPLAN_FMA inline float load1(const void *m, int64_t i) {
    if (F16) return _cvtsh_ss(((const uint16_t *)m)[i]);
    return ((const float *)m)[i];
}

// C row of 16 (two vectors) after the product: mode 0 adds C's values, 1 the bias vectors.
SDPLAN_FMA inline void put(float *c, __m256 lo, __m256 hi, int mode, __m256 blo, __m256 bhi) {
    if (mode == 0) lo = _mm256_add_ps(lo, _mm256_loadu_ps(c)), hi = _mm256_add_ps(hi, _mm256_loadu_ps(c + 8));
    else lo = _mm256_add_ps(lo, blo), hi = _mm256_add_ps(hi, bhi);
    _mm256_storeu_ps(c, lo);
    _mm256_storeu_ps(c + 8, hi);
}

// C [6][16] (row stride ldc) from a [k][6] and b [k][16] over kc: mode 0 C += A B, mode 1
// C = A B + bias (rb: one value per row, cb: 16 per column, or neither), mode 2 C = A B.
// The accumulators are named variables (an array of __m256 would live on the stack).
SDPLAN_FMA inline void micro(const float *a, const float *b, int64_t kc, float *c, int64_t ldc, int mode, const float *rb,
                             const float *cb) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
           c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t k = 0; k < kc; ++k, a += MR, b += NR) {
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        __m256 av = _mm256_broadcast_ss(a);
        c00 = _mm256_fmadd_ps(av, b0, c00), c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(a + 1);
        c10 = _mm256_fmadd_ps(av, b0, c10), c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(a + 2);
        c20 = _mm256_fmadd_ps(av, b0, c20), c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(a + 3);
        c30 = _mm256_fmadd_ps(av, b0, c30), c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(a + 4);
        c40 = _mm256_fmadd_ps(av, b0, c40), c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(a + 5);
        c50 = _mm256_fmadd_ps(av, b0, c50), c51 = _mm256_fmadd_ps(av, b1, c51);
    }
    const __m256 z = _mm256_setzero_ps();
    const __m256 clo = mode == 1 && cb ? _mm256_loadu_ps(cb) : z, chi = mode == 1 && cb ? _mm256_loadu_ps(cb + 8) : z;
    const int m = mode == 0 ? 0 : 1;  // mode 2 adds zero vectors
    const bool rows = mode == 1 && rb;
    __m256 v = rows ? _mm256_set1_ps(rb[0]) : z;
    put(c, c00, c01, m, _mm256_add_ps(clo, v), _mm256_add_ps(chi, v));
    v = rows ? _mm256_set1_ps(rb[1]) : z;
    put(c + ldc, c10, c11, m, _mm256_add_ps(clo, v), _mm256_add_ps(chi, v));
    v = rows ? _mm256_set1_ps(rb[2]) : z;
    put(c + 2 * ldc, c20, c21, m, _mm256_add_ps(clo, v), _mm256_add_ps(chi, v));
    v = rows ? _mm256_set1_ps(rb[3]) : z;
    put(c + 3 * ldc, c30, c31, m, _mm256_add_ps(clo, v), _mm256_add_ps(chi, v));
    v = rows ? _mm256_set1_ps(rb[4]) : z;
    put(c + 4 * ldc, c40, c41, m, _mm256_add_ps(clo, v), _mm256_add_ps(chi, v));
    v = rows ? _mm256_set1_ps(rb[5]) : z;
    put(c + 5 * ldc, c50, c51, m, _mm256_add_ps(clo, v), _mm256_add_ps(chi, v));
}

}  // namespace sdplan::fma

#endif  // SDPLAN_FMA_X86
