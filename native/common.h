// Shared declarations of the sdplan._ggml extension.
// Each source file registers its part of the module; module.cpp calls them in order.
#pragma once

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace sdplan {
void register_devices(nb::module_ &m);
}  // namespace sdplan
