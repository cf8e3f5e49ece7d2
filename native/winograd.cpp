// Winograd F(2x2, 3x3) convolution on the CPU (Lavin & Gray 2016, "Fast Algorithms for
// Convolutional Neural Networks"): each 2x2 output tile is A^T [(G g G^T) . (B^T d B)] A for
// the 4x4 input patch d at (2ty-1, 2tx-1), with
//   B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]], G = [[1,0,0],[.5,.5,.5],[.5,-.5,.5],[0,0,1]],
//   A^T = [[1,1,1,0],[0,1,-1,-1]].
// Summed over input channels the 16 element-wise products become 16 matrix products
// [tiles, IC] x [IC, OC]: 2.25x fewer multiplications than im2col.
//
// One fused op runs everything per block of tiles (a run of up to MB tiles of one tile row):
// input transform into a block buffer V[16][IC][MB] that stays in the core's cache, then per
// panel of 16 output channels the 16 products by a register-blocked micro-kernel (6 tiles x 16
// channels of f32 accumulators, the kernel panel U[e][IC][16] streamed), then the output
// transform straight into y. All arithmetic is f32 (the transformed kernel too). The
// micro-kernel uses AVX2/FMA when the CPU has them (compiled with a target attribute and
// chosen at run time), plain loops otherwise.
#include "winograd.h"

#include <ggml-cpu.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SDPLAN_WINO_X86 1
#endif

