// RoPE of the Flux-style DiTs (rope.cpp): a custom ggml CPU op for Graph::rope_pairs on CPU-only
// graphs, one pass instead of the planes, products and copies the generic form takes.
#pragma once

#include <ggml.h>

namespace sdplan {

// Custom op: x f32 [hd, H, N, B] (src 0, rows contiguous, any other strides), tables cos and sin
// f32 contiguous with N x hd/2 values (src 1 and 2, row n for token n) -> dst f32 [hd, H, N, B]
// contiguous: each channel pair (2i, 2i+1) of a row turned by its token's angle i,
//   dst[2i] = x[2i] cos - x[2i+1] sin,  dst[2i+1] = x[2i] sin + x[2i+1] cos
// (the products and sums of the generic form, the same f32 values). Threads split the rows.
void cpu_rope_pairs(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
