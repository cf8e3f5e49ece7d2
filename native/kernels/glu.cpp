// GELU and GEGLU with a vectorized erf (see glu.h), 16 lanes with AVX-512 or 8 with AVX2 and
// FMA (the same formulas). erf(z) for z >= 0 by Abramowitz & Stegun 7.1.26,
// 1 - (a1 t + ... + a5 t^5) exp(-z^2) with t = 1 / (1 + p z), absolute error below 1.5e-7
// (Handbook of Mathematical Functions, 1964), odd extension for z < 0; exp by range reduction
// and a degree-6 polynomial (relative error below 2e-7). The tanh approximation is
// 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), computed as x exp(2u) / (exp(2u) + 1).
// Threads split the rows.
#include "kernels/glu.h"
#include "kernels/fma_gemm.h"
#include "kernels/fma_tiles.h"

#include <atomic>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define SDPLAN_GLU_X86 1
#define SDPLAN_GLU_AVX512 __attribute__((target("avx512f,avx512dq")))
#endif

namespace sdplan {

namespace {

float gelu_erf_scalar(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

float gelu_tanh_scalar(float x) {
    // 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): no cancellation where tanh(u) is near -1
    return x / (1.0f + std::exp(-2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

#ifdef SDPLAN_GLU_X86
SDPLAN_GLU_AVX512 inline __m512 exp_ps(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), f);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

SDPLAN_GLU_AVX512 inline __m512 gelu_erf_ps(__m512 x) {
    const __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f));
    const __m512 az = _mm512_abs_ps(z);
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(az, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.0f)));
    __m512 poly = _mm512_set1_ps(1.061405429f);
    poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(-1.453152027f));
    poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(1.421413741f));
    poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(-0.284496736f));
    poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(0.254829592f));
    poly = _mm512_mul_ps(poly, t);
    const __m512 e = exp_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), az), az));
    __m512 erf = _mm512_fnmadd_ps(poly, e, _mm512_set1_ps(1.0f));             // erf(|z|)
    erf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(erf),       // sign of z
                                              _mm512_and_si512(_mm512_castps_si512(z), _mm512_set1_epi32(INT32_MIN))));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), erf));
}

SDPLAN_GLU_AVX512 inline __m512 gelu_tanh_ps(__m512 x) {
    const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                   _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), _mm512_mul_ps(x, x), x));
    // 0.5 (1 + tanh(u)) = e / (e + 1), e = exp(2u) (clamped finite): no cancellation near -1
    const __m512 e = exp_ps(_mm512_add_ps(u, u));
    return _mm512_mul_ps(x, _mm512_div_ps(e, _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
}

// out[i] = (mul ? mul[i] : 1) * gelu(x[i]) for i < n.
template <bool TANH>
SDPLAN_GLU_AVX512 void row_avx512(const float *x, const float *mul, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const int64_t left = n - i;
        const __mmask16 mk = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(mk, x + i);
        __m512 y = TANH ? gelu_tanh_ps(v) : gelu_erf_ps(v);
        if (mul) y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(mk, mul + i));
        _mm512_mask_storeu_ps(out + i, mk, y);
    }
}
#endif

#ifdef SDPLAN_FMA_X86
// exp(x) as exp_ps above in 8 lanes: x clamped to [-87, 88] (AVX2 has no scalef: 2^n is put into
// the exponent bits, so n stays within the normal exponents; below -87 the result is about
// 1e-38 instead of a subnormal or 0, which both GELUs multiply away).
SDPLAN_FMA inline __m256 exp_256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), f);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

SDPLAN_FMA inline __m256 gelu_erf_256(__m256 x) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
    const __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
    const __m256 az = _mm256_andnot_ps(sign, z);
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(az, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.0f)));
    __m256 poly = _mm256_set1_ps(1.061405429f);
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-1.453152027f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(1.421413741f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-0.284496736f));
    poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(0.254829592f));
    poly = _mm256_mul_ps(poly, t);
    const __m256 e = exp_256(_mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), az), az));
    __m256 erf = _mm256_fnmadd_ps(poly, e, _mm256_set1_ps(1.0f));  // erf(|z|)
    erf = _mm256_or_ps(erf, _mm256_and_ps(z, sign));                 // sign of z
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), erf));
}

SDPLAN_FMA inline __m256 gelu_tanh_256(__m256 x) {
    const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                                   _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x), _mm256_mul_ps(x, x), x));
    const __m256 u2 = _mm256_add_ps(u, u), e = exp_256(u2);
    const __m256 y = _mm256_mul_ps(x, _mm256_div_ps(e, _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    // below 2u = -87 (x below about -10) the clamped exp would leave x * 1e-38, up to -5 at
    // x = -3e38: those lanes take x * 0 (-0, NaN for -inf), the value to f32's precision
    const __m256 far = _mm256_cmp_ps(u2, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    return _mm256_blendv_ps(y, _mm256_mul_ps(x, _mm256_setzero_ps()), far);
}

// row_avx512 in 8 lanes; the last partial vector through masked loads and stores, so that every
// value takes the same formula wherever it sits in the row.
template <bool TANH>
SDPLAN_FMA void row_avx2(const float *x, const float *mul, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        const int64_t left = n - i;
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)std::min<int64_t>(left, 8)),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 v = left >= 8 ? _mm256_loadu_ps(x + i) : _mm256_maskload_ps(x + i, mk);
        __m256 y = TANH ? gelu_tanh_256(v) : gelu_erf_256(v);
        if (mul) y = _mm256_mul_ps(y, left >= 8 ? _mm256_loadu_ps(mul + i) : _mm256_maskload_ps(mul + i, mk));
        if (left >= 8) _mm256_storeu_ps(out + i, y);
        else _mm256_maskstore_ps(out + i, mk, y);
    }
}
#endif

