// Fused Winograd convolution for conv_2d's winograd method: two custom ggml CPU ops
// (ggml_custom_4d callbacks: wino_pack_kernel transforms the kernel, wino_conv convolves)
// implementing F(2x2, 3x3) and F(4x4, 3x3) (Lavin & Gray 2016, "Fast Algorithms for
// Convolutional Neural Networks") for 3x3 kernels, stride 1, padding 1. Each T x T output tile is
// A^T [(G g G^T) . (B^T d B)] A for the (T+2) x (T+2) input patch d at (T ty - 1, T tx - 1);
// summed over input channels the E = (T+2)^2 element-wise products become E matrix products
// [tiles, IC] x [IC, OC]. F(2x2, 3x3) (T = 2, E = 16) has
//   B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]], G = [[1,0,0],[.5,.5,.5],[.5,-.5,.5],[0,0,1]],
//   A^T = [[1,1,1,0],[0,1,-1,-1]]
// and 2.25x fewer multiplications than im2col; F(4x4, 3x3) (T = 4, E = 36; matrices below)
// 4x fewer, at the price of larger transforms and rounding errors (1e-6 to 3e-5 of the output's
// range in f32, growing with the input channels: 1.2e-5 at 512, 2.1e-5 at 1280, 3.3e-5 at 2560,
// against a float64 reference; and B^T d B weighs a patch's values by up to 10 x 10 in absolute
// sum, so finite inputs past about 3e36 can overflow where F(2x2) and the column paths do not).
//
// One fused op runs everything per block of tiles (a run of up to 32 or 64 tiles of one tile
// row): input transform into a block buffer V[E][IC][tiles] that stays in the core's cache,
// then per panel of 16 output channels the E products by a register-blocked micro-kernel (the
// kernel panel U[e][IC][16] streamed), then the output transform straight into y. All
// arithmetic is f32 (the transformed kernel too). Three builds of the op, chosen at run time
// (target attributes): AVX-512 (all 16 channels x 16 tiles in 512-bit accumulators, each
// weight broadcast from memory into its FMA: 0.7-0.9x the AVX2 op's time on a Zen 4 EPYC,
// 1 thread, the SD VAE's 3x3 sizes), AVX2/FMA (6 channels x 16 tiles of 256-bit ones), plain
// loops otherwise. Every product sums over the input channels in the same order in each.
#include "kernels/winograd.h"

#include <ggml-cpu.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/buffers.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SDPLAN_WINO_X86 1
#endif

// The transforms' loops read and write distinct buffers (or distinct parts of one); with
// more streams than GCC versions a loop for, it would leave them scalar without being told.
#if defined(__clang__)
#define SDPLAN_WINO_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define SDPLAN_WINO_IVDEP _Pragma("GCC ivdep")
#else
#define SDPLAN_WINO_IVDEP
#endif

// The driver is inlined into each ISA's entry point (so that each build's transforms are
// vectorized with its ISA); plain inline (and no prefetch) for other compilers.
#if defined(__GNUC__)
#define SDPLAN_WINO_INLINE inline __attribute__((always_inline))
#define SDPLAN_WINO_PREFETCH(p) __builtin_prefetch(p)
#else
#define SDPLAN_WINO_INLINE inline
#define SDPLAN_WINO_PREFETCH(p) ((void)(p))
#endif

