// Backend instances: one ggml_backend_t per device, shared through the BackendManager.
#include "common.h"

#include <algorithm>

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace sdplan {

ggml_backend_dev_t find_device(const std::string &name) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
    if (!dev) throw std::invalid_argument("no ggml device named '" + name + "'");
    return dev;
}

std::shared_ptr<Backend> init_backend(const std::string &device_name) {
    ggml_backend_dev_t dev = find_device(device_name);
    ggml_backend_t b = ggml_backend_dev_init(dev, nullptr);
    if (!b) throw std::runtime_error("ggml could not initialise a backend on '" + device_name + "'");
    return std::make_shared<Backend>(b, dev, std::string(ggml_backend_dev_name(dev)));
}

bool set_backend_threads(ggml_backend_t backend, ggml_backend_dev_t dev, int n_threads) {
    if (!backend || !dev || n_threads <= 0) return false;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    if (!reg) return false;
    auto fn = (ggml_backend_set_n_threads_t)ggml_backend_reg_get_proc_address(
        reg, "ggml_backend_set_n_threads");
    if (!fn) return false;
    fn(backend, n_threads);
    return true;
}

std::shared_ptr<Backend> BackendManager::get(const std::string &device_name) {
    // One lock over lookup and creation: two threads asking for the same device must
    // share one instance.
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) throw std::runtime_error("the backend manager is closed");
    for (auto &entry : backends_) {
        if (entry.first == device_name) return entry.second;
    }
    auto backend = init_backend(device_name);
    set_backend_threads(backend->handle, backend->device, cpu_threads_);
    backends_.emplace_back(device_name, backend);
    return backend;
}

void BackendManager::set_cpu_threads(int n) {
    if (n < 0) throw std::invalid_argument("cpu_threads must be >= 0, got " + std::to_string(n));
    std::lock_guard<std::mutex> lock(mutex_);
    cpu_threads_ = n;
    for (auto &entry : backends_) {
        if (entry.second->handle) set_backend_threads(entry.second->handle, entry.second->device, n);
    }
}

std::vector<std::string> BackendManager::open_devices() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> names;
    for (const auto &entry : backends_) names.push_back(entry.first);
    return names;
}

void BackendManager::close() {
    std::vector<std::pair<std::string, std::shared_ptr<Backend>>> doomed;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        closed_ = true;
        doomed.swap(backends_);
    }
    for (auto &entry : doomed) entry.second->close();
}

void register_backends(nb::module_ &m) {
    nb::class_<Backend>(m, "Backend", "One initialised ggml backend on one device.")
        .def_prop_ro("device_name", [](const Backend &b) { return b.device_name; },
                     "Name of the device this backend runs on.")
        .def_prop_ro("name", [](const Backend &b) { return std::string(ggml_backend_name(b.get())); },
                     "ggml's name of the backend.")
        .def_prop_ro("closed", [](const Backend &b) { return b.handle == nullptr; },
                     "True once the backend was freed.")
        .def_prop_rw("stand_in", [](const Backend &b) { return b.stand_in; },
                     [](Backend &b, bool v) { b.stand_in = v; },
                     "True for a CPU backend standing in for a device that is not a CPU: graphs over it\n"
                     "build as for that device (ggml's own ops, none of sdplan's CPU-only kernels).")
        .def("set_n_threads", [](Backend &b, int n) {
            return set_backend_threads(b.get(), b.device, n);
        }, nb::arg("n_threads"),
        "Set the thread count (CPU-like backends); returns False when the backend has none.")
        .def("synchronize", [](Backend &b) {
            ggml_backend_t h = b.get();
            nb::gil_scoped_release nogil;
            ggml_backend_synchronize(h);
        }, "Wait for every queued operation of this backend.")
        .def("close", &Backend::close, "Free the ggml backend now (idempotent).")
        .def("__repr__", [](const Backend &b) {
            return "<Backend " + b.device_name + (b.handle ? ">" : " closed>");
        });

    m.def("init_backend", [](const std::string &device_name) {
        std::shared_ptr<Backend> b;
        {
            nb::gil_scoped_release nogil;  // an RPC backend connects to its server
            b = init_backend(device_name);
        }
        return b;
    }, nb::arg("device_name"),
    "Initialise a new backend on the device with this exact name.\n\n"
    "Raises ValueError when no such device exists. Prefer BackendManager, which\n"
    "shares one instance per device.");

    nb::class_<BackendManager>(m, "BackendManager",
        "One shared Backend per device (spec section 10), all freed by close().")
        .def(nb::init<int>(), nb::arg("cpu_threads") = 0,
             "cpu_threads: threads of CPU-like backends (0: ggml's default).")
        .def("get", [](BackendManager &mgr, const std::string &device_name) {
            std::shared_ptr<Backend> b;
            {
                nb::gil_scoped_release nogil;
                b = mgr.get(device_name);
            }
            return b;
        }, nb::arg("device_name"),
        "The shared backend of the device with this exact ggml name, created on first use.\n"
        "Raises ValueError for an unknown device, RuntimeError once the manager is closed.")
        .def_prop_rw("cpu_threads", &BackendManager::cpu_threads, &BackendManager::set_cpu_threads,
                     "Threads of CPU-like backends (0: ggml's default); setting it applies to\n"
                     "open backends too. Raises ValueError when negative.")
        .def("open_devices", &BackendManager::open_devices,
             "Names of the devices with an open backend, in opening order.")
        .def("close", [](BackendManager &mgr) {
            nb::gil_scoped_release nogil;
            mgr.close();
        }, "Free every backend; users still holding one see it closed. Idempotent.")
        .def_prop_ro("closed", &BackendManager::closed, "True after close().");
}

}  // namespace sdplan
