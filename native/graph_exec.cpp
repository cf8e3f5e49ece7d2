// Graph execution (build, reserve, compute, inputs/outputs) and the Python bindings of
// Tensor and Graph.
#include "graph.h"
#include "kernels/bf16_gemm.h"
#include "kernels/fma_gemm.h"
#include "kernels/glu.h"
#include "kernels/winograd.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <tuple>

namespace sdplan {

namespace {

template <typename Fn>
Fn backend_proc(const Backend &b, const char *name) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(b.device);
    return reg ? (Fn)ggml_backend_reg_get_proc_address(reg, name) : nullptr;
}

bool abort_cb(void *data) { return static_cast<Graph *>(data)->cancel_flag.load(); }

bool eval_cb(ggml_tensor *t, bool ask, void *data) {
    auto *g = static_cast<Graph *>(data);
    if (ask) return g->cancel_flag.load() || g->checkpoints.count(t) > 0 || g->profiling;
    if (g->profiling) {
        auto now = std::chrono::steady_clock::now();
        g->profile_rows.push_back({t, std::chrono::duration<double>(now - g->profile_last).count()});
        g->profile_last = std::chrono::steady_clock::now();
    }
    return !g->cancel_flag.load();
}

// numpy dtype string of a ggml type, or nullptr when there is none.
const char *np_dtype(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32: return "float32";
        case GGML_TYPE_F16: return "float16";
        case GGML_TYPE_I32: return "int32";
        default: return nullptr;
    }
}

bool dtype_matches(const nb::dlpack::dtype &d, ggml_type t) {
    using nb::dlpack::dtype_code;
    switch (t) {
        case GGML_TYPE_F32: return d.code == (uint8_t)dtype_code::Float && d.bits == 32;
        case GGML_TYPE_F16: return d.code == (uint8_t)dtype_code::Float && d.bits == 16;
        case GGML_TYPE_I32: return d.code == (uint8_t)dtype_code::Int && d.bits == 32;
        default: return false;
    }
}

using HostArray = nb::ndarray<nb::c_contig, nb::device::cpu>;
// Arrays that are only read (inputs): read-only numpy views such as np.broadcast_to are fine.
using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

}  // namespace

bool is_view_op(ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

namespace {

// Reorders gf's nodes so that every view node follows its source node directly (views of
// leafs stay where they are: just before their first user).
//
// The scheduler cuts splits at non-view nodes, so a view node belongs to the split of the
// last non-view node before it. Depth-first graph order puts a view right before its first
// user, which can be the tail of another device's split (the producer on device A, the
// previous node on device B). Computing nothing, such a view is harmless on most backends,
// but an RPC backend serializes every node of a split with its buffer: a view of a tensor
// in server A's buffer sent to server B makes B reject the graph and drop the connection.
// Placing views directly after their source keeps them in their source's split; it stays a
// topological order because a view's only source is that node.
void views_after_sources(ggml_cgraph *gf) {
    const int n = ggml_graph_n_nodes(gf);
    std::unordered_set<ggml_tensor *> nodes;
    for (int i = 0; i < n; ++i) nodes.insert(ggml_graph_node(gf, i));
    std::unordered_map<ggml_tensor *, std::vector<ggml_tensor *>> children;
    for (int i = 0; i < n; ++i) {
        ggml_tensor *t = ggml_graph_node(gf, i);
        if (is_view_op(t->op) && t->src[0] && nodes.count(t->src[0])) children[t->src[0]].push_back(t);
    }
    if (children.empty()) return;
    std::vector<ggml_tensor *> order;
    order.reserve(n);
    std::vector<ggml_tensor *> stack;
    for (int i = 0; i < n; ++i) {
        ggml_tensor *t = ggml_graph_node(gf, i);
        if (is_view_op(t->op) && t->src[0] && nodes.count(t->src[0])) continue;  // placed with its source
        stack.push_back(t);
        while (!stack.empty()) {
            ggml_tensor *u = stack.back();
            stack.pop_back();
            order.push_back(u);
            auto it = children.find(u);
            if (it == children.end()) continue;
            for (auto c = it->second.rbegin(); c != it->second.rend(); ++c) stack.push_back(*c);
        }
    }
    if ((int)order.size() != n) throw std::runtime_error("Graph.build: view reordering lost nodes");
    ggml_tensor **dst = ggml_graph_nodes(gf);
    for (int i = 0; i < n; ++i) dst[i] = order[i];
}

}  // namespace

void Graph::build() {
    if (gf) return;
    if (outputs.empty()) throw nb::value_error("Graph.build: declare at least one output");
    int n = 0;
    for (ggml_tensor *t = ggml_get_first_tensor(ctx->ctx); t; t = ggml_get_next_tensor(ctx->ctx, t)) ++n;
    capacity = n + (int)ext.size() + 64;
    gctx = std::make_unique<Context>(ggml_graph_overhead_custom(capacity, false) + 1024);
    gf = ggml_new_graph_custom(gctx->ctx, capacity, false);
    for (auto &kv : outputs) ggml_build_forward_expand(gf, kv.second.t);
    views_after_sources(gf);
    // The scheduler rewrites node sources to its per-split copies (tensors of its own
    // context, gone with the next split or the scheduler); keep the originals, by node, so
    // the graph can be split again (new scheduler, reserve) without dangling sources. By
    // node rather than by position: a backend's graph_optimize may reorder split nodes.
    orig_src.clear();
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor *t = ggml_graph_node(gf, i);
        std::array<ggml_tensor *, GGML_MAX_SRC> srcs;
        for (int j = 0; j < GGML_MAX_SRC; ++j) srcs[j] = t->src[j];
        orig_src.emplace_back(t, srcs);
    }
    // keep only assignments of nodes that made it into the graph
    std::unordered_set<ggml_tensor *> nodes;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) nodes.insert(ggml_graph_node(gf, i));
    std::vector<std::pair<ggml_tensor *, int>> kept;
    for (auto &a : assign)
        if (nodes.count(a.first)) kept.push_back(a);
    assign.swap(kept);
    // weights must live where some backend of this graph can read them
    for (auto &kv : ext) {
        ggml_tensor *t = kv.first;
        ggml_backend_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
        ggml_backend_buffer_type_t buft = buf ? ggml_backend_buffer_get_type(buf) : kv.second;
        if (!buft) continue;
        bool ok = false;
        for (auto &b : backends) ok = ok || ggml_backend_supports_buft(b->get(), buft);
        if (!ok)
            throw nb::value_error(("Graph.build: weight '" + tensor_name(t) + "' lives in buffer type " +
                                   ggml_backend_buft_name(buft) + ", which no backend of this graph can use")
                                      .c_str());
    }
}

