// The Graph type: ops (graph.cpp) and execution (graph_exec.cpp).
#pragma once

#include "tensor.h"

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace sdplan {

// Raised (as sdplan._ggml.ComputeCancelled) when cancel() stopped a compute.
struct ComputeCancelled : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ggml ops that only reinterpret their source (no computation).
bool is_view_op(ggml_op op);

// ---- conv_2d's methods (graph.cpp)

// The ways Graph::conv_2d lowers a convolution: im2col (ggml's im2col + mul_mat), cpu_im2col
// (channels-last columns by a CPU op, kernels/im2col.cpp), winograd (one fused CPU op,
// kernels/winograd.cpp), direct (ggml_conv_2d_direct), bf16 (im2col columns packed in bf16 and
// multiplied by the bf16 kernel in one CPU op, kernels/bf16_gemm.cpp), fma (im2col columns
// gathered in f32 and multiplied by FMA in one CPU op, kernels/fma_gemm.cpp).
enum class ConvMethod { im2col, cpu_im2col, winograd, direct, bf16, fma };
const char *conv_method_name(ConvMethod method);

// Output size along one axis of a convolution (input in, kernel k, stride s, padding p, dilation d).
int64_t conv_out_size(int64_t in, int64_t k, int s, int p, int d);

// choose_conv_method's answer: the method, or (error non-empty) why the request is invalid;
// conv_2d raises ValueError("conv_2d: " + error).
struct ConvChoice {
    ConvMethod method = ConvMethod::im2col;
    std::string error;
};

// The method conv_2d uses, from plain values only (no graph): requested is auto, im2col,
// cpu_im2col, winograd, direct or bf16; pairs are (H, W) like conv_2d's arguments (kernel (KH, KW),
// image: the input's (H, W)); all_cpu: every backend of the graph is a CPU; avx2_fma: the CPU
// runs the Winograd AVX2/FMA micro-kernel (wino_fast_cpu()); bf16: the kernel is held in bf16
// (or in f16 on a graph with f16_as_bf16) and the CPU runs a bf16 kernel (bf16_kernel() != none);
// wino_f4_first: the F(4x4, 3x3) Winograd path outruns that bf16 kernel (the kernel is
// AVX512_BF16, not AMX, and the Winograd convolution runs its AVX-512 build). auto takes
// winograd when wino_f4_first, avx2_fma, all_cpu, the Winograd shape, >= 16 output channels and outputs
// >= 32 pixels wide (F(4x4)); else bf16 when bf16 and all_cpu and the depth (IC*KH*KW) is even;
// else winograd for 3x3,
// stride 1, padding 1, dilation 1 kernels with >= 16 output channels (one kernel panel) on
// outputs >= 32 pixels wide (16 tiles of 2) when all_cpu and avx2_fma; else cpu_im2col when
// all_cpu and the output has at least half as many pixels (OW * OH * batch) as the kernel has
// output channels; else im2col. Explicit winograd needs the Winograd shape and all_cpu (not
// avx2_fma: without it a slower generic micro-kernel runs); cpu_im2col needs all_cpu; bf16
// needs bf16, all_cpu and an even depth (in_channels * KH * KW). fma: the kernel is f16 or f32
// and the CPU runs the FMA product (fma_gemm_on()); auto takes fma where it would take
// cpu_im2col or im2col when all_cpu and fma and the output has at least kFmaMinColumns (64)
// pixels, batch included; explicit fma needs all_cpu and fma. Other methods take a
// bf16 kernel converted to f32.
ConvChoice choose_conv_method(const std::string &requested, std::pair<int64_t, int64_t> kernel,
                              std::pair<int, int> stride, std::pair<int, int> pad, std::pair<int, int> dil,
                              std::pair<int64_t, int64_t> image, int64_t batch, int64_t out_channels, bool all_cpu,
                              bool avx2_fma, bool bf16 = false, int64_t in_channels = 0, bool fma = false,
                              bool wino_f4_first = false);

// The operands of one conv_2d, validated, as its lowerings take them (ggml ne order inside
// the tensors; pairs (H, W)).
struct ConvOperands {
    ggml_tensor *w, *x, *b;  // kernel [KW, KH, IC, OC], input [W, H, IC, N], bias [OC] or null
    const Tensor *bias;      // the bias as given (null without one)
    std::pair<int, int> stride, pad, dil;
    int64_t OW, OH;
};

struct Graph {
    std::shared_ptr<Context> ctx;                   // op tensors (no_alloc)
    std::vector<std::shared_ptr<Backend>> backends; // scheduler order; last is a CPU
    int max_nodes;
    int n_threads;
    std::map<std::string, Tensor> inputs, outputs;
    std::vector<std::pair<ggml_tensor *, int>> assign;  // node -> backend index
    int scope = -1;
    std::unordered_set<ggml_tensor *> checkpoints;
    std::set<std::shared_ptr<void>> keep;  // owners of weight tensors used here
    std::unordered_map<ggml_tensor *, ggml_backend_buffer_type_t> ext;  // weight leafs
    std::unique_ptr<Context> gctx;
    ggml_cgraph *gf = nullptr;
    int capacity = 0;
    ggml_backend_sched_t sched = nullptr;
    bool allocated = false;
    bool computed = false;
    std::atomic<bool> cancel_flag{false};
    bool profiling = false;  // compute node by node, timing each (Graph.profile)
    std::vector<std::pair<ggml_tensor *, double>> profile_rows;
    std::chrono::steady_clock::time_point profile_last;

    Graph(std::vector<std::shared_ptr<Backend>> backends, int max_nodes, int n_threads);
    ~Graph();
    Graph(const Graph &) = delete;
    Graph &operator=(const Graph &) = delete;

    // building blocks
    void room(const char *op, int n);
    ggml_tensor *use(const char *op, const Tensor &x);
    Tensor own(ggml_tensor *r, int ndim);
    ggml_tensor *contig(ggml_tensor *t);
    // A contiguous copy of t: sdplan's blocked transposes for a permuted f32 view on CPU-only
    // graphs (kernels/transpose.h), ggml_cont otherwise.
    ggml_tensor *copy_contiguous(ggml_tensor *t);
    ggml_tensor *to_f32(ggml_tensor *t);
    void set_scope(int index);
    // A CPU custom op (ggml_custom_4d): f32 output of sizes ne over the sources args (null
    // entries allowed), userdata a copy of params kept for the graph's life (none: null).
    ggml_tensor *cpu_op(ggml_custom_op_t fn, const std::array<int64_t, 4> &ne, std::initializer_list<ggml_tensor *> args,
                        const std::array<int, 8> *params = nullptr);
    // A norm's optional weight or bias: a float vector of n values, as f32 (null when absent);
    // `axis` names the values in the error ("C=", "the last axis' ").
    ggml_tensor *norm_vector(const char *op, const std::optional<Tensor> &v, int64_t n, const char *axis);
    // One of sdplan's CPU product ops (bf16_gemm, fma_gemm): x as f32 and w contiguous, the bias
    // (if any) as f32, params kept as the op's userdata, an f32 result of ne0..ne3.
    ggml_tensor *product_op(ggml_custom_op_t fn, const std::array<int, 8> &params, ggml_tensor *x, ggml_tensor *w,
                            ggml_tensor *b, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);

    // ops (numpy-order shapes)
    Tensor input(const std::string &name, const std::vector<int64_t> &shape, const std::string &dtype);
    Tensor output(const std::string &name, const Tensor &x);
    void checkpoint(const Tensor &x);
    // b @ a.T; a bf16 2-D weight times f32 b on a CPU-only graph runs the bf16 kernel
    // (kernels/bf16_gemm.cpp) when the CPU has one, with the optional bias fused.
    Tensor mul_mat(const Tensor &a, const Tensor &b, std::optional<Tensor> bias = std::nullopt);
    Tensor binary(const char *op, const Tensor &a, const Tensor &b);
    Tensor scale(const Tensor &a, float s, float bias);
    Tensor unary(const std::string &name, const Tensor &a);
    // GEGLU in diffusers' order: x (..., 2D) -> (..., D) = x[..., :D] * gelu(x[..., D:]) (erf
    // form, or the tanh approximation); one CPU op on CPU-only graphs (kernels/glu.cpp).
    Tensor geglu(const Tensor &x, bool approximate);
    Tensor leaky_relu(const Tensor &a, float slope);
    Tensor clamp(const Tensor &a, float lo, float hi);
    Tensor norm(const std::string &kind, const Tensor &a, float eps, int n_groups);
    // GroupNorm with an optional per-channel affine (fused into one op on CPU-only graphs)
    Tensor group_norm_affine(const Tensor &a, int n_groups, float eps, std::optional<Tensor> weight,
                             std::optional<Tensor> bias, bool silu = false);
    // LayerNorm over the last axis with an optional affine (one op on CPU-only graphs)
    Tensor layer_norm(const Tensor &a, float eps, std::optional<Tensor> weight, std::optional<Tensor> bias);
    Tensor rope_pairs(const Tensor &x, const Tensor &cos, const Tensor &sin);
    Tensor soft_max(const Tensor &a, std::optional<Tensor> mask, float scale, float max_bias);
    Tensor flash_attn(const Tensor &q, const Tensor &k, const Tensor &v, std::optional<Tensor> mask, float scale,
                      float max_bias, float softcap);
    bool supports(const Tensor &x, int index);
    // method: auto (choose_conv_method's rule: CPU-only graphs: winograd for wide 3x3
    // convolutions on AVX2/FMA CPUs, else cpu_im2col; im2col otherwise), im2col (ggml's),
    // cpu_im2col (channels-last columns, CPU only), winograd (F(2x2,3x3) or F(4x4,3x3) in one
    // fused CPU op, kernels/winograd.cpp), direct (ggml_conv_2d_direct). bias (OC,): added per
    // output channel (fused into winograd). Validates, chooses, then calls one lowering below.
    Tensor conv_2d(const Tensor &w, const Tensor &x, std::pair<int, int> stride, std::pair<int, int> pad,
                   std::pair<int, int> dil, bool direct, const std::string &method, std::optional<Tensor> bias);
    Tensor lower_conv_im2col(const ConvOperands &a);
    Tensor lower_conv_cpu_im2col(const ConvOperands &a);
    Tensor lower_conv_winograd(const ConvOperands &a);
    Tensor lower_conv_direct(const ConvOperands &a);
    Tensor lower_conv_bf16(const ConvOperands &a);
    Tensor lower_conv_fma(const ConvOperands &a);
    Tensor conv_add_bias(const ConvOperands &a, const Tensor &y);       // the column and direct paths' bias
    Tensor conv_columns_result(const ConvOperands &a, ggml_tensor *mm);  // [OW*OH*N, OC] -> (N, OC, OH, OW)
    bool all_cpu() const;
    // w runs the bf16 kernel where the CPU has one: bf16, or f16 on a graph with f16_as_bf16
    bool bf16_weight(const ggml_tensor *w) const {
        return w->type == GGML_TYPE_BF16 || (w->type == GGML_TYPE_F16 && f16_as_bf16);
    }
    std::deque<std::array<int, 8>> custom_params;  // userdata of custom CPU ops (stable addresses)
    // flash_attn runs sdplan's bf16 attention op (on CPU-only graphs, with a bf16 kernel) once
    // the graph has a bf16 product (its weights are bf16, or f16 with f16_as_bf16: the
    // attention's precision then follows), or always when attention_bf16 is set (tests, benchmarks).
    bool bf16_products = false;
    bool attention_bf16 = false;
    // f16 weights of mul_mat and conv_2d run the bf16 kernel too (rounded to bf16 as they are
    // used, the same bits as weights converted to bf16 at load): set per module by the runner
    // where the module runs faster in bf16 and its weights stay f16 (AVX512_BF16), so they stay
    // mapped from the file. It covers every f16 operand of the graph's products (a LoRA's f16
    // factors applied at runtime too: their branch then carries bf16's rounding as well).
    bool f16_as_bf16 = false;
    // mul_mat with Q8_0, Q4_K or Q5_K weights runs the bf16 kernel too, each block dequantised
    // as ggml does and rounded to bf16 as it is used (kernels/bf16_gemm.cpp), instead of ggml's
    // quantised product (which also quantises the activations to 8 bits): set per module by the
    // runner where its products run in bf16 (AMX or AVX512_BF16 measured fast); the weights stay
    // quantised in memory, mapped from the file.
    bool quant_as_bf16 = false;
    bool bf16_quant_weight(const ggml_tensor *w) const {
        return quant_as_bf16 &&
               (w->type == GGML_TYPE_Q8_0 || w->type == GGML_TYPE_Q4_K || w->type == GGML_TYPE_Q5_K);
    }
    Tensor conv_transpose_2d(const Tensor &w, const Tensor &x, int stride);
    Tensor upscale(const Tensor &a, int factor);
    Tensor interpolate(const Tensor &a, const std::vector<int64_t> &shape, const std::string &mode, bool align_corners);
    Tensor pad(const Tensor &a, const std::vector<std::pair<int, int>> &pads);
    Tensor concat(const Tensor &a, const Tensor &b, int axis);
    Tensor permute(const Tensor &a, const std::vector<int> &axes);
    Tensor transpose(const Tensor &a);
    Tensor reshape(const Tensor &a, const std::vector<int64_t> &shape);
    Tensor view(const Tensor &a, const std::vector<int64_t> &shape, std::optional<std::vector<int64_t>> strides,
                int64_t offset);
    Tensor cont(const Tensor &a);
    Tensor cast(const Tensor &a, const std::string &dtype);
    Tensor repeat(const Tensor &a, const std::vector<int64_t> &shape);
    Tensor get_rows(const Tensor &a, const Tensor &ids);
    Tensor rope(const Tensor &a, const Tensor &pos, int n_dims, int mode, std::optional<std::vector<int>> sections,
                int n_ctx_orig, float freq_base, float freq_scale, float ext_factor, float attn_factor,
                float beta_fast, float beta_slow, std::optional<Tensor> freq_factors);
    Tensor timestep_embedding(const Tensor &ts, int dim, int max_period);
    Tensor reduce(const std::string &kind, const Tensor &a);

    // execution (graph_exec.cpp)
    void build();
    void make_sched();
    void apply_assignments();
    void ensure_alloc();
    std::vector<size_t> reserve();
    std::vector<size_t> buffer_sizes();
    void compute();
    void free_sched();
    void check_resident();
    void reset_tensors();
    bool weights_moved() const;
    void restore_srcs();
    void check_split_views();
    std::vector<std::pair<ggml_tensor *, std::array<ggml_tensor *, GGML_MAX_SRC>>> orig_src;  // sources as built
    std::unordered_map<ggml_tensor *, std::pair<void *, ggml_backend_buffer_t>> ext_data;  // weights at allocation
    uint64_t alloc_epoch = 0;  // weight_epoch at allocation
};

}  // namespace sdplan
