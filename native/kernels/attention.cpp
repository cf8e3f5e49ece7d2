// Attention with bf16 products on the CPU (the bf16_attention custom op). Per batch and head
// the keys are packed once into a panel for S = Q K^T (pairs of head-dimension values, 16 keys
// per column group) and the values into a panel for O = P V (pairs of keys, 16 value columns
// per group); then per block of 32 queries: the queries scaled by scale * log2(e) (scores in
// base 2) and rounded to bf16, and per block of 256 keys (flash attention: the block's scores
// stay in L1): S by the blocked product of bf16_tiles.h (AMX tiles or AVX512_BF16), the online
// softmax in f32 (vectorized exp2; running maximum and sum per row, what was accumulated
// rescaled when the maximum grows), the probabilities rounded to bf16, O += P V by the same
// product; at the end each row divided by its sum. Threads split the batch-head pairs, and the
// query rows when there are fewer pairs than two per thread.
#include "kernels/attention.h"
#include "kernels/bf16_gemm.h"
#include "kernels/bf16_tiles.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace sdplan {

#ifdef SDPLAN_BF16_X86

namespace {

using namespace tiles;

// 2^x for x <= 127: 2^n p(f) with n = round(x), f = x - n (exact, |f| <= 1/2), p the degree-3
// polynomial that minimizes the largest relative error of 2^f on |f| <= 1/2 (7.5e-5, fitted by
// iterated weighted least squares; 26 times below the bf16 rounding of the probabilities,
// 2^-9); -inf and values below -150 give 0 (the scale underflows). The scores are in base 2 (the
// queries carry log2(e)), so no ln 2 reduction.
SDPLAN_AVX512 inline __m512 exp2_512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));  // also NaN (-inf - -inf, NaN scores) -> -150
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(0.05517154186964035f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24261118471622467f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932610273361206f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999280571937561f));
    return _mm512_scalef_ps(p, n);
}

constexpr float kLog2e = 1.44269504088896341f;

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1); }

