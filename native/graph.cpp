// Graph building and execution: a no_alloc ggml context, the ops model graphs need (each
// checks shapes and dtypes and raises ValueError instead of letting ggml abort), and a
// ggml_backend_sched over the graph's backends, allocated once and reused across steps.
//
// Conventions (see core/graph.py): shapes are numpy order, outermost first; ggml's ne[] is
// that reversed. Ops are methods of Graph; their results are Tensors of that graph.
#include "graph.h"
#include "kernels/attention.h"
#include "kernels/bf16_gemm.h"
#include "kernels/fma_attention.h"
#include "kernels/fma_gemm.h"
#include "kernels/glu.h"
#include "kernels/group_norm.h"
#include "kernels/im2col.h"
#include "kernels/layer_norm.h"
#include "kernels/rope.h"
#include "kernels/transpose.h"
#include "kernels/winograd.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace sdplan {

// ------------------------------------------------------------------ tensor helpers

namespace {
std::mutex long_names_mutex;
std::unordered_map<const ggml_tensor *, std::string> long_names;
}  // namespace

std::string tensor_name(const ggml_tensor *t) {
    {
        std::lock_guard<std::mutex> lock(long_names_mutex);
        auto it = long_names.find(t);
        if (it != long_names.end()) return it->second;
    }
    return t->name;
}

void set_long_name(ggml_tensor *t, const std::string &name) {
    if (name.size() < GGML_MAX_NAME) {
        ggml_set_name(t, name.c_str());
        return;
    }
    // ggml's copy: "~" and the tail, which holds the distinctive part of dotted names
    std::string tail = "~" + name.substr(name.size() - (GGML_MAX_NAME - 2));
    ggml_set_name(t, tail.c_str());
    std::lock_guard<std::mutex> lock(long_names_mutex);
    long_names[t] = name;
}

void forget_long_names(const std::vector<ggml_tensor *> &ts) {
    std::lock_guard<std::mutex> lock(long_names_mutex);
    for (auto *t : ts) long_names.erase(t);
}

std::vector<int64_t> np_shape(const ggml_tensor *t, int ndim) {
    std::vector<int64_t> s(ndim);
    for (int k = 0; k < ndim; ++k) s[k] = t->ne[ndim - 1 - k];
    return s;
}

std::string shape_str(const Tensor &x) {
    std::ostringstream o;
    o << "(";
    auto s = np_shape(x.t, x.ndim);
    for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
    if (s.size() == 1) o << ",";
    o << ") " << dtype_name(x.t->type);
    return o.str();
}

std::string dtype_name(ggml_type type) {
    const char *n = ggml_type_name(type);
    std::string s = n ? n : "?";
    for (auto &c : s) c = (char)std::tolower((unsigned char)c);
    return s;
}

ggml_type dtype_from_name(const std::string &name, const char *what) {
    std::string want = name;
    for (auto &c : want) c = (char)std::tolower((unsigned char)c);
    for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
        const char *n = ggml_type_name((ggml_type)i);
        if (!n || ggml_type_size((ggml_type)i) == 0) continue;
        if (dtype_name((ggml_type)i) == want) return (ggml_type)i;
    }
    throw nb::value_error((std::string(what) + ": unknown dtype '" + name + "'").c_str());
}

void shape_to_ne(const std::vector<int64_t> &shape, int64_t ne[4], const char *what) {
    if (shape.empty() || shape.size() > 4)
        throw nb::value_error((std::string(what) + ": shapes have 1 to 4 dimensions, got " +
                               std::to_string(shape.size())).c_str());
    for (int i = 0; i < 4; ++i) ne[i] = 1;
    const int n = (int)shape.size();
    for (int k = 0; k < n; ++k) {
        if (shape[k] < 1)
            throw nb::value_error((std::string(what) + ": dimensions must be >= 1").c_str());
        ne[n - 1 - k] = shape[k];
    }
}

namespace {

[[noreturn]] void fail(const char *op, const std::string &msg) {
    throw nb::value_error((std::string(op) + ": " + msg).c_str());
}

bool is_float(ggml_type t) { return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16; }

bool rows_contiguous(const ggml_tensor *t) { return t->nb[0] == ggml_type_size(t->type); }

int axis_to_dim(const char *op, int axis, int ndim) {
    if (axis < -ndim || axis >= ndim)
        fail(op, "axis " + std::to_string(axis) + " out of range for rank " + std::to_string(ndim));
    if (axis < 0) axis += ndim;
    return ndim - 1 - axis;
}

}  // namespace

// ------------------------------------------------------------------ Graph

Graph::Graph(std::vector<std::shared_ptr<Backend>> bs, int max_nodes_, int n_threads_)
    : max_nodes(max_nodes_), n_threads(n_threads_) {
    if (bs.empty()) throw nb::value_error("Graph: needs at least one backend");
    if (max_nodes < 16) throw nb::value_error("Graph: max_nodes must be >= 16");
    for (auto &b : bs) {
        if (!b) throw nb::value_error("Graph: backend is None");
        b->get();
        bool dup = false;
        for (auto &o : backends) dup = dup || o.get() == b.get();
        if (!dup) backends.push_back(b);
    }
    if (ggml_backend_dev_type(backends.back()->device) != GGML_BACKEND_DEVICE_TYPE_CPU)
        throw nb::value_error("Graph: the last backend must be a CPU backend (the scheduler's "
                              "fallback); append the CPU backend");
    if (backends.size() > 16) throw nb::value_error("Graph: at most 16 backends");
    size_t mem = (size_t)max_nodes * ggml_tensor_overhead() + 4096;
    ctx = std::make_shared<Context>(mem);
}

Graph::~Graph() { free_sched(); }

void Graph::free_sched() {
    if (sched) {
        ggml_backend_sched_free(sched);
        sched = nullptr;
    }
    if (ctx) reset_tensors();
}

void Graph::room(const char *op, int n) {
    if (gf) fail(op, "the graph is already built; build a new Graph for another shape");
    if (ctx->room() < (size_t)n * ggml_tensor_overhead())
        fail(op, "graph context is full (max_nodes=" + std::to_string(max_nodes) +
                     "); create the Graph with a larger max_nodes");
}

ggml_tensor *Graph::use(const char *op, const Tensor &x) {
    if (!x.t) fail(op, "tensor is None");
    if (x.owner == ctx) return x.t;
    if (!x.weight) fail(op, "tensor '" + tensor_name(x.t) + "' belongs to another graph");
    keep.insert(x.owner);
    if (!ext.count(x.t)) ext[x.t] = x.planned_buft;
    return x.t;
}

Tensor Graph::own(ggml_tensor *r, int ndim) {
    Tensor out;
    out.t = r;
    out.ndim = std::max(ndim, std::max(1, ggml_n_dims(r)));
    out.owner = ctx;
    if (scope >= 0 && r->view_src == nullptr && r->op != GGML_OP_NONE) assign.emplace_back(r, scope);
    return out;
}

// Strictly packed: every stride the product of the sizes inside it, size-1 dimensions included
// (ggml_is_contiguous ignores those, while some ggml ops assert the strict layout).
static bool packed(const ggml_tensor *t) {
    if (t->nb[0] != ggml_type_size(t->type)) return false;
    for (int d = 1; d < GGML_MAX_DIMS; ++d)
        if (t->nb[d] != t->nb[d - 1] * (size_t)(d == 1 ? t->ne[0] / ggml_blck_size(t->type) : t->ne[d - 1])) return false;
    return true;
}

ggml_tensor *Graph::contig(ggml_tensor *t) { return ggml_is_contiguous(t) && packed(t) ? t : copy_contiguous(t); }

ggml_tensor *Graph::copy_contiguous(ggml_tensor *t) {
    if (const int d = all_cpu() ? transpose_copy_dim(t) : -1; d > 0) {  // a permuted view: blocked transposes
        const std::array<int, 8> prm{d};
        return cpu_op(cpu_transpose_copy, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, {t}, &prm);
    }
    return ggml_cont(ctx->ctx, t);
}

ggml_tensor *Graph::to_f32(ggml_tensor *t) {
    if (t->type == GGML_TYPE_F32) return t;
    return ggml_cast(ctx->ctx, contig(t), GGML_TYPE_F32);
}

