// GELU (erf and tanh forms), quick GELU and GEGLU for the CPU backend (glu.cpp): custom ggml
// CPU ops with a vectorized erfc or exp, behind Graph::unary("gelu_erf"), unary("gelu"),
// unary("gelu_quick") and Graph::geglu on CPU-only graphs.
#pragma once

#include <ggml.h>

namespace sdplan {

// True when the ops run their AVX-512 versions: the CPU has them (glu_cpu_avx512()) and
// set_glu_simd did not forbid them.
bool glu_avx512();
bool glu_cpu_avx512();
// True when the ops run vectorized: AVX-512 (glu_avx512()), else AVX2 with FMA where the CPU has
// them (fma_gemm_cpu()); false after set_glu_simd(false) (the C library's erff and expf).
// unary("gelu") takes the tanh op only while the FMA products are on as well (fma_gemm_on()):
// with them off it is ggml's GELU, as on the devices an RPC comparison runs.
bool glu_simd();
// "avx512", "avx2" or "off": the version the ops run now.
const char *glu_simd_name();
// Allow (on, the default) or forbid the vectorized versions for computes from now on;
// allow_avx512 false keeps to the AVX2 one on an AVX-512 CPU (tests cover both there).
void set_glu_simd(bool on, bool allow_avx512 = true);

// Custom op: dst = x * Phi(x) (GELU, erf form) elementwise; src 0: x f32 contiguous, dst f32
// of its shape.
void cpu_gelu_erf(ggml_tensor *dst, int ith, int nth, void *userdata);

// Custom op: GELU's tanh approximation (the DiTs' and T5's activation) elementwise in f32, as
// cpu_gelu_erf (ggml's gelu rounds x to f16 for a table on the CPU: errors up to about 1e-3).
void cpu_gelu_tanh(ggml_tensor *dst, int ith, int nth, void *userdata);

// Custom op: quick GELU, dst = x * sigmoid(1.702 x) (OpenAI CLIP's activation) elementwise in
// f32 (relative error about 3e-7; ggml's gelu_quick rounds x to f16 for a table); src 0: x
// f32 contiguous. AVX2 with FMA where the CPU has them (fma_gemm_cpu()), a scalar loop
// otherwise; Graph::unary takes it with sdplan's FMA kernels (fma_gemm_on()).
void cpu_gelu_quick(ggml_tensor *dst, int ith, int nth, void *userdata);

// out[i] = silu(x[i] * scale + shift) = v / (1 + exp(-v)) for i < n (out may be x): the
// affine and SiLU of GroupNorm's fused write (group_norm.cpp); vectorized as the GELUs are
// (glu_simd(), glu_avx512(); exp's relative error below 2e-7), else the C library's expf.
void silu_affine_row(const float *x, float *out, int64_t n, float scale, float shift);

// Custom op: GEGLU in diffusers' order: src 0 x f32 contiguous [2D, rows...]; dst f32
// [D, rows...]: dst[r][i] = x[r][i] * gelu(x[r][D + i]), gelu the erf form, or with userdata
// pointing at a nonzero int the tanh approximation.
void cpu_geglu(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
