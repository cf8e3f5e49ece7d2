// Shared declarations of the sdplan._ggml extension.
//
// Each source file registers its part of the module; module.cpp calls the register_*
// functions in order. Ownership: a Backend owns one ggml_backend_t and frees it when the
// last Python reference goes; the BackendManager (backends.cpp) caches one Backend per
// device so every user of a device shares one instance (spec section 10).
#pragma once

#include <ggml-backend.h>
#include <ggml.h>
#include <nanobind/nanobind.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace sdplan {

// One initialised ggml backend on one device.
struct Backend {
    ggml_backend_t handle = nullptr;
    ggml_backend_dev_t device = nullptr;
    std::string device_name;
    // A CPU backend standing in for a device that is not a CPU (counting another machine's
    // graphs): graphs over it build as for that device (ggml's own ops, no CPU-only kernels).
    bool stand_in = false;

    Backend(ggml_backend_t h, ggml_backend_dev_t d, std::string name)
        : handle(h), device(d), device_name(std::move(name)) {}
    Backend(const Backend &) = delete;
    Backend &operator=(const Backend &) = delete;
    ~Backend() { close(); }

    void close() {
        if (handle) {
            ggml_backend_free(handle);
            handle = nullptr;
        }
    }
    ggml_backend_t get() const {
        if (!handle) throw std::runtime_error("backend for device '" + device_name + "' is closed");
        return handle;
    }
};

// Find a device by its exact ggml name; throws std::invalid_argument naming it otherwise.
ggml_backend_dev_t find_device(const std::string &name);

// Initialise a new backend on the named device (not cached; see BackendManager).
std::shared_ptr<Backend> init_backend(const std::string &device_name);

// Device memory in bytes as (free, total); may block (RPC devices ask their server), so call
// it without the GIL.
std::pair<size_t, size_t> device_memory(ggml_backend_dev_t dev);

// Set the thread count of a backend through its registry's "ggml_backend_set_n_threads"
// proc address; returns false when the backend has no thread setting (GPU, RPC).
bool set_backend_threads(ggml_backend_t backend, ggml_backend_dev_t dev, int n_threads);

// One shared Backend per device name (spec section 10). Thread-safe; get() may block
// (an RPC backend connects to its server), so bindings call it without the GIL.
class BackendManager {
public:
    explicit BackendManager(int cpu_threads = 0) : cpu_threads_(cpu_threads) {}
    ~BackendManager() { close(); }
    BackendManager(const BackendManager &) = delete;
    BackendManager &operator=(const BackendManager &) = delete;

    // The shared backend of the device with this exact ggml name (created on first use).
    // Throws std::invalid_argument for an unknown device, std::runtime_error when closed.
    std::shared_ptr<Backend> get(const std::string &device_name);
    // Thread count for CPU-like backends (0: ggml's default); applies to open ones too.
    void set_cpu_threads(int n);
    int cpu_threads() const { return cpu_threads_; }
    // Names of the devices with an open backend, in opening order.
    std::vector<std::string> open_devices() const;
    // Free every backend (users still holding one see it closed); the manager stays closed.
    void close();
    bool closed() const { return closed_; }

private:
    mutable std::mutex mutex_;
    std::vector<std::pair<std::string, std::shared_ptr<Backend>>> backends_;
    int cpu_threads_ = 0;
    bool closed_ = false;
};

void register_devices(nb::module_ &m);
void register_backends(nb::module_ &m);
void register_rpc(nb::module_ &m);
void register_graph(nb::module_ &m);
void register_weights(nb::module_ &m);
void register_graph_work(nb::module_ &m);

}  // namespace sdplan