void Graph::set_scope(int index) {
    if (index < -1 || index >= (int)backends.size())
        throw nb::value_error(("Graph.set_scope: backend index " + std::to_string(index) +
                               " out of range").c_str());
    scope = index;
}

Tensor Graph::input(const std::string &name, const std::vector<int64_t> &shape, const std::string &dtype) {
    room("input", 1);
    if (name.empty() || name.size() >= GGML_MAX_NAME) fail("input", "name must have 1 to 63 characters");
    if (inputs.count(name)) fail("input", "duplicate input name '" + name + "'");
    int64_t ne[4];
    shape_to_ne(shape, ne, "input");
    ggml_type type = dtype_from_name(dtype, "input");
    ggml_tensor *t = ggml_new_tensor_4d(ctx->ctx, type, ne[0], ne[1], ne[2], ne[3]);
    ggml_set_name(t, name.c_str());
    ggml_set_input(t);
    Tensor out{t, (int)shape.size(), ctx};
    inputs[name] = out;
    return out;
}

Tensor Graph::output(const std::string &name, const Tensor &x) {
    room("output", 2);
    ggml_tensor *t = use("output", x);
    if (outputs.count(name)) fail("output", "duplicate output name '" + name + "'");
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_I32)
        fail("output", "outputs are f32, f16 or i32, got " + shape_str(x) + "; cast first");
    if (!ggml_is_contiguous(t) || x.owner != ctx || t->op == GGML_OP_NONE) t = ggml_cont(ctx->ctx, t);
    ggml_set_name(t, name.c_str());
    ggml_set_output(t);
    Tensor out = own(t, x.ndim);
    outputs[name] = out;
    return out;
}

void Graph::checkpoint(const Tensor &x) {
    ggml_tensor *t = use("checkpoint", x);
    checkpoints.insert(t);
}

// ---- linear algebra and elementwise

ggml_tensor *Graph::cpu_op(ggml_custom_op_t fn, const std::array<int64_t, 4> &ne,
                           std::initializer_list<ggml_tensor *> args, const std::array<int, 8> *params) {
    void *userdata = nullptr;
    if (params) {
        custom_params.push_back(*params);
        userdata = custom_params.back().data();
    }
    std::vector<ggml_tensor *> srcs(args);
    return ggml_custom_4d(ctx->ctx, GGML_TYPE_F32, ne[0], ne[1], ne[2], ne[3], srcs.data(), (int)srcs.size(), fn,
                          GGML_N_TASKS_MAX, userdata);
}

ggml_tensor *Graph::product_op(ggml_custom_op_t fn, const std::array<int, 8> &params, ggml_tensor *x, ggml_tensor *w,
                               ggml_tensor *b, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    x = to_f32(contig(x));
    w = contig(w);
    if (!b) return cpu_op(fn, {ne0, ne1, ne2, ne3}, {x, w}, &params);
    return cpu_op(fn, {ne0, ne1, ne2, ne3}, {x, w, to_f32(contig(b))}, &params);
}

Tensor Graph::mul_mat(const Tensor &a, const Tensor &b, std::optional<Tensor> bias) {
    room("mul_mat", 8);
    ggml_tensor *ta = use("mul_mat", a), *tb = use("mul_mat", b);
    if (ta->ne[0] != tb->ne[0])
        fail("mul_mat", "inner dimensions differ: a " + shape_str(a) + ", b " + shape_str(b) +
                            " (computes b @ a.T; the last dims must match)");
    if (tb->ne[2] % ta->ne[2] != 0 || tb->ne[3] % ta->ne[3] != 0)
        fail("mul_mat", "batch dims of a " + shape_str(a) + " must divide those of b " + shape_str(b));
    ggml_tensor *tc = bias ? use("mul_mat", *bias) : nullptr;
    if (tc && (ggml_nelements(tc) != ta->ne[1] || tc->ne[0] != ta->ne[1] || !is_float(tc->type)))
        fail("mul_mat", "bias must be a float vector of " + std::to_string(ta->ne[1]) + " values for a " +
                            shape_str(a) + ", got " + shape_str(*bias));
    const int nd = std::max({a.ndim, b.ndim, 2});
    const Bf16Kernel kern = bf16_kernel();
    if ((bf16_weight(ta) || bf16_quant_weight(ta)) && kern != Bf16Kernel::none && ta->ne[2] == 1 && ta->ne[3] == 1 && ta->ne[0] % 2 == 0 &&
        all_cpu()) {
        // the bf16 kernel: x f32 contiguous, w bf16 (or f16, rounded as used) contiguous, the bias fused
        bf16_products = true;
        return own(product_op(bf16_gemm, {(int)kern, 0, 1, 1, 0, 0, 1, 1}, tb, ta, tc, ta->ne[1], tb->ne[1], tb->ne[2],
                              tb->ne[3]),
                   nd);
    }
    if (ta->type == GGML_TYPE_F16 && fma_gemm_on() && ta->ne[2] == 1 && ta->ne[3] == 1 && all_cpu() &&
        ggml_nrows(tb) >= kFmaMinRows) {
        // the FMA product: x f32 contiguous, w f16 contiguous (widened as packed), the bias fused
        return own(product_op(fma_gemm, {0, 1, 1, 0, 0, 1, 1, 0}, tb, ta, tc, ta->ne[1], tb->ne[1], tb->ne[2],
                              tb->ne[3]),
                   nd);
    }
    if (ggml_is_transposed(ta)) ta = ggml_cont(ctx->ctx, ta);
    if (tb->type != GGML_TYPE_F32) tb = to_f32(tb);
    Tensor y = own(ggml_mul_mat(ctx->ctx, ta, tb), nd);
    return bias ? binary("add", y, *bias) : y;
}

Tensor Graph::binary(const char *op, const Tensor &a, const Tensor &b) {
    room(op, 6);
    ggml_tensor *ta = use(op, a), *tb = use(op, b);
    const bool commutes = !std::strcmp(op, "add") || !std::strcmp(op, "mul");
    if (!is_float(ta->type) || !is_float(tb->type))
        fail(op, "float tensors required, got a " + shape_str(a) + ", b " + shape_str(b));
    if (ta->type != tb->type) {
        ta = to_f32(ta);
        tb = to_f32(tb);
    }
    if (!ggml_can_repeat(tb, ta)) {
        if (!ggml_can_repeat(ta, tb))
            fail(op, "shapes do not broadcast: a " + shape_str(a) + ", b " + shape_str(b) +
                         " (each dim of the smaller must divide the larger's)");
        if (commutes) std::swap(ta, tb);
        else ta = ggml_repeat(ctx->ctx, ta, tb);
    }
    if (!rows_contiguous(ta)) ta = ggml_cont(ctx->ctx, ta);
    if (!rows_contiguous(tb)) tb = ggml_cont(ctx->ctx, tb);
    // ggml's CPU kernels broadcast a single-element row one call per element: a per-channel
    // (C, 1, 1) operand over (N, C, H, W) runs far slower than a row-wise one. Widen such an
    // operand to whole rows first when that stays small next to the other operand.
    if (tb->ne[0] == 1 && ta->ne[0] >= 8 && ggml_nelements(tb) * ta->ne[0] * 2 <= ggml_nelements(ta))
        tb = ggml_repeat_4d(ctx->ctx, tb, ta->ne[0], tb->ne[1], tb->ne[2], tb->ne[3]);
    ggml_tensor *r = nullptr;
    if (!std::strcmp(op, "add")) r = ggml_add(ctx->ctx, ta, tb);
    else if (!std::strcmp(op, "sub")) r = ggml_sub(ctx->ctx, ta, tb);
    else if (!std::strcmp(op, "mul")) r = ggml_mul(ctx->ctx, ta, tb);
    else r = ggml_div(ctx->ctx, ta, tb);
    return own(r, std::max(a.ndim, b.ndim));
}

