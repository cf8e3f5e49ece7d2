// Channels-last im2col for conv_2d's cpu_im2col method: two custom ggml CPU ops (run through
// ggml_custom_4d on CPU-only graphs), the column builder cpu_im2col and the kernel reorder
// cpu_kernel_order that puts a conv kernel in the same (kh, kw, ic) column order, so that one
// ggml_mul_mat of the two gives the convolution.
#include "kernels/im2col.h"

#include <ggml-cpu.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace sdplan {

// im2col for the CPU backend with the columns in (kh, kw, ic) order: x f32 [IW, IH, IC, N]
// (ggml ne, contiguous) -> dst [KH*KW*IC, OW*OH*N] (f32 or f16). Each thread takes a run of
// output rows (n, oh). An input row slab x[n, :, ih, :] is transposed once to [IW, IC] (in
// the columns' dtype) and kept in a small cache of KH slabs, so that every column segment is
// a contiguous copy of IC values (ggml's own im2col gathers one value at a time in
// (ic, kh, kw) order).
void cpu_im2col(ggml_tensor *dst, int ith, int nth, void *userdata) {
    Im2colParams p;
    std::memcpy(&p, userdata, sizeof p);
    const ggml_tensor *x = dst->src[0];
    const int64_t IW = x->ne[0], IH = x->ne[1], IC = x->ne[2], N = x->ne[3];
    const int64_t OW = (IW + 2 * p.p0 - p.d0 * (p.kw - 1) - 1) / p.s0 + 1;
    const int64_t OH = (IH + 2 * p.p1 - p.d1 * (p.kh - 1) - 1) / p.s1 + 1;
    const bool half = dst->type == GGML_TYPE_F16;
    const size_t es = half ? 2 : 4;
    const size_t row_bytes = (size_t)IC * es;
    thread_local std::vector<float> tmp;
    thread_local std::vector<char> cache;
    thread_local std::vector<int64_t> tags;
    tmp.resize((size_t)IW * IC);
    cache.resize((size_t)p.kh * IW * row_bytes);
    tags.assign(p.kh, -1);
    auto slab = [&](int64_t n, int64_t ih) -> const char * {
        const int64_t tag = n * IH + ih;
        for (int k = 0; k < p.kh; ++k)
            if (tags[k] == tag) return cache.data() + (size_t)k * IW * row_bytes;
        const int k = (int)(ih % p.kh);
        tags[k] = tag;
        char *out = cache.data() + (size_t)k * IW * row_bytes;
        const char *base = (const char *)x->data + n * x->nb[3] + ih * x->nb[1];
        float *t = half ? tmp.data() : (float *)out;
        // 8x8 blocks: read 8 channel rows along iw, write 8 pixel rows along ic
        for (int64_t c0 = 0; c0 < IC; c0 += 8) {
            const int64_t nc = std::min<int64_t>(8, IC - c0);
            const float *rows[8];
            for (int64_t c = 0; c < nc; ++c) rows[c] = (const float *)(base + (c0 + c) * x->nb[2]);
            for (int64_t w0 = 0; w0 < IW; w0 += 8) {
                const int64_t nw = std::min<int64_t>(8, IW - w0);
                for (int64_t w = 0; w < nw; ++w) {
                    float *d = t + (w0 + w) * IC + c0;
                    for (int64_t c = 0; c < nc; ++c) d[c] = rows[c][w0 + w];
                }
            }
        }
        if (half) ggml_cpu_fp32_to_fp16(tmp.data(), (ggml_fp16_t *)out, IW * IC);
        return out;
    };
    const int64_t rows = N * OH;
    const int64_t per = (rows + nth - 1) / nth;
    const int64_t r0 = per * ith, r1 = std::min(rows, r0 + per);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / OH, oh = r % OH;
        char *out = (char *)dst->data + (size_t)(n * OH + oh) * OW * dst->nb[1];
        for (int kh = 0; kh < p.kh; ++kh) {
            const int64_t ih = oh * p.s1 + (int64_t)kh * p.d1 - p.p1;
            if (ih < 0 || ih >= IH) {
                for (int64_t ow = 0; ow < OW; ++ow)
                    std::memset(out + ow * dst->nb[1] + (size_t)kh * p.kw * row_bytes, 0, (size_t)p.kw * row_bytes);
                continue;
            }
            const char *src = slab(n, ih);
            for (int kw = 0; kw < p.kw; ++kw) {
                const size_t off = (size_t)(kh * p.kw + kw) * row_bytes;
                for (int64_t ow = 0; ow < OW; ++ow) {
                    const int64_t iw = ow * p.s0 + (int64_t)kw * p.d0 - p.p0;
                    char *d = out + ow * dst->nb[1] + off;
                    if (iw < 0 || iw >= IW) std::memset(d, 0, row_bytes);
                    else std::memcpy(d, src + iw * row_bytes, row_bytes);
                }
            }
        }
    }
}

// A conv kernel [KW, KH, IC, OC] (ggml ne, f32 or f16, contiguous) reordered to
// [IC, KW, KH, OC]: the column order of cpu_im2col. Threads split the output channels.
void cpu_kernel_order(ggml_tensor *dst, int ith, int nth, void *) {
    const ggml_tensor *w = dst->src[0];
    const int64_t KK = w->ne[0] * w->ne[1], IC = w->ne[2], OC = w->ne[3];
    const size_t es = ggml_type_size(w->type);
    const int64_t per = (OC + nth - 1) / nth;
    const int64_t o0 = per * ith, o1 = std::min(OC, o0 + per);
    for (int64_t o = o0; o < o1; ++o) {
        const char *src = (const char *)w->data + o * w->nb[3];
        char *d = (char *)dst->data + o * dst->nb[3];
        if (es == 2) {
            const uint16_t *s16 = (const uint16_t *)src;
            uint16_t *d16 = (uint16_t *)d;
            for (int64_t ic = 0; ic < IC; ++ic)
                for (int64_t k = 0; k < KK; ++k) d16[k * IC + ic] = s16[ic * KK + k];
        } else {
            const float *s32 = (const float *)src;
            float *d32 = (float *)d;
            for (int64_t ic = 0; ic < IC; ++ic)
                for (int64_t k = 0; k < KK; ++k) d32[k * IC + ic] = s32[ic * KK + k];
        }
    }
}

}  // namespace sdplan
