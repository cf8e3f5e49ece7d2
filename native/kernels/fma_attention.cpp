// Attention with f32 FMA products on the CPU (the fma_attention custom op): flash attention
// (Dao et al. 2022, "FlashAttention": key blocks, an online softmax) with the 6 x 16 micro-kernel
// of fma_tiles.h, computed transposed so that every step is vertical across 16 queries:
// - S^T = K Q^T per block of 240 keys and 64 queries: A = the keys (packed once per batch and
//   head into micro-panels of 6 keys), B = the queries (16 per panel, scaled by scale * log2 e:
//   scores in base 2), S^T stored [query group][key][16] (60 KB, in L2);
// - the online softmax down each key column of a group: running maximum and sum per query (two
//   vectors), probabilities exp2(s - maximum) in place, the factor 2^(old - new maximum) that
//   rescales what the queries accumulated;
// - O^T += V^T P^T: A = the values (packed once per batch and head into micro-panels of 6 value
//   columns over the keys), B = P^T, exactly S^T's layout, C = O^T [group][value column][16];
// - at the end each query's column divided by its sum and transposed into dst's rows.
// Threads split the batch-head pairs, and the queries when there are fewer pairs than two per
// thread.
#include "kernels/fma_attention.h"
#include "kernels/fma_gemm.h"
#include "kernels/fma_tiles.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace sdplan {

#ifdef SDPLAN_FMA_X86

