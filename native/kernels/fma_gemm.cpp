// f32 matrix products with FMA for f16 or f32 weights (the fma_gemm custom op): the linear
// layers and convolutions of an AVX2-only CPU (or one whose bf16 kernel is turned off).
//
// C [rows][cols] = A [rows][K] B [K][cols] in the loop order of BLIS (Van Zee & van de Geijn,
// "BLIS: A Framework for Rapidly Instantiating BLAS Functionality", ACM TOMS 2015): per block
// of up to NC columns and KC of depth, B is packed into micro-panels of 16 columns ([k][16]
// f32; one is 16 KB, read from L1), and per block of MC rows A into micro-panels of 6 rows
// ([k][6] f32; the block stays in L2); a 6 x 16 micro-kernel holds C's block in 12 ymm
// accumulators and per k reads two vectors of B and broadcasts six values of A (12 FMAs).
// - convolution: rows = output channels (A = the kernel's rows, f16 widened as they are
//   packed), cols = output pixels of all images (B = the im2col columns, gathered from x as
//   they are packed; no im2col buffer), C = the output planes, the bias added per row;
// - linear: rows = x's rows (A = x), cols = W's rows (B = W transposed and widened as it is
//   packed), C = dst's rows, the bias added per column.
// Packing per call is what lets the weights stay f16 in memory (as in the file): each f16 value
// is widened once per block of up to NC columns, against 2 NC flops of work.
// Threads split the column blocks, and the rows too when there are fewer than two blocks per
// thread. The functions carry a target attribute and run only where fma_gemm_cpu() is true.
#include "kernels/fma_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/conv_columns.h"
#include "kernels/fma_tiles.h"

namespace sdplan {

bool fma_gemm_cpu() {
#ifdef SDPLAN_FMA_X86
    static const bool ok =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    return ok;
#else
    return false;
#endif
}

namespace {
std::atomic<bool> forbidden{false};  // set_fma_gemm(false)
}  // namespace

bool fma_gemm_on() { return fma_gemm_cpu() && !forbidden.load(); }

void set_fma_gemm(bool on) { forbidden.store(!on); }

#ifdef SDPLAN_FMA_X86

namespace {

using namespace fma;

#ifndef KB_FMA_KC
#define KB_FMA_KC 256
#endif
#ifndef KB_FMA_MC
#define KB_FMA_MC 96
#endif
#ifndef KB_FMA_NC
#define KB_FMA_NC 512
#endif
constexpr int64_t KC = KB_FMA_KC;  // depth per packed block
constexpr int64_t MC = KB_FMA_MC;  // rows per packed block of A (MC x KC f32: 96 KB)
constexpr int64_t NC = KB_FMA_NC;  // at most this many columns per packed block of B (512 KB)
static_assert(MC % MR == 0 && NC % NR == 0, "blocks hold whole micro-panels");

struct Problem {
    bool conv, w16;            // a convolution; W is f16 (else f32)
    int64_t rows, cols, K;     // C [rows][cols]
    int64_t N, M, images;      // W's rows; x's rows (linear) or output pixels per image (conv)
    int64_t IW, IH, OW, KW, KH;  // convolution geometry
    int s0, s1, p0, p1, d0, d1;
    const float *x;
    int64_t x_img;  // floats between input images
    const void *w;
    const float *bias;
    float *dst;
    int64_t dst_img;  // floats between output images
};

// ---- packing

// A: rows i0 .. i0 + mc of a row-major [rows][K] matrix (f16 or f32), depth pc .. pc + kc, as
// micro-panels ap[p][k][6] (rows past `rows` zero). Writes up to 8 floats past the last panel.
template <bool F16>
SDPLAN_FMA void pack_a(const void *src, int64_t K, int64_t rows, int64_t i0, int64_t mc, int64_t pc, int64_t kc,
                       float *ap) {
    const int64_t k8 = kc / 8 * 8;
    for (int64_t ir = 0; ir < mc; ir += MR) {
        float *o = ap + ir * kc;
        const int64_t valid = std::clamp<int64_t>(rows - (i0 + ir), 0, MR);
        const int64_t row0 = (i0 + ir) * K + pc;
        for (int64_t k = 0; k < k8; k += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i) r[i] = i < valid ? load8<F16>(src, row0 + i * K + k) : _mm256_setzero_ps();
            transpose8(r);
            // each store writes 8 floats at a 6-float step: the next k (or panel) overwrites the last 2
            for (int kk = 0; kk < 8; ++kk) _mm256_storeu_ps(o + (k + kk) * MR, r[kk]);
        }
        for (int64_t k = k8; k < kc; ++k)
            for (int i = 0; i < MR; ++i) o[k * MR + i] = i < valid ? load1<F16>(src, row0 + i * K + k) : 0.0f;
    }
}

// B for a linear layer: W^T, i.e. columns j0 .. j0 + ncp are W's rows (f16 or f32, zero past N),
// depth pc .. pc + kc, as micro-panels bp[g][k][16].
template <bool F16>
SDPLAN_FMA void pack_b_linear(const Problem &p, int64_t j0, int64_t ncp, int64_t pc, int64_t kc, float *bp) {
    const int64_t k8 = kc / 8 * 8;
    for (int64_t g = 0; g < ncp / NR; ++g)
        for (int64_t h = 0; h < NR; h += 8) {
            const int64_t n0 = j0 + g * NR + h, row0 = n0 * p.K + pc;
            const int64_t valid = std::clamp<int64_t>(p.N - n0, 0, 8);
            float *o = bp + g * kc * NR + h;
            for (int64_t k = 0; k < k8; k += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; ++i) r[i] = i < valid ? load8<F16>(p.w, row0 + i * p.K + k) : _mm256_setzero_ps();
                transpose8(r);
                for (int kk = 0; kk < 8; ++kk) _mm256_store_ps(o + (k + kk) * NR, r[kk]);
            }
            for (int64_t k = k8; k < kc; ++k)
                for (int i = 0; i < 8; ++i) o[k * NR + i] = i < valid ? load1<F16>(p.w, row0 + i * p.K + k) : 0.0f;
        }
}

