// Building blocks of the bf16 kernels (bf16_gemm.cpp, attention.cpp): the panel layout, the
// AMX and AVX512_BF16 micro-kernels and the blocked product over a panel. Everything here
// carries a target attribute and may run only after bf16_cpu_kernel() said the CPU has it.
//
// A product C [rows][cols] = A [rows][K] B [K][cols] takes A as rows of bf16 (K contiguous,
// read in place: a RowGroup of 16 rows) and B as a panel in the VNNI order: pairs of k
// (k = 2j, 2j+1) of 16 columns form one 64-byte row,
//   panel[((g * KS) + s) * 256 + jj * 16 + mm] = {B[2j][m], B[2j+1][m]}  (j = 16 s + jj,
//   m = 16 g + mm, KS = ceil(K / 32); zero past K and past the last column),
// so that one step s of one column group g is one 1 KB AMX tile and each of its rows one zmm.
#pragma once

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define SDPLAN_BF16_X86 1
#define SDPLAN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define SDPLAN_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/buffers.h"

#ifdef SDPLAN_BF16_X86

namespace sdplan::tiles {

#ifndef KB_PANEL
#define KB_PANEL 1024
#endif
constexpr int64_t kPanelBytes = KB_PANEL * 1024;  // target panel size (K x Mb bf16)

using kernels::aligned;
using kernels::round_up;
using kernels::split_work;

// 16 x 16 transpose of 32-bit elements: dst row i = column i of src (byte strides).
SDPLAN_AVX512 inline void transpose16(const void *src, int64_t sstride, void *dst, int64_t dstride) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps((const char *)src + i * sstride);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; ++i) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps((char *)dst + i * dstride, r[i]);
}

// 16 rows of W for one A tile / 16 kernel rows: pointer and byte stride; `tail` the last k step
// (K % 32 != 0), zero-padded to 32 k; `s_base` the k step that `p` points at (0: the rows'
// start; rows converted from f16 per chunk of k start at the chunk's first step).
struct RowGroup {
    const uint16_t *p;
    int64_t stride;
    const uint16_t *tail;
    int64_t tail_stride;
    int64_t s_base = 0;
};

// ---- kernels: C [NA*16][NB*16] (row stride ld floats) += rows x panel columns g0*16 ... over
// the k steps sb .. se (32 k each); C is zeroed first unless `acc`.