// n f32 rows (row i at base + i * stride bytes, `cols` values) scaled by `scale`, rounded to
// bf16 into out [round_up(n, 16)][ld] (zero past cols and past n).
SDPLAN_AVX512 void rows_to_bf16(const char *base, size_t stride, int64_t n, int64_t cols, float scale, int64_t ld,
                                uint16_t *out) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < round_up(n, 16); ++r) {
        uint16_t *o = out + r * ld;
        const float *src = (const float *)(base + r * stride);
        for (int64_t k = 0; k < ld; k += 32) {
            const __mmask16 mlo = r < n ? tail_mask(cols - k) : 0, mhi = r < n ? tail_mask(cols - k - 16) : 0;
            const __m512 lo = _mm512_mul_ps(_mm512_maskz_loadu_ps(mlo, src + k), sc);
            const __m512 hi = _mm512_mul_ps(_mm512_maskz_loadu_ps(mhi, src + k + 16), sc);
            _mm512_storeu_si512(o + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

// Keys as the panel of S = Q K^T: column = key (n keys, row i at base + i * stride), k = head
// dimension (D values): per group of 16 keys and step of 32 k, 16 key rows rounded to bf16
// pairs and transposed into the panel's rows.
SDPLAN_AVX512 void pack_keys(const char *base, size_t stride, int64_t n, int64_t D, uint32_t *panel) {
    const int64_t G = (n + 15) / 16, KS = (D + 31) / 32;
    alignas(64) uint32_t blk[16][16];
    for (int64_t g = 0; g < G; ++g)
        for (int64_t s = 0; s < KS; ++s) {
            const int64_t k0 = s * 32;
            for (int64_t r = 0; r < 16; ++r) {
                const int64_t key = g * 16 + r;
                const float *src = (const float *)(base + key * stride) + k0;
                const __mmask16 mlo = key < n ? tail_mask(D - k0) : 0, mhi = key < n ? tail_mask(D - k0 - 16) : 0;
                _mm512_store_si512(blk[r], (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(mhi, src + 16),
                                                                        _mm512_maskz_loadu_ps(mlo, src)));
            }
            transpose16(blk, 64, panel + (g * KS + s) * 256, 64);
        }
}

// Values as the panel of O = P V: k = key (n keys, row i at base + i * stride), column = value
// dimension (Dv): per pair of keys, the two rows' 16-column groups rounded to bf16 and
// interleaved into panel rows (zero past n keys, up to the panel's round_up(n, 32)).
SDPLAN_AVX512 void pack_values(const char *base, size_t stride, int64_t n, int64_t Dv, uint32_t *panel) {
    const int64_t G = (Dv + 15) / 16, KS = (n + 31) / 32;
    alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_load_si512(kIdx);
    for (int64_t j = 0; j < KS * 16; ++j) {
        const float *r0 = (const float *)(base + 2 * j * stride), *r1 = (const float *)(base + (2 * j + 1) * stride);
        const bool h0 = 2 * j < n, h1 = 2 * j + 1 < n;
        uint32_t *dst = panel + (j / 16) * 256 + (j % 16) * 16;
        for (int64_t g = 0; g < G; ++g) {
            const __mmask16 mk = tail_mask(Dv - g * 16);
            const __m512 v0 = _mm512_maskz_loadu_ps(h0 ? mk : 0, r0 + g * 16);
            const __m512 v1 = _mm512_maskz_loadu_ps(h1 ? mk : 0, r1 + g * 16);
            _mm512_store_si512(dst + g * KS * 256, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(v1, v0)));
        }
    }
}

// One key block of the online softmax (flash attention): for each of `rows` query rows, the
// base-2 scores s [r][0..n) (row stride ld; plus mask row mask + r * mrow in natural units,
// scaled by log2(e), when given) update the row's running maximum mx[r] and sum sum[r]; the
// block's probabilities against the new maximum go to p [r][0..round_up(n, 32)) as bf16 (row
// stride pld; zero past n, and rows past `rows` up to 32 zero), and alpha[r] = 2^(old maximum -
// new maximum) is the factor that rescales what the row accumulated before (1 when unchanged;
// a row whose keys are all masked so far keeps maximum -inf and sum 0).
SDPLAN_AVX512 void softmax_block(const float *s, int64_t ld, int64_t rows, int64_t n, const float *mask, int64_t mrow,
                                 uint16_t *p, int64_t pld, float *mx, float *sum, float *alpha) {
    constexpr float kInf = std::numeric_limits<float>::infinity();
    const int64_t np = round_up(n, 32);
    for (int64_t r = 0; r < 32; ++r) {
        uint16_t *pr = p + r * pld;
        alpha[r] = 1.0f;
        if (r >= rows) {
            std::memset(pr, 0, (size_t)np * 2);
            continue;
        }
        const float *sr = s + r * ld;
        const float *mr = mask ? mask + r * mrow : nullptr;
        __m512 vmax = _mm512_set1_ps(-kInf);
        for (int64_t k = 0; k < n; k += 16) {
            const __mmask16 mk = tail_mask(n - k);
            __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-kInf), mk, sr + k);
            if (mr) v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, mr + k), _mm512_set1_ps(kLog2e), v);
            vmax = _mm512_max_ps(vmax, v);
        }
        const float bmax = _mm512_reduce_max_ps(vmax);
        if (!(bmax > -kInf)) {  // every key of this block masked out: nothing added
            std::memset(pr, 0, (size_t)np * 2);
            continue;
        }
        const float m_new = std::max(mx[r], bmax);
        alpha[r] = mx[r] > -kInf ? _mm512_cvtss_f32(exp2_512(_mm512_set1_ps(mx[r] - m_new))) : 0.0f;
        mx[r] = m_new;
        const __m512 vm = _mm512_set1_ps(m_new);
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t k = 0; k < np; k += 32) {
            const __mmask16 m0 = tail_mask(n - k), m1 = tail_mask(n - k - 16);
            __m512 x0 = _mm512_maskz_loadu_ps(m0, sr + k), x1 = _mm512_maskz_loadu_ps(m1, sr + k + 16);
            if (mr) {
                x0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, mr + k), _mm512_set1_ps(kLog2e), x0);
                x1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, mr + k + 16), _mm512_set1_ps(kLog2e), x1);
            }
            x0 = _mm512_maskz_mov_ps(m0, exp2_512(_mm512_sub_ps(x0, vm)));
            x1 = _mm512_maskz_mov_ps(m1, exp2_512(_mm512_sub_ps(x1, vm)));
            vsum = _mm512_add_ps(vsum, _mm512_add_ps(x0, x1));
            _mm512_storeu_si512(pr + k, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
        }
        sum[r] = sum[r] * alpha[r] + _mm512_reduce_add_ps(vsum);
    }
}

