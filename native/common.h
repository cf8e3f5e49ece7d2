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

#include <memory>
#include <stdexcept>
#include <string>

namespace nb = nanobind;

namespace sdplan {

// One initialised ggml backend on one device.
struct Backend {
    ggml_backend_t handle = nullptr;
    ggml_backend_dev_t device = nullptr;
    std::string device_name;

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

void register_devices(nb::module_ &m);
void register_backends(nb::module_ &m);
void register_rpc(nb::module_ &m);
void register_graph(nb::module_ &m);
void register_weights(nb::module_ &m);

}  // namespace sdplan
