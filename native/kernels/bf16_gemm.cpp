// bf16 matrix products for linear layers and convolutions on the CPU (the bf16_gemm custom op).
//
// The product is computed as C[n][m] = sum_k W[n][k] X[k][m]: W is the weight as stored (bf16
// or f16, row n of K values: a linear weight [N][K], a conv kernel [OC][IC*KH*KW]); bf16 rows
// are read in place and never re-packed, f16 rows (and Q8_0 / Q4_K / Q5_K rows of a linear
// layer, dequantised per block of 32 values) are rounded to bf16 as they are used, into a
// buffer that stays in L2 (see run(): a thread's rows once per call where they fit half an L2,
// else per 32 rows, or per 32 rows and chunk of k for wide blocks; run_rows(): as W is packed),
// so the weights keep their file's dtype in memory, mapped from the file; X holds the
// activations (x's rows for a linear layer, im2col columns for a convolution), rounded to bf16
// and packed per block of Mb columns into a panel in the VNNI order both kernels read: pairs
// of k (k = 2j, 2j+1) of 16 columns form one 64-byte row,
//   panel[((g * KS) + s) * 256 + jj * 16 + mm] = {X[2j][m], X[2j+1][m]}  (j = 16 s + jj,
//   m = 16 g + mm; zero past K and past the last column).
// Two kernels compute 16 x 16 blocks of C from it, accumulating in f32:
// - AMX (Sapphire Rapids and later): a 2 x 2 block of tiles, C 32 x 32 in four accumulator
//   tiles, A tiles (16 rows of W x 32 k) loaded straight from W, B tiles from the panel;
// - AVX512_BF16 (Zen 4, Cooper Lake, ...): 8 rows of W x 32 columns in 16 zmm accumulators, one
//   VDPBF16PS per pair of k.
// A convolution's C rows are output channel planes (stored directly, bias added); a linear
// layer's C block is transposed into dst rows. Threads split the column blocks (and the rows
// of W when there are too few blocks). Every function that uses AVX-512 or AMX carries a target
// attribute and runs only after run-time detection, so one binary runs everywhere.
//
// Numerics: W is bf16 (8 significant bits; f16 weights rounded to nearest even, as the load's
// f16 -> bf16 conversion does, so both give the same bits) and X is rounded to bf16 (relative
// error <= 2^-9 per element); the products are exact in f32 and summed in f32.
#include "kernels/bf16_gemm.h"
#include "kernels/bf16_tiles.h"
#include "kernels/conv_columns.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#ifdef SDPLAN_BF16_X86
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace sdplan {

// ------------------------------------------------------------------ detection

namespace {

#ifdef SDPLAN_BF16_X86
uint64_t xgetbv0() {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

// Linux: ask for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
// without it the first tile instruction kills the process.
bool request_amx_permission() {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
#if defined(__linux__)
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
}
#endif

Bf16Kernel detect() {
#ifdef SDPLAN_BF16_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return Bf16Kernel::none;  // OSXSAVE
    const uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0xe6) != 0xe6) return Bf16Kernel::none;  // SSE, AVX, opmask and ZMM state
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Bf16Kernel::none;
    const bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));
    const bool amx = (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16, AMX-TILE
    unsigned a1, b1, c1, d1;
    const bool bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));  // AVX512_BF16
    if (!avx512 || !bf16) return Bf16Kernel::none;
    if (amx && (xcr0 & (3ull << 17)) == (3ull << 17) && request_amx_permission()) return Bf16Kernel::amx;
    return Bf16Kernel::avx512;
#else
    return Bf16Kernel::none;
#endif
}

std::atomic<int> chosen{-1};  // set_bf16_kernel's choice; -1 (the default): the CPU's

}  // namespace

Bf16Kernel bf16_cpu_kernel() {
    static const Bf16Kernel k = detect();
    return k;
}

Bf16Kernel bf16_kernel() {
    const int c = chosen.load();
    return c < 0 ? bf16_cpu_kernel() : (Bf16Kernel)c;
}

const char *bf16_kernel_name(Bf16Kernel k) {
    switch (k) {
    case Bf16Kernel::amx: return "amx";
    case Bf16Kernel::avx512: return "avx512";
    case Bf16Kernel::none: break;
    }
    return "off";
}