#ifndef ATTN_KEY_BLOCK
#define ATTN_KEY_BLOCK 256
#endif
constexpr int64_t kKeyBlock = ATTN_KEY_BLOCK;  // keys per block: scores 32 x 256 f32 = 32 KB
#ifndef ATTN_SUB_BLOCKS
#define ATTN_SUB_BLOCKS 4
#endif
constexpr int64_t kSubBlocks = ATTN_SUB_BLOCKS;  // blocks of 32 queries sharing a pass over the keys

// AMX scores for head widths up to 64 (one or two k steps): S [NA*16][gcols*16] (row stride ld)
// = the queries (NA groups of 16 rows of qb, KS steps of 32 bf16, row stride KS * 32) x the key
// panel's first gcols groups. The query tiles stay loaded across the key groups (tmm4..7), so
// each group of 16 keys costs its KS key tiles, 2 KS products and NA stores.
template <int NA, int KS>
SDPLAN_AMX void amx_scores(const uint16_t *qb, const uint32_t *panel, int64_t gcols, float *s, int64_t ld) {
    const int64_t qs = KS * 64, cs = ld * 4;
    _tile_loadd(4, qb, qs);
    if (NA > 1) _tile_loadd(5, qb + 16 * KS * 32, qs);
    if (KS > 1) _tile_loadd(6, qb + 32, qs);
    if (NA > 1 && KS > 1) _tile_loadd(7, qb + 16 * KS * 32 + 32, qs);
    for (int64_t g = 0; g < gcols; ++g) {
        const uint32_t *b = panel + g * KS * 256;
        _tile_zero(0);
        if (NA > 1) _tile_zero(1);
        _tile_loadd(2, b, 64);
        _tile_dpbf16ps(0, 4, 2);
        if (NA > 1) _tile_dpbf16ps(1, 5, 2);
        if (KS > 1) {
            _tile_loadd(3, b + 256, 64);
            _tile_dpbf16ps(0, 6, 3);
            if (NA > 1) _tile_dpbf16ps(1, 7, 3);
        }
        _tile_stored(0, s + g * 16, cs);
        if (NA > 1) _tile_stored(1, s + 16 * ld + g * 16, cs);
    }
}