namespace sdplan {

namespace {

constexpr int64_t L = kWinoLanes;  // output channels per kernel panel
constexpr int64_t NT = 16;         // tiles per micro-kernel call (two vectors of 8)
constexpr int64_t kPrefetch = 4;   // input channels read ahead

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Tiles per block (a multiple of NT, at most the row's tiles rounded up): 32, or 64 from 512
// input channels, where the kernel panels (IC x 16 floats) outgrow L1 and are worth reusing
// over more tiles (measured at the SD VAE's sizes, 1 thread; the block's transformed input
// is 16 * IC * tiles floats).
int64_t block_tiles(int64_t ic, int64_t tx) { return std::min<int64_t>(ic >= 512 ? 64 : 32, round_up(tx, NT)); }

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
#endif

// M[l][0..tiles) = U[:, l]^T V for the 16 channels l of one panel and one transformed
// element: U [IC][16], V [IC][ld], M [16][ld]; tiles a multiple of NT.
template <bool AVX>
inline __attribute__((always_inline)) void panel_product(const float *u, const float *v, int64_t ld, int64_t k_n,
                                                         float *m, int64_t tiles) {
    for (int64_t t = 0; t < tiles; t += NT) {
#ifdef SDPLAN_WINO_X86
        if (AVX) {
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

// V[e][ic][j] = (B^T d B)[e] of the patch of tile (ty, tx0 + j) for j < mb (zero up to ld),
// for every channel. Columns are split into even and odd ones so that every loop runs over
// contiguous memory.
inline __attribute__((always_inline)) void input_transform(const ggml_tensor *x, int64_t n, int64_t ty,
                                                           int64_t tx0, int64_t mb, int64_t ld, float *v,
                                                           std::vector<float> &scratch) {
    const int64_t W = x->ne[0], H = x->ne[1], IC = x->ne[2];
    const int64_t cols = 2 * ld + 2, half = ld + 1, ix0 = 2 * tx0 - 1;
    scratch.resize((size_t)(cols + 16 * half));
    float *row = scratch.data(), *pe = row + cols, *po = pe + 4 * half, *qe = po + 4 * half, *qo = qe + 4 * half;
    const int64_t c_lo = std::max<int64_t>(0, -ix0), c_hi = std::min<int64_t>(2 * mb + 2, W - ix0);
    const int64_t plane = IC * ld;
    std::fill(row, row + cols, 0.0f);
    for (int64_t ic = 0; ic < IC; ++ic) {
        const char *chan = (const char *)x->data + n * x->nb[3] + ic * x->nb[2];
        if (ic + kPrefetch < IC && c_hi > c_lo) {
            // the channels are a plane apart: no hardware prefetcher follows that
            const char *next = chan + kPrefetch * x->nb[2] + (ix0 + c_lo) * sizeof(float);
            for (int r = 0; r < 4; ++r) {
                const int64_t iy = 2 * ty - 1 + r;
                if (iy < 0 || iy >= H) continue;
                for (int64_t o = 0; o < (c_hi - c_lo) * (int64_t)sizeof(float); o += 64)
                    __builtin_prefetch(next + iy * x->nb[1] + o);
            }
        }
        for (int r = 0; r < 4; ++r) {
            const int64_t iy = 2 * ty - 1 + r;
            float *er = pe + r * half, *od = po + r * half;
            if (iy < 0 || iy >= H || c_hi <= c_lo) {
                std::fill(er, er + half, 0.0f);
                std::fill(od, od + half, 0.0f);
                continue;
            }
            const float *src = (const float *)(chan + iy * x->nb[1]);
            std::memcpy(row + c_lo, src + ix0 + c_lo, (size_t)(c_hi - c_lo) * sizeof(float));
            for (int64_t i = 0; i < half; ++i) {
                er[i] = row[2 * i];
                od[i] = row[2 * i + 1];
            }
        }
        // B^T d over the rows, even and odd columns
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
            float *v0 = v + (r * 4) * plane + ic * ld, *v1 = v0 + plane, *v2 = v1 + plane, *v3 = v2 + plane;
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
inline __attribute__((always_inline)) void output_transform(ggml_tensor *dst, int64_t n, int64_t ty, int64_t tx0,
                                                            int64_t mb, int64_t ld, int64_t ocb, const float *m,
                                                            std::vector<float> &scratch) {
    const int64_t W = dst->ne[0], H = dst->ne[1], OC = dst->ne[2];
    scratch.resize((size_t)4 * ld);
    float *y00 = scratch.data(), *y01 = y00 + ld, *y10 = y01 + ld, *y11 = y10 + ld;
    const int64_t x0 = 2 * tx0, pairs = std::min<int64_t>(mb, (W - x0) / 2), odd_end = 2 * pairs < W - x0 && pairs < mb;
    const int64_t plane = L * ld;
    for (int64_t l = 0; l < L && ocb * L + l < OC; ++l) {
        const float *a = m + l * ld;
        for (int64_t j = 0; j < mb; ++j) {
            const float b00 = a[j] + a[4 * plane + j] + a[8 * plane + j];
            const float b01 = a[plane + j] + a[5 * plane + j] + a[9 * plane + j];
            const float b02 = a[2 * plane + j] + a[6 * plane + j] + a[10 * plane + j];
            const float b03 = a[3 * plane + j] + a[7 * plane + j] + a[11 * plane + j];
            const float b10 = a[4 * plane + j] - a[8 * plane + j] - a[12 * plane + j];
            const float b11 = a[5 * plane + j] - a[9 * plane + j] - a[13 * plane + j];
            const float b12 = a[6 * plane + j] - a[10 * plane + j] - a[14 * plane + j];
            const float b13 = a[7 * plane + j] - a[11 * plane + j] - a[15 * plane + j];
            y00[j] = b00 + b01 + b02;
            y01[j] = b01 - b02 - b03;
            y10[j] = b10 + b11 + b12;
            y11[j] = b11 - b12 - b13;
        }
        char *chan = (char *)dst->data + n * dst->nb[3] + (ocb * L + l) * dst->nb[2];
        for (int i = 0; i < 2 && 2 * ty + i < H; ++i) {
            float *out = (float *)(chan + (2 * ty + i) * dst->nb[1]) + x0;
            const float *ev = i ? y10 : y00, *od = i ? y11 : y01;
            for (int64_t j = 0; j < pairs; ++j) {
                out[2 * j] = ev[j];
                out[2 * j + 1] = od[j];
            }
            if (odd_end) out[2 * pairs] = ev[pairs];  // odd width: the last tile's left column
        }
    }
}

template <bool AVX>
inline __attribute__((always_inline)) void conv_body(ggml_tensor *dst, int ith, int nth) {
    const ggml_tensor *x = dst->src[0], *u = dst->src[1];
    const int64_t W = x->ne[0], H = x->ne[1], IC = x->ne[2], N = x->ne[3];
    const int64_t TX = (W + 1) / 2, TY = (H + 1) / 2, OCB = u->ne[3];
    const int64_t ld = block_tiles(IC, TX), segs = (TX + ld - 1) / ld;
    const int64_t blocks = N * TY * segs;
    const int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    thread_local std::vector<float> v_buf, m_buf, scratch;
    float *v = aligned(v_buf, 16 * IC * ld), *m = aligned(m_buf, 16 * L * ld);
    const float *U = (const float *)u->data;
    for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = b / (TY * segs), ty = (b / segs) % TY, tx0 = (b % segs) * ld;
        const int64_t mb = std::min(ld, TX - tx0), tiles = round_up(mb, NT);
        input_transform(x, n, ty, tx0, mb, ld, v, scratch);
        for (int64_t ocb = 0; ocb < OCB; ++ocb) {
            for (int e = 0; e < 16; ++e)
                panel_product<AVX>(U + (ocb * 16 + e) * IC * L, v + e * IC * ld, ld, IC, m + e * L * ld, tiles);
            output_transform(dst, n, ty, tx0, mb, ld, ocb, m, scratch);
        }
    }
}

#ifdef SDPLAN_WINO_X86
__attribute__((target("avx2,fma"))) void conv_avx2(ggml_tensor *dst, int ith, int nth) {
    conv_body<true>(dst, ith, nth);
}
#endif

void conv_generic(ggml_tensor *dst, int ith, int nth) { conv_body<false>(dst, ith, nth); }

}  // namespace

bool wino_fast_cpu() {
#ifdef SDPLAN_WINO_X86
    static const bool fast = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return fast;
#else
    return false;
#endif
}

void wino_pack_kernel(ggml_tensor *dst, int ith, int nth, void *) {
    // threads split the panels of 16 output channels; per panel the 16 kernels are read once
    // into f32 (g[lane][ic][9]) and transformed per input channel across the lanes
    const ggml_tensor *w = dst->src[0];
    const int64_t IC = w->ne[2], OC = w->ne[3], OCB = dst->ne[3];
    const int64_t per = (OCB + nth - 1) / nth;
    const int64_t p0 = per * ith, p1 = std::min(OCB, p0 + per);
    float *U = (float *)dst->data;
    thread_local std::vector<float> g;
    g.resize((size_t)L * 9 * IC);
    for (int64_t ocb = p0; ocb < p1; ++ocb) {
        for (int64_t lane = 0; lane < L; ++lane) {
            float *gl = g.data() + lane * 9 * IC;
            const int64_t oc = ocb * L + lane;
            if (oc >= OC) {
                std::fill(gl, gl + 9 * IC, 0.0f);
                continue;
            }
            const char *src = (const char *)w->data + oc * w->nb[3];
            if (w->type == GGML_TYPE_F16) ggml_cpu_fp16_to_fp32((const ggml_fp16_t *)src, gl, 9 * IC);
            else std::memcpy(gl, src, (size_t)9 * IC * sizeof(float));
        }
        float *panel = U + ocb * 16 * IC * L;
        for (int64_t ic = 0; ic < IC; ++ic) {
            float u[16][L];
            for (int64_t lane = 0; lane < L; ++lane) {
                const float *k = g.data() + (lane * IC + ic) * 9;  // k[row * 3 + col]
                float q[4][3];                                     // G g
                for (int c = 0; c < 3; ++c) {
                    q[0][c] = k[c];
                    q[1][c] = 0.5f * (k[c] + k[3 + c] + k[6 + c]);
                    q[2][c] = 0.5f * (k[c] - k[3 + c] + k[6 + c]);
                    q[3][c] = k[6 + c];
                }
                for (int r = 0; r < 4; ++r) {  // (G g) G^T
                    u[r * 4][lane] = q[r][0];
                    u[r * 4 + 1][lane] = 0.5f * (q[r][0] + q[r][1] + q[r][2]);
                    u[r * 4 + 2][lane] = 0.5f * (q[r][0] - q[r][1] + q[r][2]);
                    u[r * 4 + 3][lane] = q[r][2];
                }
            }
            for (int e = 0; e < 16; ++e) std::memcpy(panel + (e * IC + ic) * L, u[e], sizeof u[e]);
        }
    }
}

void wino_conv(ggml_tensor *dst, int ith, int nth, void *) {
#ifdef SDPLAN_WINO_X86
    if (wino_fast_cpu()) {
        conv_avx2(dst, ith, nth);
        return;
    }
#endif
    conv_generic(dst, ith, nth);
}

}  // namespace sdplan
