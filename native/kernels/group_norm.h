// Fused GroupNorm (group_norm.cpp): a custom ggml CPU op for Graph::group_norm_affine on
// CPU-only graphs (a ggml_custom_4d callback).
#pragma once

#include <ggml.h>

namespace sdplan {

// Custom op: x f32 [W, H, C, N] (src 0, contiguous), optional gamma and beta f32 [C] (src 1
// and 2) -> dst f32 [W, H, C, N] = (x - mean) / sqrt(var + eps) * gamma + beta per group of
// C / n_groups channels, then SiLU (y / (1 + exp(-y)), silu_affine_row) with the flag.
// userdata: int n_groups, float eps, int silu flag (0 or 1).
void cpu_group_norm(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
