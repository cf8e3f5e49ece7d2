// Placeholder registration; filled in by its own part of the runtime.
#include "common.h"

namespace sdplan {
void register_weights(nb::module_ &) {}
}  // namespace sdplan
