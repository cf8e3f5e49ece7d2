// Fused GroupNorm for Graph::group_norm_affine: a custom ggml CPU op (run through
// ggml_custom_4d on CPU-only graphs) that normalizes each channel group and applies the
// per-channel affine in one pass over the output.
#include "kernels/group_norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sdplan {

// GroupNorm with its per-channel affine in one CPU op: x f32 [W, H, C, N] (contiguous),
// gamma and beta f32 [C] (src 1 and 2) -> y = (x - mean) / sqrt(var + eps) * gamma + beta
// over each group of C / n_groups channels. Two passes over the group (sums in double, then
// one scaled write) instead of ggml's group_norm, mul and add (five).
void cpu_group_norm(ggml_tensor *dst, int ith, int nth, void *userdata) {
    int n_groups;
    float eps;
    std::memcpy(&n_groups, userdata, sizeof n_groups);
    std::memcpy(&eps, (const char *)userdata + sizeof(int), sizeof eps);
    const ggml_tensor *x = dst->src[0], *gamma = dst->src[1], *beta = dst->src[2];
    const int64_t HW = x->ne[0] * x->ne[1], C = x->ne[2], N = x->ne[3];
    const int64_t jobs = N * n_groups, per = (jobs + nth - 1) / nth;
    const int64_t j0 = per * ith, j1 = std::min(jobs, j0 + per);
    for (int64_t j = j0; j < j1; ++j) {
        const int64_t n = j / n_groups, grp = j % n_groups;
        const int64_t c0 = grp * C / n_groups, c1 = (grp + 1) * C / n_groups;
        double sum = 0.0, sq = 0.0;
        for (int64_t c = c0; c < c1; ++c) {
            const float *row = (const float *)((const char *)x->data + n * x->nb[3] + c * x->nb[2]);
            float s1 = 0.0f, s2 = 0.0f;
            for (int64_t i = 0; i < HW; ++i) {
                s1 += row[i];
                s2 += row[i] * row[i];
            }
            sum += s1;
            sq += s2;
        }
        const double cnt = (double)(c1 - c0) * HW;
        const double mean = sum / cnt;
        const double var = std::max(0.0, sq / cnt - mean * mean);
        const float rstd = (float)(1.0 / std::sqrt(var + eps));
        for (int64_t c = c0; c < c1; ++c) {
            const float g = gamma ? ((const float *)gamma->data)[c] : 1.0f;
            const float b = beta ? ((const float *)beta->data)[c] : 0.0f;
            const float scale = g * rstd, shift = b - (float)mean * scale;
            const float *row = (const float *)((const char *)x->data + n * x->nb[3] + c * x->nb[2]);
            float *out = (float *)((char *)dst->data + n * dst->nb[3] + c * dst->nb[2]);
            for (int64_t i = 0; i < HW; ++i) out[i] = row[i] * scale + shift;
        }
    }
}

}  // namespace sdplan