Tensor Graph::scale(const Tensor &a, float s, float bias) {
    room("scale", 2);
    ggml_tensor *t = use("scale", a);
    if (!is_float(t->type)) fail("scale", "float tensor required, got " + shape_str(a));
    t = contig(t);
    return own(bias == 0.0f ? ggml_scale(ctx->ctx, t, s) : ggml_scale_bias(ctx->ctx, t, s, bias), a.ndim);
}

Tensor Graph::unary(const std::string &name, const Tensor &a) {
    room(name.c_str(), 3);
    ggml_tensor *t = use(name.c_str(), a);
    if (!is_float(t->type)) fail(name.c_str(), "float tensor required, got " + shape_str(a));
    t = to_f32(contig(t));
    ggml_context *c = ctx->ctx;
    ggml_tensor *r = nullptr;
    // sdplan's CPU ops (kernels/glu.cpp): both GELUs vectorized (AVX-512, else AVX2 with FMA),
    // quick GELU in f32 with AVX2
    ggml_custom_op_t own_op = name == "gelu_erf" && glu_simd()       ? cpu_gelu_erf
                              : name == "gelu" && glu_simd() && fma_gemm_on() ? cpu_gelu_tanh
                              : name == "gelu_quick" && fma_gemm_on() ? cpu_gelu_quick
                                                                      : nullptr;
    if (own_op && all_cpu()) return own(cpu_op(own_op, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, {t}), a.ndim);
    if (name == "gelu") r = ggml_gelu(c, t);
    else if (name == "gelu_erf") r = ggml_gelu_erf(c, t);
    else if (name == "gelu_quick") r = ggml_gelu_quick(c, t);
    else if (name == "silu") r = ggml_silu(c, t);
    else if (name == "relu") r = ggml_relu(c, t);
    else if (name == "sigmoid") r = ggml_sigmoid(c, t);
    else if (name == "tanh") r = ggml_tanh(c, t);
    else if (name == "exp") r = ggml_exp(c, t);
    else if (name == "sqr") r = ggml_sqr(c, t);
    else if (name == "sqrt") r = ggml_sqrt(c, t);
    else if (name == "abs") r = ggml_abs(c, t);
    else if (name == "neg") r = ggml_neg(c, t);
    else if (name == "sin") r = ggml_sin(c, t);
    else if (name == "cos") r = ggml_cos(c, t);
    else if (name == "log") r = ggml_log(c, t);
    else fail("unary", "unknown op '" + name + "'");
    return own(r, a.ndim);
}

Tensor Graph::geglu(const Tensor &x, bool approximate) {
    room("geglu", 8);
    ggml_tensor *t = use("geglu", x);
    if (!is_float(t->type)) fail("geglu", "float tensor required, got " + shape_str(x));
    if (t->ne[0] % 2) fail("geglu", "the last dimension must be even, got " + shape_str(x));
    t = to_f32(contig(t));
    ggml_context *c = ctx->ctx;
    const int64_t D = t->ne[0] / 2;
    if (all_cpu()) {  // one op (kernels/glu.cpp)
        const std::array<int, 8> prm{approximate ? 1 : 0};
        return own(cpu_op(cpu_geglu, {D, t->ne[1], t->ne[2], t->ne[3]}, {t}, &prm), x.ndim);
    }
    ggml_tensor *h = ggml_cont(c, ggml_view_4d(c, t, D, t->ne[1], t->ne[2], t->ne[3], t->nb[1], t->nb[2], t->nb[3], 0));
    ggml_tensor *gate = ggml_cont(c, ggml_view_4d(c, t, D, t->ne[1], t->ne[2], t->ne[3], t->nb[1], t->nb[2], t->nb[3],
                                                  (size_t)D * sizeof(float)));
    gate = approximate ? ggml_gelu(c, gate) : ggml_gelu_erf(c, gate);
    return own(ggml_mul(c, h, gate), x.ndim);
}

Tensor Graph::leaky_relu(const Tensor &a, float slope) {
    room("leaky_relu", 3);
    ggml_tensor *t = to_f32(contig(use("leaky_relu", a)));
    return own(ggml_leaky_relu(ctx->ctx, t, slope, false), a.ndim);
}

Tensor Graph::clamp(const Tensor &a, float lo, float hi) {
    room("clamp", 3);
    if (!(lo <= hi)) fail("clamp", "min must be <= max");
    ggml_tensor *t = to_f32(contig(use("clamp", a)));
    return own(ggml_clamp(ctx->ctx, t, lo, hi), a.ndim);
}

// ---- normalisation and softmax

Tensor Graph::norm(const std::string &kind, const Tensor &a, float eps, int n_groups) {
    const char *op = kind.c_str();
    room(op, 3);
    ggml_tensor *t = use(op, a);
    if (!is_float(t->type)) fail(op, "float tensor required, got " + shape_str(a));
    if (!(eps >= 0.0f)) fail(op, "eps must be >= 0");
    t = to_f32(contig(t));
    if (kind == "norm") return own(ggml_norm(ctx->ctx, t, eps), a.ndim);
    if (kind == "rms_norm") return own(ggml_rms_norm(ctx->ctx, t, eps), a.ndim);
    if (a.ndim < 3) fail(op, "needs (N, C, H, W) or (C, H, W) input, got " + shape_str(a));
    if (n_groups < 1 || n_groups > t->ne[2])
        fail(op, "n_groups " + std::to_string(n_groups) + " must be in 1..C for " + shape_str(a));
    return own(ggml_group_norm(ctx->ctx, t, n_groups, eps), a.ndim);
}

ggml_tensor *Graph::norm_vector(const char *op, const std::optional<Tensor> &v, int64_t n, const char *axis) {
    if (!v) return nullptr;
    ggml_tensor *t = use(op, *v);
    if (ggml_nelements(t) != n || !is_float(t->type))
        fail(op, std::string("weight and bias must be float vectors of ") + axis + std::to_string(n) + " values, got " +
                     shape_str(*v));
    return to_f32(contig(t));
}

Tensor Graph::group_norm_affine(const Tensor &a, int n_groups, float eps, std::optional<Tensor> weight,
                                std::optional<Tensor> bias, bool silu) {
    room("group_norm", 12);
    ggml_tensor *t = use("group_norm", a);
    if (!is_float(t->type)) fail("group_norm", "float tensor required, got " + shape_str(a));
    if (!(eps >= 0.0f)) fail("group_norm", "eps must be >= 0");
    if (a.ndim < 3) fail("group_norm", "needs (N, C, H, W) or (C, H, W) input, got " + shape_str(a));
    const int64_t C = t->ne[2];
    if (n_groups < 1 || n_groups > C)
        fail("group_norm", "n_groups " + std::to_string(n_groups) + " must be in 1..C for " + shape_str(a));
    ggml_tensor *tw = norm_vector("group_norm", weight, C, "C="), *tb = norm_vector("group_norm", bias, C, "C=");
    t = to_f32(contig(t));
    ggml_context *c = ctx->ctx;
    if (all_cpu() && C % n_groups == 0) {
        std::array<int, 8> prm{};
        prm[0] = n_groups;
        std::memcpy(&prm[1], &eps, sizeof eps);
        prm[2] = silu ? 1 : 0;
        return own(cpu_op(cpu_group_norm, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, {t, tw, tb}, &prm), a.ndim);
    }
    ggml_tensor *r = ggml_group_norm(c, t, n_groups, eps);
    auto per_channel = [&](ggml_tensor *v) {  // [C] -> [W, 1, C, 1] rows (see binary())
        return ggml_repeat_4d(c, ggml_reshape_4d(c, v, 1, 1, C, 1), t->ne[0], 1, C, 1);
    };
    if (tw) r = ggml_mul(c, r, per_channel(tw));
    if (tb) r = ggml_add(c, r, per_channel(tb));
    if (silu) r = ggml_silu(c, r);
    return own(r, a.ndim);
}

