// Channels-last im2col (im2col.cpp): custom ggml CPU ops for conv_2d's cpu_im2col method, the
// column builder and the matching kernel reorder (ggml_custom_4d callbacks).
#pragma once

#include <ggml.h>

#include <array>

namespace sdplan {

// Parameters of a channels-last im2col (cpu_im2col's userdata, ggml ne order: width first),
// kept by the graph as a std::array<int, 8> (Graph::custom_params).
struct Im2colParams {
    int kw, kh, s0, s1, p0, p1, d0, d1;
};
static_assert(sizeof(Im2colParams) == sizeof(std::array<int, 8>), "Im2colParams is 8 ints");

// Custom op: x f32 [IW, IH, IC, N] (src 0, contiguous) -> columns [KH*KW*IC, OW*OH*N] in
// (kh, kw, ic) order, dst f32 or f16; userdata: an Im2colParams.
void cpu_im2col(ggml_tensor *dst, int ith, int nth, void *userdata);

// Custom op: a conv kernel [KW, KH, IC, OC] (src 0, f32 or f16, contiguous) -> dst
// [IC, KW, KH, OC] of the same type: the column order of cpu_im2col.
void cpu_kernel_order(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