std::string set_bf16_kernel(const std::string &name) {
    const Bf16Kernel cpu = bf16_cpu_kernel();
    if (name == "auto") {
        chosen.store(-1);
        return {};
    }
    Bf16Kernel want;
    if (name == "amx") want = Bf16Kernel::amx;
    else if (name == "avx512") want = Bf16Kernel::avx512;
    else if (name == "off") want = Bf16Kernel::none;
    else return "unknown bf16 kernel '" + name + "' (auto, amx, avx512, off)";
    if ((int)want > (int)cpu)
        return std::string("this CPU cannot run the ") + bf16_kernel_name(want) + " bf16 kernel (it runs: " +
               bf16_kernel_name(cpu) + ")";
    chosen.store((int)want);
    return {};
}

#ifdef SDPLAN_BF16_X86

namespace {

using namespace tiles;

// The problem as the driver sees it: C [N][cols] = W [N][K] X [K][cols], cols = images * M.
struct Problem {
    bool conv;
    int64_t N, K, M, images;  // rows of W, depth, columns per image, images
    // convolution
    int64_t IW, IH, IC, OW, OH, KW, KH;
    int s0, s1, p0, p1, d0, d1;
    const float *x;
    size_t x_img;  // bytes between input images (conv)
    const uint16_t *w;
    bool w_f16;  // W holds f16 values, or quantised blocks (wq), rounded to bf16 as used; else bf16
    // W in ggml's quantised blocks (Q8_0, Q4_K, Q5_K; 0: none): row n at wq_data + n * wq_row
    int wq;
    const uint8_t *wq_data;
    size_t wq_row;
    const float *bias;
    float *dst;
    size_t dst_img;  // bytes between output images (conv)
};

// ---- packing

// Linear: columns c0 .. c0 + Mb of X are rows of x ([M][K] f32). Per group of 16 rows and step
// of 32 k: 16 rows rounded to 16 bf16 pairs each, then transposed into the panel's 16 rows.
SDPLAN_AVX512 void pack_linear(const Problem &p, int64_t c0, int64_t Mb, uint32_t *panel) {
    const int64_t G = Mb / 16, KS = (p.K + 31) / 32;
    alignas(64) uint32_t blk[16][16];
    for (int64_t g = 0; g < G; ++g) {
        const int64_t mrow = c0 + g * 16;
        const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(16, p.M - mrow));
        for (int64_t s = 0; s < KS; ++s) {
            const int64_t k0 = s * 32, left = p.K - k0;
            const __mmask16 mlo = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            const __mmask16 mhi = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
            for (int64_t r = 0; r < 16; ++r) {
                if (r >= rows) {
                    _mm512_store_si512(blk[r], _mm512_setzero_si512());
                    continue;
                }
                const float *src = p.x + (mrow + r) * p.K + k0;
                const __m512 lo = _mm512_maskz_loadu_ps(mlo, src), hi = _mm512_maskz_loadu_ps(mhi, src + 16);
                _mm512_store_si512(blk[r], (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            }
            transpose16(blk, 64, panel + (g * KS + s) * 256, 64);
        }
    }
}

// Convolution: where each column's input value lies (conv_columns.h: int32 offsets, the op
// refuses inputs of 2^31 floats or more).
void conv_tables(const Problem &p, int64_t c0, int64_t Mb, int32_t *offs, ColumnGroup *pg) {
    const ConvColumns g{p.IW, p.IH, p.OW, p.M, p.M * p.images, p.KW, p.KH, (int64_t)(p.x_img / sizeof(float)),
                        p.s0, p.s1, p.p0, p.p1, p.d0, p.d1};
    column_tables(g, c0, Mb, offs, pg);
}

// The 16 values of im2col row k (channel ic, position r) for column group g, in f32.
SDPLAN_AVX512 inline __m512 conv_load(const float *x, int64_t plane, int64_t ic, int64_t r, int64_t g, int64_t G,
                                      int64_t Mb, const int32_t *offs, const ColumnGroup *pg) {
    const ColumnGroup &q = pg[r * G + g];
    const float *base = x + ic * plane;
    if (q.contiguous) return _mm512_maskz_loadu_ps(q.mask, base + q.start);
    const __m512i idx = _mm512_loadu_si512(offs + r * Mb + g * 16);
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), q.mask, idx, base, 4);
}

