// Attention for the CPU backend with bf16 products (attention.cpp): one custom ggml CPU op
// behind Graph::flash_attn on CPU-only graphs when the CPU runs a bf16 kernel.
#pragma once

#include <ggml.h>

#include <array>

namespace sdplan {

// The op's userdata (a Graph::custom_params entry): kernel (a Bf16Kernel), the score scale as
// float bits.
struct Bf16AttentionParams {
    int kernel, scale_bits, unused[6];
};
static_assert(sizeof(Bf16AttentionParams) == sizeof(std::array<int, 8>), "Bf16AttentionParams is 8 ints");

// Custom op: softmax(scale * q k^T + mask) v per batch and head, the products in bf16 with f32
// sums, the softmax in f32. src 0: q f32 [D, Nq, Hq, B]; src 1: k f32 [D, Nk, Hk, B]; src 2:
// v f32 [Dv, Nk, Hk, B] (rows contiguous, any strides between them; Hq a multiple of Hk);
// src 3 (optional): mask f32 [Nk, Nq', Hm, Bm] contiguous, Nq' >= Nq, Hm dividing Hq and Bm
// dividing B (added to the scaled scores). dst f32 [Dv, Hq, Nq, B] (flash_attn_ext's layout).
// q (scaled) and k are rounded to bf16, the probabilities too (after the f32 softmax).
void bf16_attention(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