Tensor Graph::layer_norm(const Tensor &a, float eps, std::optional<Tensor> weight, std::optional<Tensor> bias) {
    room("layer_norm", 10);
    ggml_tensor *t = use("layer_norm", a);
    if (!is_float(t->type)) fail("layer_norm", "float tensor required, got " + shape_str(a));
    if (!(eps >= 0.0f)) fail("layer_norm", "eps must be >= 0");
    const int64_t D = t->ne[0];
    ggml_tensor *tw = norm_vector("layer_norm", weight, D, "the last axis' ");
    ggml_tensor *tb = norm_vector("layer_norm", bias, D, "the last axis' ");
    for (ggml_tensor **v : {&tw, &tb})  // no view of a (D,) weight: it stays on its device
        if (*v && (*v)->ne[0] != D) *v = ggml_reshape_1d(ctx->ctx, *v, D);
    t = to_f32(contig(t));
    ggml_context *c = ctx->ctx;
    if (all_cpu()) {  // one pass (kernels/layer_norm.cpp)
        std::array<int, 8> prm{};
        std::memcpy(&prm[0], &eps, sizeof eps);
        return own(cpu_op(cpu_layer_norm, {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}, {t, tw, tb}, &prm), a.ndim);
    }
    ggml_tensor *r = ggml_norm(c, t, eps);
    if (tw) r = ggml_mul(c, r, tw);
    if (tb) r = ggml_add(c, r, tb);
    return own(r, a.ndim);
}

// x (B, N, H, hd) turned pair by pair by the tables cos and sin (N x hd/2 values each, contiguous):
// kernels/rope.cpp on CPU-only graphs; elsewhere the pairs split into two planes (hd/2-long rows,
// so each product broadcasts a table row over the heads), the four products, and the planes
// joined and interleaved back.
Tensor Graph::rope_pairs(const Tensor &x, const Tensor &cos, const Tensor &sin) {
    room("rope_pairs", 16);
    ggml_tensor *t = use("rope_pairs", x);
    if (!is_float(t->type)) fail("rope_pairs", "x must be a float tensor (f32, f16 or bf16), got " + shape_str(x));
    t = to_f32(t);
    ggml_tensor *tc = use("rope_pairs", cos), *ts = use("rope_pairs", sin);
    const int64_t hd = t->ne[0], H = t->ne[1], N = t->ne[2], B = t->ne[3], half = hd / 2;
    if (hd % 2 != 0) fail("rope_pairs", "the last axis must be even, got " + shape_str(x));
    for (ggml_tensor *v : {tc, ts})
        if (v->type != GGML_TYPE_F32 || !ggml_is_contiguous(v) || ggml_nelements(v) != N * half)
            fail("rope_pairs", "cos and sin must be contiguous f32 tables of " + std::to_string(N) + " x " +
                                   std::to_string(half) + " values, got " + shape_str(v == tc ? cos : sin));
    ggml_context *c = ctx->ctx;
    if (all_cpu()) {  // the op reads rows through their strides; the values of a row must be adjacent
        if (t->nb[0] != ggml_type_size(t->type)) t = copy_contiguous(t);
        return own(cpu_op(cpu_rope_pairs, {hd, H, N, B}, {t, tc, ts}), x.ndim);
    }
    t = contig(t);
    ggml_tensor *planes = ggml_cont(c, ggml_permute(c, ggml_reshape_4d(c, t, 2, half, H, N * B), 1, 0, 2, 3));
    const size_t f = sizeof(float);
    ggml_tensor *x0 = ggml_view_4d(c, planes, half, 1, H, N * B, half * f, hd * f, H * hd * f, 0);
    ggml_tensor *x1 = ggml_view_4d(c, planes, half, 1, H, N * B, half * f, hd * f, H * hd * f, half * f);
    ggml_tensor *cc = ggml_reshape_4d(c, tc, half, 1, 1, N), *ss = ggml_reshape_4d(c, ts, half, 1, 1, N);
    if (B > 1) cc = ggml_repeat(c, cc, ggml_new_tensor_4d(c, GGML_TYPE_F32, half, 1, 1, N * B)),
               ss = ggml_repeat(c, ss, ggml_new_tensor_4d(c, GGML_TYPE_F32, half, 1, 1, N * B));
    ggml_tensor *o0 = ggml_sub(c, ggml_mul(c, x0, cc), ggml_mul(c, x1, ss));
    ggml_tensor *o1 = ggml_add(c, ggml_mul(c, x0, ss), ggml_mul(c, x1, cc));
    ggml_tensor *pairs = ggml_cont(c, ggml_permute(c, ggml_concat(c, o0, o1, 1), 1, 0, 2, 3));  // [2, hd/2, H, N B]
    return own(ggml_reshape_4d(c, pairs, hd, H, N, B), x.ndim);
}

Tensor Graph::soft_max(const Tensor &a, std::optional<Tensor> mask, float scale_, float max_bias) {
    room("soft_max", 4);
    ggml_tensor *t = to_f32(contig(use("soft_max", a)));
    ggml_tensor *m = nullptr;
    if (mask) {
        m = use("soft_max", *mask);
        if (m->type != GGML_TYPE_F32 && m->type != GGML_TYPE_F16)
            fail("soft_max", "mask must be f32 or f16, got " + shape_str(*mask));
        m = contig(m);
        if (m->ne[0] != t->ne[0] || m->ne[1] < t->ne[1] || t->ne[2] % m->ne[2] || t->ne[3] % m->ne[3])
            fail("soft_max", "mask " + shape_str(*mask) + " does not fit scores " + shape_str(a) +
                                 " (last dim equal, rows >= rows, outer dims dividing)");
    } else if (max_bias > 0.0f) {
        fail("soft_max", "max_bias (ALiBi) needs a mask");
    }
    return own(ggml_soft_max_ext(ctx->ctx, t, m, scale_, max_bias), a.ndim);
}

Tensor Graph::flash_attn(const Tensor &q, const Tensor &k, const Tensor &v, std::optional<Tensor> mask,
                         float scale_, float max_bias, float softcap) {
    room("flash_attn", 12);
    ggml_tensor *tq = use("flash_attn", q), *tk = use("flash_attn", k), *tv = use("flash_attn", v);
    if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4)
        fail("flash_attn", "q, k, v must be (B, H, N, D); got " + shape_str(q) + ", " + shape_str(k) +
                               ", " + shape_str(v));
    if (tk->ne[0] != tq->ne[0] || tq->ne[2] % tk->ne[2] || tq->ne[3] != tk->ne[3] || tq->ne[3] != tv->ne[3] ||
        tv->ne[1] != tk->ne[1] || tv->ne[2] != tk->ne[2])
        fail("flash_attn", "incompatible q " + shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v) +
                               " (k,v share B, heads and length; q's heads a multiple of k's; head dims equal)");
    ggml_tensor *m = nullptr;
    if (mask) {
        m = use("flash_attn", *mask);
        if (!is_float(m->type)) fail("flash_attn", "mask must be float, got " + shape_str(*mask));
        if (m->ne[0] != tk->ne[1] || m->ne[1] < tq->ne[1] || tq->ne[2] % m->ne[2] || tq->ne[3] % m->ne[3])
            fail("flash_attn", "mask " + shape_str(*mask) + " does not fit q " + shape_str(q) + " and k " +
                                   shape_str(k) + " (mask (.., Nq, Nk))");
    } else if (max_bias > 0.0f) {
        fail("flash_attn", "max_bias (ALiBi) needs a mask");
    }
    const Bf16Kernel kern = bf16_kernel();
    const bool bf16 = kern != Bf16Kernel::none && (bf16_products || attention_bf16);
    if ((bf16 || fma_gemm_on()) && max_bias == 0.0f && softcap == 0.0f && all_cpu()) {
        // sdplan's attention ops: bf16 products (AMX or AVX512_BF16) with an f32 softmax, or
        // everything in f32 with FMA (a CPU without a bf16 kernel, or weights not in bf16)
        auto rows_f32 = [&](ggml_tensor *t) {
            t = t->type == GGML_TYPE_F32 ? t : ggml_cast(ctx->ctx, contig(t), GGML_TYPE_F32);
            return rows_contiguous(t) ? t : ggml_cont(ctx->ctx, t);
        };
        if (m) m = to_f32(contig(m));
        int bits;
        std::memcpy(&bits, &scale_, sizeof bits);
        const std::array<int, 8> prm = bf16 ? std::array<int, 8>{(int)kern, bits} : std::array<int, 8>{bits};
        const std::array<int64_t, 4> ne{tv->ne[0], tq->ne[2], tq->ne[1], tq->ne[3]};
        ggml_custom_op_t fn = bf16 ? bf16_attention : fma_attention;
        ggml_tensor *q32 = rows_f32(tq), *k32 = rows_f32(tk), *v32 = rows_f32(tv);
        return own(m ? cpu_op(fn, ne, {q32, k32, v32, m}, &prm) : cpu_op(fn, ne, {q32, k32, v32}, &prm), 4);
    }
    tq = to_f32(tq);
    if (tk->type != GGML_TYPE_F16) tk = ggml_cast(ctx->ctx, contig(tk), GGML_TYPE_F16);
    if (tv->type != GGML_TYPE_F16) tv = ggml_cast(ctx->ctx, contig(tv), GGML_TYPE_F16);
    if (m) {
        if (m->type != GGML_TYPE_F16) m = ggml_cast(ctx->ctx, contig(m), GGML_TYPE_F16);
        m = contig(m);
    }
    ggml_tensor *r = ggml_flash_attn_ext(ctx->ctx, tq, tk, tv, m, scale_, max_bias, softcap);
    ggml_flash_attn_ext_set_prec(r, GGML_PREC_F32);
    return own(r, 4);
}