struct TileConfig {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

SDPLAN_AMX inline void amx_configure() {
    alignas(64) TileConfig cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

struct Steps {
    int64_t sb, se, KF, K;  // k steps sb..se; full steps below KF; depth K
};

template <int NA, int NB>
SDPLAN_AMX void amx_block(const RowGroup *a, const uint32_t *panel, int64_t G, int64_t g0, Steps st, bool acc,
                          float *c, int64_t ld) {
    const int64_t cs = ld * 4;
    float *c01 = c + 16, *c10 = c + 16 * ld, *c11 = c + 16 * ld + 16;
    if (acc) {
        _tile_loadd(0, c, cs);
        if (NB > 1) _tile_loadd(1, c01, cs);
        if (NA > 1) _tile_loadd(2, c10, cs);
        if (NA > 1 && NB > 1) _tile_loadd(3, c11, cs);
    } else {
        _tile_zero(0);
        if (NB > 1) _tile_zero(1);
        if (NA > 1) _tile_zero(2);
        if (NA > 1 && NB > 1) _tile_zero(3);
    }
    const int64_t KS = (st.K + 31) / 32;
    const uint32_t *b = panel + (g0 * KS + st.sb) * 256;
    for (int64_t s = st.sb; s < st.se; ++s, b += 256) {
        if (s < st.KF) {
            _tile_loadd(4, a[0].p + (s - a[0].s_base) * 32, a[0].stride);
            if (NA > 1) _tile_loadd(5, a[1].p + (s - a[1].s_base) * 32, a[1].stride);
        } else {
            _tile_loadd(4, a[0].tail, a[0].tail_stride);
            if (NA > 1) _tile_loadd(5, a[1].tail, a[1].tail_stride);
        }
        _tile_loadd(6, b, 64);
        if (NB > 1) _tile_loadd(7, b + KS * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (NB > 1) _tile_dpbf16ps(1, 4, 7);
        if (NA > 1) _tile_dpbf16ps(2, 5, 6);
        if (NA > 1 && NB > 1) _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, cs);
    if (NB > 1) _tile_stored(1, c01, cs);
    if (NA > 1) _tile_stored(2, c10, cs);
    if (NA > 1 && NB > 1) _tile_stored(3, c11, cs);
}

// 8 rows (r0 .. r0 + 8 of a row group) x NB*16 columns with VDPBF16PS; HALF: the last of the
// NB groups only 8 columns wide, in 256-bit accumulators (half the work of a 512-bit one where
// the core splits those in two, as Zen 4 does; each lane computes the same, so the same bits).
template <int NB, bool HALF = false>
SDPLAN_AVX512 void avx_rows8(const RowGroup &a, int r0, const uint32_t *panel, int64_t G, int64_t g0, Steps st,
                             bool accumulate, float *c, int64_t ld) {
    constexpr int NF = HALF ? NB - 1 : NB;  // full 16-column groups
    __m512 acc[8][NF > 0 ? NF : 1];
    __m256 half[8];
    for (int r = 0; r < 8; ++r) {
        for (int q = 0; q < NF; ++q)
            acc[r][q] = accumulate ? _mm512_loadu_ps(c + r * ld + q * 16) : _mm512_setzero_ps();
        if (HALF) half[r] = accumulate ? _mm256_loadu_ps(c + r * ld + NF * 16) : _mm256_setzero_ps();
    }
    const int64_t j_end = std::min(st.se * 16, (st.K + 1) / 2), KS = (st.K + 31) / 32;
    for (int64_t j = st.sb * 16; j < j_end; ++j) {
        const int64_t s = j / 16, jj = j % 16;
        const uint32_t *b = panel + (g0 * KS + s) * 256 + jj * 16;
        __m512bh bv[NF > 0 ? NF : 1];
        for (int q = 0; q < NF; ++q) bv[q] = (__m512bh)_mm512_load_si512(b + q * KS * 256);
        __m256bh hb;
        if (HALF) hb = (__m256bh)_mm256_load_si256((const __m256i *)(b + NF * KS * 256));
        const char *ap = s < st.KF ? (const char *)(a.p + 2 * (j - 16 * a.s_base)) + r0 * a.stride
                                   : (const char *)(a.tail + 2 * jj) + r0 * a.tail_stride;
        const int64_t stride = s < st.KF ? a.stride : a.tail_stride;
        for (int r = 0; r < 8; ++r) {
            uint32_t v;
            std::memcpy(&v, ap + r * stride, 4);
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)v);
            for (int q = 0; q < NF; ++q) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], av, bv[q]);
            if (HALF) half[r] = _mm256_dpbf16_ps(half[r], (__m256bh)_mm512_castsi512_si256((__m512i)av), hb);
        }
    }
    for (int r = 0; r < 8; ++r) {
        for (int q = 0; q < NF; ++q) _mm512_storeu_ps(c + r * ld + q * 16, acc[r][q]);
        if (HALF) _mm256_storeu_ps(c + r * ld + NF * 16, half[r]);
    }
}

template <int NA, int NB, bool HALF = false>
SDPLAN_AVX512 void avx_block(const RowGroup *a, const uint32_t *panel, int64_t G, int64_t g0, Steps st, bool acc,
                             float *c, int64_t ld) {
    for (int t = 0; t < NA; ++t)
        for (int h = 0; h < 2; ++h)
            avx_rows8<NB, HALF>(a[t], 8 * h, panel, G, g0, st, acc, c + (t * 16 + 8 * h) * ld, ld);
}

#ifndef KB_CHUNK
#define KB_CHUNK 12
#endif
constexpr int64_t kChunkSteps = KB_CHUNK;  // k steps (32 k) per chunk: 32 rows of W x 384 k = 24 KB

