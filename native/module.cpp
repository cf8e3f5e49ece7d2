// sdplan._ggml: a thin, model-agnostic binding of ggml (devices, backends, graphs, RPC).
#include "common.h"

#include <nanobind/stl/string.h>

NB_MODULE(_ggml, m) {
    m.doc() = "Thin binding of ggml used by sdplan: devices, backends, buffers, graphs, RPC.";
    m.def("ggml_version", []() { return std::string(ggml_version()); },
          "The version string of the loaded ggml library.");
    sdplan::register_devices(m);
    sdplan::register_backends(m);
    sdplan::register_rpc(m);
    sdplan::register_graph(m);
    sdplan::register_weights(m);
    sdplan::register_graph_work(m);
}
