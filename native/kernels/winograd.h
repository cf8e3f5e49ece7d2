// Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution for the CPU backend (winograd.cpp): two
// custom ggml CPU ops (ggml_custom_4d callbacks) behind conv_2d's winograd method.
#pragma once

#include <ggml.h>

#include <cstdint>

namespace sdplan {

// Output channels per packed kernel panel (the micro-kernel's width).
constexpr int64_t kWinoLanes = 16;

// Transformed elements per tile for output rows ``width`` pixels wide: 36 (F(4x4, 3x3)) from
// 32 pixels, else 16 (F(2x2, 3x3)). Measured on a Zen 4 EPYC, 2 threads, batch 1-2, 64 to 1280
// channels at 32 to 48 pixels wide: F(4x4) 0.6-0.8x the time of F(2x2) with the AVX-512 build,
// 0.75-0.9x with the AVX2 one (F(4x4) had been slower at 32 pixels before the transforms were
// vectorized; it was taken from 64 then). At 8 and 16 pixels the transformed kernel (2.25x
// larger) costs more than F(4x4) saves.
int64_t wino_elements(int64_t width);

// Custom op: a 3x3 kernel w [3, 3, IC, OC] (ggml ne, f32 or f16, src 0) transformed to
// U = G g G^T and packed f32 as [16 lanes, IC, E elements, ceil(OC/16)] (ne order; output
// channels past OC are zero). dst must have that shape, E = 16 or 36 (the variant).
void wino_pack_kernel(ggml_tensor *dst, int ith, int nth, void *userdata);

// Custom op: y = conv3x3(x, w) with stride 1, padding 1, dilation 1. src 0: x f32 [W, H, IC, N]
// (contiguous); src 1: the packed kernel of wino_pack_kernel (its E picks the variant); src 2
// (optional): a bias f32 [OC] added per output channel; dst: y f32 [W, H, OC, N].
void wino_conv(ggml_tensor *dst, int ith, int nth, void *userdata);

// True when this CPU runs the AVX2/FMA micro-kernel (the generic one is slower than im2col).
bool wino_fast_cpu();

// True when convolutions run the AVX-512 micro-kernel and transforms (an AVX-512F CPU, unless
// set_wino_avx512(false)); else the AVX2/FMA ones where wino_fast_cpu(), else plain loops.
bool wino_avx512();

// Allow (the default) or forbid the AVX-512 path on an AVX-512 CPU (tests compare both paths;
// benchmarks time them). Takes effect at the next compute.
void set_wino_avx512(bool allow);

// The path convolutions run now: "avx512", "avx2" or "generic".
const char *wino_kernel_name();

}  // namespace sdplan