namespace sdplan {

namespace {

constexpr int64_t L = kWinoLanes;  // output channels per kernel panel
constexpr int64_t NT = 16;         // tiles per micro-kernel call (two 256-bit vectors, or one 512-bit)
constexpr int64_t kPrefetch = 4;   // input channels read ahead
constexpr int kIsaGeneric = 0, kIsaAvx2 = 1, kIsaAvx512 = 2;  // micro-kernel and transforms' ISA

using kernels::round_up;

// Tiles per block row (a multiple of NT, at most the row's tiles rounded up): 32, or 64 for
// F(2x2) from 512 input channels, where the kernel panels (IC x 16 floats) outgrow L1 and are
// worth reusing over more tiles (measured at the SD VAE's and UNet's sizes, 1 thread; the
// block's transformed input is E * IC * tiles floats).
int64_t block_tiles(int64_t ic, int64_t tx, int t) {
    return std::min<int64_t>(ic >= 512 && t == 2 ? 64 : 32, round_up(tx, NT));
}

// n floats of buf starting at a 64-byte boundary (the micro-kernel's 16-float rows then
// never straddle two cache lines).
float *aligned(std::vector<float> &buf, int64_t n) {
    buf.resize((size_t)n + 16);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf.data());
    return buf.data() + ((64 - p % 64) % 64) / sizeof(float);
}

// C[r * ldc + 0..16) = sum_k A[k * 16 + r] * B[k * ldb + 0..16) for r < R: R output
// channels of a kernel panel (A) by 16 tiles of the transformed input (B).
template <int R>
void kernel_generic(const float *a, const float *b, int64_t ldb, int64_t k_n, float *c, int64_t ldc) {
    float acc[R][NT] = {};
    for (int64_t k = 0; k < k_n; ++k) {
        const float *ak = a + k * L, *bk = b + k * ldb;
        for (int r = 0; r < R; ++r)
            for (int t = 0; t < NT; ++t) acc[r][t] += ak[r] * bk[t];
    }
    for (int r = 0; r < R; ++r) std::memcpy(c + r * ldc, acc[r], sizeof acc[r]);
}

#ifdef SDPLAN_WINO_X86
// The accumulators are named variables (an array of __m256 ends up on the stack): rows
// r >= R are compiled out.
template <int R>
__attribute__((target("avx2,fma"))) void kernel_avx2(const float *a, const float *b, int64_t ldb, int64_t k_n,
                                                     float *c, int64_t ldc) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
           c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t k = 0; k < k_n; ++k) {
        const float *bk = b + k * ldb, *ak = a + k * L;
        const __m256 b0 = _mm256_loadu_ps(bk), b1 = _mm256_loadu_ps(bk + 8);
        __m256 av = _mm256_broadcast_ss(ak);
        c00 = _mm256_fmadd_ps(av, b0, c00);
        c01 = _mm256_fmadd_ps(av, b1, c01);
        if (R > 1) {
            av = _mm256_broadcast_ss(ak + 1);
            c10 = _mm256_fmadd_ps(av, b0, c10);
            c11 = _mm256_fmadd_ps(av, b1, c11);
        }
        if (R > 2) {
            av = _mm256_broadcast_ss(ak + 2);
            c20 = _mm256_fmadd_ps(av, b0, c20);
            c21 = _mm256_fmadd_ps(av, b1, c21);
        }
        if (R > 3) {
            av = _mm256_broadcast_ss(ak + 3);
            c30 = _mm256_fmadd_ps(av, b0, c30);
            c31 = _mm256_fmadd_ps(av, b1, c31);
        }
        if (R > 4) {
            av = _mm256_broadcast_ss(ak + 4);
            c40 = _mm256_fmadd_ps(av, b0, c40);
            c41 = _mm256_fmadd_ps(av, b1, c41);
        }
        if (R > 5) {
            av = _mm256_broadcast_ss(ak + 5);
            c50 = _mm256_fmadd_ps(av, b0, c50);
            c51 = _mm256_fmadd_ps(av, b1, c51);
        }
    }
    _mm256_storeu_ps(c, c00);
    _mm256_storeu_ps(c + 8, c01);
    if (R > 1) _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
    if (R > 2) _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    if (R > 3) _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    if (R > 4) _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    if (R > 5) _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

// All 16 channels of a panel by 16 tiles: one 512-bit vector of tiles per channel, the
// channel's weight broadcast from the panel (16 accumulators; b, c and ldb, ldc 64-byte
// aligned). Each product sums over k in the same order as kernel_avx2 (same bits).
__attribute__((target("avx512f"))) void kernel_avx512(const float *a, const float *b, int64_t ldb, int64_t k_n,
                                                      float *c, int64_t ldc) {
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
           c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
    for (int64_t k = 0; k < k_n; ++k) {
        const float *ak = a + k * L;
        const __m512 bv = _mm512_load_ps(b + k * ldb);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(ak[0]), bv, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(ak[1]), bv, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(ak[2]), bv, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(ak[3]), bv, c3);
        c4 = _mm512_fmadd_ps(_mm512_set1_ps(ak[4]), bv, c4);
        c5 = _mm512_fmadd_ps(_mm512_set1_ps(ak[5]), bv, c5);
        c6 = _mm512_fmadd_ps(_mm512_set1_ps(ak[6]), bv, c6);
        c7 = _mm512_fmadd_ps(_mm512_set1_ps(ak[7]), bv, c7);
        c8 = _mm512_fmadd_ps(_mm512_set1_ps(ak[8]), bv, c8);
        c9 = _mm512_fmadd_ps(_mm512_set1_ps(ak[9]), bv, c9);
        c10 = _mm512_fmadd_ps(_mm512_set1_ps(ak[10]), bv, c10);
        c11 = _mm512_fmadd_ps(_mm512_set1_ps(ak[11]), bv, c11);
        c12 = _mm512_fmadd_ps(_mm512_set1_ps(ak[12]), bv, c12);
        c13 = _mm512_fmadd_ps(_mm512_set1_ps(ak[13]), bv, c13);
        c14 = _mm512_fmadd_ps(_mm512_set1_ps(ak[14]), bv, c14);
        c15 = _mm512_fmadd_ps(_mm512_set1_ps(ak[15]), bv, c15);
    }
    _mm512_store_ps(c, c0);
    _mm512_store_ps(c + ldc, c1);
    _mm512_store_ps(c + 2 * ldc, c2);
    _mm512_store_ps(c + 3 * ldc, c3);
    _mm512_store_ps(c + 4 * ldc, c4);
    _mm512_store_ps(c + 5 * ldc, c5);
    _mm512_store_ps(c + 6 * ldc, c6);
    _mm512_store_ps(c + 7 * ldc, c7);
    _mm512_store_ps(c + 8 * ldc, c8);
    _mm512_store_ps(c + 9 * ldc, c9);
    _mm512_store_ps(c + 10 * ldc, c10);
    _mm512_store_ps(c + 11 * ldc, c11);
    _mm512_store_ps(c + 12 * ldc, c12);
    _mm512_store_ps(c + 13 * ldc, c13);
    _mm512_store_ps(c + 14 * ldc, c14);
    _mm512_store_ps(c + 15 * ldc, c15);
}
#endif