// Convolution: where each column's input value lies (conv_columns.h).
void conv_tables(const Problem &p, int64_t j0, int64_t ncp, int64_t *offs, ColumnGroup *pg) {
    const ConvColumns g{p.IW, p.IH, p.OW, p.M, p.cols, p.KW, p.KH, p.x_img, p.s0, p.s1, p.p0, p.p1, p.d0, p.d1};
    column_tables(g, j0, ncp, offs, pg);
}

// 8 lanes' masks (all ones where bit i of `bits` is set).
SDPLAN_FMA inline __m256i lane_mask(uint32_t bits) {
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), sel), sel);
}

// B for a convolution: the im2col rows pc .. pc + kc (k = ic * KH * KW + kh * KW + kw) of the
// columns in the tables, as micro-panels bp[g][k][16].
SDPLAN_FMA void pack_b_conv(const Problem &p, int64_t ncp, int64_t pc, int64_t kc, const int64_t *offs,
                            const ColumnGroup *pg, float *bp) {
    const int64_t KK = p.KW * p.KH, G = ncp / NR, plane = p.IW * p.IH;
    int64_t ic = pc / KK, r = pc % KK;
    for (int64_t k = 0; k < kc; ++k) {
        const float *base = p.x + ic * plane;
        for (int64_t g = 0; g < G; ++g) {
            float *o = bp + g * kc * NR + k * NR;
            const ColumnGroup &q = pg[r * G + g];
            if (q.mask == 0xffff && q.contiguous) {
                _mm256_store_ps(o, _mm256_loadu_ps(base + q.start));
                _mm256_store_ps(o + 8, _mm256_loadu_ps(base + q.start + 8));
            } else if (q.contiguous) {  // the first or last group of an output row (the padding)
                _mm256_store_ps(o, _mm256_maskload_ps(base + q.start, lane_mask(q.mask)));
                _mm256_store_ps(o + 8, _mm256_maskload_ps(base + q.start + 8, lane_mask(q.mask >> 8)));
            } else {
                const int64_t *off = offs + r * ncp + g * NR;
                for (int i = 0; i < NR; ++i) o[i] = off[i] < 0 ? 0.0f : base[off[i]];
            }
        }
        if (++r == KK) r = 0, ++ic;
    }
}

// ---- the micro-kernel and C

// C's element (i, j): a convolution's column j is pixel j % M of image j / M.
inline float *c_at(const Problem &p, int64_t i, int64_t j) {
    if (!p.conv) return p.dst + i * p.cols + j;
    return p.dst + (j / p.M) * p.dst_img + i * p.M + j % p.M;
}

// The 6 x 16 block of C at (i, j): straight into dst when it lies whole in one image's rows,
// else through a local block (edges of C, columns that cross from one image into the next).
SDPLAN_FMA void block(const Problem &p, const float *a, const float *b, int64_t kc, int64_t i, int64_t j,
                      bool first) {
    const int64_t vr = std::min(MR, p.rows - i), vc = std::min(NR, p.cols - j);
    const bool whole = vr == MR && vc == NR && (!p.conv || j % p.M + NR <= p.M);
    if (whole) {
        const int64_t ldc = p.conv ? p.M : p.cols;
        const float *rb = p.conv && p.bias ? p.bias + i : nullptr, *cb = !p.conv && p.bias ? p.bias + j : nullptr;
        micro(a, b, kc, c_at(p, i, j), ldc, first ? 1 : 0, rb, cb);
        return;
    }
    alignas(32) float t[MR * NR];
    micro(a, b, kc, t, NR, 2, nullptr, nullptr);
    for (int64_t r = 0; r < vr; ++r)
        for (int64_t q = 0; q < vc; ++q) {
            float *d = c_at(p, i + r, j + q);
            const float base = !first ? *d : !p.bias ? 0.0f : p.conv ? p.bias[i + r] : p.bias[j + q];
            *d = base + t[r * NR + q];
        }
}

// ---- driver

