// RoPE of the Flux-style DiTs (see rope.h). A plain loop over channel pairs, vectorized by the
// compiler (-O3); each row reads its token's table row once.
#include "kernels/rope.h"

#include <cstdint>

namespace sdplan {

void cpu_rope_pairs(ggml_tensor *dst, int ith, int nth, void *) {
    const ggml_tensor *x = dst->src[0];
    const float *cos_t = (const float *)dst->src[1]->data, *sin_t = (const float *)dst->src[2]->data;
    const int64_t hd = x->ne[0], half = hd / 2, H = x->ne[1], N = x->ne[2], B = x->ne[3];
    const int64_t rows = H * N * B;
    for (int64_t r = rows * ith / nth; r < rows * (ith + 1) / nth; ++r) {
        const int64_t h = r % H, n = (r / H) % N, b = r / (H * N);
        const float *src = (const float *)((const char *)x->data + h * x->nb[1] + n * x->nb[2] + b * x->nb[3]);
        float *out = (float *)dst->data + r * hd;
        const float *c = cos_t + n * half, *s = sin_t + n * half;
        for (int64_t i = 0; i < half; ++i) {
            const float x0 = src[2 * i], x1 = src[2 * i + 1];
            out[2 * i] = x0 * c[i] - x1 * s[i];
            out[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
    }
}

}  // namespace sdplan