// M[l][0..tiles) = U[:, l]^T V for the 16 channels l of one panel and one transformed
// element: U [IC][16], V [IC][ld], M [16][ld]; tiles a multiple of NT.
template <int ISA>
SDPLAN_WINO_INLINE void panel_product(const float *u, const float *v, int64_t ld, int64_t k_n,
                                      float *m, int64_t tiles) {
    for (int64_t t = 0; t < tiles; t += NT) {
#ifdef SDPLAN_WINO_X86
        if (ISA == kIsaAvx512) {
            kernel_avx512(u, v + t, ld, k_n, m + t, ld);
            continue;
        }
        if (ISA == kIsaAvx2) {
            kernel_avx2<6>(u, v + t, ld, k_n, m + t, ld);
            kernel_avx2<6>(u + 6, v + t, ld, k_n, m + 6 * ld + t, ld);
            kernel_avx2<4>(u + 12, v + t, ld, k_n, m + 12 * ld + t, ld);
            continue;
        }
#endif
        kernel_generic<6>(u, v + t, ld, k_n, m + t, ld);
        kernel_generic<6>(u + 6, v + t, ld, k_n, m + 6 * ld + t, ld);
        kernel_generic<4>(u + 12, v + t, ld, k_n, m + 12 * ld + t, ld);
    }
}

// Prefetch the `rows` input rows from iy0 of channel ic + kPrefetch (columns c_lo..c_hi of the
// window starting at ix0): the channels are a plane apart, no hardware prefetcher follows that.
SDPLAN_WINO_INLINE void prefetch_channel_ahead(const ggml_tensor *x, const char *chan, int64_t ic,
                                               int64_t iy0, int rows, int64_t ix0, int64_t c_lo,
                                               int64_t c_hi) {
    const int64_t IC = x->ne[2], H = x->ne[1];
    if (ic + kPrefetch >= IC || c_hi <= c_lo) return;
    const char *next = chan + kPrefetch * x->nb[2] + (ix0 + c_lo) * sizeof(float);
    for (int r = 0; r < rows; ++r) {
        const int64_t iy = iy0 + r;
        if (iy < 0 || iy >= H) continue;
        for (int64_t o = 0; o < (c_hi - c_lo) * (int64_t)sizeof(float); o += 64)
            SDPLAN_WINO_PREFETCH(next + iy * x->nb[1] + o);
    }
}

// Input row iy of a channel, window from column ix0, split into P phases:
// out[k * stride + i] = x[iy][ix0 + P * i + k] for i < n (zero outside the image; `row` holds
// the window, its columns outside c_lo..c_hi stay zero).
template <int P>
SDPLAN_WINO_INLINE void load_row_phases(const ggml_tensor *x, const char *chan, int64_t iy,
                                        int64_t ix0, int64_t c_lo, int64_t c_hi, float *row,
                                        float *out, int64_t n, int64_t stride) {
    if (iy < 0 || iy >= x->ne[1] || c_hi <= c_lo) {
        for (int k = 0; k < P; ++k) std::fill(out + k * stride, out + k * stride + n, 0.0f);
        return;
    }
    const float *src = (const float *)(chan + iy * x->nb[1]);
    std::memcpy(row + c_lo, src + ix0 + c_lo, (size_t)(c_hi - c_lo) * sizeof(float));
    SDPLAN_WINO_IVDEP
    for (int64_t i = 0; i < n; ++i)
        for (int k = 0; k < P; ++k) out[k * stride + i] = row[P * i + k];
}

// V[e][ic][j] = (B^T d B)[e] of the patch of tile (ty, tx0 + j) for j < mb (zero up to ld),
// for every channel. Columns are split into even and odd ones so that every loop runs over
// contiguous memory.
SDPLAN_WINO_INLINE void input_transform(const ggml_tensor *x, int64_t n, int64_t ty,
                                        int64_t tx0, int64_t mb, int64_t ld, int64_t ldv,
                                        float *v, std::vector<float> &scratch) {
    const int64_t W = x->ne[0], IC = x->ne[2];
    const int64_t cols = 2 * ld + 2, half = ld + 1, ix0 = 2 * tx0 - 1;
    scratch.resize((size_t)(cols + 16 * half));
    float *row = scratch.data(), *pe = row + cols, *po = pe + 4 * half, *qe = po + 4 * half, *qo = qe + 4 * half;
    const int64_t c_lo = std::max<int64_t>(0, -ix0), c_hi = std::min<int64_t>(2 * mb + 2, W - ix0);
    const int64_t plane = IC * ldv;
    std::fill(row, row + cols, 0.0f);
    for (int64_t ic = 0; ic < IC; ++ic) {
        const char *chan = (const char *)x->data + n * x->nb[3] + ic * x->nb[2];
        prefetch_channel_ahead(x, chan, ic, 2 * ty - 1, 4, ix0, c_lo, c_hi);
        for (int r = 0; r < 4; ++r)  // even columns to pe, odd ones to po = pe + 4 * half
            load_row_phases<2>(x, chan, 2 * ty - 1 + r, ix0, c_lo, c_hi, row, pe + r * half, half,
                               po - pe);
        // B^T d over the rows, even and odd columns
        SDPLAN_WINO_IVDEP
        for (int64_t i = 0; i < half; ++i) {
            const float e0 = pe[i], e1 = pe[half + i], e2 = pe[2 * half + i], e3 = pe[3 * half + i];
            const float o0 = po[i], o1 = po[half + i], o2 = po[2 * half + i], o3 = po[3 * half + i];
            qe[i] = e0 - e2;
            qe[half + i] = e1 + e2;
            qe[2 * half + i] = e2 - e1;
            qe[3 * half + i] = e1 - e3;
            qo[i] = o0 - o2;
            qo[half + i] = o1 + o2;
            qo[2 * half + i] = o2 - o1;
            qo[3 * half + i] = o1 - o3;
        }
        // (B^T d) B over the columns of each tile: columns 2j..2j+3 are qe[j], qo[j], qe[j+1], qo[j+1]
        for (int r = 0; r < 4; ++r) {
            const float *a = qe + r * half, *b = qo + r * half;
            float *v0 = v + (r * 4) * plane + ic * ldv, *v1 = v0 + plane, *v2 = v1 + plane, *v3 = v2 + plane;
            SDPLAN_WINO_IVDEP
            for (int64_t j = 0; j < ld; ++j) {
                v0[j] = a[j] - a[j + 1];
                v1[j] = b[j] + a[j + 1];
                v2[j] = a[j + 1] - b[j];
                v3[j] = b[j] - b[j + 1];
            }
        }
    }
    (void)mb;
}

