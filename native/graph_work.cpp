// Graph.nodes(): the nodes of a built graph as plain records, for counting a graph's work
// (operations and bytes per device) without computing it (sdplan.core.runtime.work_count).
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

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unordered_map.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <tuple>
#include <unordered_map>

namespace sdplan {

namespace {

// The name of one of sdplan's custom CPU ops (the function a GGML_OP_CUSTOM node calls; ggml
// keeps it first in the node's op_params), or "custom" for another.
std::string custom_kernel(const ggml_tensor *t) {
    ggml_custom_op_t fn = nullptr;
    std::memcpy(&fn, t->op_params, sizeof fn);
    static const std::pair<ggml_custom_op_t, const char *> known[] = {
        {bf16_gemm, "bf16_gemm"},           {fma_gemm, "fma_gemm"},
        {wino_conv, "winograd"},            {wino_pack_kernel, "winograd_pack"},
        {bf16_attention, "bf16_attention"}, {fma_attention, "fma_attention"},
        {cpu_im2col, "cpu_im2col"},         {cpu_kernel_order, "kernel_order"},
        {cpu_transpose_copy, "transpose"},  {cpu_geglu, "geglu"},
        {cpu_gelu_erf, "gelu_erf"},         {cpu_gelu_tanh, "gelu_tanh"},
        {cpu_gelu_quick, "gelu_quick"},     {cpu_group_norm, "group_norm"},
        {cpu_layer_norm, "layer_norm"},     {cpu_rope_pairs, "rope_pairs"},
    };
    for (const auto &k : known)
        if (k.first == fn) return k.second;
    return "custom";
}

// Index of the backend (in the graph's scheduler order) that runs or holds t: the one it was
// pinned to (Graph.scope, the runner's layer split), else the scheduler's choice while a
// compute's assignment is in place; -1 when unknown.
int backend_of(const Graph &g, const std::unordered_map<const ggml_tensor *, int> &pins, ggml_tensor *t) {
    auto pin = pins.find(t);
    if (pin != pins.end()) return pin->second;
    if (!g.sched) return -1;
    ggml_backend_t b = ggml_backend_sched_get_tensor_backend(g.sched, t);
    for (size_t i = 0; b && i < g.backends.size(); ++i)
        if (g.backends[i]->handle == b) return (int)i;
    return -1;
}

std::vector<int64_t> ne4(const ggml_tensor *t) { return {t->ne[0], t->ne[1], t->ne[2], t->ne[3]}; }

using Src = std::tuple<int, std::vector<int64_t>, std::string, size_t, bool, int>;
using Node = std::tuple<std::string, std::string, std::vector<int64_t>, std::string, size_t, bool, int,
                        std::vector<Src>>;

std::vector<Node> graph_nodes(Graph &g) {
    if (!g.gf) throw nb::value_error("graph_nodes: the graph is not built");
    // The scheduler's split points nodes' sources at its copies (on another backend) and
    // Graph keeps the originals: read the graph as built, then leave the split as it was
    // (after free_compute those copies are gone; the next allocation restores again).
    std::vector<std::array<ggml_tensor *, GGML_MAX_SRC>> now;
    now.reserve(g.orig_src.size());
    for (auto &ns : g.orig_src) {
        std::array<ggml_tensor *, GGML_MAX_SRC> cur{};
        for (int j = 0; j < GGML_MAX_SRC; ++j) cur[j] = ns.first->src[j];
        now.push_back(cur);
    }
    g.restore_srcs();
    struct PutBack {
        Graph &g;
        std::vector<std::array<ggml_tensor *, GGML_MAX_SRC>> &now;
        ~PutBack() {
            for (size_t i = 0; i < g.orig_src.size(); ++i)
                for (int j = 0; j < GGML_MAX_SRC; ++j) g.orig_src[i].first->src[j] = now[i][j];
        }
    } put_back{g, now};
    const int n = ggml_graph_n_nodes(g.gf);
    std::unordered_map<const ggml_tensor *, int> index, pins, leafs;
    for (const auto &a : g.assign) pins[a.first] = a.second;
    for (int i = 0; i < n; ++i) index[ggml_graph_node(g.gf, i)] = i;
    std::vector<Node> out;
    out.reserve((size_t)n);
    for (int i = 0; i < n; ++i) {
        ggml_tensor *t = ggml_graph_node(g.gf, i);
        std::vector<Src> srcs;
        for (int j = 0; j < GGML_MAX_SRC && t->src[j]; ++j) {
            ggml_tensor *s = t->src[j];
            auto it = index.find(s);
            const bool weight = g.ext.count(s) > 0 || (s->view_src && g.ext.count(s->view_src) > 0);
            int id;
            if (it != index.end()) {
                id = it->second;
            } else {  // a leaf: numbered -2, -3, ... by the tensor it views or is
                const ggml_tensor *base = s->view_src ? s->view_src : s;
                auto lf = leafs.emplace(base, -2 - (int)leafs.size()).first;
                id = lf->second;
            }
            srcs.emplace_back(id, ne4(s), dtype_name(s->type), ggml_nbytes(s), weight, backend_of(g, pins, s));
        }
        const std::string kernel = t->op == GGML_OP_CUSTOM ? custom_kernel(t) : std::string(ggml_op_name(t->op));
        out.emplace_back(ggml_op_desc(t), kernel, ne4(t), dtype_name(t->type), ggml_nbytes(t), is_view_op(t->op),
                         backend_of(g, pins, t), std::move(srcs));
    }
    return out;
}

}  // namespace

void register_graph_work(nb::module_ &m) {
    m.def("graph_nodes", &graph_nodes, nb::arg("graph"),
          "The nodes of a built graph in execution order, each ``(op, kernel, ne, dtype, nbytes,\n"
          "view, backend, srcs)``: ggml's op description, the kernel (ggml's op name, or for a\n"
          "custom op sdplan's kernel: bf16_gemm, fma_gemm, winograd, winograd_pack,\n"
          "bf16_attention, fma_attention, cpu_im2col, ...), the shape in ggml's ne order (4\n"
          "entries, innermost first), dtype, bytes, whether the op only views its source, and the\n"
          "index of the backend running it in the graph's scheduler order (the one it was pinned\n"
          "to with Graph.scope; -1 for a node left to the scheduler). ``srcs``: per source ``(id,\n"
          "ne, dtype, nbytes, is a weight, backend index)``, id a node's index, or for a leaf -2,\n"
          "-3, ... (one number per leaf tensor, its views included). Raises ValueError before\n"
          "build().");
}

}  // namespace sdplan
