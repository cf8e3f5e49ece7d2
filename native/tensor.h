// Tensor handles shared by the graph builder (graph.cpp) and the weight stores (weights.cpp).
//
// Shapes cross the Python boundary in numpy order (outermost first); ggml stores them
// reversed in ne[]. A Tensor remembers its numpy rank because ggml keeps every tensor 4-D.
#pragma once

#include "common.h"

#include <ggml-alloc.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace sdplan {

// Counts weight buffers freed so far (graphs compare it to find stale weight references).
inline std::atomic<uint64_t> weight_epoch{0};

// Owns one ggml context; shared by every Tensor created in it.
struct Context {
    ggml_context *ctx = nullptr;
    explicit Context(size_t mem_size) {
        ggml_init_params p{mem_size, nullptr, /*no_alloc=*/true};
        ctx = ggml_init(p);
        if (!ctx) throw std::runtime_error("ggml_init failed (out of host memory?)");
    }
    ~Context() {
        if (ctx) ggml_free(ctx);
    }
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;
    // Bytes still free for tensor metadata.
    size_t room() const { return ggml_get_mem_size(ctx) - ggml_used_mem(ctx); }
};

// A ggml tensor seen from Python. `owner` keeps the context (and, for weights, the
// store) alive; `planned_buft` is the buffer type a weight will live in once allocated
// (used to measure compute buffers before weights are loaded).
struct Tensor {
    ggml_tensor *t = nullptr;
    int ndim = 1;
    std::shared_ptr<void> owner;
    ggml_backend_buffer_type_t planned_buft = nullptr;
    bool weight = false;  // owned by a WeightStore (usable in any graph)
};

// The full name of a tensor: ggml keeps at most GGML_MAX_NAME - 1 (63) bytes, so weight
// stores register longer names (model files have names such as
// "model.diffusion_model.double_blocks.0.img_attn.norm.query_norm.scale") here.
std::string tensor_name(const ggml_tensor *t);
// Name `t` (ggml gets a shortened form of a long name; tensor_name gives it back whole).
void set_long_name(ggml_tensor *t, const std::string &name);
// Forget the long names of these tensors (their store goes).
void forget_long_names(const std::vector<ggml_tensor *> &ts);

// Numpy-order shape of t with `ndim` entries.
std::vector<int64_t> np_shape(const ggml_tensor *t, int ndim);
std::string shape_str(const Tensor &x);
// "f32", "f16", "bf16", "q8_0", "q4_k", ... (ggml's names, lower case).
std::string dtype_name(ggml_type type);
// Inverse of dtype_name; throws nb::value_error naming `what` for unknown names.
ggml_type dtype_from_name(const std::string &name, const char *what = "dtype");
// numpy-order shape -> ggml ne (4 entries); throws nb::value_error for rank > 4 or
// dimensions < 1.
void shape_to_ne(const std::vector<int64_t> &shape, int64_t ne[4], const char *what);

void register_tensor(nb::module_ &m);

}  // namespace sdplan