namespace {

using namespace fma;

constexpr float kLog2e = 1.44269504088896341f;
constexpr int64_t kKeys = 240;    // keys per block (a multiple of 6 and of 16)
constexpr int64_t kGroups = 4;    // groups of 16 queries per block
constexpr int64_t kQueries = kGroups * NR;

// Rows (n of them, row i at base + i * stride, `cols` values) as micro-panels of 6 rows over
// the columns: out[p][c][6] = row 6p + r, column c (zero past n).
SDPLAN_FMA void pack_rows6(const char *base, size_t stride, int64_t n, int64_t cols, float *out) {
    for (int64_t p = 0; p < (n + MR - 1) / MR; ++p)
        for (int r = 0; r < MR; ++r) {
            const int64_t row = p * MR + r;
            float *o = out + p * cols * MR + r;
            if (row >= n) {
                for (int64_t c = 0; c < cols; ++c) o[c * MR] = 0.0f;
                continue;
            }
            const float *src = (const float *)(base + row * stride);
            for (int64_t c = 0; c < cols; ++c) o[c * MR] = src[c];
        }
}

// Columns of rows (n rows, row i at base + i * stride) as micro-panels of 6 columns over the
// rows: out[p][i][6] = row i, column 6p + r (zero past `cols` and for rows n .. n_pad).
SDPLAN_FMA void pack_cols6(const char *base, size_t stride, int64_t n, int64_t n_pad, int64_t cols, float *out) {
    const int64_t panels = (cols + MR - 1) / MR;
    for (int64_t i = 0; i < n_pad; ++i) {
        const float *src = (const float *)(base + i * stride);
        for (int64_t p = 0; p < panels; ++p) {
            float *o = out + (p * n_pad + i) * MR;
            for (int r = 0; r < MR; ++r) {
                const int64_t c = p * MR + r;
                o[r] = i < n && c < cols ? src[c] : 0.0f;
            }
        }
    }
}

// The queries q0 .. q0 + rows (row i at base + i * stride, D values) times `scale` as panels
// of 16: out[g][d][16] (zero past rows).
SDPLAN_FMA void pack_queries(const char *base, size_t stride, int64_t rows, int64_t D, float scale, float *out) {
    for (int64_t g = 0; g < (rows + NR - 1) / NR; ++g)
        for (int64_t t = 0; t < NR; ++t) {
            const int64_t i = g * NR + t;
            float *o = out + g * D * NR + t;
            const float *src = (const float *)(base + i * stride);
            for (int64_t d = 0; d < D; ++d) o[d * NR] = i < rows ? src[d] * scale : 0.0f;
        }
}

// One key block of one group's online softmax: s [key][16] over n keys (rows n .. n_pad set to
// 0), the running maximum mx and sum sm (16 each) updated, alpha = 2^(old - new maximum) (0
// where nothing was accumulated yet).
SDPLAN_FMA void softmax_block(float *s, int64_t n, int64_t n_pad, float *mx, float *sm, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256 m0 = ninf, m1 = ninf;
    for (int64_t k = 0; k < n; ++k) {
        m0 = _mm256_max_ps(m0, _mm256_load_ps(s + k * NR));
        m1 = _mm256_max_ps(m1, _mm256_load_ps(s + k * NR + 8));
    }
    const __m256 o0 = _mm256_loadu_ps(mx), o1 = _mm256_loadu_ps(mx + 8);
    m0 = _mm256_max_ps(m0, o0), m1 = _mm256_max_ps(m1, o1);
    const __m256 a0 = exp2_256(_mm256_sub_ps(o0, m0)), a1 = exp2_256(_mm256_sub_ps(o1, m1));
    // subtract a finite maximum (a query whose keys are all masked so far keeps -inf: its
    // scores stay -inf and give 0)
    const __m256 z = _mm256_setzero_ps();
    const __m256 u0 = _mm256_blendv_ps(z, m0, _mm256_cmp_ps(m0, ninf, _CMP_GT_OQ));
    const __m256 u1 = _mm256_blendv_ps(z, m1, _mm256_cmp_ps(m1, ninf, _CMP_GT_OQ));
    __m256 s0 = z, s1 = z;
    for (int64_t k = 0; k < n; ++k) {
        const __m256 p0 = exp2_256(_mm256_sub_ps(_mm256_load_ps(s + k * NR), u0));
        const __m256 p1 = exp2_256(_mm256_sub_ps(_mm256_load_ps(s + k * NR + 8), u1));
        _mm256_store_ps(s + k * NR, p0);
        _mm256_store_ps(s + k * NR + 8, p1);
        s0 = _mm256_add_ps(s0, p0), s1 = _mm256_add_ps(s1, p1);
    }
    for (int64_t k = n; k < n_pad; ++k) _mm256_store_ps(s + k * NR, z), _mm256_store_ps(s + k * NR + 8, z);
    _mm256_storeu_ps(sm, _mm256_fmadd_ps(_mm256_loadu_ps(sm), a0, s0));
    _mm256_storeu_ps(sm + 8, _mm256_fmadd_ps(_mm256_loadu_ps(sm + 8), a1, s1));
    _mm256_storeu_ps(mx, m0), _mm256_storeu_ps(mx + 8, m1);
    _mm256_storeu_ps(alpha, a0), _mm256_storeu_ps(alpha + 8, a1);
}

SDPLAN_FMA void run(ggml_tensor *dst, int ith, int nth, float scale) {
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *m = dst->src[3];
    const int64_t D = q->ne[0], Nq = q->ne[1], Hq = q->ne[2], B = q->ne[3];
    const int64_t Nk = k->ne[1], Hk = k->ne[2], Dv = v->ne[0];
    const int64_t Nk6 = round_up(Nk, MR), Dv6 = round_up(Dv, MR);
    const int64_t heads = B * Hq, qblocks = (Nq + NR - 1) / NR;
    const auto [qsplit, i0, i1] = split_work(heads, qblocks, ith, nth);
    if (i0 >= i1) return;
    thread_local std::vector<char> kp_buf, vp_buf, qp_buf, s_buf, o_buf;
    float *kp = aligned<float>(kp_buf, (size_t)Nk6 * D);
    float *vp = aligned<float>(vp_buf, (size_t)Dv6 * Nk6);
    float *qp = aligned<float>(qp_buf, (size_t)kQueries * D);
    float *s = aligned<float>(s_buf, (size_t)kGroups * kKeys * NR);
    float *o = aligned<float>(o_buf, (size_t)kGroups * Dv6 * NR);
    alignas(32) float mx[kGroups][NR], sm[kGroups][NR], alpha[NR];
    int64_t packed = -1;
    for (int64_t it = i0; it < i1; ++it) {
        const int64_t head = it / qsplit, part = it % qsplit;
        const int64_t b = head / Hq, hq = head % Hq, hk = hq / (Hq / Hk);
        if (b * Hk + hk != packed) {
            pack_rows6((const char *)k->data + b * k->nb[3] + hk * k->nb[2], k->nb[1], Nk, D, kp);
            pack_cols6((const char *)v->data + b * v->nb[3] + hk * v->nb[2], v->nb[1], Nk, Nk6, Dv, vp);
            packed = b * Hk + hk;
        }
        const int64_t qa = qblocks * part / qsplit * NR, qe = std::min(Nq, qblocks * (part + 1) / qsplit * NR);
        for (int64_t Q0 = qa; Q0 < qe; Q0 += kQueries) {
            const int64_t nq = std::min(kQueries, qe - Q0), G = (nq + NR - 1) / NR;
            pack_queries((const char *)q->data + b * q->nb[3] + hq * q->nb[2] + Q0 * q->nb[1], q->nb[1], nq, D,
                         scale * kLog2e, qp);
            for (int64_t g = 0; g < G; ++g) {
                std::fill(mx[g], mx[g] + NR, -std::numeric_limits<float>::infinity());
                std::fill(sm[g], sm[g] + NR, 0.0f);
            }
            std::fill(o, o + G * Dv6 * NR, 0.0f);
            for (int64_t k0 = 0; k0 < Nk; k0 += kKeys) {
                const int64_t nb = std::min(kKeys, Nk - k0), nb6 = round_up(nb, MR);
                for (int64_t g = 0; g < G; ++g) {
                    float *sg = s + g * kKeys * NR;
                    for (int64_t r = 0; r < nb6; r += MR)
                        micro(kp + (k0 + r) * D, qp + g * D * NR, D, sg + r * NR, NR, 2, nullptr, nullptr);
                    if (m) {  // the mask, in natural units, added to the base-2 scores
                        for (int64_t t = 0; t < NR && g * NR + t < nq; ++t) {
                            const int64_t qi = Q0 + g * NR + t;
                            const float *mrow = (const float *)((const char *)m->data + (b % m->ne[3]) * m->nb[3] +
                                                                (hq % m->ne[2]) * m->nb[2] + qi * m->nb[1]) + k0;
                            for (int64_t kk = 0; kk < nb; ++kk) sg[kk * NR + t] += mrow[kk] * kLog2e;
                        }
                    }
                    softmax_block(sg, nb, nb6, mx[g], sm[g], alpha);
                    float *og = o + g * Dv6 * NR;
                    if (k0 > 0) {
                        const __m256 a0 = _mm256_load_ps(alpha), a1 = _mm256_load_ps(alpha + 8);
                        for (int64_t c = 0; c < Dv6; ++c) {
                            _mm256_store_ps(og + c * NR, _mm256_mul_ps(_mm256_load_ps(og + c * NR), a0));
                            _mm256_store_ps(og + c * NR + 8, _mm256_mul_ps(_mm256_load_ps(og + c * NR + 8), a1));
                        }
                    }
                    for (int64_t c = 0; c < Dv6; c += MR)
                        micro(vp + (c / MR * Nk6 + k0) * MR, sg, nb6, og + c * NR, NR, 0, nullptr, nullptr);
                }
            }
            for (int64_t g = 0; g < G; ++g) {
                const float *og = o + g * Dv6 * NR;
                for (int64_t t = 0; t < NR && g * NR + t < nq; ++t) {
                    const int64_t qi = Q0 + g * NR + t;
                    float *out = (float *)((char *)dst->data + b * dst->nb[3] + qi * dst->nb[2] + hq * dst->nb[1]);
                    const float inv = sm[g][t] > 0.0f ? 1.0f / sm[g][t] : 0.0f;  // all keys masked: zero
                    for (int64_t c = 0; c < Dv; ++c) out[c] = og[c * NR + t] * inv;
                }
            }
        }
    }
}

}  // namespace

#endif  // SDPLAN_FMA_X86

void fma_attention(ggml_tensor *dst, int ith, int nth, void *userdata) {
#ifdef SDPLAN_FMA_X86
    FmaAttentionParams prm;
    std::memcpy(&prm, userdata, sizeof prm);
    float scale;
    std::memcpy(&scale, &prm.scale_bits, sizeof scale);
    run(dst, ith, nth, scale);
#else
    (void)dst, (void)ith, (void)nth, (void)userdata;
#endif
}

}  // namespace sdplan
