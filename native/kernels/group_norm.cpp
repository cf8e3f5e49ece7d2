// Fused GroupNorm for Graph::group_norm_affine: a custom ggml CPU op (run through
// ggml_custom_4d on CPU-only graphs) that normalizes each channel group and applies the
// per-channel affine, and optionally the SiLU that follows it in the UNets' and VAEs' blocks,
// in one pass over the output.
#include "kernels/group_norm.h"

#include "kernels/glu.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sdplan {

namespace {

constexpr int kLanes = 16;  // independent partial sums per row (vectorized without reassociation)

// Sum and sum of squares of row[0..n) - k, each as 16 interleaved double partial sums (element
// i goes to sum i % 16): one loop the compiler vectorizes (the target wrappers below), each
// partial sum covering n / 16 values. About a shift k (a value of the group), so that the
// variance E[(x-k)^2] - E[x-k]^2 keeps its digits when the mean is large against the spread
// (about 0 and in float sums, values of mean 1000 and std 1 came out up to 0.09 off after
// normalizing, and at mean -3000 and std 0.5 the variance cancelled to 0); in double, so that a
// k far from the mean (an outlier as the group's first value: 1000 std off gave 2e-2 with float
// sums) costs no accuracy a float32 result shows and x - k cannot overflow.
#if defined(__GNUC__)
#define SDPLAN_GN_INLINE inline __attribute__((always_inline))  // into each target's wrapper
#else
#define SDPLAN_GN_INLINE inline
#endif

SDPLAN_GN_INLINE void row_sums_body(const float *row, int64_t n, double k, double &sum, double &sq) {
    double s1[kLanes] = {}, s2[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
            const double v = (double)row[i + l] - k;
            s1[l] += v;
            s2[l] += v * v;
        }
    }
    for (int l = 0; i < n; ++i, ++l) {
        const double v = (double)row[i] - k;
        s1[l] += v;
        s2[l] += v * v;
    }
    for (int l = 0; l < kLanes; ++l) {
        sum += s1[l];
        sq += s2[l];
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("avx512f"))) void row_sums_avx512(const float *row, int64_t n, double k, double &sum,
                                                        double &sq) {
    row_sums_body(row, n, k, sum, sq);
}
__attribute__((target("avx2,fma"))) void row_sums_avx2(const float *row, int64_t n, double k, double &sum,
                                                       double &sq) {
    row_sums_body(row, n, k, sum, sq);
}
#endif

void row_sums(const float *row, int64_t n, double k, double &sum, double &sq) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (glu_avx512()) return row_sums_avx512(row, n, k, sum, sq);
    if (glu_simd()) return row_sums_avx2(row, n, k, sum, sq);
#endif
    row_sums_body(row, n, k, sum, sq);
}

}  // namespace

// GroupNorm with its per-channel affine (and SiLU) in one CPU op: x f32 [W, H, C, N]
// (contiguous), gamma and beta f32 [C] (src 1 and 2) -> y = (x - mean) / sqrt(var + eps) * gamma
// + beta over each group of C / n_groups channels, then y / (1 + exp(-y)) with the SiLU flag.
// Two passes over the group (sums, then one scaled write) instead of ggml's group_norm, mul,
// add (and silu): five (seven) passes.
void cpu_group_norm(ggml_tensor *dst, int ith, int nth, void *userdata) {
    int n_groups, silu;
    float eps;
    std::memcpy(&n_groups, userdata, sizeof n_groups);
    std::memcpy(&eps, (const char *)userdata + sizeof(int), sizeof eps);
    std::memcpy(&silu, (const char *)userdata + 2 * sizeof(int), sizeof silu);
    const ggml_tensor *x = dst->src[0], *gamma = dst->src[1], *beta = dst->src[2];
    const int64_t HW = x->ne[0] * x->ne[1], C = x->ne[2], N = x->ne[3];
    const int64_t jobs = N * n_groups, per = (jobs + nth - 1) / nth;
    const int64_t j0 = per * ith, j1 = std::min(jobs, j0 + per);
    for (int64_t j = j0; j < j1; ++j) {
        const int64_t n = j / n_groups, grp = j % n_groups;
        const int64_t c0 = grp * C / n_groups, c1 = (grp + 1) * C / n_groups;
        const auto src_row = [&](int64_t c) {
            return (const float *)((const char *)x->data + n * x->nb[3] + c * x->nb[2]);
        };
        const double k = std::isfinite(src_row(c0)[0]) ? src_row(c0)[0] : 0.0;
        double sum = 0.0, sq = 0.0;
        for (int64_t c = c0; c < c1; ++c) row_sums(src_row(c), HW, k, sum, sq);
        const double cnt = (double)(c1 - c0) * HW;
        const double dmean = sum / cnt;  // mean - k
        const double mean = k + dmean;
        const double var = std::max(0.0, sq / cnt - dmean * dmean);
        const float rstd = (float)(1.0 / std::sqrt(var + eps));
        for (int64_t c = c0; c < c1; ++c) {
            const float g = gamma ? ((const float *)gamma->data)[c] : 1.0f;
            const float b = beta ? ((const float *)beta->data)[c] : 0.0f;
            const float scale = g * rstd, shift = (float)(b - mean * scale);
            const float *row = src_row(c);
            float *out = (float *)((char *)dst->data + n * dst->nb[3] + c * dst->nb[2]);
            if (silu) {
                silu_affine_row(row, out, HW, scale, shift);
            } else {
                for (int64_t i = 0; i < HW; ++i) out[i] = row[i] * scale + shift;
            }
        }
    }
}

}  // namespace sdplan