void row(bool tanh, const float *x, const float *mul, float *out, int64_t n) {
#ifdef SDPLAN_GLU_X86
    if (glu_avx512()) {
        if (tanh) row_avx512<true>(x, mul, out, n);
        else row_avx512<false>(x, mul, out, n);
        return;
    }
#endif
#ifdef SDPLAN_FMA_X86
    if (glu_simd()) {  // not AVX-512: AVX2 with FMA
        if (tanh) row_avx2<true>(x, mul, out, n);
        else row_avx2<false>(x, mul, out, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) {
        const float y = tanh ? gelu_tanh_scalar(x[i]) : gelu_erf_scalar(x[i]);
        out[i] = mul ? mul[i] * y : y;
    }
}

}  // namespace

namespace {
std::atomic<bool> simd_off{false};    // set_glu_simd(false): the scalar path (tests compare them)
std::atomic<bool> avx512_off{false};  // set_glu_simd(true, false): the AVX2 path on an AVX-512 CPU
}  // namespace

bool glu_cpu_avx512() {
#ifdef SDPLAN_GLU_X86
    static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    return ok;
#else
    return false;
#endif
}

bool glu_avx512() { return glu_cpu_avx512() && !simd_off.load() && !avx512_off.load(); }

bool glu_simd() { return (glu_cpu_avx512() || fma_gemm_cpu()) && !simd_off.load(); }

const char *glu_simd_name() { return glu_avx512() ? "avx512" : glu_simd() ? "avx2" : "off"; }

void set_glu_simd(bool on, bool allow_avx512) {
    simd_off.store(!on);
    avx512_off.store(!allow_avx512);
}

namespace {
// Every value of dst's source through the erf GELU or the tanh one, in chunks split among threads.
void gelu_values(ggml_tensor *dst, int ith, int nth, bool tanh) {
    const ggml_tensor *x = dst->src[0];
    const int64_t n = ggml_nelements(x), chunk = 4096;
    const int64_t chunks = (n + chunk - 1) / chunk;
    for (int64_t c = chunks * ith / nth; c < chunks * (ith + 1) / nth; ++c) {
        const int64_t i0 = c * chunk;
        row(tanh, (const float *)x->data + i0, nullptr, (float *)dst->data + i0, std::min(chunk, n - i0));
    }
}
}  // namespace

void cpu_gelu_erf(ggml_tensor *dst, int ith, int nth, void *) { gelu_values(dst, ith, nth, false); }

void cpu_gelu_tanh(ggml_tensor *dst, int ith, int nth, void *) { gelu_values(dst, ith, nth, true); }

namespace {

// Quick GELU, x sigmoid(1.702 x) = x / (1 + 2^(-1.702 log2(e) x)), for n values. Where the
// exponent passes 126 (x below about -52) exp overflows f32 in the scalar loop and x / inf gives
// -0 (NaN for -inf); the vector loop clamps the exponent to 126 for exp2_256 and then takes x * 0
// for those lanes, the same values (x / 2^126 alone would be -4 at x = -3.4e38, and -inf at -inf).
void gelu_quick_scalar(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-1.702f * x[i]));
}

#ifdef SDPLAN_FMA_X86
SDPLAN_FMA void gelu_quick_avx2(const float *x, float *y, int64_t n) {
    const __m256 c = _mm256_set1_ps(-1.702f * 1.44269504088896341f), hi = _mm256_set1_ps(126.0f);
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i), t = _mm256_mul_ps(v, c);
        const __m256 e = fma::exp2_256(_mm256_min_ps(t, hi));
        const __m256 far = _mm256_cmp_ps(t, hi, _CMP_GT_OQ);  // exp overflows: x * 0
        const __m256 r = _mm256_div_ps(v, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_blendv_ps(r, _mm256_mul_ps(v, _mm256_setzero_ps()), far));
    }
    gelu_quick_scalar(x + i, y + i, n - i);
}
#endif

}  // namespace

void cpu_gelu_quick(ggml_tensor *dst, int ith, int nth, void *) {
    const ggml_tensor *x = dst->src[0];
    const int64_t n = ggml_nelements(x), chunk = 4096;
    const int64_t chunks = (n + chunk - 1) / chunk;
    for (int64_t c = chunks * ith / nth; c < chunks * (ith + 1) / nth; ++c) {
        const int64_t i0 = c * chunk, m = std::min(chunk, n - i0);
        const float *src = (const float *)x->data + i0;
        float *out = (float *)dst->data + i0;
#ifdef SDPLAN_FMA_X86
        if (fma_gemm_cpu()) {
            gelu_quick_avx2(src, out, m);
            continue;
        }
#endif
        gelu_quick_scalar(src, out, m);
    }
}

void cpu_geglu(ggml_tensor *dst, int ith, int nth, void *userdata) {
    const bool tanh = userdata && *static_cast<const int *>(userdata) != 0;
    const ggml_tensor *x = dst->src[0];
    const int64_t D = dst->ne[0], rows = ggml_nrows(dst);
    for (int64_t r = rows * ith / nth; r < rows * (ith + 1) / nth; ++r) {
        const float *xr = (const float *)x->data + r * 2 * D;
        row(tanh, xr + D, xr, (float *)dst->data + r * D, D);
    }
}

}  // namespace sdplan