// Convolution: the panel of columns c0 .. c0 + Mb: per pair of k (im2col rows k = ic * KK + r),
// the two rows' 16-column groups rounded to bf16 and interleaved (VPERMW) into panel rows.
SDPLAN_AVX512 void pack_conv(const Problem &p, int64_t c0, int64_t Mb, uint32_t *panel, int32_t *offs,
                             ColumnGroup *pg) {
    const int64_t G = Mb / 16, KS = (p.K + 31) / 32, pairs = KS * 16, KK = p.KW * p.KH;
    const int64_t plane = p.IW * p.IH;
    conv_tables(p, c0, Mb, offs, pg);
    alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_load_si512(kIdx);
    int64_t ic0 = 0, r0 = 0;  // im2col row k0 = 2j as channel and kernel position, kept without divisions
    for (int64_t j = 0; j < pairs; ++j, r0 += 2) {
        const int64_t k0 = 2 * j, k1 = k0 + 1;
        while (r0 >= KK) r0 -= KK, ++ic0;
        uint32_t *dst = panel + (j / 16) * 256 + (j % 16) * 16;
        if (k0 >= p.K) {
            for (int64_t g = 0; g < G; ++g) _mm512_store_si512(dst + g * KS * 256, _mm512_setzero_si512());
            continue;
        }
        const int64_t ic1 = r0 + 1 < KK ? ic0 : ic0 + 1, r1 = r0 + 1 < KK ? r0 + 1 : 0;
        const bool has1 = k1 < p.K;
        for (int64_t g = 0; g < G; ++g) {
            const __m512 v0 = conv_load(p.x, plane, ic0, r0, g, G, Mb, offs, pg);
            const __m512 v1 = has1 ? conv_load(p.x, plane, ic1, r1, g, G, Mb, offs, pg) : _mm512_setzero_ps();
            _mm512_store_si512(dst + g * KS * 256, _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(v1, v0)));
        }
    }
}

// ---- rows of W

// 32 values of W from `src` (zero where `mk` is clear) as bf16: f16 widened (exact) and rounded
// to nearest even, bf16 as they are.
SDPLAN_AVX512 inline __m512i load_w32(const uint16_t *src, __mmask32 mk, bool f16) {
    const __m512i v = _mm512_maskz_loadu_epi16(mk, src);
    if (!f16) return v;
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v)), hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Quantised W: the 32 values of row `row`, k step `s` (k = 32 s .. 32 s + 31) dequantised as
// ggml's dequantize_row_* computes them (f32: d * q for Q8_0, d * sc * q - dmin * m for the
// K-quants' sub-blocks of 32) and rounded to bf16 (nearest even). Block layouts (ggml-common.h):
// Q8_0 {f16 d; i8 qs[32]} per 32 values; Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]} and
// Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]} per 256 values, sub-block j's
// 6-bit scale and min packed in `scales` as get_scale_min_k4 reads them, its 4-bit values the
// low (j even) or high (j odd) nibbles of qs[32 (j / 2) ..], Q5_K's fifth bit bit j of qh[l].
SDPLAN_AVX512 inline __m512 f16_broadcast(const uint8_t *h) {
    uint16_t v;
    std::memcpy(&v, h, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)v));
}

SDPLAN_AVX512 inline __m512i load_wq32(const Problem &p, int64_t row, int64_t s) {
    const uint8_t *r = p.wq_data + (size_t)row * p.wq_row;
    if (p.wq == GGML_TYPE_Q8_0) {
        const uint8_t *b = r + (size_t)s * 34;
        const __m512 d = f16_broadcast(b);
        const __m128i q0 = _mm_loadu_si128((const __m128i *)(b + 2)), q1 = _mm_loadu_si128((const __m128i *)(b + 18));
        const __m512 lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)));
        const __m512 hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)));
        return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
    const bool q5 = p.wq == GGML_TYPE_Q5_K;
    const int j = (int)(s & 7);
    const uint8_t *b = r + (size_t)(s >> 3) * (q5 ? 176 : 144);
    const uint8_t *sc = b + 4;
    int scale, mn;
    if (j < 4) {
        scale = sc[j] & 63, mn = sc[j + 4] & 63;
    } else {
        scale = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), mn = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
    const __m512 d = _mm512_mul_ps(f16_broadcast(b), _mm512_set1_ps((float)scale));
    const __m512 m = _mm512_mul_ps(f16_broadcast(b + 2), _mm512_set1_ps((float)mn));
    const uint8_t *qs = b + (q5 ? 48 : 16) + 32 * (j >> 1);
    __m256i q = _mm256_loadu_si256((const __m256i *)qs);
    if (j & 1) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
    if (q5) {  // bit j of qh[l] is the value's fifth bit
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
    }
    const __m512 lo = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q))), m);
    const __m512 hi = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1))), m);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

