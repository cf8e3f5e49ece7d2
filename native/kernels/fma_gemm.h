// f32 matrix products for f16 or f32 weights on CPUs with AVX2, FMA and F16C (fma_gemm.cpp):
// one custom ggml CPU op behind Graph::mul_mat (linear layers with f16 weights) and conv_2d's
// fma method, where no bf16 kernel runs (an AVX2-only CPU, or SDPLAN_BF16_KERNEL=off).
#pragma once

#include <ggml.h>

#include <array>

namespace sdplan {

// The op widens and packs the whole weight per call, which pays from this many rows of x
// (linear) or output pixels, batch included (convolution): below, ggml's products are as
// fast or faster (1280 x 1280 f16, 2 threads: 2.7x ggml's time at 2 rows, 1.5x at 8, 1.1x at
// 16, 1.0x at 32, 0.8x at 64 and 77; a 3x3 1280 -> 1280 convolution about 1.0x from 32 to 72
// pixels, 5-6x at 2 to 8).
constexpr long kFmaMinRows = 32, kFmaMinColumns = 64;

// True when this CPU has AVX2, FMA and F16C (every x86 CPU since Haswell and Zen 1).
bool fma_gemm_cpu();
// True when graphs built now use the op: fma_gemm_cpu() and set_fma_gemm(false) was not called.
bool fma_gemm_on();
// Allow (true, the default) or forbid the op for graphs built from now on (forbidden: ggml's
// mul_mat and conv_2d's other methods; tests and benchmarks compare them).
void set_fma_gemm(bool on);

// The op's userdata (a Graph::custom_params entry): conv (0: linear, 1: convolution) and the
// convolution's stride, padding and dilation in ggml ne order (width first); the last int is
// unused.
struct FmaGemmParams {
    int conv, s0, s1, p0, p1, d0, d1, unused;
};
static_assert(sizeof(FmaGemmParams) == sizeof(std::array<int, 8>), "FmaGemmParams is 8 ints");

// Custom op. src 0: x f32, contiguous; src 1: w f16 or f32, contiguous; src 2 (optional): bias
// f32. Shapes as bf16_gemm's: linear (conv 0) x [K, M...], w [K, N], bias [N], dst f32
// [N, M...] with dst[m][n] = sum_k w[n][k] x[m][k] + bias[n]; convolution (conv 1)
// x [IW, IH, IC, B], w [KW, KH, IC, OC], bias [OC], dst f32 [OW, OH, OC, B] (the
// cross-correlation with the params' stride, padding and dilation).
// Every value is widened to f32 (exactly) and the products are summed in f32 by FMA: the
// result is the f32 product of the f16 weights, in a summation order of blocks of 256 k.
void fma_gemm(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
