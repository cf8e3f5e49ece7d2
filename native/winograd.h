// Winograd F(2x2, 3x3) convolution for the CPU backend (winograd.cpp): two custom ggml ops.
#pragma once

#include <ggml.h>

#include <cstdint>

namespace sdplan {

// Output channels per packed kernel panel (the micro-kernel's width).
constexpr int64_t kWinoLanes = 16;

// Custom op: a 3x3 kernel w [3, 3, IC, OC] (ggml ne, f32 or f16, src 0) transformed to
// U = G g G^T and packed f32 as [16 lanes, IC, 16 elements, ceil(OC/16)] (ne order; output
// channels past OC are zero). dst must have that shape.
void wino_pack_kernel(ggml_tensor *dst, int ith, int nth, void *userdata);

// Custom op: y = conv3x3(x, w) with stride 1, padding 1, dilation 1. src 0: x f32 [W, H, IC, N]
// (contiguous); src 1: the packed kernel of wino_pack_kernel; dst: y f32 [W, H, OC, N].
void wino_conv(ggml_tensor *dst, int ith, int nth, void *userdata);

// True when this CPU runs the AVX2/FMA micro-kernel (the generic one is slower than im2col).
bool wino_fast_cpu();

}  // namespace sdplan