// C [na*16][gcols*16] (row stride ld) = the row groups a x the panel's first gcols column
// groups over the k steps s0 .. s1 of K (s1 < 0: all of K), in chunks of k that keep the 32
// rows in L1 while the column groups go by (chunks of `chunk_steps`; one chunk when there is a
// single pair of groups); C is overwritten, or added to when `accumulate`. half_last: only the
// last group's first 8 columns are wanted (AVX512_BF16 computes just those; C's other 8 columns
// of that group are left as they were).
template <bool AMX>
SDPLAN_AMX void block_product(const RowGroup *a, int na, const uint32_t *panel, int64_t G, int64_t gcols, int64_t K,
                              float *c, int64_t ld, int64_t s0 = 0, int64_t s1 = -1, bool accumulate = false,
                              int64_t chunk_steps = kChunkSteps, bool half_last = false) {
    const int64_t KS = (K + 31) / 32, end = s1 < 0 ? KS : std::min(KS, s1);
    const int64_t chunk = gcols > 2 ? chunk_steps : end - s0;
    for (int64_t sb = s0; sb < end; sb += chunk) {
        const Steps st{sb, std::min(end, sb + chunk), K / 32, K};
        const bool acc = accumulate || sb > s0;
        for (int64_t g = 0; g < gcols;) {
            // AVX512_BF16: an odd count of three or more groups starts with three at once (8 rows x
            // 48 columns in 24 accumulators: attention's values 40 or 80 wide), then pairs
            const int nb = !AMX && (gcols - g) % 2 == 1 && gcols - g >= 3 ? 3 : g + 1 < gcols ? 2 : 1;
            float *cg = c + g * 16;
            if (AMX) {
                if (na == 2 && nb == 2) amx_block<2, 2>(a, panel, G, g, st, acc, cg, ld);
                else if (na == 2) amx_block<2, 1>(a, panel, G, g, st, acc, cg, ld);
                else if (nb == 2) amx_block<1, 2>(a, panel, G, g, st, acc, cg, ld);
                else amx_block<1, 1>(a, panel, G, g, st, acc, cg, ld);
            } else if (half_last && g + nb == gcols) {  // the last group 8 columns wide
                if (nb == 3 && na == 2) avx_block<2, 3, true>(a, panel, G, g, st, acc, cg, ld);
                else if (nb == 3) avx_block<1, 3, true>(a, panel, G, g, st, acc, cg, ld);
                else if (nb == 2 && na == 2) avx_block<2, 2, true>(a, panel, G, g, st, acc, cg, ld);
                else if (nb == 2) avx_block<1, 2, true>(a, panel, G, g, st, acc, cg, ld);
                else if (na == 2) avx_block<2, 1, true>(a, panel, G, g, st, acc, cg, ld);
                else avx_block<1, 1, true>(a, panel, G, g, st, acc, cg, ld);
            } else if (nb == 3) {
                if (na == 2) avx_block<2, 3>(a, panel, G, g, st, acc, cg, ld);
                else avx_block<1, 3>(a, panel, G, g, st, acc, cg, ld);
            } else {
                if (na == 2 && nb == 2) avx_block<2, 2>(a, panel, G, g, st, acc, cg, ld);
                else if (na == 2) avx_block<2, 1>(a, panel, G, g, st, acc, cg, ld);
                else if (nb == 2) avx_block<1, 2>(a, panel, G, g, st, acc, cg, ld);
                else avx_block<1, 1>(a, panel, G, g, st, acc, cg, ld);
            }
            g += nb;
        }
    }
}

// Columns per panel: a multiple of 32 near kPanelBytes, at most all columns (rounded).
inline int64_t panel_columns(int64_t KS, int64_t cols) {
    return std::min(std::clamp<int64_t>(kPanelBytes / (KS * 64) / 32 * 32, 32, 256), round_up(cols, 32));
}

// A = W, B = X (im2col columns, or x's rows transposed), C rows = W rows.
}  // namespace sdplan::tiles

#endif  // SDPLAN_BF16_X86
