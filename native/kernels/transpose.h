// Copies of permuted f32 views as blocked transposes (transpose.cpp): Graph::cont on CPU-only
// graphs, for the layout changes around attention blocks (NCHW images to token rows and back).
// ggml's copy of a permuted tensor walks the destination element by element, reading the
// source one strided float at a time (about 1.2 GB/s on SD 1.5's 320 x 64 x 64 maps).
#pragma once

#include <ggml.h>

namespace sdplan {

// The dimension d (1..3) along which the f32 view `t` is contiguous (4-byte step) while its
// dimension 0 is not, with at least 8 elements along both: a stack of 2D transposes
// (ne[0] x ne[d]) that cpu_transpose_copy copies. -1 for any other tensor.
int transpose_copy_dim(const ggml_tensor *t);

// Custom op: dst (f32, contiguous, src 0's shape) = src 0, the view transpose_copy_dim()
// accepted; userdata points at that dimension (int). Bitwise a copy; 8 x 8 blocks through
// AVX2 registers where the CPU has AVX2, a scalar loop otherwise.
void cpu_transpose_copy(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