inline __mmask32 mask32(int64_t left) {
    return left >= 32 ? 0xffffffffu : left <= 0 ? 0 : (__mmask32)((1ull << left) - 1);
}

// Rows n0 .. n0 + 16 of an f16 W over the k steps s0 .. s1, rounded to bf16 into out
// [16][(s1 - s0) * 32] (zero past N and past K): a row group that starts at step s0.
SDPLAN_AVX512 RowGroup convert_rows_f16(const Problem &p, int64_t n0, int64_t s0, int64_t s1, uint16_t *out) {
    const int64_t ld = (s1 - s0) * 32, rows = std::clamp<int64_t>(p.N - n0, 0, 16), KF = p.K / 32;
    for (int64_t r = 0; r < 16; ++r) {
        uint16_t *o = out + r * ld;
        if (r >= rows) {
            std::fill(o, o + ld, (uint16_t)0);
            continue;
        }
        if (p.wq) {  // K is a multiple of the block (32 or 256): whole steps
            for (int64_t s = s0; s < s1; ++s) _mm512_storeu_si512(o + (s - s0) * 32, load_wq32(p, n0 + r, s));
            continue;
        }
        const uint16_t *src = p.w + (n0 + r) * p.K;
        for (int64_t s = s0; s < s1; ++s)
            _mm512_storeu_si512(o + (s - s0) * 32, load_w32(src + s * 32, mask32(p.K - s * 32), true));
    }
    // the tail step (K % 32 != 0) lies in the buffer like the others, zero-padded
    return {out, ld * 2, KF < s1 ? out + (KF - s0) * 32 : out, ld * 2, s0};
}

// Rows n0 .. n0 + 16 of W. Past N or past K the values come from zero-padded copies in `pad`
// (16 x KS*32 bf16) or `tail` (16 x 32 bf16).
RowGroup row_group(const Problem &p, int64_t n0, uint16_t *pad, uint16_t *tail) {
    const int64_t KS = (p.K + 31) / 32, KF = p.K / 32;
    if (n0 + 16 > p.N) {
        const int64_t ld = KS * 32;
        std::fill(pad, pad + 16 * ld, (uint16_t)0);
        for (int64_t r = 0; r < p.N - n0; ++r) std::memcpy(pad + r * ld, p.w + (n0 + r) * p.K, p.K * 2);
        return {pad, ld * 2, pad + KF * 32, ld * 2};
    }
    RowGroup g{p.w + n0 * p.K, p.K * 2, nullptr, 64};
    if (KF < KS) {
        std::fill(tail, tail + 16 * 32, (uint16_t)0);
        for (int64_t r = 0; r < 16; ++r)
            std::memcpy(tail + r * 32, p.w + (n0 + r) * p.K + KF * 32, (p.K - KF * 32) * 2);
        g.tail = tail;
    }
    return g;
}

// ---- stores

