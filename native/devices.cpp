// Device inventory straight from ggml's backend registry.
//
// Every query that can reach an RPC server runs with the GIL released; results are copied
// into plain C++ structs first and turned into Python objects afterwards.
#include "common.h"

#include <ggml-backend.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

namespace sdplan {
namespace {

struct DeviceRecord {
    std::string name, description, type, registry;
    std::optional<std::string> device_id;
    size_t free = 0, total = 0;
    bool async = false, host_buffer = false, buffer_from_host_ptr = false, events = false;
};

const char *type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        default: return "meta";
    }
}

// ggml builds that load backends dynamically start with an empty registry.
void ensure_backends_loaded() {
    static std::once_flag once;
    std::call_once(once, []() {
        if (ggml_backend_reg_count() == 0) ggml_backend_load_all();
    });
}

DeviceRecord read_device(ggml_backend_dev_t dev) {
    ggml_backend_dev_props props{};
    ggml_backend_dev_get_props(dev, &props);
    DeviceRecord r;
    r.name = props.name ? props.name : ggml_backend_dev_name(dev);
    r.description = props.description ? props.description : "";
    r.type = type_name(props.type);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    r.registry = reg ? ggml_backend_reg_name(reg) : "";
    if (props.device_id && *props.device_id) r.device_id = std::string(props.device_id);
    r.free = props.memory_free;
    r.total = props.memory_total;
    r.async = props.caps.async;
    r.host_buffer = props.caps.host_buffer;
    r.buffer_from_host_ptr = props.caps.buffer_from_host_ptr;
    r.events = props.caps.events;
    return r;
}

nb::dict to_dict(const DeviceRecord &r) {
    nb::dict d, caps;
    d["name"] = r.name;
    d["description"] = r.description;
    d["type"] = r.type;
    d["registry"] = r.registry;
    d["device_id"] = r.device_id ? nb::cast(*r.device_id) : nb::none();
    d["free"] = r.free;
    d["total"] = r.total;
    caps["async"] = r.async;
    caps["host_buffer"] = r.host_buffer;
    caps["buffer_from_host_ptr"] = r.buffer_from_host_ptr;
    caps["events"] = r.events;
    d["caps"] = caps;
    return d;
}

}  // namespace

std::pair<size_t, size_t> device_memory(ggml_backend_dev_t dev) {
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(dev, &free, &total);
    return {free, total};
}

void register_devices(nb::module_ &m) {
    m.def("device_names", []() {
        std::vector<std::string> names;
        {
            nb::gil_scoped_release nogil;
            ensure_backends_loaded();
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                names.emplace_back(ggml_backend_dev_name(ggml_backend_dev_get(i)));
            }
        }
        return names;
    }, "Names of every ggml device, in ggml's enumeration order.");

    m.def("list_devices", []() {
        std::vector<DeviceRecord> records;
        {
            nb::gil_scoped_release nogil;
            ensure_backends_loaded();
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                records.push_back(read_device(ggml_backend_dev_get(i)));
            }
        }
        nb::list out;
        for (const auto &r : records) out.append(to_dict(r));
        return out;
    },
    "Every ggml device in enumeration order, as dicts with keys ``name``, ``description``,\n"
    "``type`` (``cpu``/``gpu``/``igpu``/``accel``/``meta``), ``registry`` (the backend\n"
    "registry name), ``device_id`` (PCI bus id or other id, or None), ``free`` and\n"
    "``total`` (bytes) and ``caps`` (dict of bool: ``async``, ``host_buffer``,\n"
    "``buffer_from_host_ptr``, ``events``). RPC devices ask their server for memory\n"
    "(the GIL is released meanwhile).");

    m.def("device_memory", [](const std::string &name) {
        ggml_backend_dev_t dev = find_device(name);
        nb::gil_scoped_release nogil;
        return device_memory(dev);
    }, nb::arg("name"),
    "``(free, total)`` memory in bytes of the device with this exact ggml name; cheap for\n"
    "local devices, one round trip for RPC devices. Raises ValueError for an unknown name.");

    m.def("device_type", [](const std::string &name) {
        return std::string(type_name(ggml_backend_dev_type(find_device(name))));
    }, nb::arg("name"),
    "Type (``cpu``/``gpu``/``igpu``/``accel``/``meta``) of the device with this exact ggml\n"
    "name, without any memory query. Raises ValueError for an unknown name.");

    m.def("registry_names", []() {
        std::vector<std::string> names;
        ensure_backends_loaded();
        for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
            names.emplace_back(ggml_backend_reg_name(ggml_backend_reg_get(i)));
        }
        return names;
    }, "Names of every registered ggml backend registry (``CPU``, ``RPC``, ``CUDA``...).");

    m.def("backend_features", [](const std::string &registry) {
        std::vector<std::pair<std::string, std::string>> out;
        ensure_backends_loaded();
        ggml_backend_reg_t reg = ggml_backend_reg_by_name(registry.c_str());
        if (!reg) throw std::invalid_argument("no ggml backend registry named '" + registry + "'");
        auto fn = (ggml_backend_get_features_t)ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_get_features");
        if (!fn) return out;
        for (ggml_backend_feature *f = fn(reg); f && f->name; ++f) {
            out.emplace_back(f->name, f->value ? f->value : "");
        }
        return out;
    }, nb::arg("registry") = "CPU",
    "Feature flags a backend registry reports through its ``ggml_backend_get_features``\n"
    "proc address, as ``[(name, value), ...]`` (e.g. ``('AVX2', '1')``,\n"
    "``('LLAMAFILE', '1')``); empty when the registry reports none. Raises ValueError for an\n"
    "unknown registry.");
}

}  // namespace sdplan