bool Graph::supports(const Tensor &x, int index) {
    ggml_tensor *t = use("supports", x);
    if (index < 0 || index >= (int)backends.size()) throw nb::value_error("supports: backend index out of range");
    return ggml_backend_supports_op(backends[index]->get(), t);
}

// ---- convolution and resampling

bool Graph::all_cpu() const {
    for (auto &b : backends)
        if (b->stand_in || ggml_backend_dev_type(b->device) != GGML_BACKEND_DEVICE_TYPE_CPU) return false;
    return true;
}

const char *conv_method_name(ConvMethod method) {
    switch (method) {
    case ConvMethod::im2col: return "im2col";
    case ConvMethod::cpu_im2col: return "cpu_im2col";
    case ConvMethod::winograd: return "winograd";
    case ConvMethod::direct: return "direct";
    case ConvMethod::bf16: return "bf16";
    case ConvMethod::fma: return "fma";
    }
    return "?";
}

int64_t conv_out_size(int64_t in, int64_t k, int s, int p, int d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

ConvChoice choose_conv_method(const std::string &requested, std::pair<int64_t, int64_t> kernel,
                              std::pair<int, int> stride, std::pair<int, int> pad, std::pair<int, int> dil,
                              std::pair<int64_t, int64_t> image, int64_t batch, int64_t out_channels, bool all_cpu,
                              bool avx2_fma, bool bf16, int64_t in_channels, bool fma, bool wino_f4_first) {
    auto invalid = [](std::string msg) { return ConvChoice{ConvMethod::im2col, std::move(msg)}; };
    // conv_2d has checked all of this (with the shapes in its messages) before it asks
    if (kernel.first < 1 || kernel.second < 1 || image.first < 1 || image.second < 1 || batch < 1 || out_channels < 1)
        return invalid("kernel, image, batch and output channels must be >= 1");
    if (stride.first < 1 || stride.second < 1 || dil.first < 1 || dil.second < 1 || pad.first < 0 || pad.second < 0)
        return invalid("stride and dilation must be >= 1, padding >= 0");
    const int64_t OW = conv_out_size(image.second, kernel.second, stride.second, pad.second, dil.second);
    const int64_t OH = conv_out_size(image.first, kernel.first, stride.first, pad.first, dil.first);
    if (OW < 1 || OH < 1) return invalid("kernel larger than padded input");

    if (requested != "auto" && requested != "im2col" && requested != "direct" && requested != "cpu_im2col" &&
        requested != "winograd" && requested != "bf16" && requested != "fma")
        return invalid("method must be auto, im2col, cpu_im2col, winograd, direct, bf16 or fma, got '" + requested +
                       "'");
    const bool even_depth = in_channels * kernel.first * kernel.second % 2 == 0;
    if (requested == "bf16" && (!bf16 || !all_cpu || !even_depth))
        return invalid("method 'bf16' needs a bf16 kernel with an even depth (in channels x KH x KW), a CPU that "
                       "runs a bf16 kernel (AVX512_BF16 or AMX) and a graph whose backends are all CPUs");
    if (requested == "bf16") return {ConvMethod::bf16, {}};
    if (requested == "fma" && (!fma || !all_cpu))
        return invalid("method 'fma' needs an f16 or f32 kernel, a CPU with AVX2, FMA and F16C and a graph whose "
                       "backends are all CPUs");
    if (requested == "fma") return {ConvMethod::fma, {}};
    const bool wino_shape = kernel.first == 3 && kernel.second == 3 && stride.first == 1 && stride.second == 1 &&
                            pad.first == 1 && pad.second == 1 && dil.first == 1 && dil.second == 1;
    if (requested == "winograd" && (!wino_shape || !all_cpu))
        return invalid("method 'winograd' needs a 3x3 kernel, stride 1, padding 1, dilation 1 and a graph whose "
                       "backends are all CPUs");
    if (requested == "cpu_im2col" && !all_cpu)
        return invalid("method 'cpu_im2col' needs a graph whose backends are all CPUs");
    if (requested == "im2col") return {ConvMethod::im2col, {}};
    if (requested == "cpu_im2col") return {ConvMethod::cpu_im2col, {}};
    if (requested == "winograd") return {ConvMethod::winograd, {}};
    if (requested == "direct") return {ConvMethod::direct, {}};
    // auto. winograd (AVX2/FMA CPUs) takes 3x3 convolutions whose rows hold at least 16 tiles of 2
    // pixels (the micro-kernel's width; from 32 pixels F(4x4) runs, wino_elements) and at least
    // 16 output channels (its panel): 0.5-0.8x the time of cpu_im2col at the VAE's and the UNet's
    // 32x32..256x256 sizes, 0.6-0.8x that of fma at 32x32 (bench/bench_ops.py --methods
    // cpu_im2col,winograd,fma). Narrower: the UNet's 16x16 level (rows of 8 tiles packed back to
    // back) measured 0.7-1.3x fma's time per op and a slower 256 px step, so fma keeps it.
    const bool wino_auto = wino_shape && all_cpu && avx2_fma && OW >= 2 * 16 && out_channels >= kWinoLanes;
    // Where it takes them, F(4x4)'s f32 product in the AVX-512 build does a quarter of the
    // multiplications at half the AVX512_BF16 product's rate: on a Zen 4 EPYC, 2 threads, batch
    // 2, the UNet's 64x64 convolutions (320 to 960 -> 320 and 640 channels) took 0.5-0.65x the
    // bf16 product's time, its 32x32 ones (320 to 1920 -> 320 to 1280 channels) 0.4-0.85x; at
    // 16x16 and 8x8 2-5x (packing the transformed kernel), so bf16 keeps those
    // (bench/bench_ops.py --methods winograd,bf16). Not with AMX (below).
    if (wino_f4_first && wino_auto) return {ConvMethod::winograd, {}};
    // bf16 (a bf16 kernel on a CPU with a bf16 kernel): 0.1-0.3x the time of winograd's f32
    // at the UNet's and the VAE's sizes with AMX (bench/bench_ops.py --methods winograd,bf16).
    if (bf16 && all_cpu && even_depth) return {ConvMethod::bf16, {}};
    if (wino_auto) return {ConvMethod::winograd, {}};
    // fma: the columns gathered straight into the product's packed panels (no im2col buffer)
    // and multiplied in f32 by FMA, from 64 output pixels (batch included): it widens and packs
    // the whole kernel per call, which fewer columns do not pay for (3x3, 1280 -> 1280, batch 2,
    // 2 threads: 0.6-0.85x ggml's time from 7x7, about 1.0x at 4x4 to 6x6, 5-6x at 1x1 and 2x2)
    const int64_t pixels = OW * OH * batch;
    if (fma && all_cpu && pixels >= kFmaMinColumns) return {ConvMethod::fma, {}};
    // cpu_im2col copies the kernel into its column order at each compute: worth it while
    // the image has at least half as many pixels as the kernel has output channels (measured by
    // bench/bench_ops.py; deep UNet levels with 8x8 images and 1280 channels lose otherwise).
    return {all_cpu && 2 * pixels >= out_channels ? ConvMethod::cpu_im2col : ConvMethod::im2col, {}};
}

Tensor Graph::conv_2d(const Tensor &w, const Tensor &x, std::pair<int, int> stride, std::pair<int, int> pad,
                      std::pair<int, int> dil, bool direct, const std::string &method,
                      std::optional<Tensor> bias) {
    room("conv_2d", 16);
    ggml_tensor *tw = use("conv_2d", w), *tx = use("conv_2d", x);
    if (w.ndim != 4 || (x.ndim != 4 && x.ndim != 3))
        fail("conv_2d", "weight must be (OC, IC, KH, KW) and x (N, IC, H, W); got " + shape_str(w) + ", " + shape_str(x));
    if (tw->type != GGML_TYPE_F32 && tw->type != GGML_TYPE_F16 && tw->type != GGML_TYPE_BF16)
        fail("conv_2d", "weight must be f32, f16 or bf16, got " + shape_str(w));
    if (tw->ne[2] != tx->ne[2])
        fail("conv_2d", "input channels differ: weight " + shape_str(w) + ", x " + shape_str(x));
    if (stride.first < 1 || stride.second < 1 || dil.first < 1 || dil.second < 1 || pad.first < 0 || pad.second < 0)
        fail("conv_2d", "stride and dilation must be >= 1, padding >= 0");
    ggml_tensor *tb = bias ? use("conv_2d", *bias) : nullptr;
    if (tb && (bias->ndim != 1 || tb->ne[0] != tw->ne[3] || !is_float(tb->type)))
        fail("conv_2d", "bias must be a float (OC,) vector for weight " + shape_str(w) + ", got " + shape_str(*bias));
    const int64_t OW = conv_out_size(tx->ne[0], tw->ne[0], stride.second, pad.second, dil.second);
    const int64_t OH = conv_out_size(tx->ne[1], tw->ne[1], stride.first, pad.first, dil.first);
    if (OW < 1 || OH < 1)
        fail("conv_2d", "kernel larger than padded input: weight " + shape_str(w) + ", x " + shape_str(x));
    const ConvChoice choice = choose_conv_method(direct ? "direct" : method, {tw->ne[1], tw->ne[0]}, stride, pad, dil,
                                                 {tx->ne[1], tx->ne[0]}, tx->ne[3], tw->ne[3], all_cpu(),
                                                 wino_fast_cpu(),
                                                 bf16_weight(tw) && bf16_kernel() != Bf16Kernel::none &&
                                                     ggml_nelements(tx) < INT32_MAX,  // the op's offsets are int32
                                                 tw->ne[2],
                                                 (tw->type == GGML_TYPE_F16 || tw->type == GGML_TYPE_F32) &&
                                                     fma_gemm_on(),
                                                 bf16_kernel() == Bf16Kernel::avx512 && wino_avx512());
    if (!choice.error.empty()) fail("conv_2d", choice.error);
    if (tw->type == GGML_TYPE_BF16 && choice.method != ConvMethod::bf16) tw = to_f32(contig(tw));
    const ConvOperands a{tw, tx, tb, bias ? &*bias : nullptr, stride, pad, dil, OW, OH};
    switch (choice.method) {
    case ConvMethod::bf16: return lower_conv_bf16(a);
    case ConvMethod::fma: return lower_conv_fma(a);
    case ConvMethod::winograd: return lower_conv_winograd(a);
    case ConvMethod::cpu_im2col: return lower_conv_cpu_im2col(a);
    case ConvMethod::direct: return lower_conv_direct(a);
    case ConvMethod::im2col: break;
    }
    return lower_conv_im2col(a);
}

// The kernel transformed and packed at each compute (wino_pack_kernel), then one fused op that
// also adds the bias; F(4x4, 3x3) from 32 pixels wide, F(2x2, 3x3) below.
Tensor Graph::lower_conv_winograd(const ConvOperands &a) {
    ggml_context *c = ctx->ctx;
    ggml_tensor *tw = a.w;
    const int64_t OCB = (tw->ne[3] + kWinoLanes - 1) / kWinoLanes;
    const int64_t E = wino_elements(a.OW);
    ggml_tensor *wa[1] = {contig(tw)};
    ggml_tensor *u = ggml_custom_4d(c, GGML_TYPE_F32, kWinoLanes, tw->ne[2], E, OCB, wa, 1, wino_pack_kernel,
                                    GGML_N_TASKS_MAX, nullptr);
    ggml_tensor *xa[3] = {to_f32(contig(a.x)), u, a.b ? to_f32(contig(a.b)) : nullptr};
    return own(ggml_custom_4d(c, GGML_TYPE_F32, a.OW, a.OH, tw->ne[3], a.x->ne[3], xa, a.b ? 3 : 2, wino_conv,
                              GGML_N_TASKS_MAX, nullptr), 4);
}

// Columns packed in bf16 and multiplied by the bf16 kernel, bias added, in one CPU op.
Tensor Graph::lower_conv_bf16(const ConvOperands &a) {
    bf16_products = true;
    return own(product_op(bf16_gemm,
                          {(int)bf16_kernel(), 1, a.stride.second, a.stride.first, a.pad.second, a.pad.first,
                           a.dil.second, a.dil.first},
                          a.x, a.w, a.b, a.OW, a.OH, a.w->ne[3], a.x->ne[3]),
               4);
}

// Columns gathered in f32 and multiplied by FMA, bias added, in one CPU op.
Tensor Graph::lower_conv_fma(const ConvOperands &a) {
    return own(product_op(fma_gemm,
                          {1, a.stride.second, a.stride.first, a.pad.second, a.pad.first, a.dil.second, a.dil.first, 0},
                          a.x, a.w, a.b, a.OW, a.OH, a.w->ne[3], a.x->ne[3]),
               4);
}

Tensor Graph::lower_conv_direct(const ConvOperands &a) {
    ggml_tensor *tx = to_f32(contig(a.x));
    return conv_add_bias(a, own(ggml_conv_2d_direct(ctx->ctx, a.w, tx, a.stride.second, a.stride.first,
                                                    a.pad.second, a.pad.first, a.dil.second, a.dil.first), 4));
}

// Columns in (kh, kw, ic) order by cpu_im2col and the kernel reordered to match by
// cpu_kernel_order (kernels/im2col.cpp), then one mul_mat.
Tensor Graph::lower_conv_cpu_im2col(const ConvOperands &a) {
    ggml_tensor *tw = a.w, *tx = to_f32(contig(a.x));
    ggml_context *c = ctx->ctx;
    const int64_t N = tx->ne[3], OC = tw->ne[3], IC = tw->ne[2];
    const int64_t K = tw->ne[0] * tw->ne[1] * IC;
    custom_params.push_back({(int)tw->ne[0], (int)tw->ne[1], a.stride.second, a.stride.first, a.pad.second,
                             a.pad.first, a.dil.second, a.dil.first});
    void *prm = custom_params.back().data();
    ggml_tensor *args[1] = {tx};
    ggml_tensor *cols = ggml_custom_4d(c, tw->type, K, a.OW * a.OH * N, 1, 1, args, 1, cpu_im2col,
                                       GGML_N_TASKS_MAX, prm);
    // kernel [KW, KH, IC, OC] -> [IC, KW, KH, OC]: the same (kh, kw, ic) order as the columns
    ggml_tensor *wargs[1] = {contig(tw)};
    ggml_tensor *kt = ggml_custom_4d(c, tw->type, IC, tw->ne[0], tw->ne[1], OC, wargs, 1, cpu_kernel_order,
                                     GGML_N_TASKS_MAX, nullptr);
    return conv_add_bias(a, conv_columns_result(a, ggml_mul_mat(c, cols, ggml_reshape_2d(c, kt, K, OC))));
}

// im2col + mul_mat like ggml_conv_2d, but keeping f32 columns for an f32 kernel (ggml_conv_2d
// always rounds the columns to f16).
Tensor Graph::lower_conv_im2col(const ConvOperands &a) {
    ggml_tensor *tw = a.w, *tx = to_f32(contig(a.x));
    ggml_context *c = ctx->ctx;
    const int64_t N = tx->ne[3], OC = tw->ne[3];
    const int64_t K = tw->ne[0] * tw->ne[1] * tw->ne[2];
    ggml_tensor *cols = ggml_im2col(c, tw, tx, a.stride.second, a.stride.first, a.pad.second, a.pad.first,
                                    a.dil.second, a.dil.first, true, tw->type);  // [N, OH, OW, IC*KH*KW]
    ggml_tensor *mm =
        ggml_mul_mat(c, ggml_reshape_2d(c, cols, K, a.OW * a.OH * N), ggml_reshape_2d(c, contig(tw), K, OC));
    return conv_add_bias(a, conv_columns_result(a, mm));
}

Tensor Graph::conv_columns_result(const ConvOperands &a, ggml_tensor *mm) {
    ggml_context *c = ctx->ctx;
    const int64_t N = a.x->ne[3], OC = a.w->ne[3];
    ggml_tensor *r = ggml_reshape_4d(c, mm, a.OW, a.OH, N, OC);
    r = N == 1 ? ggml_reshape_4d(c, r, a.OW, a.OH, OC, 1) : ggml_cont(c, ggml_permute(c, r, 0, 1, 3, 2));
    return own(r, 4);
}

// The bias of the column and direct paths: the per-channel add of Graph::binary.
Tensor Graph::conv_add_bias(const ConvOperands &a, const Tensor &y) {
    return a.bias ? binary("add", y, reshape(*a.bias, {a.w->ne[3], 1, 1})) : y;
}

Tensor Graph::conv_transpose_2d(const Tensor &w, const Tensor &x, int stride) {
    room("conv_transpose_2d", 4);
    ggml_tensor *tw = use("conv_transpose_2d", w), *tx = use("conv_transpose_2d", x);
    if (w.ndim != 4 || x.ndim < 3)
        fail("conv_transpose_2d", "weight must be (IC, OC, KH, KW) and x (N, IC, H, W); got " + shape_str(w) + ", " + shape_str(x));
    if (tw->type != GGML_TYPE_F32 && tw->type != GGML_TYPE_F16 && tw->type != GGML_TYPE_BF16)
        fail("conv_transpose_2d", "weight must be f32, f16 or bf16, got " + shape_str(w));
    if (tw->type == GGML_TYPE_BF16) tw = to_f32(contig(tw));
    if (tw->ne[3] != tx->ne[2])
        fail("conv_transpose_2d", "input channels differ: weight " + shape_str(w) + ", x " + shape_str(x));
    if (stride < 1) fail("conv_transpose_2d", "stride must be >= 1");
    tx = to_f32(contig(tx));
    return own(ggml_conv_transpose_2d_p0(ctx->ctx, contig(tw), tx, stride), 4);
}

Tensor Graph::upscale(const Tensor &a, int factor) {
    room("upscale", 3);
    ggml_tensor *t = use("upscale", a);
    if (factor < 1) fail("upscale", "factor must be >= 1");
    if (a.ndim < 2) fail("upscale", "needs at least (H, W), got " + shape_str(a));
    t = to_f32(contig(t));
    return own(ggml_upscale(ctx->ctx, t, factor, GGML_SCALE_MODE_NEAREST), a.ndim);
}

Tensor Graph::interpolate(const Tensor &a, const std::vector<int64_t> &shape, const std::string &mode,
                          bool align_corners) {
    room("interpolate", 3);
    ggml_tensor *t = use("interpolate", a);
    if ((int)shape.size() != a.ndim) fail("interpolate", "shape must have rank " + std::to_string(a.ndim));
    int64_t ne[4];
    shape_to_ne(shape, ne, "interpolate");
    uint32_t m;
    if (mode == "nearest") m = GGML_SCALE_MODE_NEAREST;
    else if (mode == "bilinear") m = GGML_SCALE_MODE_BILINEAR;
    else if (mode == "bicubic") m = GGML_SCALE_MODE_BICUBIC;
    else fail("interpolate", "mode must be nearest, bilinear or bicubic, got '" + mode + "'");
    if (align_corners) m |= GGML_SCALE_FLAG_ALIGN_CORNERS;
    t = to_f32(contig(t));
    return own(ggml_interpolate(ctx->ctx, t, ne[0], ne[1], ne[2], ne[3], m), a.ndim);
}

Tensor Graph::pad(const Tensor &a, const std::vector<std::pair<int, int>> &pads) {
    room("pad", 3);
    ggml_tensor *t = use("pad", a);
    if ((int)pads.size() != a.ndim)
        fail("pad", "give one (before, after) pair per axis (" + std::to_string(a.ndim) + ")");
    int lp[4] = {0, 0, 0, 0}, rp[4] = {0, 0, 0, 0};
    for (int k = 0; k < a.ndim; ++k) {
        if (pads[k].first < 0 || pads[k].second < 0) fail("pad", "padding must be >= 0");
        lp[a.ndim - 1 - k] = pads[k].first;
        rp[a.ndim - 1 - k] = pads[k].second;
    }
    t = to_f32(contig(t));
    return own(ggml_pad_ext(ctx->ctx, t, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3]), a.ndim);
}