void Graph::restore_srcs() {
    for (auto &ns : orig_src)
        for (int j = 0; j < GGML_MAX_SRC; ++j) ns.first->src[j] = ns.second[j];
}

void Graph::check_split_views() {
    // After a split: a view node in a split of another backend must not reference a buffer
    // that backend cannot address (see views_after_sources); RPC servers would drop the
    // connection on such a graph, so refuse it here with the names involved.
    ggml_backend_t cur = nullptr;
    for (int i = 0; i < ggml_graph_n_nodes(gf) && !cur; ++i) {
        ggml_tensor *t = ggml_graph_node(gf, i);
        if (!is_view_op(t->op)) cur = ggml_backend_sched_get_tensor_backend(sched, t);
    }
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor *t = ggml_graph_node(gf, i);
        if (!is_view_op(t->op)) {
            if (ggml_backend_t b = ggml_backend_sched_get_tensor_backend(sched, t)) cur = b;
            continue;
        }
        ggml_backend_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
        if (!cur || !buf || ggml_backend_supports_buft(cur, ggml_backend_buffer_get_type(buf))) continue;
        if (ggml_backend_buffer_is_host(buf)) continue;  // serialized without an address
        throw std::runtime_error("Graph: view '" + tensor_name(t) + "' of a tensor in " +
                                 ggml_backend_buffer_name(buf) + " lands in a split of " + ggml_backend_name(cur) +
                                 ", which cannot address it; pin the view's users to the tensor's device");
    }
}

void Graph::reset_tensors() {
    // Forget addresses in a freed or outdated compute allocation (and views of weights
    // that may have moved); the next allocation assigns them afresh.
    for (ggml_tensor *t = ggml_get_first_tensor(ctx->ctx); t; t = ggml_get_next_tensor(ctx->ctx, t)) {
        t->data = nullptr;
        t->buffer = nullptr;
    }
    allocated = false;
    computed = false;
}

bool Graph::weights_moved() const {
    // A freed weight buffer may leave the same addresses behind for a new one while views
    // of the weights still point at the freed buffer object: any free since the allocation
    // counts as a move.
    if (weight_epoch.load() != alloc_epoch) return true;
    for (auto &kv : ext_data)
        if (kv.first->data != kv.second.first || kv.first->buffer != kv.second.second) return true;
    return false;
}

void Graph::make_sched() {
    build();
    if (sched) return;
    std::vector<ggml_backend_t> hs;
    for (auto &b : backends) hs.push_back(b->get());
    sched = ggml_backend_sched_new(hs.data(), nullptr, (int)hs.size(), (size_t)capacity, false, false);
    if (!sched) throw std::runtime_error("Graph: ggml_backend_sched_new failed");
    allocated = false;
}

void Graph::apply_assignments() {
    for (auto &a : assign) ggml_backend_sched_set_tensor_backend(sched, a.first, backends[a.second]->get());
}

void Graph::check_resident() {
    for (auto &kv : ext) {
        ggml_tensor *t = kv.first;
        if (!t->buffer && !(t->view_src && t->view_src->buffer))
            throw std::runtime_error("Graph: weight '" + tensor_name(t) +
                                     "' is not resident; load or stage its weights before computing");
    }
}

