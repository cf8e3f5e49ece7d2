// GELU and GEGLU vectorized (see glu.h), 16 lanes with AVX-512 or 8 with AVX2 and FMA, one
// formula for both widths (gelu_erf_v, gelu_tanh_v below): the erf form through erfc with a
// relative error bound, the tanh form 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3),
// as x exp(2u) / (exp(2u) + 1); exp by range reduction and a degree-6 polynomial. The scalar
// path (set_glu_simd(false)) is the C library's erff and expf. Threads split the rows.
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
// One formula for every vector width: F is __m256 or __m512 (GCC/Clang vector types, so
// arithmetic, comparisons and scalar operands are element-wise), I the int32 vector of its size.
// The functions are inlined into each ISA's row loop below, whose target attribute then picks
// the instructions; nothing here names an ISA.
template <class F> struct Ints { typedef int32_t I __attribute__((vector_size(sizeof(F)))); };

// Only ever inlined into a function of the matching target, so the ABI of passing these vectors
// by value (GCC's -Wpsabi note about functions without that target, given where the templates
// are instantiated, at the end of the file: hence for the whole file) never applies.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define SDPLAN_GLU_VEC inline __attribute__((always_inline))

// m ? a : b per lane (m from a comparison: all bits set or clear).
template <class F, class I = typename Ints<F>::I>
SDPLAN_GLU_VEC F select(I m, F a, F b) { return (F)(((I)a & m) | ((I)b & ~m)); }

// v in every lane.
template <class F>
SDPLAN_GLU_VEC F splat(float v) { return F{} + v; }

// exp(x) for x clamped to [-87, 88]: n = round(x / ln 2) (by adding and subtracting 1.5 * 2^23),
// f = x - n ln 2 in two parts (Cody-Waite), e^f by its degree-6 Taylor polynomial (|f| <= ln 2 / 2:
// relative error below 2e-7), 2^n put into the exponent bits (n stays a normal exponent; below
// -87 the result is about 1e-38 instead of a subnormal or 0, which both GELUs multiply away).
template <class F, class I = typename Ints<F>::I>
SDPLAN_GLU_VEC F exp_v(F x) {
    x = select<F>(x < -87.0f, splat<F>(-87.0f), x);
    x = select<F>(x > 88.0f, splat<F>(88.0f), x);
    const F n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    F f = x - n * 0.693145751953125f;
    f = f - n * 1.428606765330187e-06f;
    F p = f * (1.0f / 720) + 1.0f / 120;
    p = p * f + 1.0f / 24;
    p = p * f + 1.0f / 6;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    const I e = (__builtin_convertvector(n, I) + 127) << 23;
    return p * (F)e;
}

// GELU, erf form: x Phi(x) = x (1 - erfc(z) / 2) for x >= 0 and x erfc(|z|) / 2 below, z = x / sqrt 2,
// with erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), P of degree 9: fractional error below
// 1.2e-7 for every z >= 0 (the Chebyshev fit of Press et al., Numerical Recipes, 2nd ed., 6.2
// "erfcc"). A relative bound on erfc keeps the negative tail (x Phi(x) small) accurate relative to
// itself, which an absolute bound on erf (1 + erf cancels there) does not.
template <class F, class I = typename Ints<F>::I>
SDPLAN_GLU_VEC F gelu_erf_v(F x) {
    const F z = (F)((I)(x * 0.70710678118654752f) & 0x7fffffff);  // |x| / sqrt 2
    const F t = 1.0f / (z * 0.5f + 1.0f);
    F p = t * 0.17087277f - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    // the exponent p - z^2 with z^2 = x^2 / 2 from x itself (z's rounding would move exp(-z^2)
    // by 2 z^2 * 6e-8 relative, 2e-6 at z = 4) and the rounding error r of both steps (x^2's by
    // FMA where the compiler fuses x * x - h, the subtraction's by TwoSum): exp(p - z^2) =
    // exp(a) (1 + r) to f32's precision
    const F h = x * x, q = h * 0.5f, ql = (x * x - h) * 0.5f;
    const F a = p - q, b = a + q;
    // past exp's clamp (and for x^2 = inf, where r would be NaN) erfc is below 1e-38: no r
    const F r = select<F>(a < -87.0f, F{}, ((p - b) + (b - a - q)) - ql);
    const F c = t * (exp_v<F>(a) * (r + 1.0f));  // erfc(|z|)
    return x * select<F>(x >= 0.0f, 1.0f - c * 0.5f, c * 0.5f);
}