Tensor Graph::concat(const Tensor &a, const Tensor &b, int axis) {
    room("concat", 5);
    ggml_tensor *ta = use("concat", a), *tb = use("concat", b);
    const int nd = std::max(a.ndim, b.ndim);
    const int dim = axis_to_dim("concat", axis, nd);
    for (int d = 0; d < 4; ++d)
        if (d != dim && ta->ne[d] != tb->ne[d])
            fail("concat", "shapes differ off the concat axis: a " + shape_str(a) + ", b " + shape_str(b));
    if (ta->type != tb->type) {
        ta = to_f32(ta);
        tb = to_f32(tb);
    }
    return own(ggml_concat(ctx->ctx, ta, tb, dim), nd);
}

// ---- shape ops

Tensor Graph::permute(const Tensor &a, const std::vector<int> &axes) {
    room("permute", 1);
    ggml_tensor *t = use("permute", a);
    const int n = a.ndim;
    if ((int)axes.size() != n) fail("permute", "axes must list every axis of " + shape_str(a));
    int p[4] = {0, 1, 2, 3};
    std::vector<bool> seen(n, false);
    for (int i = 0; i < n; ++i) {
        int ax = axes[i] < 0 ? axes[i] + n : axes[i];
        if (ax < 0 || ax >= n || seen[ax]) fail("permute", "axes must be a permutation of 0..ndim-1");
        seen[ax] = true;
        p[n - 1 - ax] = n - 1 - i;  // source ggml dim -> destination ggml dim
    }
    return own(ggml_permute(ctx->ctx, t, p[0], p[1], p[2], p[3]), n);
}

