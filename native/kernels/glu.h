// GELU (erf form) and GEGLU for the CPU backend (glu.cpp): custom ggml CPU ops with a
// vectorized erf, behind Graph::unary("gelu_erf") and Graph::geglu on CPU-only graphs.
#pragma once

#include <ggml.h>

namespace sdplan {

// True when this CPU runs the AVX-512 versions (otherwise the ops use the C library's erff).
bool glu_avx512();

// Custom op: dst = x * Phi(x) (GELU, erf form) elementwise; src 0: x f32 contiguous, dst f32
// of its shape.
void cpu_gelu_erf(ggml_tensor *dst, int ith, int nth, void *userdata);

// Custom op: GEGLU in diffusers' order: src 0 x f32 contiguous [2D, rows...]; dst f32
// [D, rows...]: dst[r][i] = x[r][i] * gelu(x[r][D + i]), gelu the erf form, or with userdata
// pointing at a nonzero int the tanh approximation.
void cpu_geglu(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