// y[oc][2ty + i][2(tx0 + j) + k] = (A^T M A)[i][k] for the 16 channels of panel ocb; m holds
// M[e][l][ld] for the block.
SDPLAN_WINO_INLINE void output_transform(ggml_tensor *dst, int64_t n, int64_t ty, int64_t tx0,
                                         int64_t mb, int64_t ld, int64_t ldv, int64_t ocb,
                                         const float *m, const float *bias,
                                         std::vector<float> &scratch) {
    const int64_t W = dst->ne[0], H = dst->ne[1], OC = dst->ne[2];
    scratch.resize((size_t)4 * ld);
    float *y00 = scratch.data(), *y01 = y00 + ld, *y10 = y01 + ld, *y11 = y10 + ld;
    const int64_t x0 = 2 * tx0, pairs = std::min<int64_t>(mb, (W - x0) / 2), odd_end = 2 * pairs < W - x0 && pairs < mb;
    const int64_t plane = L * ldv;
    for (int64_t l = 0; l < L && ocb * L + l < OC; ++l) {
        const float *a = m + l * ldv;
        const float bv = bias ? bias[ocb * L + l] : 0.0f;
        SDPLAN_WINO_IVDEP
        for (int64_t j = 0; j < mb; ++j) {
            const float b00 = a[j] + a[4 * plane + j] + a[8 * plane + j];
            const float b01 = a[plane + j] + a[5 * plane + j] + a[9 * plane + j];
            const float b02 = a[2 * plane + j] + a[6 * plane + j] + a[10 * plane + j];
            const float b03 = a[3 * plane + j] + a[7 * plane + j] + a[11 * plane + j];
            const float b10 = a[4 * plane + j] - a[8 * plane + j] - a[12 * plane + j];
            const float b11 = a[5 * plane + j] - a[9 * plane + j] - a[13 * plane + j];
            const float b12 = a[6 * plane + j] - a[10 * plane + j] - a[14 * plane + j];
            const float b13 = a[7 * plane + j] - a[11 * plane + j] - a[15 * plane + j];
            y00[j] = b00 + b01 + b02 + bv;
            y01[j] = b01 - b02 - b03 + bv;
            y10[j] = b10 + b11 + b12 + bv;
            y11[j] = b11 - b12 - b13 + bv;
        }
        char *chan = (char *)dst->data + n * dst->nb[3] + (ocb * L + l) * dst->nb[2];
        for (int i = 0; i < 2 && 2 * ty + i < H; ++i) {
            float *out = (float *)(chan + (2 * ty + i) * dst->nb[1]) + x0;
            const float *ev = i ? y10 : y00, *od = i ? y11 : y01;
            SDPLAN_WINO_IVDEP
            for (int64_t j = 0; j < pairs; ++j) {
                out[2 * j] = ev[j];
                out[2 * j + 1] = od[j];
            }
            if (odd_end) out[2 * pairs] = ev[pairs];  // odd width: the last tile's left column
        }
    }
}

// F(4x4, 3x3): 6x6 patches at (4ty-1, 4tx-1), 36 elements, with
//   B^T = [[4,0,-5,0,1,0],[0,-4,-4,1,1,0],[0,4,-4,-1,1,0],[0,-2,-1,2,1,0],[0,2,-1,-2,1,0],[0,4,0,-5,0,1]],
//   A^T = [[1,1,1,1,1,0],[0,1,-1,2,-2,0],[0,1,1,4,4,0],[0,1,-1,8,-8,1]] (G in wino_pack_kernel).
// Columns are split by their position modulo 4 so that every loop runs over contiguous memory.