// Work items: column blocks (of at most NC, as equal as multiples of 16 allow) times parts of
// the rows (split when there are fewer than two blocks per thread); each thread takes a run of
// items, and its consecutive parts of one column block are one range of rows.
SDPLAN_FMA void run(const Problem &p, int ith, int nth) {
    const int64_t cblocks = round_up((p.cols + NC - 1) / NC, nth);  // a multiple of the threads: balanced
    const int64_t ncb = round_up((p.cols + cblocks - 1) / cblocks, NR);  // columns per block
    const int64_t panels = (p.rows + MR - 1) / MR;
    const auto [nsplit, i0, i1] = split_work(cblocks, panels, ith, nth);
    if (i0 >= i1) return;
    // K in chunks of about KC (a depth up to 1.5 KC in one: C is read and written once per chunk)
    const int64_t chunks = std::max<int64_t>(1, (p.K + KC / 2) / KC);
    const int64_t kcmax = round_up((p.K + chunks - 1) / chunks, 8);
    thread_local std::vector<char> a_buf, b_buf, offs_buf, pg_buf;
    float *ap = aligned<float>(a_buf, (size_t)MC * kcmax + 8);
    float *bp = aligned<float>(b_buf, (size_t)ncb * kcmax);
    const size_t kk = p.conv ? (size_t)(p.KW * p.KH) : 0;
    int64_t *offs = aligned<int64_t>(offs_buf, kk * ncb);
    ColumnGroup *pg = aligned<ColumnGroup>(pg_buf, kk * (ncb / NR));
    for (int64_t it = i0; it < i1;) {
        // this thread's consecutive parts of one column block form one run of rows (B packed once)
        const int64_t cb = it / nsplit, first_part = it % nsplit;
        const int64_t last = std::min(i1, (cb + 1) * nsplit);
        const int64_t parts_end = last - cb * nsplit;
        it = last;
        const int64_t j0 = cb * ncb;
        if (j0 >= p.cols) continue;
        const int64_t ncp = std::min(ncb, round_up(p.cols - j0, NR));
        const int64_t r0 = panels * first_part / nsplit * MR;
        const int64_t r1 = std::min(p.rows, panels * parts_end / nsplit * MR);
        if (r0 >= r1) continue;
        if (p.conv) conv_tables(p, j0, ncp, offs, pg);
        for (int64_t pc = 0; pc < p.K; pc += kcmax) {
            const int64_t kc = std::min(kcmax, p.K - pc);
            if (p.conv) pack_b_conv(p, ncp, pc, kc, offs, pg, bp);
            else if (p.w16) pack_b_linear<true>(p, j0, ncp, pc, kc, bp);
            else pack_b_linear<false>(p, j0, ncp, pc, kc, bp);
            for (int64_t ic = r0; ic < r1; ic += MC) {
                const int64_t mc = std::min(MC, r1 - ic);
                if (!p.conv) pack_a<false>(p.x, p.K, p.rows, ic, mc, pc, kc, ap);
                else if (p.w16) pack_a<true>(p.w, p.K, p.rows, ic, mc, pc, kc, ap);
                else pack_a<false>(p.w, p.K, p.rows, ic, mc, pc, kc, ap);
                for (int64_t jr = 0; jr < ncp; jr += NR)
                    for (int64_t ir = 0; ir < mc; ir += MR)
                        block(p, ap + ir * kc, bp + jr * kc, kc, ic + ir, j0 + jr, pc == 0);
            }
        }
    }
}

}  // namespace

#endif  // SDPLAN_FMA_X86

void fma_gemm(ggml_tensor *dst, int ith, int nth, void *userdata) {
#ifdef SDPLAN_FMA_X86
    FmaGemmParams prm;
    std::memcpy(&prm, userdata, sizeof prm);
    const ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    Problem p{};
    p.conv = prm.conv != 0;
    p.w16 = w->type == GGML_TYPE_F16;
    p.x = (const float *)x->data;
    p.w = w->data;
    p.bias = b ? (const float *)b->data : nullptr;
    p.dst = (float *)dst->data;
    if (p.conv) {
        p.IW = x->ne[0], p.IH = x->ne[1], p.images = x->ne[3];
        p.KW = w->ne[0], p.KH = w->ne[1], p.N = w->ne[3];
        p.OW = dst->ne[0];
        p.K = p.KW * p.KH * x->ne[2], p.M = p.OW * dst->ne[1];
        p.s0 = prm.s0, p.s1 = prm.s1, p.p0 = prm.p0, p.p1 = prm.p1, p.d0 = prm.d0, p.d1 = prm.d1;
        p.x_img = (int64_t)(x->nb[3] / sizeof(float));
        p.dst_img = (int64_t)(dst->nb[3] / sizeof(float));
        p.rows = p.N, p.cols = p.M * p.images;
    } else {
        p.K = x->ne[0], p.N = w->ne[1], p.M = ggml_nrows(x), p.images = 1;
        p.rows = p.M, p.cols = p.N;
    }
    run(p, ith, nth);
#else
    (void)dst, (void)ith, (void)nth, (void)userdata;
#endif
}

}  // namespace sdplan