// GELU, tanh form: 0.5 (1 + tanh(u)) = e / (e + 1), e = exp(2u) (clamped finite): no
// cancellation near -1. Below 2u = -87 (x below about -10) the clamped exp would leave
// x * 1e-38, up to -5 at x = -3e38: those lanes take x * 0 (-0, NaN for -inf).
template <class F, class I = typename Ints<F>::I>
SDPLAN_GLU_VEC F gelu_tanh_v(F x) {
    const F u2 = (x * x * (0.044715f * 0.7978845608028654f * 2.0f) + 0.7978845608028654f * 2.0f) * x;
    const F e = exp_v<F>(u2);
    return select<F>(u2 < -87.0f, x * 0.0f, x * (e / (e + 1.0f)));
}

// SiLU, v / (1 + exp(-v)); below -88 (exp_v clamped) v * 0, as 1 + expf(-v) = inf gives.
template <class F, class I = typename Ints<F>::I>
SDPLAN_GLU_VEC F silu_v(F v) {
    return select<F>(v < -88.0f, v * 0.0f, v / (exp_v<F>(-v) + 1.0f));
}

// out[i] = (mul ? mul[i] : 1) * gelu(x[i]) for i < n, 16 lanes.
template <bool TANH>
SDPLAN_GLU_AVX512 void row_avx512(const float *x, const float *mul, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const int64_t left = n - i;
        const __mmask16 mk = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(mk, x + i);
        __m512 y = TANH ? gelu_tanh_v(v) : gelu_erf_v(v);
        if (mul) y = _mm512_mul_ps(y, _mm512_maskz_loadu_ps(mk, mul + i));
        _mm512_mask_storeu_ps(out + i, mk, y);
    }
}
#endif

#ifdef SDPLAN_FMA_X86
// row_avx512 in 8 lanes; the last partial vector through masked loads and stores, so that every
// value takes the same formula wherever it sits in the row.
template <bool TANH>
SDPLAN_FMA void row_avx2(const float *x, const float *mul, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        __m256 y = TANH ? gelu_tanh_v(v) : gelu_erf_v(v);
        if (mul) y = _mm256_mul_ps(y, _mm256_loadu_ps(mul + i));
        _mm256_storeu_ps(out + i, y);
    }
    if (i == n) return;
    const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 v = _mm256_maskload_ps(x + i, mk);
    __m256 y = TANH ? gelu_tanh_v(v) : gelu_erf_v(v);
    if (mul) y = _mm256_mul_ps(y, _mm256_maskload_ps(mul + i, mk));
    _mm256_maskstore_ps(out + i, mk, y);
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

// SiLU of an affine map, out[i] = v / (1 + exp(-v)) with v = x[i] * scale + shift, for n values:
// exp_v's range reduction and degree-6 polynomial (relative error below 2e-7) where vectorized,
// the C library's expf otherwise. The limits as expf's x / (1 + expf(-x)) gives them: v for
// v > 87; for v < -88, past exp_v's clamp, v * 0 (-0, and NaN for -inf: -inf / inf); NaN for NaN.
void silu_affine_scalar(const float *x, float *out, int64_t n, float scale, float shift) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i] * scale + shift;
        out[i] = v / (1.0f + std::exp(-v));
    }
}

#ifdef SDPLAN_GLU_X86
SDPLAN_GLU_AVX512 void silu_affine_avx512(const float *x, float *out, int64_t n, float scale, float shift) {
    const __m512 a = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift);
    for (int64_t i = 0; i < n; i += 16) {
        const int64_t left = n - i;
        const __mmask16 mk = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        const __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + i), a, b);
        _mm512_mask_storeu_ps(out + i, mk, silu_v(v));
    }
}
#endif

#ifdef SDPLAN_FMA_X86
SDPLAN_FMA void silu_affine_avx2(const float *x, float *out, int64_t n, float scale, float shift) {
    const __m256 a = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), a, b);
        _mm256_storeu_ps(out + i, silu_v(v));
    }
    if (i == n) return;
    const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 v = _mm256_fmadd_ps(_mm256_maskload_ps(x + i, mk), a, b);
    _mm256_maskstore_ps(out + i, mk, silu_v(v));
}
#endif

}  // namespace

void silu_affine_row(const float *x, float *out, int64_t n, float scale, float shift) {
#ifdef SDPLAN_GLU_X86
    if (glu_avx512()) {
        silu_affine_avx512(x, out, n, scale, shift);
        return;
    }
#endif
#ifdef SDPLAN_FMA_X86
    if (glu_simd()) {
        silu_affine_avx2(x, out, n, scale, shift);
        return;
    }
#endif
    silu_affine_scalar(x, out, n, scale, shift);
}

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
