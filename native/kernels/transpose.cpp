// Blocked transposes for copies of permuted f32 views (see transpose.h). The view is a stack of
// planes (the two dimensions other than 0 and d); each plane is a matrix whose rows run along
// dimension d in the source (contiguous) and along dimension 0 in the destination. Per block of
// 16 source columns and 8 source rows: two 8 x 8 transposes in registers, the source read in
// whole 64-byte lines and the destination written in 32-byte runs. Threads split the planes
// and, when there are few, bands of 64 along d.
#include "kernels/transpose.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/fma_gemm.h"
#include "kernels/fma_tiles.h"

namespace sdplan {

int transpose_copy_dim(const ggml_tensor *t) {
    if (t->type != GGML_TYPE_F32 || t->nb[0] == sizeof(float) || t->ne[0] < 8) return -1;
    for (int d = 1; d < 4; ++d)
        if (t->nb[d] == sizeof(float) && t->ne[d] >= 8) return d;
    return -1;
}

namespace {

struct Plane {
    const char *src;
    char *dst;
    int64_t n0, nd;          // rows (along dimension 0) and columns (along d) of the source
    size_t src_row, dst_row;  // bytes between source rows (nb[0]) and destination rows (along d)
};

// Columns c0 .. c1 of a plane, one element at a time.
void copy_scalar(const Plane &p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
        float *out = (float *)(p.dst + c * p.dst_row);
        for (int64_t r = r0; r < r1; ++r) out[r] = *(const float *)(p.src + r * p.src_row + c * sizeof(float));
    }
}

#ifdef SDPLAN_FMA_X86
using fma::transpose8;

// Columns c0 .. c1 (c1 - c0 a multiple of 8) of source rows r0 .. r0 + 8 (whole).
SDPLAN_FMA void block8(const Plane &p, int64_t r0, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; c += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps((const float *)(p.src + (r0 + i) * p.src_row) + c);
        transpose8(r);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps((float *)(p.dst + (c + i) * p.dst_row) + r0, r[i]);
    }
}

SDPLAN_FMA void copy_avx2(const Plane &p, int64_t c0, int64_t c1) {
    const int64_t c8 = c0 + (c1 - c0) / 8 * 8, r8 = p.n0 / 8 * 8;
    for (int64_t cb = c0; cb < c8; cb += 16) {  // 16 columns: one 64-byte line of each source row
        const int64_t ce = std::min(c8, cb + 16);
        for (int64_t r = 0; r < r8; r += 8) block8(p, r, cb, ce);
    }
    copy_scalar(p, r8, p.n0, c0, c8);  // rows past the last 8
    copy_scalar(p, 0, p.n0, c8, c1);   // columns past the last 8
}
#endif

}  // namespace

void cpu_transpose_copy(ggml_tensor *dst, int ith, int nth, void *userdata) {
    int d;
    std::memcpy(&d, userdata, sizeof d);
    const ggml_tensor *s = dst->src[0];
    int outer[2], k = 0;
    for (int i = 1; i < 4; ++i)
        if (i != d) outer[k++] = i;
    const int a = outer[0], b = outer[1];
    const int64_t planes = s->ne[a] * s->ne[b], nd = s->ne[d];
    // bands of 64 columns when the planes alone would leave threads idle
    const int64_t bands = planes >= 4 * nth ? 1 : std::max<int64_t>(1, (nd + 63) / 64);
    const int64_t units = planes * bands, u0 = units * ith / nth, u1 = units * (ith + 1) / nth;
    for (int64_t u = u0; u < u1; ++u) {
        const int64_t pl = u / bands, band = u % bands;
        const int64_t ia = pl % s->ne[a], ib = pl / s->ne[a];
        const Plane p{(const char *)s->data + ia * s->nb[a] + ib * s->nb[b],
                      (char *)dst->data + ia * dst->nb[a] + ib * dst->nb[b], s->ne[0], nd, s->nb[0], dst->nb[d]};
        const int64_t c0 = bands == 1 ? 0 : band * 64, c1 = bands == 1 ? nd : std::min(nd, c0 + 64);
#ifdef SDPLAN_FMA_X86
        if (fma_gemm_cpu()) {
            copy_avx2(p, c0, c1);
            continue;
        }
#endif
        copy_scalar(p, 0, p.n0, c0, c1);
    }
}

}  // namespace sdplan