// C [nrows][ncols] (row stride ld floats) of rows n0.. and columns c0.. into dst, bias added.
SDPLAN_AVX512 void store_block(const Problem &p, int64_t n0, int64_t c0, int64_t nrows, int64_t ncols,
                               const float *c, int64_t ld) {
    const int64_t rows = std::min<int64_t>(nrows, p.N - n0);
    const int64_t cols = std::min<int64_t>(ncols, p.M * p.images - c0);
    if (rows <= 0 || cols <= 0) return;
    if (p.conv) {  // rows are output channel planes; split the columns per image
        for (int64_t q0 = 0; q0 < cols;) {
            const int64_t img = (c0 + q0) / p.M, m = (c0 + q0) % p.M;
            const int64_t run = std::min(cols - q0, p.M - m);
            float *out = (float *)((char *)p.dst + img * p.dst_img) + n0 * p.M + m;
            for (int64_t r = 0; r < rows; ++r) {
                const __m512 b = _mm512_set1_ps(p.bias ? p.bias[n0 + r] : 0.0f);
                const float *src = c + r * ld + q0;
                for (int64_t q = 0; q < run; q += 16) {
                    const int64_t left = run - q;
                    const __mmask16 mk = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
                    _mm512_mask_storeu_ps(out + r * p.M + q, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, src + q), b));
                }
            }
            q0 += run;
        }
        return;
    }
    // linear: dst[m][n]; 16 x 16 sub-blocks transposed
    alignas(64) float t[16][16];
    for (int64_t a = 0; a < rows; a += 16) {
        const int64_t nr = std::min<int64_t>(16, rows - a);
        const __mmask16 mk = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
        const __m512 b = p.bias ? _mm512_maskz_loadu_ps(mk, p.bias + n0 + a) : _mm512_setzero_ps();
        for (int64_t q = 0; q < cols; q += 16) {
            transpose16(c + a * ld + q, ld * 4, t, 64);
            for (int64_t i = 0; i < std::min<int64_t>(16, cols - q); ++i)
                _mm512_mask_storeu_ps(p.dst + (c0 + q + i) * p.N + n0 + a, mk, _mm512_add_ps(_mm512_load_ps(t[i]), b));
        }
    }
}

// ---- driver

#ifndef KB_WIDE_W
#define KB_WIDE_W 2048
#endif
// W larger than this (bytes; about an L2 cache) is multiplied in wide column blocks, K outermost
constexpr int64_t kWideWeightBytes = (int64_t)KB_WIDE_W * 1024;
constexpr int64_t kWideAccBytes = 2048 * 1024;  // f32 accumulators of all rows x a wide block
#ifndef KB_WIDE_STEPS
#define KB_WIDE_STEPS 48
#endif
constexpr int64_t kWideSteps = KB_WIDE_STEPS;  // k steps per chunk of a wide block

// Columns per block when W is larger than an L2 cache: up to 256, as many as keep the f32
// accumulators of all N rows within kWideAccBytes; never fewer than `narrow` (panel_columns).
inline int64_t wide_columns(int64_t N, int64_t narrow, int64_t cols) {
    const int64_t wide = std::clamp<int64_t>(kWideAccBytes / (round_up(N, 32) * 4) / 32 * 32, 32, 256);
    return std::min(std::max(narrow, wide), round_up(cols, 32));
}

