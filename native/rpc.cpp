// Placeholder registration; filled in by its own part of the runtime.
#include "common.h"

namespace sdplan {
void register_rpc(nb::module_ &) {}
}  // namespace sdplan
