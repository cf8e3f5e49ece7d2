// Fused LayerNorm (layer_norm.cpp): a custom ggml CPU op for Graph::layer_norm on CPU-only
// graphs, one pass over the output instead of ggml's norm, mul and add (three).
#pragma once

#include <ggml.h>

namespace sdplan {

// Custom op: x f32 [D, rows...] (src 0, contiguous), optional weight and bias f32 [D] (src 1
// and 2, either may be null) -> dst f32 of x's shape = (x - mean) / sqrt(var + eps) * weight +
// bias per row of D (mean and biased variance over the row, as torch.nn.LayerNorm). userdata:
// float eps. Sums in f32 over 8 lanes (AVX2, where fma_gemm_cpu()) or in double (elsewhere).
void cpu_layer_norm(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
