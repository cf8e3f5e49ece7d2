// ggml RPC, reached only through the backend registry so the extension loads and runs
// where ggml was built without RPC (then rpc_available() is False and the functions below
// raise RuntimeError).
//
// A server added with rpc_add_server gets its own registry from ggml
// (``RPC[host:port]``); registering it with ggml_backend_register makes its devices part
// of ggml's device list. Each endpoint is registered once per process.
#include "common.h"

#include <ggml-rpc.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <tuple>

namespace sdplan {
namespace {

using rpc_add_server_t = ggml_backend_reg_t (*)(const char *endpoint);
using rpc_start_server_t = void (*)(const char *endpoint, const char *cache_dir, size_t n_threads,
                                    size_t n_devices, ggml_backend_dev_t *devices);

void *rpc_proc(const char *name) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) return nullptr;
    return ggml_backend_reg_get_proc_address(reg, name);
}

void *require_rpc_proc(const char *name) {
    void *fn = rpc_proc(name);
    if (!fn) {
        throw std::runtime_error(std::string("the loaded ggml has no RPC backend (") + name +
                                 " is missing); it was built without GGML_RPC");
    }
    return fn;
}

struct RpcServers {
    std::mutex mutex;
    std::vector<std::pair<std::string, std::vector<std::string>>> servers;  // in order added
};

RpcServers &rpc_servers() {
    static RpcServers s;
    return s;
}

// Register the server at endpoint (once) and return its ggml device names.
std::vector<std::string> add_server(const std::string &endpoint) {
    auto add = (rpc_add_server_t)require_rpc_proc("ggml_backend_rpc_add_server");
    RpcServers &s = rpc_servers();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const auto &entry : s.servers) {
        if (entry.first == endpoint) return entry.second;
    }
    ggml_backend_reg_t reg = add(endpoint.c_str());
    if (!reg) {
        throw std::runtime_error("RPC server " + endpoint + " could not be reached or exposes no devices");
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        names.emplace_back(ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i)));
    }
    // Only a registry that is not yet in ggml's list may be registered (a second
    // registration would list its devices twice).
    bool known = false;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        if (ggml_backend_reg_get(i) == reg) known = true;
    }
    if (!known) ggml_backend_register(reg);
    s.servers.emplace_back(endpoint, names);
    return names;
}

void start_server(const std::string &endpoint, const std::vector<std::string> &device_names,
                  size_t n_threads, const std::optional<std::string> &cache_dir) {
    auto start = (rpc_start_server_t)require_rpc_proc("ggml_backend_rpc_start_server");
    if (device_names.empty()) throw std::invalid_argument("rpc_start_server needs at least one device");
    std::vector<ggml_backend_dev_t> devices;
    for (const auto &name : device_names) devices.push_back(find_device(name));
    start(endpoint.c_str(), cache_dir ? cache_dir->c_str() : nullptr, n_threads, devices.size(),
          devices.data());
}

// The tensor-name length the loaded ggml library was built with: a tensor of a no-alloc
// context is given a longer name than any build uses; ggml_set_name copies at most
// sizeof(tensor->name) - 1 characters (the library's GGML_MAX_NAME - 1), whatever this
// module's headers say.
int library_max_name() {
    ggml_init_params params{ggml_tensor_overhead() * 2 + 1024, nullptr, true};
    ggml_context *ctx = ggml_init(params);
    if (!ctx) throw std::runtime_error("ggml_init failed while probing the tensor-name length");
    ggml_tensor *t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1);
    std::string longer(1023, 'n');
    ggml_set_name(t, longer.c_str());
    int n = (int)std::strlen(ggml_get_name(t)) + 1;
    ggml_free(ctx);
    return n;
}

}  // namespace

void register_rpc(nb::module_ &m) {
    m.def("ggml_max_name", []() { return (int)GGML_MAX_NAME; },
          "GGML_MAX_NAME this module was compiled with: the bytes of a tensor name, which the\n"
          "RPC tensor record carries (stable-diffusion.cpp builds ggml with 160).");
    m.def("library_max_name", &library_max_name,
          "GGML_MAX_NAME of the loaded ggml library, measured (the name a tensor keeps).");
    m.def("rpc_protocol", []() {
        return std::make_tuple((int)RPC_PROTO_MAJOR_VERSION, (int)RPC_PROTO_MINOR_VERSION,
                               (int)RPC_PROTO_PATCH_VERSION);
    }, "The ggml RPC protocol version of the headers this module was compiled with.");
    m.def("rpc_available", []() {
        return rpc_proc("ggml_backend_rpc_add_server") != nullptr &&
               rpc_proc("ggml_backend_rpc_start_server") != nullptr;
    }, "True when the loaded ggml has the RPC backend (built with GGML_RPC=ON).");

    m.def("rpc_add_server", [](const std::string &endpoint) {
        std::vector<std::string> names;
        {
            nb::gil_scoped_release nogil;
            names = add_server(endpoint);
        }
        return names;
    }, nb::arg("endpoint"),
    "Add the ggml RPC server at ``host:port`` and register its devices with ggml; returns\n"
    "their ggml device names. Adding an endpoint again returns the same names and adds\n"
    "nothing. The caller must first check that the endpoint accepts connections: ggml may\n"
    "abort the process on a server that stops answering. Raises RuntimeError when ggml has\n"
    "no RPC or the server exposes no devices.");

    m.def("rpc_servers", []() {
        RpcServers &s = rpc_servers();
        std::lock_guard<std::mutex> lock(s.mutex);
        return s.servers;
    }, "``[(endpoint, [ggml device names]), ...]`` for every server added, in order.");

    m.def("rpc_start_server", [](const std::string &endpoint, const std::vector<std::string> &devices,
                                 size_t n_threads, std::optional<std::string> cache_dir) {
        nb::gil_scoped_release nogil;
        start_server(endpoint, devices, n_threads, cache_dir);
    }, nb::arg("endpoint"), nb::arg("devices"), nb::arg("n_threads"), nb::arg("cache_dir") = nb::none(),
    "Serve the named local devices over ggml RPC at ``host:port``. Blocks (GIL released)\n"
    "until the server fails, e.g. when the address cannot be bound; it never returns\n"
    "otherwise, so run it in a thread. ggml prints its own banner on stdout. Raises\n"
    "RuntimeError when ggml has no RPC, ValueError for an unknown device.");
}

}  // namespace sdplan