Tensor Graph::transpose(const Tensor &a) {
    room("transpose", 1);
    ggml_tensor *t = use("transpose", a);
    return own(ggml_transpose(ctx->ctx, t), std::max(a.ndim, 2));
}

Tensor Graph::reshape(const Tensor &a, const std::vector<int64_t> &shape_in) {
    room("reshape", 2);
    ggml_tensor *t = use("reshape", a);
    std::vector<int64_t> shape = shape_in;
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == -1) {
            if (infer >= 0) fail("reshape", "only one dimension may be -1");
            infer = (int64_t)i;
        } else {
            if (shape[i] < 1) fail("reshape", "dimensions must be >= 1 or -1");
            known *= shape[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || ggml_nelements(t) % known) fail("reshape", "cannot infer -1 for " + shape_str(a));
        shape[infer] = ggml_nelements(t) / known;
    }
    int64_t ne[4];
    shape_to_ne(shape, ne, "reshape");
    if (ne[0] * ne[1] * ne[2] * ne[3] != ggml_nelements(t))
        fail("reshape", "element count differs: " + shape_str(a) + " has " + std::to_string(ggml_nelements(t)));
    if (ggml_is_quantized(t->type) && ne[0] % ggml_blck_size(t->type))
        fail("reshape", "quantized rows must stay whole blocks");
    t = contig(t);
    return own(ggml_reshape_4d(ctx->ctx, t, ne[0], ne[1], ne[2], ne[3]), (int)shape.size());
}