// out[s] = (B^T p)[s] for six inputs p0..p5 spaced ``st`` apart, for i < n.
SDPLAN_WINO_INLINE void bt6(const float *p, int64_t st, float *out, int64_t ost, int64_t n) {
    SDPLAN_WINO_IVDEP
    for (int64_t i = 0; i < n; ++i) {
        const float p0 = p[i], p1 = p[st + i], p2 = p[2 * st + i], p3 = p[3 * st + i], p4 = p[4 * st + i],
                    p5 = p[5 * st + i];
        out[i] = 4.0f * p0 - 5.0f * p2 + p4;
        out[ost + i] = -4.0f * (p1 + p2) + p3 + p4;
        out[2 * ost + i] = 4.0f * (p1 - p2) - p3 + p4;
        out[3 * ost + i] = 2.0f * (p3 - p1) - p2 + p4;
        out[4 * ost + i] = 2.0f * (p1 - p3) - p2 + p4;
        out[5 * ost + i] = 4.0f * p1 - 5.0f * p3 + p5;
    }
}

SDPLAN_WINO_INLINE void input_transform4(const ggml_tensor *x, int64_t n, int64_t ty,
                                         int64_t tx0, int64_t mb, int64_t ld, int64_t ldv,
                                         float *v, std::vector<float> &scratch) {
    const int64_t W = x->ne[0], IC = x->ne[2];
    const int64_t cols = 4 * ld + 4, ph = ld + 1, ix0 = 4 * tx0 - 1;
    // row buffer, then phases p[r][k][i] = row r, column 4i + k, then q[s][k][i] = (B^T p)[s]
    scratch.resize((size_t)(cols + 2 * 24 * ph));
    float *row = scratch.data(), *p = row + cols, *q = p + 24 * ph;
    const int64_t c_lo = std::max<int64_t>(0, -ix0), c_hi = std::min<int64_t>(4 * mb + 2, W - ix0);
    const int64_t plane = IC * ldv;
    std::fill(row, row + cols, 0.0f);
    for (int64_t ic = 0; ic < IC; ++ic) {
        const char *chan = (const char *)x->data + n * x->nb[3] + ic * x->nb[2];
        prefetch_channel_ahead(x, chan, ic, 4 * ty - 1, 6, ix0, c_lo, c_hi);
        for (int r = 0; r < 6; ++r)
            load_row_phases<4>(x, chan, 4 * ty - 1 + r, ix0, c_lo, c_hi, row, p + r * 4 * ph, ph, ph);
        bt6(p, 4 * ph, q, 4 * ph, 4 * ph);  // over the rows, all phases at once
        // over the columns: tile j's columns 4j..4j+5 are phases 0..3 at j, phases 0..1 at j+1
        for (int s6 = 0; s6 < 6; ++s6) {
            const float *c0 = q + s6 * 4 * ph, *c1 = c0 + ph, *c2 = c1 + ph, *c3 = c2 + ph;
            float *o = v + (s6 * 6) * plane + ic * ldv;
            SDPLAN_WINO_IVDEP
            for (int64_t j = 0; j < ld; ++j) {
                const float d0 = c0[j], d1 = c1[j], d2 = c2[j], d3 = c3[j], d4 = c0[j + 1], d5 = c1[j + 1];
                o[j] = 4.0f * d0 - 5.0f * d2 + d4;
                o[plane + j] = -4.0f * (d1 + d2) + d3 + d4;
                o[2 * plane + j] = 4.0f * (d1 - d2) - d3 + d4;
                o[3 * plane + j] = 2.0f * (d3 - d1) - d2 + d4;
                o[4 * plane + j] = 2.0f * (d1 - d3) - d2 + d4;
                o[5 * plane + j] = 4.0f * d1 - 5.0f * d3 + d5;
            }
        }
    }
}