void Graph::ensure_alloc() {
    make_sched();
    if (allocated && !weights_moved()) return;
    check_resident();
    reset_tensors();
    // Reserve first: ggml's reserve reports a failed buffer allocation cleanly, while an
    // allocation failure inside ggml_gallocr_alloc_graph crashes the process.
    restore_srcs();
    ggml_backend_sched_reset(sched);
    apply_assignments();
    bool ok;
    {
        nb::gil_scoped_release nogil;
        ok = ggml_backend_sched_reserve(sched, gf);
    }
    if (ok) {
        restore_srcs();
        ggml_backend_sched_reset(sched);
        apply_assignments();
        nb::gil_scoped_release nogil;
        ok = ggml_backend_sched_alloc_graph(sched, gf);
    }
    if (!ok) {
        free_sched();
        throw std::runtime_error("Graph: could not allocate the compute buffers (out of device memory?)");
    }
    check_split_views();
    allocated = true;
    computed = false;
    ext_data.clear();
    for (auto &kv : ext) ext_data[kv.first] = {kv.first->data, kv.first->buffer};
    alloc_epoch = weight_epoch.load();
}

std::vector<size_t> Graph::reserve() {
    make_sched();
    // weights not loaded yet: point them at a tiny placeholder buffer of their planned
    // buffer type so the scheduler places and measures as if they were resident.
    std::map<ggml_backend_buffer_type_t, ggml_backend_buffer_t> holders;
    std::vector<ggml_tensor *> faked;
    auto restore = [&]() {
        for (ggml_tensor *t : faked) {
            t->buffer = nullptr;
            t->data = nullptr;
        }
        for (auto &h : holders) ggml_backend_buffer_free(h.second);
    };
    for (auto &kv : ext) {
        ggml_tensor *t = kv.first;
        if (t->buffer || (t->view_src && t->view_src->buffer)) continue;
        if (t->view_src) {
            restore();
            throw std::runtime_error("Graph.reserve: weight view '" + tensor_name(t) + "' is not resident");
        }
        if (!kv.second) {
            restore();
            throw std::runtime_error("Graph.reserve: weight '" + tensor_name(t) +
                                     "' is neither resident nor planned on a device");
        }
        auto it = holders.find(kv.second);
        if (it == holders.end()) {
            ggml_backend_buffer_t b = ggml_backend_buft_alloc_buffer(kv.second, 512);
            if (!b) {
                restore();
                throw std::runtime_error("Graph.reserve: could not allocate a placeholder buffer");
            }
            ggml_backend_buffer_set_usage(b, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            it = holders.emplace(kv.second, b).first;
        }
        t->buffer = it->second;
        t->data = ggml_backend_buffer_get_base(it->second);
        faked.push_back(t);
    }
    bool ok;
    reset_tensors();
    restore_srcs();
    ggml_backend_sched_reset(sched);
    apply_assignments();
    {
        nb::gil_scoped_release nogil;
        ok = ggml_backend_sched_reserve(sched, gf);
    }
    restore();
    allocated = false;
    if (!ok) {
        free_sched();
        throw std::runtime_error("Graph.reserve: could not allocate the compute buffers (out of device memory?)");
    }
    return buffer_sizes();
}

std::vector<size_t> Graph::buffer_sizes() {
    std::vector<size_t> out;
    for (auto &b : backends) out.push_back(sched ? ggml_backend_sched_get_buffer_size(sched, b->get()) : 0);
    return out;
}

void Graph::compute() {
    ensure_alloc();
    using set_abort_t = ggml_backend_set_abort_callback_t;
    using set_threads_t = ggml_backend_set_n_threads_t;
    std::vector<std::pair<set_abort_t, ggml_backend_t>> aborts;
    for (auto &b : backends) {
        if (n_threads > 0)
            if (auto f = backend_proc<set_threads_t>(*b, "ggml_backend_set_n_threads")) f(b->get(), n_threads);
        if (auto f = backend_proc<set_abort_t>(*b, "ggml_backend_set_abort_callback")) {
            f(b->get(), abort_cb, this);
            aborts.emplace_back(f, b->get());
        }
    }
    const bool stepwise = !checkpoints.empty() || profiling;
    if (stepwise) ggml_backend_sched_set_eval_callback(sched, eval_cb, this);
    cancel_flag.store(false);
    profile_rows.clear();
    profile_last = std::chrono::steady_clock::now();
    ggml_status st;
    {
        nb::gil_scoped_release nogil;
        st = ggml_backend_sched_graph_compute(sched, gf);
    }
    for (auto &a : aborts) a.first(a.second, nullptr, nullptr);
    if (stepwise) ggml_backend_sched_set_eval_callback(sched, nullptr, nullptr);
    if (cancel_flag.exchange(false)) {
        computed = false;
        throw ComputeCancelled("compute cancelled");
    }
    if (st != GGML_STATUS_SUCCESS)
        throw std::runtime_error("Graph.compute failed with ggml status " + std::to_string((int)st));
    computed = true;
}

// ------------------------------------------------------------------ bindings

void register_tensor(nb::module_ &m) {
    nb::class_<Tensor>(m, "Tensor", "A ggml tensor of a Graph or a WeightStore (numpy-order shape).")
        .def_prop_ro("shape", [](const Tensor &x) {
            auto s = np_shape(x.t, x.ndim);
            nb::list l;
            for (auto v : s) l.append(v);
            return nb::tuple(l);
        }, "Shape, outermost first (numpy order).")
        .def_prop_ro("ndim", [](const Tensor &x) { return x.ndim; })
        .def_prop_ro("dtype", [](const Tensor &x) { return dtype_name(x.t->type); }, "ggml type name: f32, f16, q8_0, ...")
        .def_prop_ro("nbytes", [](const Tensor &x) { return ggml_nbytes(x.t); }, "Bytes of the tensor's data.")
        .def_prop_ro("name", [](const Tensor &x) { return tensor_name(x.t); })
        .def_prop_ro("is_contiguous", [](const Tensor &x) { return ggml_is_contiguous(x.t); })
        .def_prop_ro("is_weight", [](const Tensor &x) { return x.weight; })
        .def_prop_ro("resident", [](const Tensor &x) { return x.t->buffer != nullptr || (x.t->view_src && x.t->view_src->buffer); },
                     "True when the tensor's data is allocated in a backend buffer.")
        .def("__repr__", [](const Tensor &x) { return "<Tensor '" + tensor_name(x.t) + "' " + shape_str(x) + ">"; });
}

void register_graph(nb::module_ &m) {
    register_tensor(m);
    static nb::object cancelled = nb::exception<ComputeCancelled>(m, "ComputeCancelled", PyExc_RuntimeError);
    (void)cancelled;

    using P2 = std::pair<int, int>;
    nb::class_<Graph>(m, "Graph",
        "A ggml compute graph over backends (first = main device, last = a CPU backend as\n"
        "the scheduler's fallback). Build it once per input shape with the op methods,\n"
        "declare outputs, then set_input/compute/get_output as often as needed. Set every input\n"
        "again before each compute: the graph's intermediates reuse the inputs' memory once their\n"
        "last reader has run, so a second compute without them reads what those left there.")
        .def(nb::init<std::vector<std::shared_ptr<Backend>>, int, int>(), nb::arg("backends"),
             nb::arg("max_nodes") = 16384, nb::arg("n_threads") = 0)
        .def_prop_ro("devices", [](const Graph &g) {
            std::vector<std::string> n;
            for (auto &b : g.backends) n.push_back(b->device_name);
            return n;
        }, "Device names of the graph's backends, in scheduler order.")
        .def_prop_ro("main_cpu", [](const Graph &g) {
            const auto &b = g.backends.front();
            return !b->stand_in && ggml_backend_dev_type(b->device) == GGML_BACKEND_DEVICE_TYPE_CPU;
        }, "Whether the main (first) backend is a CPU (a stand-in for another device is not).")
        .def_prop_ro("built", [](const Graph &g) { return g.gf != nullptr; })
        .def_prop_ro("allocated", [](const Graph &g) { return g.allocated; })
        .def_prop_ro("n_nodes", [](const Graph &g) { return g.gf ? ggml_graph_n_nodes(g.gf) : 0; })
        .def_prop_ro("n_splits", [](const Graph &g) { return g.sched ? ggml_backend_sched_get_n_splits(g.sched) : 0; })
        .def_prop_ro("input_names", [](const Graph &g) {
            std::vector<std::string> n;
            for (auto &kv : g.inputs) n.push_back(kv.first);
            return n;
        })
        .def_prop_ro("output_names", [](const Graph &g) {
            std::vector<std::string> n;
            for (auto &kv : g.outputs) n.push_back(kv.first);
            return n;
        })
        .def_prop_ro("weight_names", [](const Graph &g) {
            std::vector<std::string> n;
            for (auto &kv : g.ext) n.push_back(tensor_name(kv.first));
            return n;
        }, "Names of the weight tensors the graph reads.")
        .def_prop_rw("scope", [](const Graph &g) { return g.scope; }, &Graph::set_scope,
                     "Backend index that new ops are pinned to (-1: let the scheduler choose).")
        .def("input", &Graph::input, nb::arg("name"), nb::arg("shape"), nb::arg("dtype") = "f32")
        .def("output", &Graph::output, nb::arg("name"), nb::arg("x"))
        .def("checkpoint", &Graph::checkpoint, nb::arg("x"),
             "Mark a node where a cancel can stop backends without an abort callback (RPC).")
        .def_rw("bf16_attention", &Graph::attention_bf16,
                "Run flash_attn as sdplan's bf16 attention op (CPU-only graphs, a bf16 kernel) even before\n"
                "the graph has a bf16 product (by default it does only after one: bf16 weights).")
        .def_rw("f16_as_bf16", &Graph::f16_as_bf16,
                "mul_mat and conv_2d with f16 weights run sdplan's bf16 kernel as bf16 weights do (CPU-only\n"
                "graphs, a bf16 kernel): the f16 values rounded to bf16 as they are used, so the weights stay\n"
                "in f16 (mapped from the file); each product gives the bits that weights converted to bf16 give.")
        .def_rw("quant_as_bf16", &Graph::quant_as_bf16,
                "mul_mat with Q8_0, Q4_K or Q5_K weights runs sdplan's bf16 kernel (CPU-only graphs, a bf16\n"
                "kernel): each block dequantised as ggml does and rounded to bf16 as it is used; the weights\n"
                "stay quantised (mapped from the file).")
        .def_prop_ro("bf16_products", [](const Graph &g) { return g.bf16_products; },
                     "True once a mul_mat or conv_2d of this graph ran the bf16 kernel.")
        .def("mul_mat", &Graph::mul_mat, nb::arg("a"), nb::arg("b"), nb::arg("bias") = nb::none(),
             "b @ a.T (+ bias): a (..., M, K), b (..., N, K) -> (..., N, M); bias (M,) added per column.\n"
             "A 2-D bf16 a on a graph whose backends are all CPUs runs sdplan's bf16 kernel (AMX or\n"
             "AVX512_BF16, set_bf16_kernel) with b rounded to bf16 and f32 sums.")
        .def("add", [](Graph &g, const Tensor &a, const Tensor &b) { return g.binary("add", a, b); })
        .def("sub", [](Graph &g, const Tensor &a, const Tensor &b) { return g.binary("sub", a, b); })
        .def("mul", [](Graph &g, const Tensor &a, const Tensor &b) { return g.binary("mul", a, b); })
        .def("div", [](Graph &g, const Tensor &a, const Tensor &b) { return g.binary("div", a, b); })
        .def("scale", &Graph::scale, nb::arg("a"), nb::arg("s"), nb::arg("bias") = 0.0f)
        .def("unary", &Graph::unary, nb::arg("op"), nb::arg("a"))
        .def("geglu", &Graph::geglu, nb::arg("x"), nb::arg("approximate") = false,
             "GEGLU (diffusers' order): x (..., 2D) -> x[..., :D] * gelu(x[..., D:]), gelu exact (erf) or\n"
             "the tanh approximation; one fused op with a vectorized erf on CPU-only graphs.")
        .def("leaky_relu", &Graph::leaky_relu, nb::arg("a"), nb::arg("slope"))
        .def("clamp", &Graph::clamp, nb::arg("a"), nb::arg("min"), nb::arg("max"))
        .def("norm", [](Graph &g, const Tensor &a, float eps) { return g.norm("norm", a, eps, 0); },
             nb::arg("a"), nb::arg("eps") = 1e-5f)
        .def("rms_norm", [](Graph &g, const Tensor &a, float eps) { return g.norm("rms_norm", a, eps, 0); },
             nb::arg("a"), nb::arg("eps") = 1e-6f)
        .def("group_norm", &Graph::group_norm_affine, nb::arg("a"), nb::arg("n_groups"), nb::arg("eps") = 1e-6f,
             nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(), nb::arg("silu") = false,
             "GroupNorm of (N, C, H, W) or (C, H, W) over n_groups channel groups, then * weight + bias\n"
             "(each (C,), optional), then SiLU when silu. One fused op when every backend of the graph\n"
             "is a CPU (its SiLU through the GELUs' vectorized exp: see set_glu_simd).")
        .def("rope_pairs", &Graph::rope_pairs, nb::arg("x"), nb::arg("cos"), nb::arg("sin"),
             "RoPE of the Flux-style DiTs: x (B, N, H, hd) float, cos and sin contiguous f32 tables of\n"
             "N x hd/2 values; channel pair (2i, 2i+1) of token n turned by angle (n, i). One op when every\n"
             "backend of the graph is a CPU; ggml's products on two planes of the pairs elsewhere.\n"
             "Raises ValueError for an odd hd, a non-float x or tables of another size or layout.")
        .def("layer_norm", &Graph::layer_norm, nb::arg("a"), nb::arg("eps") = 1e-5f, nb::arg("weight") = nb::none(),
             nb::arg("bias") = nb::none(),
             "LayerNorm over the last axis (mean and biased variance of each row, as torch.nn.LayerNorm),\n"
             "then * weight + bias (each of the last axis' length, optional). One fused op when every\n"
             "backend of the graph is a CPU; ggml's norm, mul and add elsewhere.")
        .def("soft_max", &Graph::soft_max, nb::arg("a"), nb::arg("mask") = nb::none(), nb::arg("scale") = 1.0f,
             nb::arg("max_bias") = 0.0f)
        .def("flash_attn", &Graph::flash_attn, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask") = nb::none(),
             nb::arg("scale") = 1.0f, nb::arg("max_bias") = 0.0f, nb::arg("softcap") = 0.0f)
        .def("supports", &Graph::supports, nb::arg("x"), nb::arg("backend_index") = 0)
        .def("conv_2d", &Graph::conv_2d, nb::arg("w"), nb::arg("x"), nb::arg("stride") = P2{1, 1},
             nb::arg("padding") = P2{0, 0}, nb::arg("dilation") = P2{1, 1}, nb::arg("direct") = false,
             nb::arg("method") = "auto", nb::arg("bias") = nb::none(),
             "2-D convolution, w (OC, IC, KH, KW) f32/f16/bf16, x (N, IC, H, W), bias (OC,) or None ->\n"
             "(N, OC, OH, OW) f32. method: auto (graphs whose backends are all CPUs: bf16 for a bf16\n"
             "kernel of even depth when the CPU runs a bf16 kernel; else winograd for\n"
             "3x3/stride 1/padding 1 kernels with >= 16 output channels on images >= 32 wide when\n"
             "the CPU has AVX2 and FMA, else fma for f16/f32 kernels when the CPU has AVX2, FMA and\n"
             "F16C and the output has >= 64 pixels (batch included), else cpu_im2col when the image\n"
             "has >= OC/2 pixels; im2col otherwise), im2col (ggml's im2col + mul_mat, columns in the kernel's dtype), cpu_im2col\n"
             "(columns in (kh, kw, ic) order by a CPU op that copies whole channel runs), winograd\n"
             "(F(2x2,3x3), from 32 pixels wide F(4x4,3x3), f32, one fused CPU op that also adds the\n"
             "bias), direct (ggml_conv_2d_direct), bf16 (bf16 kernel only: im2col columns rounded to bf16\n"
             "and multiplied in one CPU op by AMX tiles or AVX512_BF16, f32 sums, the bias fused); other\n"
             "methods take a bf16 kernel converted to f32; direct=True means method='direct'.\n"
             "choose_conv_method() gives the method (or the error) from plain values, without a graph.")
        .def("conv_transpose_2d", &Graph::conv_transpose_2d, nb::arg("w"), nb::arg("x"), nb::arg("stride"))
        .def("upscale", &Graph::upscale, nb::arg("a"), nb::arg("factor"))
        .def("interpolate", &Graph::interpolate, nb::arg("a"), nb::arg("shape"), nb::arg("mode") = "nearest",
             nb::arg("align_corners") = false)
        .def("pad", &Graph::pad, nb::arg("a"), nb::arg("pads"))
        .def("concat", &Graph::concat, nb::arg("a"), nb::arg("b"), nb::arg("axis"))
        .def("permute", &Graph::permute, nb::arg("a"), nb::arg("axes"))
        .def("transpose", &Graph::transpose, nb::arg("a"))
        .def("reshape", &Graph::reshape, nb::arg("a"), nb::arg("shape"))
        .def("view", &Graph::view, nb::arg("a"), nb::arg("shape"), nb::arg("strides") = nb::none(),
             nb::arg("offset") = 0)
        .def("cont", &Graph::cont, nb::arg("a"))
        .def("cast", &Graph::cast, nb::arg("a"), nb::arg("dtype"))
        .def("repeat", &Graph::repeat, nb::arg("a"), nb::arg("shape"))
        .def("get_rows", &Graph::get_rows, nb::arg("a"), nb::arg("ids"))
        .def("rope", &Graph::rope, nb::arg("x"), nb::arg("pos"), nb::arg("n_dims"), nb::arg("mode") = 0,
             nb::arg("sections") = nb::none(), nb::arg("n_ctx_orig") = 0, nb::arg("freq_base") = 10000.0f,
             nb::arg("freq_scale") = 1.0f, nb::arg("ext_factor") = 0.0f, nb::arg("attn_factor") = 1.0f,
             nb::arg("beta_fast") = 32.0f, nb::arg("beta_slow") = 1.0f, nb::arg("freq_factors") = nb::none())
        .def("timestep_embedding", &Graph::timestep_embedding, nb::arg("t"), nb::arg("dim"),
             nb::arg("max_period") = 10000)
        .def("sum_rows", [](Graph &g, const Tensor &a) { return g.reduce("sum_rows", a); })
        .def("mean", [](Graph &g, const Tensor &a) { return g.reduce("mean", a); })
        .def("build", &Graph::build, "Freeze the graph (no more ops).")
        .def("reserve", &Graph::reserve,
             "Measure and reserve compute buffers without computing; weights need not be loaded\n"
             "(planned weights count as resident). Returns bytes per backend, scheduler order.")
        .def("compute_buffer_sizes", &Graph::buffer_sizes,
             "Bytes of the compute buffer per backend (scheduler order); 0 before reserve/alloc.")
        .def("allocate", &Graph::ensure_alloc, "Allocate the compute buffers now (weights must be resident).")
        .def("set_input", [](Graph &g, const std::string &name, InArray arr) {
            auto it = g.inputs.find(name);
            if (it == g.inputs.end()) throw nb::key_error(("Graph.set_input: no input named '" + name + "'").c_str());
            const Tensor &x = it->second;
            auto shape = np_shape(x.t, x.ndim);
            bool same = (int)arr.ndim() == x.ndim;
            for (int k = 0; same && k < x.ndim; ++k) same = (int64_t)arr.shape(k) == shape[k];
            if (!same || !dtype_matches(arr.dtype(), x.t->type))
                throw nb::value_error(("Graph.set_input: '" + name + "' wants an array of shape " + shape_str(x)).c_str());
            g.ensure_alloc();
            if (!x.t->buffer) throw nb::value_error(("Graph.set_input: input '" + name + "' is not used by the graph").c_str());
            const void *src = arr.data();
            size_t n = ggml_nbytes(x.t);
            nb::gil_scoped_release nogil;
            ggml_backend_tensor_set(x.t, src, 0, n);
        }, nb::arg("name"), nb::arg("array"),
        "Copy a C-contiguous numpy array (float32/float16/int32, the input's shape) into an input.")
        .def("compute", &Graph::compute,
             "Run the graph (GIL released). Raises ComputeCancelled after cancel(), RuntimeError\n"
             "when weights are not resident or ggml fails.")
        .def("profile", [](Graph &g) {
            g.profiling = true;
            try {
                g.compute();
            } catch (...) {
                g.profiling = false;
                throw;
            }
            g.profiling = false;
            std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, std::string, double>> rows;
            for (auto &r : g.profile_rows) {
                ggml_tensor *t = r.first;
                std::string src;
                for (int j = 0; j < GGML_MAX_SRC && t->src[j]; ++j) src += (j ? "," : "") + dtype_name(t->src[j]->type);
                rows.emplace_back(ggml_op_desc(t), tensor_name(t), np_shape(t, 4), src, r.second);
            }
            return rows;
        }, "Compute once node by node and time each: a list of (op, node name, shape as 4 numpy-order\n"
           "dims, source dtypes joined by commas, seconds). Slower than compute(): for finding where\n"
           "the time goes, not for measuring totals.")
        .def("cancel", [](Graph &g) { g.cancel_flag.store(true); },
             "Ask a running compute to stop at the next node (CPU) or checkpoint (other backends).")
        .def("get_output", [](Graph &g, const std::string &name) {
            auto it = g.outputs.find(name);
            if (it == g.outputs.end()) throw nb::key_error(("Graph.get_output: no output named '" + name + "'").c_str());
            if (!g.computed) throw std::runtime_error("Graph.get_output: compute() has not completed");
            const Tensor &x = it->second;
            auto shape = np_shape(x.t, x.ndim);
            nb::list dims;
            for (auto v : shape) dims.append(v);
            nb::object arr = nb::module_::import_("numpy").attr("empty")(nb::tuple(dims), np_dtype(x.t->type));
            HostArray view = nb::cast<HostArray>(arr);
            void *dst = view.data();
            size_t n = ggml_nbytes(x.t);
            {
                nb::gil_scoped_release nogil;
                ggml_backend_tensor_get(x.t, dst, 0, n);
            }
            return arr;
        }, nb::arg("name"), "The output as a new numpy array.")
        .def("free_compute", &Graph::free_sched,
             "Release the compute buffers (the graph stays built; the next compute reallocates).");

    using P64 = std::pair<int64_t, int64_t>;
    m.def("choose_conv_method",
        [](const std::string &method, P64 kernel, P64 image, int64_t out_channels, bool all_cpu, bool avx2_fma,
           P2 stride, P2 padding, P2 dilation, int64_t batch, bool bf16, int64_t in_channels, bool fma,
           bool wino_f4_first) {
            ConvChoice c = choose_conv_method(method, kernel, stride, padding, dilation, image, batch, out_channels,
                                              all_cpu, avx2_fma, bf16, in_channels, fma, wino_f4_first);
            if (!c.error.empty()) throw nb::value_error(("conv_2d: " + c.error).c_str());
            return std::string(conv_method_name(c.method));
        },
        nb::arg("method"), nb::kw_only(), nb::arg("kernel"), nb::arg("image"), nb::arg("out_channels"),
        nb::arg("all_cpu"), nb::arg("avx2_fma"), nb::arg("stride") = P2{1, 1}, nb::arg("padding") = P2{0, 0},
        nb::arg("dilation") = P2{1, 1}, nb::arg("batch") = 1, nb::arg("bf16") = false, nb::arg("in_channels") = 0,
        nb::arg("fma") = false, nb::arg("wino_f4_first") = false,
        "The method Graph.conv_2d lowers a convolution with (im2col, cpu_im2col, winograd, direct,\n"
        "bf16 or fma), from plain values and without a graph: method as given to conv_2d (auto or an\n"
        "explicit one), kernel (KH, KW), image (H, W) of the input, the output channels, whether\n"
        "every backend of the graph is a CPU, whether the CPU has AVX2 and FMA (cpu_avx2_fma()),\n"
        "stride/padding/dilation (H, W), the batch, whether the kernel is bf16 on a CPU that runs\n"
        "a bf16 kernel (bf16_kernel() != 'off'), the input channels and whether the kernel is f16\n"
        "or f32 on a CPU that runs the FMA product (fma_gemm()), and whether the Winograd F(4x4)\n"
        "path outruns the bf16 kernel (bf16_kernel() == 'avx512' and wino_kernel() == 'avx512':\n"
        "conv_2d then takes winograd for 3x3 convolutions from 32 pixels wide). Raises ValueError with\n"
        "conv_2d's message when conv_2d would refuse the method.");
    m.def("bf16_kernel", []() { return std::string(bf16_kernel_name(bf16_kernel())); },
          "The bf16 kernel graphs built now use for bf16 weights on CPU-only graphs: 'amx' (AMX-BF16\n"
          "tiles), 'avx512' (AVX512_BF16 dot products) or 'off' (the default until set_bf16_kernel;\n"
          "f16 weights, the FMA product or ggml's mul_mat; conv kernels\n"
          "converted to f32).");
    m.def("bf16_cpu_kernel", []() { return std::string(bf16_kernel_name(bf16_cpu_kernel())); },
          "The fastest bf16 kernel this CPU runs ('amx', 'avx512' or 'off'); AMX counts only when\n"
          "Linux grants the tile data permission (asked once per process).");
    m.def("set_bf16_kernel", [](const std::string &name) {
            std::string err = set_bf16_kernel(name);
            if (!err.empty()) throw nb::value_error(("set_bf16_kernel: " + err).c_str());
        }, nb::arg("name"),
        "Use the bf16 kernel `name` (auto, amx, avx512, off) for graphs built from now on (tests and\n"
        "benchmarks compare them). Raises ValueError for an unknown name or one this CPU cannot run.");
    m.def("set_glu_simd", &set_glu_simd, nb::arg("on"), nb::arg("allow_avx512") = true,
          "Allow (True, the default) or forbid the vectorized GELU/GEGLU (erf and tanh forms; AVX-512,\n"
          "else AVX2 with FMA) for graphs built and computed from now on; forbidden, unary('gelu_erf')\n"
          "and unary('gelu') are ggml's and geglu uses erff/expf. allow_avx512=False keeps to the AVX2\n"
          "version on an AVX-512 CPU.");
    m.def("set_fma_gemm", &set_fma_gemm, nb::arg("on"),
          "Allow (True, the default) or forbid the FMA product (f16/f32 weights widened to f32 and\n"
          "multiplied by AVX2/FMA in sdplan's own kernel) for graphs built from now on; forbidden,\n"
          "linear layers use ggml's mul_mat, conv_2d's auto method its other methods, attention and\n"
          "unary('gelu_quick') ggml's ops.");
    m.def("fma_gemm", &fma_gemm_on,
          "True when graphs built now multiply f16 linear weights and f16/f32 convolution kernels on\n"
          "CPU-only graphs with the FMA product (the CPU has AVX2, FMA and F16C; set_fma_gemm).");
    m.def("glu_simd", &glu_simd,
          "True when GELU (erf and tanh forms) and GEGLU run vectorized (AVX-512, or AVX2 with FMA).\n"
          "unary('gelu') (the tanh form) takes it only while fma_gemm() is on too; else ggml's GELU.");
    m.def("glu_simd_name", []() { return std::string(glu_simd_name()); },
          "The GELU/GEGLU version graphs run now: 'avx512', 'avx2' or 'off' (scalar).");
    m.def("set_wino_avx512", &set_wino_avx512, nb::arg("allow"),
          "Allow (True, the default) or forbid the Winograd convolution's AVX-512 micro-kernel and\n"
          "transforms on an AVX-512 CPU (forbidden: the AVX2/FMA ones) from the next compute on.");
    m.def("wino_kernel", []() { return std::string(wino_kernel_name()); },
          "The Winograd convolution's path now: 'avx512' (16 output channels by 16 tiles of 512-bit\n"
          "accumulators), 'avx2' (6 channels by 16 tiles of 256-bit ones) or 'generic' (plain loops).");
    m.def("cpu_avx2_fma", &wino_fast_cpu,
          "True when this CPU has AVX2 and FMA (conv_2d's auto method then takes winograd for wide\n"
          "3x3 convolutions): the avx2_fma of choose_conv_method.");
}

}  // namespace sdplan