// AVX512_BF16 scores of one block: S [rows][gcols*16] (row stride ld) = `rows` (16 or 32)
// bf16 query rows (row stride qld values, zero-padded past the head width) x the key panel's
// first gcols groups (KS k steps each), over the first `pairs` pairs of the head dimension. Per
// 8 query rows and 2 key groups, 16 accumulators over all pairs, written once: the same
// products in the same order as block_product (the same bits) without its per-call set-up (GCC
// kept its accumulators on the stack around the loop), which cost a fifth of the scores at a
// head width of 40 (20 pairs per call).
SDPLAN_AVX512 void avx_scores(const uint16_t *q, int64_t qld, int64_t rows, const uint32_t *panel, int64_t KS,
                              int64_t gcols, int64_t pairs, float *s, int64_t ld) {
    for (int64_t r0 = 0; r0 < rows; r0 += 8)
        for (int64_t g = 0; g < gcols; g += 2) {
            const uint32_t *b0 = panel + g * KS * 256, *b1 = b0 + KS * 256;
            const bool two = g + 1 < gcols;
            __m512 c0[8], c1[8];
            for (int r = 0; r < 8; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
            const uint16_t *qr = q + r0 * qld;
            for (int64_t j = 0; j < pairs; ++j) {
                const int64_t off = (j / 16) * 256 + (j % 16) * 16;
                const __m512bh k0 = (__m512bh)_mm512_load_si512(b0 + off);
                const __m512bh k1 = two ? (__m512bh)_mm512_load_si512(b1 + off) : k0;
                for (int r = 0; r < 8; ++r) {
                    uint32_t v;
                    std::memcpy(&v, qr + r * qld + 2 * j, 4);
                    const __m512bh a = (__m512bh)_mm512_set1_epi32((int)v);
                    c0[r] = _mm512_dpbf16_ps(c0[r], a, k0);
                    c1[r] = _mm512_dpbf16_ps(c1[r], a, k1);
                }
            }
            for (int r = 0; r < 8; ++r) {
                _mm512_storeu_ps(s + (r0 + r) * ld + g * 16, c0[r]);
                if (two) _mm512_storeu_ps(s + (r0 + r) * ld + g * 16 + 16, c1[r]);
            }
        }
}

template <bool AMX>
SDPLAN_AMX void run(ggml_tensor *dst, int ith, int nth, float scale) {
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *m = dst->src[3];
    const int64_t D = q->ne[0], Nq = q->ne[1], Hq = q->ne[2], B = q->ne[3];
    const int64_t Nk = k->ne[1], Hk = k->ne[2], Dv = v->ne[0];
    const int64_t Dp = round_up(D, 32), Nkp = round_up(Nk, 32), Dvp = round_up(Dv, 16);
    const int64_t heads = B * Hq, q32 = (Nq + 31) / 32;
    const auto [qsplit, i0, i1] = split_work(heads, q32, ith, nth);
    if (i0 >= i1) return;
    thread_local std::vector<char> kt_buf, vp_buf, qb_buf, s_buf, p_buf, o_buf;
    uint32_t *kt = aligned<uint32_t>(kt_buf, (size_t)(Nkp / 16) * (Dp / 32) * 256);
    uint32_t *vp = aligned<uint32_t>(vp_buf, (size_t)(Dvp / 16) * (Nkp / 32) * 256);
    uint16_t *qb = aligned<uint16_t>(qb_buf, (size_t)kSubBlocks * 32 * Dp);
    float *s = aligned<float>(s_buf, (size_t)32 * kKeyBlock);
    uint16_t *pb = aligned<uint16_t>(p_buf, (size_t)kSubBlocks * 32 * kKeyBlock);
    float *o = aligned<float>(o_buf, (size_t)kSubBlocks * 32 * Dvp);
    alignas(64) float mx[kSubBlocks][32], sum[kSubBlocks][32], alpha[32];
    if (AMX) amx_configure();
    int64_t packed = -1;
    for (int64_t it = i0; it < i1; ++it) {
        const int64_t head = it / qsplit, part = it % qsplit;
        const int64_t b = head / Hq, hq = head % Hq, hk = hq / (Hq / Hk);
        if (b * Hk + hk != packed) {
            pack_keys((const char *)k->data + b * k->nb[3] + hk * k->nb[2], k->nb[1], Nk, D, kt);
            pack_values((const char *)v->data + b * v->nb[3] + hk * v->nb[2], v->nb[1], Nk, Dv, vp);
            packed = b * Hk + hk;
        }
        const int64_t qa = q32 * part / qsplit * 32, qe = std::min(Nq, q32 * (part + 1) / qsplit * 32);
        // up to kSubBlocks blocks of 32 queries go through the key blocks together, so that each
        // key block's panels are read from L2 once for all of them
        for (int64_t Q0 = qa; Q0 < qe; Q0 += 32 * kSubBlocks) {
            const int64_t nsub = std::min<int64_t>(kSubBlocks, (qe - Q0 + 31) / 32);
            for (int64_t j = 0; j < nsub; ++j) {
                const int64_t q0 = Q0 + 32 * j, rows = std::min<int64_t>(32, qe - q0);
                rows_to_bf16((const char *)q->data + b * q->nb[3] + hq * q->nb[2] + q0 * q->nb[1], q->nb[1], rows,
                             D, scale * kLog2e, Dp, qb + j * 32 * Dp);  // scores in base 2: softmax by exp2
                std::fill(mx[j], mx[j] + 32, -std::numeric_limits<float>::infinity());
                std::fill(sum[j], sum[j] + 32, 0.0f);
            }
            // per key block: S = Q K^T of the block (in L1), its online softmax, O += P V
            for (int64_t k0 = 0; k0 < Nk; k0 += kKeyBlock) {
                const int64_t nb = std::min(kKeyBlock, Nk - k0), kg = (nb + 15) / 16;
                const uint32_t *kblock = kt + (k0 / 16) * (Dp / 32) * 256;
                for (int64_t j = 0; j < nsub; ++j) {
                    const int64_t q0 = Q0 + 32 * j, rows = std::min<int64_t>(32, qe - q0);
                    const int na = rows > 16 ? 2 : 1;
                    const uint16_t *qj = qb + j * 32 * Dp;
                    uint16_t *pj = pb + j * 32 * kKeyBlock;
                    float *oj = o + j * 32 * Dvp;
                    if (AMX && Dp == 32) {
                        if (na == 2) amx_scores<2, 1>(qj, kblock, kg, s, kKeyBlock);
                        else amx_scores<1, 1>(qj, kblock, kg, s, kKeyBlock);
                    } else if (AMX && Dp == 64) {
                        if (na == 2) amx_scores<2, 2>(qj, kblock, kg, s, kKeyBlock);
                        else amx_scores<1, 2>(qj, kblock, kg, s, kKeyBlock);
                    } else if (AMX) {
                        const RowGroup qr[2] = {{qj, Dp * 2, qj, Dp * 2}, {qj + 16 * Dp, Dp * 2, qj + 16 * Dp, Dp * 2}};
                        block_product<AMX>(qr, na, kblock, kg, kg, Dp, s, kKeyBlock);
                    } else {
                        // VDPBF16PS stops at the last pair of the head dimension (a width of 40
                        // takes 20 pairs, not 32)
                        avx_scores(qj, Dp, na * 16, kblock, Dp / 32, kg, (D + 1) / 2, s, kKeyBlock);
                    }
                    const float *mrow = nullptr;
                    if (m) mrow = (const float *)((const char *)m->data + (b % m->ne[3]) * m->nb[3] +
                                                  (hq % m->ne[2]) * m->nb[2] + q0 * m->nb[1]) + k0;
                    softmax_block(s, kKeyBlock, rows, nb, mrow, m ? m->nb[1] / 4 : 0, pj, kKeyBlock, mx[j], sum[j],
                                  alpha);
                    if (k0 > 0)
                        for (int64_t r = 0; r < rows; ++r)
                            if (alpha[r] != 1.0f) {
                                const __m512 sc = _mm512_set1_ps(alpha[r]);
                                for (int64_t c = 0; c < Dvp; c += 16)
                                    _mm512_storeu_ps(oj + r * Dvp + c, _mm512_mul_ps(_mm512_loadu_ps(oj + r * Dvp + c), sc));
                            }
                    // the block's k steps: the value panel from step k0 / 32 on (K = Nkp keeps its column
                    // groups' spacing), the probabilities from their block's start; K is a multiple of
                    // 32, so the rows' tail pointers are never read
                    const int64_t pl = kKeyBlock * 2;
                    const RowGroup pa[2] = {{pj, pl, pj, pl}, {pj + 16 * kKeyBlock, pl, pj + 16 * kKeyBlock, pl}};
                    // value widths of 8 past a multiple of 16 (SD 1.x's 40): the last group in 256 bits
                    block_product<AMX>(pa, na, vp + (k0 / 32) * 256, Dvp / 16, Dvp / 16, Nkp, oj, Dvp, 0,
                                       (nb + 31) / 32, k0 > 0, kChunkSteps, Dv % 16 != 0 && Dv % 16 <= 8);
                }
            }
            for (int64_t j = 0; j < nsub; ++j) {
                const int64_t q0 = Q0 + 32 * j, rows = std::min<int64_t>(32, qe - q0);
                const float *oj = o + j * 32 * Dvp;
                for (int64_t r = 0; r < rows; ++r) {
                    float *out = (float *)((char *)dst->data + b * dst->nb[3] + (q0 + r) * dst->nb[2] + hq * dst->nb[1]);
                    const __m512 sc = _mm512_set1_ps(sum[j][r] > 0.0f ? 1.0f / sum[j][r] : 0.0f);  // all masked: zero
                    for (int64_t c = 0; c < Dv; c += 16) {
                        const __mmask16 mk = tail_mask(Dv - c);
                        _mm512_mask_storeu_ps(out + c, mk, _mm512_mul_ps(_mm512_loadu_ps(oj + r * Dvp + c), sc));
                    }
                }
            }
        }
    }
    if (AMX) _tile_release();
}

}  // namespace

#endif  // SDPLAN_BF16_X86

void bf16_attention(ggml_tensor *dst, int ith, int nth, void *userdata) {
    Bf16AttentionParams prm;
    std::memcpy(&prm, userdata, sizeof prm);
#ifdef SDPLAN_BF16_X86
    float scale;
    std::memcpy(&scale, &prm.scale_bits, sizeof scale);
    if ((Bf16Kernel)prm.kernel == Bf16Kernel::amx && bf16_cpu_kernel() == Bf16Kernel::amx) run<true>(dst, ith, nth, scale);
    else run<false>(dst, ith, nth, scale);
#else
    (void)dst, (void)ith, (void)nth;
#endif
}

}  // namespace sdplan