SDPLAN_WINO_INLINE void output_transform4(ggml_tensor *dst, int64_t n, int64_t ty, int64_t tx0,
                                          int64_t mb, int64_t ld, int64_t ldv, int64_t ocb,
                                          const float *m, const float *bias,
                                          std::vector<float> &scratch) {
    const int64_t W = dst->ne[0], H = dst->ne[1], OC = dst->ne[2];
    scratch.resize((size_t)(24 + 16) * ld);
    float *b = scratch.data(), *y = b + 24 * ld;  // b[i][t][j] = (A^T M)[i][t], y[i][k][j]
    const int64_t plane = L * ldv, x0 = 4 * tx0, nx = std::min<int64_t>(4 * mb, W - x0);
    for (int64_t l = 0; l < L && ocb * L + l < OC; ++l) {
        const float *a = m + l * ldv;
        const float bv = bias ? bias[ocb * L + l] : 0.0f;
        for (int t = 0; t < 6; ++t) {  // A^T over the rows s, column t
            const float *m0 = a + t * plane, *m1 = m0 + 6 * plane, *m2 = m1 + 6 * plane, *m3 = m2 + 6 * plane,
                        *m4 = m3 + 6 * plane, *m5 = m4 + 6 * plane;
            float *b0 = b + t * ld, *b1 = b0 + 6 * ld, *b2 = b1 + 6 * ld, *b3 = b2 + 6 * ld;
            SDPLAN_WINO_IVDEP
            for (int64_t j = 0; j < mb; ++j) {
                const float s12 = m1[j] + m2[j], d12 = m1[j] - m2[j], s34 = m3[j] + m4[j], d34 = m3[j] - m4[j];
                b0[j] = m0[j] + s12 + s34;
                b1[j] = d12 + 2.0f * d34;
                b2[j] = s12 + 4.0f * s34;
                b3[j] = d12 + 8.0f * d34 + m5[j];
            }
        }
        for (int i = 0; i < 4; ++i) {  // A^T over the columns t
            const float *bi = b + i * 6 * ld;
            const float *m0 = bi, *m1 = bi + ld, *m2 = m1 + ld, *m3 = m2 + ld, *m4 = m3 + ld, *m5 = m4 + ld;
            float *y0 = y + i * 4 * ld, *y1 = y0 + ld, *y2 = y1 + ld, *y3 = y2 + ld;
            SDPLAN_WINO_IVDEP
            for (int64_t j = 0; j < mb; ++j) {
                const float s12 = m1[j] + m2[j], d12 = m1[j] - m2[j], s34 = m3[j] + m4[j], d34 = m3[j] - m4[j];
                y0[j] = m0[j] + s12 + s34 + bv;
                y1[j] = d12 + 2.0f * d34 + bv;
                y2[j] = s12 + 4.0f * s34 + bv;
                y3[j] = d12 + 8.0f * d34 + m5[j] + bv;
            }
        }
        char *chan = (char *)dst->data + n * dst->nb[3] + (ocb * L + l) * dst->nb[2];
        for (int i = 0; i < 4 && 4 * ty + i < H; ++i) {
            float *out = (float *)(chan + (4 * ty + i) * dst->nb[1]) + x0;
            const float *y0 = y + i * 4 * ld, *y1 = y0 + ld, *y2 = y1 + ld, *y3 = y2 + ld;
            if (nx == 4 * mb) {
                SDPLAN_WINO_IVDEP
                for (int64_t j = 0; j < mb; ++j) {
                    out[4 * j] = y0[j];
                    out[4 * j + 1] = y1[j];
                    out[4 * j + 2] = y2[j];
                    out[4 * j + 3] = y3[j];
                }
            } else {
                for (int64_t c = 0; c < nx; ++c) out[c] = y[(i * 4 + c % 4) * ld + c / 4];
            }
        }
    }
}

// Output tile T x T (2 or 4); E = (T + 2)^2 transformed elements, U with E panels per 16 channels.
// A block is a run of up to ld tiles of one tile row, or, when a whole row is narrower than the
// block target, several whole rows (their tiles ld apart in V and M; fewer panel reads per
// tile), as long as every thread still gets two blocks. Each output is computed the same way
// whatever the grouping.
template <int ISA, int T>
SDPLAN_WINO_INLINE void conv_body(ggml_tensor *dst, int ith, int nth) {
    constexpr int E = (T + 2) * (T + 2);
    const ggml_tensor *x = dst->src[0], *u = dst->src[1];
    const int64_t W = x->ne[0], H = x->ne[1], IC = x->ne[2], N = x->ne[3];
    const int64_t TX = (W + T - 1) / T, TY = (H + T - 1) / T, OCB = u->ne[3];
    const int64_t ld = block_tiles(IC, TX, T), segs = (TX + ld - 1) / ld;
    int64_t rows = segs == 1 ? std::max<int64_t>(1, block_tiles(IC, 1 << 20, T) / ld) : 1;
    rows = std::max<int64_t>(1, std::min(rows, N * TY / (2 * nth)));
    // several whole rows: their tiles back to back (row stride TX), so that rows narrower than
    // the micro-kernel's 16 tiles fill it
    const int64_t rs = segs == 1 && rows > 1 ? TX : ld;
    const int64_t groups = (TY + rows - 1) / rows, ldv = round_up(rows * rs, NT);
    const int64_t blocks = N * groups * segs;
    const int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    thread_local std::vector<float> v_buf, m_buf, scratch;
    float *v = aligned(v_buf, E * IC * ldv), *m = aligned(m_buf, E * L * ldv);
    const float *U = (const float *)u->data;
    const float *bias = dst->src[2] ? (const float *)dst->src[2]->data : nullptr;  // (OC,) or none
    for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = b / (groups * segs), ty0 = (b / segs) % groups * rows, tx0 = (b % segs) * ld;
        const int64_t mb = std::min(ld, TX - tx0), nr = std::min(rows, TY - ty0);
        const int64_t tiles = round_up((nr - 1) * rs + mb, NT);
        for (int64_t r = 0; r < nr; ++r) {
            if (T == 4) input_transform4(x, n, ty0 + r, tx0, mb, rs, ldv, v + r * rs, scratch);
            else input_transform(x, n, ty0 + r, tx0, mb, rs, ldv, v + r * rs, scratch);
        }
        for (int64_t ocb = 0; ocb < OCB; ++ocb) {
            for (int e = 0; e < E; ++e)
                panel_product<ISA>(U + (ocb * E + e) * IC * L, v + e * IC * ldv, ldv, IC, m + e * L * ldv, tiles);
            for (int64_t r = 0; r < nr; ++r) {
                if (T == 4) output_transform4(dst, n, ty0 + r, tx0, mb, rs, ldv, ocb, m + r * rs, bias, scratch);
                else output_transform(dst, n, ty0 + r, tx0, mb, rs, ldv, ocb, m + r * rs, bias, scratch);
            }
        }
    }
}

