// Fused LayerNorm (see layer_norm.h). Per row: the mean, then the variance of the centred
// values (two passes over a row that stays in L1), then one write of the normalised row times
// the weight plus the bias. Threads split the rows.
#include "kernels/layer_norm.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/fma_gemm.h"
#include "kernels/fma_tiles.h"

namespace sdplan {

namespace {

struct Row {
    const float *x, *w, *b;
    float *y;
    int64_t n;
    float eps;
};

void row_scalar(const Row &r) {
    double s = 0.0;
    for (int64_t i = 0; i < r.n; ++i) s += r.x[i];
    const float mean = (float)(s / (double)r.n);
    double v = 0.0;
    for (int64_t i = 0; i < r.n; ++i) v += (double)(r.x[i] - mean) * (r.x[i] - mean);
    const float inv = 1.0f / std::sqrt((float)(v / (double)r.n) + r.eps);
    for (int64_t i = 0; i < r.n; ++i) {
        const float t = (r.x[i] - mean) * inv;
        r.y[i] = (r.w ? t * r.w[i] : t) + (r.b ? r.b[i] : 0.0f);
    }
}

#ifdef SDPLAN_FMA_X86
SDPLAN_FMA inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

SDPLAN_FMA void row_avx2(const Row &r) {
    const int64_t n8 = r.n / 8 * 8;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n8; i += 16) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(r.x + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(r.x + i + 8));
    }
    for (; i < n8; i += 8) s0 = _mm256_add_ps(s0, _mm256_loadu_ps(r.x + i));
    float s = hsum(_mm256_add_ps(s0, s1));
    for (i = n8; i < r.n; ++i) s += r.x[i];
    const float mean = s / (float)r.n;
    const __m256 m = _mm256_set1_ps(mean);
    __m256 v0 = _mm256_setzero_ps();
    for (i = 0; i < n8; i += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(r.x + i), m);
        v0 = _mm256_fmadd_ps(d, d, v0);
    }
    float v = hsum(v0);
    for (i = n8; i < r.n; ++i) v += (r.x[i] - mean) * (r.x[i] - mean);
    const float inv = 1.0f / std::sqrt(v / (float)r.n + r.eps);
    const __m256 sc = _mm256_set1_ps(inv);
    for (i = 0; i < n8; i += 8) {
        __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(r.x + i), m), sc);
        if (r.w) t = _mm256_mul_ps(t, _mm256_loadu_ps(r.w + i));
        if (r.b) t = _mm256_add_ps(t, _mm256_loadu_ps(r.b + i));
        _mm256_storeu_ps(r.y + i, t);
    }
    for (i = n8; i < r.n; ++i) {
        const float t = (r.x[i] - mean) * inv;
        r.y[i] = (r.w ? t * r.w[i] : t) + (r.b ? r.b[i] : 0.0f);
    }
}
#endif

}  // namespace

void cpu_layer_norm(ggml_tensor *dst, int ith, int nth, void *userdata) {
    float eps;
    std::memcpy(&eps, userdata, sizeof eps);
    const ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const int64_t D = x->ne[0], rows = ggml_nrows(x);
    const float *wd = w ? (const float *)w->data : nullptr, *bd = b ? (const float *)b->data : nullptr;
    for (int64_t r = rows * ith / nth; r < rows * (ith + 1) / nth; ++r) {
        const Row row{(const float *)x->data + r * D, wd, bd, (float *)dst->data + r * D, D, eps};
#ifdef SDPLAN_FMA_X86
        if (fma_gemm_cpu()) {
            row_avx2(row);
            continue;
        }
#endif
        row_scalar(row);
    }
}

}  // namespace sdplan