// Each work item is one block of Mb columns (its panel packed once per thread) and a range of
// W's rows. Narrow blocks (W fits an L2 cache): per 32 rows of W, C [32][Mb] over all of K in
// L1 (block_product). Wide blocks (W larger): K in chunks of kWideSteps outermost, each chunk
// of the panel (kWideSteps * 32 k x Mb, in L2) multiplied by every row of the range into f32 accumulators
// [rows][Mb], so W streams from memory once per column block instead of once per narrow block
// (the convolutions with 640 to 2560 input channels: 3.8 GB of W traffic -> 0.5 GB at 32 x 32
// with 2560 channels).
template <bool AMX>
SDPLAN_AMX void run(const Problem &p, int ith, int nth) {
    const int64_t K = p.K, KS = (K + 31) / 32, cols = p.M * p.images;
    const int64_t narrow = panel_columns(KS, cols);
    const bool wide = p.N * K * 2 > kWideWeightBytes && cols > narrow;
    // narrow blocks of even width (multiples of 32): with 128-column panels 192 columns run as
    // 96 + 96, not 128 + 64, which gave one of two threads twice the other's columns
    const int64_t nblocks = (cols + narrow - 1) / narrow;
    const int64_t Mb = wide ? wide_columns(p.N, narrow, cols)
                            : std::min(narrow, round_up((cols + nblocks - 1) / nblocks, 32));
    const int64_t mblocks = (cols + Mb - 1) / Mb, G = Mb / 16;
    const int64_t n32 = (p.N + 31) / 32;
    // split the rows of W when there are fewer column blocks than 2 per thread
    const auto [nsplit, i0, i1] = split_work(mblocks, n32, ith, nth);
    if (i0 >= i1) return;
    thread_local std::vector<char> panel_buf, offs_buf, pg_buf, pad_buf, tail_buf, c_buf, cvt_buf;
    thread_local std::vector<RowGroup> groups;
    uint32_t *panel = aligned<uint32_t>(panel_buf, (size_t)KS * 16 * Mb);
    const size_t kk = p.conv ? (size_t)(p.KW * p.KH) : 0;
    int32_t *offs = aligned<int32_t>(offs_buf, kk * Mb);
    ColumnGroup *pg = aligned<ColumnGroup>(pg_buf, kk * (Mb / 16));
    uint16_t *pad = aligned<uint16_t>(pad_buf, (size_t)16 * KS * 32);
    const int64_t range_rows = (n32 + nsplit - 1) / nsplit * 32 + 32;  // rows of W per work item, at most
    const int64_t max_rows = wide ? range_rows : 32;
    uint16_t *tail = aligned<uint16_t>(tail_buf, (size_t)max_rows * 32);
    float *c = aligned<float>(c_buf, (size_t)max_rows * Mb);
    // f16 W rounded to bf16: narrow blocks convert the thread's rows once when they fit half an
    // L2 cache (1 MB; every column block reads all of them), else per 32 rows; wide blocks per
    // chunk of k and 32 rows
    const bool keep_rows = !wide && range_rows * KS * 64 <= kWideWeightBytes / 2;
    uint16_t *cvt = p.w_f16 ? aligned<uint16_t>(cvt_buf, (size_t)(wide ? 32 * std::min(KS, kWideSteps)
                                                                        : (keep_rows ? range_rows : 32) * KS) * 32)
                            : nullptr;
    int64_t cvt_r0 = -1, cvt_r1 = -1;  // narrow: the rows of W converted in cvt (groups)
    if (AMX) amx_configure();
    int64_t packed = -1;
    for (int64_t it = i0; it < i1; ++it) {
        const int64_t mb = it / nsplit, part = it % nsplit;
        const int64_t c0 = mb * Mb;
        if (mb != packed) {
            if (p.conv) pack_conv(p, c0, Mb, panel, offs, pg);
            else pack_linear(p, c0, Mb, panel);
            packed = mb;
        }
        const int64_t r0 = n32 * part / nsplit * 32, r1 = std::min(p.N, n32 * (part + 1) / nsplit * 32);
        const int64_t gcols = std::min<int64_t>(G, (cols - c0 + 15) / 16);  // column groups holding data
        if (!wide) {
            if (p.w_f16 && keep_rows && (r0 != cvt_r0 || r1 != cvt_r1)) {
                groups.clear();
                for (int64_t n0 = r0; n0 < r1; n0 += 16)
                    groups.push_back(convert_rows_f16(p, n0, 0, KS, cvt + (n0 - r0) * KS * 32));
                cvt_r0 = r0, cvt_r1 = r1;
            }
            for (int64_t n0 = r0; n0 < r1; n0 += 32) {
                const int na = n0 + 16 < r1 ? 2 : 1;
                RowGroup a[2];
                if (p.w_f16 && keep_rows) {
                    a[0] = groups[(n0 - r0) / 16];
                    if (na > 1) a[1] = groups[(n0 - r0) / 16 + 1];
                } else if (p.w_f16) {
                    a[0] = convert_rows_f16(p, n0, 0, KS, cvt);
                    if (na > 1) a[1] = convert_rows_f16(p, n0 + 16, 0, KS, cvt + 16 * KS * 32);
                } else {
                    a[0] = row_group(p, n0, pad, tail);
                    if (na > 1) a[1] = row_group(p, n0 + 16, pad, tail + 16 * 32);
                }
                block_product<AMX>(a, na, panel, G, gcols, K, c, Mb);
                store_block(p, n0, c0, na * 16, gcols * 16, c, Mb);
            }
            continue;
        }
        groups.clear();  // the range's row groups (only the last can be partial: one pad)
        if (!p.w_f16)
            for (int64_t n0 = r0; n0 < r1; n0 += 16) groups.push_back(row_group(p, n0, pad, tail + (n0 - r0) * 32));
        for (int64_t sb = 0; sb < KS; sb += kWideSteps) {
            const int64_t se = std::min(KS, sb + kWideSteps);
            for (int64_t n0 = r0; n0 < r1; n0 += 32) {
                const int na = n0 + 16 < r1 ? 2 : 1;
                RowGroup cv[2];  // f16 W: this chunk of the 32 rows, converted (48 steps: 96 KB)
                if (p.w_f16) {
                    cv[0] = convert_rows_f16(p, n0, sb, se, cvt);
                    if (na > 1) cv[1] = convert_rows_f16(p, n0 + 16, sb, se, cvt + 16 * (se - sb) * 32);
                }
                block_product<AMX>(p.w_f16 ? cv : &groups[(n0 - r0) / 16], na, panel, G, gcols, K, c + (n0 - r0) * Mb,
                                   Mb, sb, se, sb > 0, kWideSteps);
            }
        }
        for (int64_t n0 = r0; n0 < r1; n0 += 32)
            store_block(p, n0, c0, std::min<int64_t>(32, r1 - n0), gcols * 16, c + (n0 - r0) * Mb, Mb);
    }
    if (AMX) _tile_release();
}