#ifdef SDPLAN_WINO_X86
__attribute__((target("avx2,fma"))) void conv_avx2(ggml_tensor *dst, int ith, int nth, bool f4) {
    if (f4) conv_body<kIsaAvx2, 4>(dst, ith, nth);
    else conv_body<kIsaAvx2, 2>(dst, ith, nth);
}

__attribute__((target("avx512f,avx2,fma"))) void conv_avx512(ggml_tensor *dst, int ith, int nth, bool f4) {
    if (f4) conv_body<kIsaAvx512, 4>(dst, ith, nth);
    else conv_body<kIsaAvx512, 2>(dst, ith, nth);
}
#endif

void conv_generic(ggml_tensor *dst, int ith, int nth, bool f4) {
    if (f4) conv_body<kIsaGeneric, 4>(dst, ith, nth);
    else conv_body<kIsaGeneric, 2>(dst, ith, nth);
}

}  // namespace

int64_t wino_elements(int64_t width) { return width >= 32 ? 36 : 16; }

bool wino_fast_cpu() {
#ifdef SDPLAN_WINO_X86
    static const bool fast = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return fast;
#else
    return false;
#endif
}

namespace {
std::atomic<bool> avx512_forbidden{false};  // set_wino_avx512(false): the AVX2 path on an AVX-512 CPU
}  // namespace

bool wino_avx512() {
#ifdef SDPLAN_WINO_X86
    static const bool cpu = wino_fast_cpu() && __builtin_cpu_supports("avx512f");
    return cpu && !avx512_forbidden.load();
#else
    return false;
#endif
}

void set_wino_avx512(bool allow) { avx512_forbidden.store(!allow); }

const char *wino_kernel_name() { return wino_avx512() ? "avx512" : wino_fast_cpu() ? "avx2" : "generic"; }

namespace {

const float kG2[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}};
const float kG4[6][3] = {{0.25f, 0, 0},
                         {-1 / 6.0f, -1 / 6.0f, -1 / 6.0f},
                         {-1 / 6.0f, 1 / 6.0f, -1 / 6.0f},
                         {1 / 24.0f, 1 / 12.0f, 1 / 6.0f},
                         {1 / 24.0f, -1 / 12.0f, 1 / 6.0f},
                         {0, 0, 1}};

// panel[e][ic][0..16) = (G g G^T)[e] for the 16 kernels g = gt[ic][0..9)[lane] (P points per axis).
// Per chunk of input channels, each row r of G g is formed for the chunk, then each point
// (r, c) is written as one run of the chunk's channels: the P * P output streams (IC * 64 bytes
// apart) are filled kChunk lines at a time. Written one line per stream in turn (and gathered
// with scalar stores) the pack of a 1280-channel kernel took 46-52 ms inside SDXL's UNet against
// 10.6 now (2 threads, Zen 4: the 236 MB of U at about the memory's write rate).
template <int ISA, int P>
SDPLAN_WINO_INLINE void pack_panel(const float *gt, const float (*G)[3], int64_t IC, float *panel) {
    constexpr int64_t kChunk = 256;
    alignas(64) float q[kChunk][3][L];  // row r of G g for the chunk's channels
    for (int64_t ic0 = 0; ic0 < IC; ic0 += kChunk) {
        const int64_t n = std::min(kChunk, IC - ic0);
        for (int r = 0; r < P; ++r) {
            const float g0 = G[r][0], g1 = G[r][1], g2 = G[r][2];
            for (int64_t i = 0; i < n; ++i) {
                const float *k = gt + (ic0 + i) * 9 * L;  // k[(row * 3 + col) * 16 + lane]
                for (int c = 0; c < 3; ++c) {
                    SDPLAN_WINO_IVDEP
                    for (int l = 0; l < L; ++l) q[i][c][l] = g0 * k[c * L + l] + g1 * k[(3 + c) * L + l] + g2 * k[(6 + c) * L + l];
                }
            }
            for (int c = 0; c < P; ++c) {  // (G g) G^T
                const float h0 = G[c][0], h1 = G[c][1], h2 = G[c][2];
                float *o = panel + ((r * P + c) * IC + ic0) * L;
                for (int64_t i = 0; i < n; ++i, o += L) {
                    // streamed past the caches: U is larger than them at the VAE's widths, and ordinary
                    // stores would read each line first (the pack took 2x the time, 8% of a 256 px decode)
                    alignas(64) float t[L];
                    SDPLAN_WINO_IVDEP
                    for (int l = 0; l < L; ++l) t[l] = q[i][0][l] * h0 + q[i][1][l] * h1 + q[i][2][l] * h2;
#ifdef SDPLAN_WINO_X86
                    for (int l = 0; l < L; l += 4) _mm_stream_ps(o + l, _mm_load_ps(t + l));
#else
                    std::memcpy(o, t, sizeof t);
#endif
                }
            }
        }
    }
}

// Row i of output channel oc of the kernel as f32 (its 9 * IC values; zeros past OC).
SDPLAN_WINO_INLINE void kernel_row(const ggml_tensor *w, int64_t oc, float *row) {
    const int64_t n = 9 * w->ne[2];
    if (oc >= w->ne[3]) {
        std::fill(row, row + n, 0.0f);
        return;
    }
    const char *src = (const char *)w->data + oc * w->nb[3];
    if (w->type == GGML_TYPE_F16) ggml_cpu_fp16_to_fp32((const ggml_fp16_t *)src, row, n);
    else std::memcpy(row, src, (size_t)n * sizeof(float));
}

