// Backend instances: one ggml_backend_t per device, shared through the BackendManager.
#include "common.h"

#include <ggml-cpu.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

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

void register_backends(nb::module_ &m) {
    nb::class_<Backend>(m, "Backend", "One initialised ggml backend on one device.")
        .def_prop_ro("device_name", [](const Backend &b) { return b.device_name; },
                     "Name of the device this backend runs on.")
        .def_prop_ro("name", [](const Backend &b) { return std::string(ggml_backend_name(b.get())); },
                     "ggml's name of the backend.")
        .def_prop_ro("closed", [](const Backend &b) { return b.handle == nullptr; })
        .def("close", &Backend::close, "Free the ggml backend now (idempotent).");
    m.def("init_backend", &init_backend, nb::arg("device_name"),
          "Initialise a new backend on the device with this exact name.\n\n"
          "Raises ValueError when no such device exists. Prefer BackendManager, which\n"
          "shares one instance per device.");
}

}  // namespace sdplan