Tensor Graph::view(const Tensor &a, const std::vector<int64_t> &shape, std::optional<std::vector<int64_t>> strides,
                   int64_t offset) {
    room("view", 1);
    ggml_tensor *t = use("view", a);
    int64_t ne[4];
    shape_to_ne(shape, ne, "view");
    const int n = (int)shape.size();
    if (ggml_is_quantized(t->type)) fail("view", "views of quantized tensors are not supported");
    const size_t es = ggml_type_size(t->type);
    size_t nb[4];
    if (strides) {
        if ((int)strides->size() != n) fail("view", "strides must have one entry per dimension");
        for (int k = 0; k < n; ++k) {
            if ((*strides)[k] < 0) fail("view", "strides must be >= 0");
            nb[n - 1 - k] = (size_t)(*strides)[k];
        }
        if (nb[0] != es) fail("view", "the innermost stride must equal the element size (" + std::to_string(es) + ")");
        for (int d = n; d < 4; ++d) nb[d] = nb[d - 1] * ne[d - 1];
    } else {
        if (!ggml_is_contiguous(t)) fail("view", "a view without strides needs a contiguous tensor");
        nb[0] = es;
        for (int d = 1; d < 4; ++d) nb[d] = nb[d - 1] * ne[d - 1];
    }
    if (offset < 0) fail("view", "offset must be >= 0");
    size_t last = (size_t)offset + es;
    for (int d = 0; d < 4; ++d) last += (size_t)(ne[d] - 1) * nb[d];
    if (last > ggml_nbytes(t))
        fail("view", "view reaches byte " + std::to_string(last) + " of a tensor of " +
                         std::to_string(ggml_nbytes(t)) + " bytes " + shape_str(a));
    size_t dense = es;  // ggml asserts that the view's elements, packed, fit after the offset
    for (int d = 0; d < 4; ++d) dense *= (size_t)ne[d];
    if ((size_t)offset + dense > ggml_nbytes(t))
        fail("view", "ggml needs the view's " + std::to_string(dense) + " bytes (its elements, packed) after offset " +
                         std::to_string(offset) + " within the tensor's " + std::to_string(ggml_nbytes(t)) +
                         " bytes " + shape_str(a) + "; broadcast the tensor instead");
    return own(ggml_view_4d(ctx->ctx, t, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], (size_t)offset), n);
}

Tensor Graph::cont(const Tensor &a) {
    room("cont", 1);
    return own(copy_contiguous(use("cont", a)), a.ndim);
}

Tensor Graph::cast(const Tensor &a, const std::string &dtype) {
    room("cast", 2);
    ggml_tensor *t = use("cast", a);
    ggml_type to = dtype_from_name(dtype, "cast");
    if (to == t->type) return own(ggml_cont(ctx->ctx, t), a.ndim);
    if (!is_float(t->type)) fail("cast", "source must be a float tensor, got " + shape_str(a));
    if (ggml_is_quantized(to) && (t->type != GGML_TYPE_F32 || t->ne[0] % ggml_blck_size(to)))
        fail("cast", "quantizing needs f32 rows that are whole blocks, got " + shape_str(a));
    return own(ggml_cast(ctx->ctx, contig(t), to), a.ndim);
}

Tensor Graph::repeat(const Tensor &a, const std::vector<int64_t> &shape) {
    room("repeat", 2);
    ggml_tensor *t = use("repeat", a);
    int64_t ne[4];
    shape_to_ne(shape, ne, "repeat");
    for (int d = 0; d < 4; ++d)
        if (ne[d] % t->ne[d]) fail("repeat", "target shape must be a multiple of " + shape_str(a));
    return own(ggml_repeat_4d(ctx->ctx, t, ne[0], ne[1], ne[2], ne[3]), std::max((int)shape.size(), a.ndim));
}

Tensor Graph::get_rows(const Tensor &a, const Tensor &ids) {
    room("get_rows", 2);
    ggml_tensor *ta = use("get_rows", a), *ti = use("get_rows", ids);
    if (ti->type != GGML_TYPE_I32) fail("get_rows", "ids must be i32, got " + shape_str(ids));
    if (ids.ndim > 3 || ta->ne[2] != ti->ne[1] || ta->ne[3] != ti->ne[2])
        fail("get_rows", "table " + shape_str(a) + " and ids " + shape_str(ids) +
                             " do not fit (table (..., rows, cols), ids (..., n))");
    return own(ggml_get_rows(ctx->ctx, ta, ti), std::max(a.ndim, ids.ndim + 1));
}

Tensor Graph::rope(const Tensor &a, const Tensor &pos, int n_dims, int mode, std::optional<std::vector<int>> sections,
                   int n_ctx_orig, float freq_base, float freq_scale, float ext_factor, float attn_factor,
                   float beta_fast, float beta_slow, std::optional<Tensor> freq_factors) {
    room("rope", 3);
    ggml_tensor *t = use("rope", a), *tp = use("rope", pos);
    if (a.ndim < 3) fail("rope", "x must be (B, T, H, D) or (T, H, D), got " + shape_str(a));
    if (tp->type != GGML_TYPE_I32 || !ggml_is_vector(tp)) fail("rope", "positions must be an i32 vector, got " + shape_str(pos));
    if (n_dims < 2 || n_dims % 2 || n_dims > t->ne[0])
        fail("rope", "n_dims must be even and <= head dim for " + shape_str(a));
    if (!is_float(t->type)) fail("rope", "float tensor required, got " + shape_str(a));
    if (mode & 1) fail("rope", "mode must be 0 (normal), 2 (neox), 8 (mrope), 24 (vision) or 40 (imrope)");
    const bool multi = (mode & GGML_ROPE_TYPE_MROPE) != 0;
    if (multi != (bool)sections) fail("rope", "sections are required exactly for mrope, vision and imrope modes");
    if (tp->ne[0] != (multi ? 4 : 1) * t->ne[2])
        fail("rope", "positions " + shape_str(pos) + " must have " + (multi ? "4*T" : "T") + " entries for " + shape_str(a));
    ggml_tensor *tc = nullptr;
    if (freq_factors) {
        tc = use("rope", *freq_factors);
        if (tc->type != GGML_TYPE_F32 || tc->ne[0] < n_dims / 2) fail("rope", "freq_factors must be f32 with n_dims/2 entries");
    }
    t = to_f32(t);
    ggml_tensor *r;
    if (multi) {
        if (sections->size() != 4) fail("rope", "sections must have 4 entries");
        int s[GGML_MROPE_SECTIONS] = {(*sections)[0], (*sections)[1], (*sections)[2], (*sections)[3]};
        r = ggml_rope_multi(ctx->ctx, t, tp, tc, n_dims, s, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                            attn_factor, beta_fast, beta_slow);
    } else {
        r = ggml_rope_ext(ctx->ctx, t, tp, tc, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                          attn_factor, beta_fast, beta_slow);
    }
    return own(r, a.ndim);
}

Tensor Graph::timestep_embedding(const Tensor &ts, int dim, int max_period) {
    room("timestep_embedding", 2);
    ggml_tensor *t = use("timestep_embedding", ts);
    if (!ggml_is_vector(t) || t->type != GGML_TYPE_F32)
        fail("timestep_embedding", "timesteps must be an f32 vector, got " + shape_str(ts));
    if (dim < 2 || max_period < 1) fail("timestep_embedding", "dim must be >= 2 and max_period >= 1");
    return own(ggml_timestep_embedding(ctx->ctx, t, dim, max_period), 2);
}

Tensor Graph::reduce(const std::string &kind, const Tensor &a) {
    room(kind.c_str(), 2);
    ggml_tensor *t = to_f32(contig(use(kind.c_str(), a)));
    if (kind == "sum_rows") return own(ggml_sum_rows(ctx->ctx, t), a.ndim);
    if (kind == "mean") return own(ggml_mean(ctx->ctx, t), a.ndim);
    fail("reduce", "unknown reduction '" + kind + "'");
}

}  // namespace sdplan