#ifdef SDPLAN_WINO_X86
// Transpose the 16 x 16 floats r[row][col] in place (r[c] then holds column c): 4x4 blocks by
// unpacking pairs of rows (ps, then pd), then the 128-bit lanes by two rounds of shuffle_f32x4.
__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int k = 0; k < 8; ++k) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);  // per lane j: r0[4j], r1[4j], r0[4j+1], r1[4j+1]
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) {  // u[4k + c], lane j: column 4j + c of rows 4k..4k+3
        const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * k + 1]), d = _mm512_castps_pd(t[4 * k + 3]);
        u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int c = 0; c < 4; ++c) {
        const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        const __m512 d = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(a, d, 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(a, d, 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(b, e, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(b, e, 0xdd);
    }
}

// gt[i][lane] = f16 row `lane` (16 rows `stride` bytes apart from base) at i < n, n a multiple
// of 16: 16 columns of the 16 rows at a time, converted and transposed in registers.
__attribute__((target("avx512f,avx2,f16c"))) void gather_f16_avx512(const char *base, size_t stride, int64_t n,
                                                                   float *gt) {
    for (int64_t i = 0; i < n; i += L) {
        __m512 r[16];
        for (int l = 0; l < L; ++l)
            r[l] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + l * stride) + i / L));
        transpose16(r);
        for (int j = 0; j < L; ++j) _mm512_storeu_ps(gt + (i + j) * L, r[j]);
    }
}
#endif

// gt[i][lane] = kernel row i of output channel 16 * ocb + lane, i < 9 * IC.
template <int ISA>
SDPLAN_WINO_INLINE void gather_panel(const ggml_tensor *w, int64_t ocb, float *gt, std::vector<float> &row) {
    const int64_t n = 9 * w->ne[2];
#ifdef SDPLAN_WINO_X86
    if (ISA == kIsaAvx512 && w->type == GGML_TYPE_F16 && (ocb + 1) * L <= w->ne[3] && n % L == 0) {
        gather_f16_avx512((const char *)w->data + ocb * L * w->nb[3], w->nb[3], n, gt);
        return;
    }
#endif
    row.resize((size_t)n);
    for (int64_t lane = 0; lane < L; ++lane) {
        kernel_row(w, ocb * L + lane, row.data());
        for (int64_t i = 0; i < n; ++i) gt[i * L + lane] = row[i];
    }
}

// threads split the panels of 16 output channels; per panel the 16 kernels are read once into
// f32 with the lanes innermost (gt[ic][9][lane]), then transformed across the lanes
template <int ISA>
SDPLAN_WINO_INLINE void pack_body(ggml_tensor *dst, int ith, int nth) {
    const ggml_tensor *w = dst->src[0];
    const int64_t IC = w->ne[2], E = dst->ne[2], OCB = dst->ne[3];
    const int64_t per = (OCB + nth - 1) / nth;
    const int64_t p0 = per * ith, p1 = std::min(OCB, p0 + per);
    float *U = (float *)dst->data;
    thread_local std::vector<float> row, gt_buf;
    float *gt = aligned(gt_buf, L * 9 * IC);
    for (int64_t ocb = p0; ocb < p1; ++ocb) {
        gather_panel<ISA>(w, ocb, gt, row);
        float *panel = U + ocb * E * IC * L;
        if (E == 36) pack_panel<ISA, 6>(gt, kG4, IC, panel);
        else pack_panel<ISA, 4>(gt, kG2, IC, panel);
    }
#ifdef SDPLAN_WINO_X86
    _mm_sfence();  // the streamed stores are visible before the convolution reads them
#endif
}

#ifdef SDPLAN_WINO_X86
__attribute__((target("avx512f,avx2,fma,f16c"))) void pack_avx512(ggml_tensor *dst, int ith, int nth) {
    pack_body<kIsaAvx512>(dst, ith, nth);
}

__attribute__((target("avx2,fma,f16c"))) void pack_avx2(ggml_tensor *dst, int ith, int nth) {
    pack_body<kIsaAvx2>(dst, ith, nth);
}
#endif

}  // namespace

void wino_pack_kernel(ggml_tensor *dst, int ith, int nth, void *) {
#ifdef SDPLAN_WINO_X86
    if (wino_avx512()) {
        pack_avx512(dst, ith, nth);
        return;
    }
    if (wino_fast_cpu()) {
        pack_avx2(dst, ith, nth);
        return;
    }
#endif
    pack_body<kIsaGeneric>(dst, ith, nth);
}

void wino_conv(ggml_tensor *dst, int ith, int nth, void *) {
    const bool f4 = dst->src[1]->ne[2] == 36;
#ifdef SDPLAN_WINO_X86
    if (wino_avx512()) {
        conv_avx512(dst, ith, nth, f4);
        return;
    }
    if (wino_fast_cpu()) {
        conv_avx2(dst, ith, nth, f4);
        return;
    }
#endif
    conv_generic(dst, ith, nth, f4);
}

}  // namespace sdplan