// Linear layers with many rows of x: A = x's rows rounded to bf16 (each thread converts its
// own run of rows once), B = W's rows packed per panel of columns (every thread packs all of
// W), C [x rows][W rows] stored straight into dst's rows with the bias.
SDPLAN_AVX512 void convert_rows(const Problem &p, int64_t rb, int64_t n, int64_t Kp, uint16_t *out) {
    for (int64_t r = 0; r < round_up(n, 16); ++r) {
        uint16_t *o = out + r * Kp;
        if (r >= n) {
            std::fill(o, o + Kp, (uint16_t)0);
            continue;
        }
        const float *src = p.x + (rb + r) * p.K;
        for (int64_t k = 0; k < Kp; k += 32) {
            const int64_t left = p.K - k;
            const __mmask16 mlo = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
            const __mmask16 mhi = left >= 32 ? 0xffff : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
            const __m512 lo = _mm512_maskz_loadu_ps(mlo, src + k), hi = _mm512_maskz_loadu_ps(mhi, src + k + 16);
            _mm512_storeu_si512(o + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

// W's rows n0 .. n0 + Nb (zero past N and past K; f16 rounded to bf16) in the panel order: per group of 16 rows and
// step of 32 k, 16 rows of 16 bf16 pairs transposed into the panel's 16 rows.
SDPLAN_AVX512 void pack_weight(const Problem &p, int64_t n0, int64_t Nb, uint32_t *panel) {
    const int64_t G = Nb / 16, KS = (p.K + 31) / 32;
    alignas(64) uint32_t blk[16][16];
    for (int64_t g = 0; g < G; ++g) {
        const int64_t rows = std::clamp<int64_t>(p.N - (n0 + g * 16), 0, 16);
        for (int64_t s = 0; s < KS; ++s) {
            const __mmask32 mk = mask32(p.K - s * 32);
            for (int64_t r = 0; r < 16; ++r)
                _mm512_store_si512(blk[r], r >= rows ? _mm512_setzero_si512()
                                           : p.wq   ? load_wq32(p, n0 + g * 16 + r, s)
                                                    : load_w32(p.w + (n0 + g * 16 + r) * p.K + s * 32, mk, p.w_f16));
            transpose16(blk, 64, panel + (g * KS + s) * 256, 64);
        }
    }
}

// C [nrows][ncols] (row stride ld) of x rows m0.. and W rows n0.. into dst[m][n], bias added.
SDPLAN_AVX512 void store_rows(const Problem &p, int64_t m0, int64_t n0, int64_t nrows, int64_t ncols, const float *c,
                              int64_t ld) {
    const int64_t rows = std::min(nrows, p.M - m0), cols = std::min(ncols, p.N - n0);
    for (int64_t r = 0; r < rows; ++r) {
        float *out = p.dst + (m0 + r) * p.N + n0;
        for (int64_t q = 0; q < cols; q += 16) {
            const int64_t left = cols - q;
            const __mmask16 mk = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            __m512 v = _mm512_maskz_loadu_ps(mk, c + r * ld + q);
            if (p.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, p.bias + n0 + q));
            _mm512_mask_storeu_ps(out + q, mk, v);
        }
    }
}

template <bool AMX>
SDPLAN_AMX void run_rows(const Problem &p, int ith, int nth) {
    const int64_t K = p.K, KS = (K + 31) / 32, Kp = KS * 32;
    const int64_t m32 = (p.M + 31) / 32;
    const int64_t rb = m32 * ith / nth * 32, re = std::min(p.M, m32 * (ith + 1) / nth * 32);
    if (rb >= re) return;
    const int64_t Nb = panel_columns(KS, p.N), G = Nb / 16;
    thread_local std::vector<char> xb_buf, panel_buf, c_buf;
    uint16_t *xb = aligned<uint16_t>(xb_buf, (size_t)round_up(re - rb, 16) * Kp);
    uint32_t *panel = aligned<uint32_t>(panel_buf, (size_t)KS * 16 * Nb);
    float *c = aligned<float>(c_buf, (size_t)32 * Nb);
    convert_rows(p, rb, re - rb, Kp, xb);
    if (AMX) amx_configure();
    for (int64_t n0 = 0; n0 < p.N; n0 += Nb) {
        pack_weight(p, n0, Nb, panel);
        const int64_t gcols = std::min<int64_t>(G, (p.N - n0 + 15) / 16);
        for (int64_t m0 = rb; m0 < re; m0 += 32) {
            const int na = m0 + 16 < re ? 2 : 1;
            const uint16_t *a0 = xb + (m0 - rb) * Kp;
            const RowGroup a[2] = {{a0, Kp * 2, a0 + K / 32 * 32, Kp * 2},
                                   {a0 + 16 * Kp, Kp * 2, a0 + 16 * Kp + K / 32 * 32, Kp * 2}};
            block_product<AMX>(a, na, panel, G, gcols, K, c, Nb);
#ifndef KB_NO_STORE
            store_rows(p, m0, n0, na * 16, gcols * 16, c, Nb);
#endif
        }
    }
    if (AMX) _tile_release();
}

}  // namespace

#endif  // SDPLAN_BF16_X86

void bf16_gemm(ggml_tensor *dst, int ith, int nth, void *userdata) {
    Bf16GemmParams prm;
    std::memcpy(&prm, userdata, sizeof prm);
#ifdef SDPLAN_BF16_X86
    const ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    Problem p{};
    p.conv = prm.conv != 0;
    p.x = (const float *)x->data;
    p.w = (const uint16_t *)w->data;
    p.w_f16 = w->type == GGML_TYPE_F16;
    if (w->type == GGML_TYPE_Q8_0 || w->type == GGML_TYPE_Q4_K || w->type == GGML_TYPE_Q5_K) {
        p.wq = w->type, p.wq_data = (const uint8_t *)w->data, p.wq_row = w->nb[1];
        p.w_f16 = true;  // converted as used, as f16 rows are
    }
    p.bias = b ? (const float *)b->data : nullptr;
    p.dst = (float *)dst->data;
    if (p.conv) {
        p.IW = x->ne[0], p.IH = x->ne[1], p.IC = x->ne[2], p.images = x->ne[3];
        p.KW = w->ne[0], p.KH = w->ne[1], p.N = w->ne[3];
        p.OW = dst->ne[0], p.OH = dst->ne[1];
        p.K = p.KW * p.KH * p.IC, p.M = p.OW * p.OH;
        p.s0 = prm.s0, p.s1 = prm.s1, p.p0 = prm.p0, p.p1 = prm.p1, p.d0 = prm.d0, p.d1 = prm.d1;
        p.x_img = x->nb[3];
        p.dst_img = dst->nb[3];
    } else {
        p.K = x->ne[0], p.N = w->ne[1], p.M = ggml_nrows(x), p.images = 1;
    }
    // the kernel was chosen from bf16_kernel(), which asked for the AMX permission first
    const bool amx = (Bf16Kernel)prm.kernel == Bf16Kernel::amx && bf16_cpu_kernel() == Bf16Kernel::amx;
    // linear layers with many rows per thread: x's rows as A (no transposed stores)
#ifndef KB_ROWS_MIN
#define KB_ROWS_MIN 128
#endif
    if (!p.conv && p.M >= (int64_t)KB_ROWS_MIN * nth) {
        if (amx) run_rows<true>(p, ith, nth);
        else run_rows<false>(p, ith, nth);
    } else if (amx) {
        run<true>(p, ith, nth);
    } else {
        run<false>(p, ith, nth);
    }
#else
    (void)dst, (void)ith, (void)nth;
#endif
}

}  // namespace sdplan
