// Attention with f32 FMA products on the CPU (fma_attention.cpp): one custom ggml CPU op behind
// Graph::flash_attn on CPU-only graphs where the bf16 attention does not run and the CPU runs
// the FMA product (fma_gemm_on()).
#pragma once

#include <ggml.h>

#include <array>

namespace sdplan {

// The op's userdata (a Graph::custom_params entry): the score scale as float bits.
struct FmaAttentionParams {
    int scale_bits, unused[7];
};
static_assert(sizeof(FmaAttentionParams) == sizeof(std::array<int, 8>), "FmaAttentionParams is 8 ints");

// Custom op: softmax(scale * q k^T + mask) v per batch and head, everything in f32. Operands as
// bf16_attention's: src 0 q f32 [D, Nq, Hq, B]; src 1 k f32 [D, Nk, Hk, B]; src 2 v f32
// [Dv, Nk, Hk, B] (rows contiguous, any strides between them; Hq a multiple of Hk); src 3
// (optional) mask f32 [Nk, Nq', Hm, Bm] contiguous, Nq' >= Nq, Hm dividing Hq, Bm dividing B;
// dst f32 [Dv, Hq, Nq, B] (flash_attn_ext's layout). exp is a degree-5 polynomial of relative
// error 2.4e-7 (f32 rounding level); a row whose keys are all masked gives zeros.
void fma_attention(ggml_tensor *dst, int ith, int nth, void *userdata);

}  // namespace sdplan
