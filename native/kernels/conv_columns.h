// Where a convolution's im2col columns read the input (shared by the bf16 and FMA products,
// bf16_gemm.cpp and fma_gemm.cpp, which gather the columns straight into their packed panels).
#pragma once

#include <cstdint>

namespace sdplan {

// The geometry, in ggml's order (width first): input IW x IH, output OW wide with M pixels per
// image, `cols` columns in all (images x M), kernel KW x KH, stride, padding and dilation;
// x_img floats between input images.
struct ConvColumns {
    int64_t IW, IH, OW, M, cols, KW, KH, x_img;
    int s0, s1, p0, p1, d0, d1;
};

// A group of 16 columns for one kernel position: the valid ones' bits, and whether their
// values are consecutive in the input (then at start + lane).
struct ColumnGroup {
    int64_t start;
    uint32_t mask;
    bool contiguous;
};

// For columns j0 .. j0 + n (n a multiple of 16) and every kernel position r = kh * KW + kw:
// offs[r * n + c] = the offset (floats from the input channel's start) of column j0 + c's value
// (column: image col / M, output pixel col % M), -1 outside the input or past the last column;
// groups[r * n / 16 + g] describes columns 16 g .. 16 g + 16. Off is the offset type (int32_t
// where the input has fewer than 2^31 floats).
template <typename Off>
void column_tables(const ConvColumns &p, int64_t j0, int64_t n, Off *offs, ColumnGroup *groups) {
    const int64_t KK = p.KW * p.KH, G = n / 16;
    for (int64_t r = 0; r < KK; ++r) {
        const int64_t kh = r / p.KW, kw = r % p.KW;
        Off *o = offs + r * n;
        for (int64_t c = 0; c < n; ++c) {
            const int64_t col = j0 + c;
            o[c] = -1;
            if (col >= p.cols) continue;
            const int64_t img = col / p.M, m = col % p.M, oh = m / p.OW, ow = m % p.OW;
            const int64_t iy = oh * p.s1 - p.p1 + kh * p.d1, ix = ow * p.s0 - p.p0 + kw * p.d0;
            if (iy >= 0 && iy < p.IH && ix >= 0 && ix < p.IW) o[c] = (Off)(img * p.x_img + iy * p.IW + ix);
        }
        for (int64_t g = 0; g < G; ++g) {
            ColumnGroup q{0, 0, true};
            bool first = true;
            for (int i = 0; i < 16; ++i) {
                const int64_t v = o[g * 16 + i];
                if (v < 0) continue;
                q.mask |= 1u << i;
                if (first) q.start = v - i, first = false;
                else if (v - i != q.start) q.contiguous = false;
            }
            groups[r * G + g] = q;
        }
    }
}

}  // namespace sdplan
