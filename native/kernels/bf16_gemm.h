// bf16 matrix products for the CPU backend (bf16_gemm.cpp): one custom ggml CPU op behind
// Graph::mul_mat (linear layers with bf16 weights) and conv_2d's bf16 method, run by AMX tiles
// or AVX512_BF16 dot products, whichever the CPU has (chosen at run time).
#pragma once

#include <ggml.h>

#include <array>
#include <string>

namespace sdplan {

// The bf16 kernels: none (this CPU has neither), avx512 (AVX512_BF16 dot products: AVX512F,
// AVX512BW, AVX512VL and AVX512_BF16), amx (AMX-BF16 tiles, which also needs the Linux
// permission for the tile data state; asked once per process).
enum class Bf16Kernel { none = 0, avx512 = 1, amx = 2 };

// The fastest kernel this CPU runs (detected once; AMX only when the kernel grants the tile
// data permission).
Bf16Kernel bf16_cpu_kernel();

// The kernel graphs built from now on use: the CPU's (auto) unless set_bf16_kernel chose
// another (off: f16 weights, multiplied by fma_gemm where the CPU runs it, else by ggml's
// mul_mat; bf16 weights change outputs by about 1%).
Bf16Kernel bf16_kernel();

// Use `name` (auto, amx, avx512, off) for the graphs built from now on. Returns an empty
// string, or why not (an unknown name, a kernel this CPU cannot run).
std::string set_bf16_kernel(const std::string &name);

const char *bf16_kernel_name(Bf16Kernel k);

// The op's userdata (a Graph::custom_params entry): kernel (a Bf16Kernel), conv (0: linear,
// 1: convolution) and the convolution's stride, padding and dilation in ggml ne order
// (width first).
struct Bf16GemmParams {
    int kernel, conv, s0, s1, p0, p1, d0, d1;
};
static_assert(sizeof(Bf16GemmParams) == sizeof(std::array<int, 8>), "Bf16GemmParams is 8 ints");

// Custom op. src 0: x f32, contiguous; src 1: w bf16 or f16 (rounded to bf16 as it is used,
// nearest even), or, for a linear layer, Q8_0 / Q4_K / Q5_K blocks (each block dequantised as
// ggml's dequantize_row_* does, then rounded to bf16 as it is used), contiguous; src 2
// (optional): bias f32.
// Linear (conv 0): x [K, M...] (M = the product of the outer dims), w [K, N], bias [N];
// dst f32 [N, M...]: dst[m][n] = sum_k w[n][k] x[m][k] + bias[n].
// Convolution (conv 1): x [IW, IH, IC, B], w [KW, KH, IC, OC], bias [OC]; dst f32
// [OW, OH, OC, B]: the cross-correlation with the params' stride, padding and dilation.
// x is rounded to bf16 (nearest even) as it is packed; products are accumulated in f32.
// K (IC*KH*KW for a convolution) must be even.
void bf16_gemm(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
