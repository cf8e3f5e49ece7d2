// Device inventory straight from ggml's backend registry.
#include "common.h"

#include <ggml-backend.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace sdplan {

void register_devices(nb::module_ &m) {
    m.def("device_names", []() {
        std::vector<std::string> names;
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            names.emplace_back(ggml_backend_dev_name(ggml_backend_dev_get(i)));
        }
        return names;
    }, "Names of every ggml device, in ggml's enumeration order.");
}

}  // namespace sdplan
