"""Live devices from ggml: inventory, features of the loaded ggml, RPC servers, backends.

The native module is reached through :func:`sdplan.core.runtime.native.native`, so this
module imports without it.

RPC devices are named ``RPC0``, ``RPC1``... in the order added across servers and described
by their ``host:port`` endpoint (spec section 3). ggml names the devices of
``ggml_backend_rpc_add_server`` the same way in this ggml version; the mapping from sdplan
names to ggml names is still derived from the servers' own device lists
(:func:`rpc_device_map`), so a ggml that named them otherwise would keep working.

A registered RPC server that stops answering makes ggml abort the whole process: add
servers only in processes that may die with them.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any

from sdplan.core.errors import InventoryError
from sdplan.core.planning.inventory import DEVICE_TYPES, Device, Inventory
from sdplan.core.runtime.native import NativeUnavailable, native
from sdplan.core.runtime.threads import choose_threads, usable_cpus

log = logging.getLogger(__name__)

#: How to get a ggml with the RPC backend and llamafile's sgemm kernels.
RPC_INSTALL_COMMAND = (
    "pip install --no-binary libggml-python --no-cache-dir -C cmake.define.GGML_RPC=ON "
    "-C cmake.define.GGML_LLAMAFILE=ON -C cmake.define.CMAKE_C_FLAGS=-DGGML_MAX_NAME=160 "
    "-C cmake.define.CMAKE_CXX_FLAGS=-DGGML_MAX_NAME=160 --force-reinstall "
    "libggml-python==0.20.2.post1 (then reinstall sdplan)"
)

#: Seconds to wait for an RPC endpoint to accept a TCP connection before giving up.
CONNECT_TIMEOUT_S = 3.0

#: ggml CPU feature -> (/proc/cpuinfo flag, ggml's CMake switch): a fast path the host has
#: but ggml may lack. libggml-python builds with ``GGML_NATIVE=OFF`` (its pyproject.toml), so
#: a source build has only the switches it is given.
_X86_FAST_PATHS = {"AVX2": ("avx2", "GGML_AVX2"), "FMA": ("fma", "GGML_FMA"),
                   "F16C": ("f16c", "GGML_F16C"), "AVX512": ("avx512f", "GGML_AVX512")}

#: The features ``sdplan devices`` suggests rebuilding ggml for, each by its own switch. Measured
#: by bench/bench_ggml_build.py (ggml 0.20.2 under sdplan, SD 1.5-size UNet step at 256 px with
#: CFG, 2 threads, medians of 3 interleaved processes, Xeon with AMX; README "CPU speed"): the
#: README's build against one without AVX2, FMA and F16C ran the f16 path's step
#: (``SDPLAN_BF16_KERNEL=off``, what a CPU without AMX or AVX512_BF16 runs) in 0.07x the time, the
#: bf16 path's in 0.95x (noise). Not AVX512 nor GGML_NATIVE=ON: a native build (AVX-512, VNNI,
#: AVX512_BF16, AMX) ran the bf16 path's step in 0.94x (within the 1.54x spread: ggml runs about
#: 14% of it) and the f16 path's in 2.53x, as ggml's CPU flash attention takes its tiled kernel
#: only for head widths that are a multiple of the vector width (16 floats with AVX-512; SD 1.x's
#: 40-wide heads fall back, 15-17x slower), though its f16 products ran in 0.61-0.77x. sdplan's
#: own bf16 kernels use AVX-512 and AMX in either build.
_SUGGESTED_FAST_PATHS = ("AVX2", "FMA", "F16C")


#: The one bf16 change ``sdplan devices`` suggests, where the CPU has AMX: measured by
#: bench/bench_cpu_bf16.py (SD 1.5 size, 2 threads, medians of 3 interleaved processes; the
#: README's "CPU speed" table) and bench/bench_cpu_bf16_families.py (a call of the FLUX.1,
#: FLUX.2 klein, Z-Image and SD3 DiTs, T5-XXL and Qwen3-4B at their real widths) and
#: bench/bench_upscale.py (an x4 SRVGGNetCompact upscale).
BF16_ADVICE = ("this CPU runs sdplan's AMX bf16 kernel, turned off here: SDPLAN_BF16_KERNEL=auto "
               "holds the UNets, DiTs, VAEs, text encoders and upscalers in bf16 (measured: an SD 1.5 256/512 px "
               "step in 0.23x/0.18x, a decode in 0.39x/0.49x, text encoding in 0.30x, a DiT or T5/Qwen3 "
               "call in 0.12x-0.51x the f16 path's time, an x4 upscale in 0.51x-0.67x the f32 path's); outputs "
               "change by about 1% of their range (T5's up to 3%)")


class RpcError(InventoryError):
    """An RPC server cannot be used: ggml lacks RPC, or the endpoint is bad or unreachable."""

    code = "rpc_error"


# --------------------------------------------------------------------------- RPC


def rpc_available() -> bool:
    """True when the loaded ggml has the RPC backend (built with ``GGML_RPC=ON``)."""
    return bool(native().rpc_available())


def require_rpc() -> None:
    """Raise :class:`RpcError` with the install command when ggml lacks RPC."""
    if not rpc_available():
        raise RpcError(
            "the installed ggml (libggml-python) was built without the RPC backend; "
            f"get an RPC-enabled one with: {RPC_INSTALL_COMMAND}"
        )


def parse_endpoint(text: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 as ``[::1]:port``) into ``(host, port)``.

    Raises :class:`RpcError` naming ``text`` when it is not ``host:port`` with a port in
    1..65535.
    """
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RpcError(f"RPC endpoint {text!r} is not host:port (port 1-65535)")
    return host, int(port_text)


def split_endpoints(values: Iterable[str]) -> list[str]:
    """Flatten ``--rpc-servers`` values (each may be comma-separated) into endpoints,
    dropping empty entries and duplicates, keeping the first occurrence's order."""
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    return out


def check_endpoint(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Check that ``endpoint`` (``host:port``) accepts a TCP connection within ``timeout``
    seconds; raises :class:`RpcError` naming the endpoint otherwise."""
    import socket  # RPC only: not loaded by an engine process that uses none

    from sdplan.core.runtime.rpc_wire import abandon

    host, port = parse_endpoint(endpoint)
    try:
        abandon(socket.create_connection((host, port), timeout=timeout))
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise RpcError(
            f"RPC server {endpoint} is unreachable ({reason}); is `sdplan rpc-server` "
            f"running there and the port open?"
        ) from None


_PROBE_SCRIPT = """
import sys
from sdplan._ggml import rpc_add_server
for endpoint in sys.argv[1:]:
    rpc_add_server(endpoint)
    print(endpoint, flush=True)
"""


def probe_rpc_servers(endpoints: Sequence[str], timeout: float = 30.0) -> None:
    """Handshake with each endpoint in a throwaway subprocess before this process
    registers it: ggml aborts the process it runs in when a peer is not a ggml RPC server
    of the same protocol version, so that abort must happen elsewhere.

    Raises :class:`RpcError` naming the first endpoint that fails, with ggml's reason.
    """
    if not endpoints:
        return
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE_SCRIPT, *endpoints],
                             capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RpcError(f"RPC servers {', '.join(endpoints)} did not answer the ggml RPC "
                       f"handshake within {timeout:.0f} s") from None
    if res.returncode == 0:
        return
    done = set(res.stdout.split())
    failed = next((ep for ep in endpoints if ep not in done), endpoints[-1])
    reasons = re.findall(r"\.cpp:\d+: (.+)|(RuntimeError: .+)", res.stderr)
    reason = next((a or b for a, b in reasons), f"exit code {res.returncode}")
    raise RpcError(f"RPC server {failed} does not answer as a ggml RPC server of this "
                   f"ggml's protocol ({reason.strip()}); is it `sdplan rpc-server` or "
                   "`rpc-server` from the same ggml version?")


def local_rpc_speaks() -> tuple[tuple[int, int, int], int]:
    """``(protocol, name length)`` of the loaded ggml: its RPC protocol version and the
    tensor-name length of its tensor records."""
    ng = native()
    return tuple(ng.rpc_protocol()), int(ng.library_max_name())  # type: ignore[return-value]


def check_rpc_server(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse a server that does not speak this ggml's RPC: another protocol major version,
    or tensor records of another name length (``GGML_MAX_NAME``: 160 in
    stable-diffusion.cpp's builds, 64 in ggml's default), asked over the wire without
    ggml (:mod:`sdplan.core.runtime.rpc_wire`), before ggml could abort on a misread record.

    Raises:
        RpcError: one line naming the endpoint, what it speaks and what this ggml speaks;
            or that it is busy serving another client (connected, no answer in ``timeout``).
    """
    from sdplan.core.runtime.rpc_wire import RpcBusy, probe_server

    protocol, local = local_rpc_speaks()
    try:
        info = probe_server(endpoint, timeout=timeout)
    except RpcBusy as exc:
        raise RpcError(f"RPC server {endpoint} is busy: {exc}. A ggml RPC server serves one "
                       "client at a time; wait until its other client (sd-cli, another "
                       "sdplan) finishes, or start a second server on another port") from None
    except (OSError, ConnectionError) as exc:
        raise RpcError(f"RPC server {endpoint} does not answer as a ggml RPC server of "
                       f"protocol {protocol[0]} ({exc}); is it `sdplan rpc-server` or "
                       "`rpc-server` from the same ggml version?") from None
    if info.protocol[0] != protocol[0]:
        raise RpcError(f"RPC server {endpoint} speaks ggml RPC "
                       f"{'.'.join(map(str, info.protocol))}; this sdplan's ggml speaks "
                       f"{'.'.join(map(str, protocol))}")
    if info.max_name != local:
        theirs = f"{info.max_name} bytes" if info.max_name else "a length sdplan cannot tell"
        raise RpcError(f"RPC server {endpoint} speaks tensor names of {theirs}; this sdplan's "
                       f"ggml uses {local} (GGML_MAX_NAME): run a server built with the same "
                       "ggml (`sdplan rpc-server`, or rebuild sdplan's ggml with "
                       f"-DGGML_MAX_NAME={info.max_name or 160})")


def add_rpc_servers(endpoints: Sequence[str], timeout: float = CONNECT_TIMEOUT_S) -> list[str]:
    """Add ggml RPC servers so their devices join the inventory; returns the sdplan names
    (``RPC0``...) of every device the given endpoints expose, in order.

    Each new endpoint is first checked with :func:`check_endpoint` (TCP) and
    :func:`probe_rpc_servers` (RPC handshake in a subprocess), so a bad endpoint is an
    error, not an abort of this process. Adding an endpoint twice adds nothing. Raises :class:`RpcError` when ggml lacks RPC, an endpoint is malformed or
    unreachable, or a server exposes no devices.
    """
    endpoints = split_endpoints(endpoints)
    if not endpoints:
        return []
    require_rpc()
    ng = native()
    for endpoint in endpoints:
        parse_endpoint(endpoint)
    known = {ep for ep, _ in ng.rpc_servers()}
    new = [ep for ep in endpoints if ep not in known]
    for endpoint in new:
        check_endpoint(endpoint, timeout)
        check_rpc_server(endpoint, timeout)
    probe_rpc_servers(new)
    for endpoint in new:
        try:
            names = ng.rpc_add_server(endpoint)
        except RuntimeError as exc:
            raise RpcError(f"RPC server {endpoint}: {exc}") from None
        log.debug("RPC server %s added devices %s", endpoint, names)
    mapping = rpc_device_map()
    return [name for name, (_, ep) in mapping.items() if ep in endpoints]


def rpc_device_map() -> dict[str, tuple[str, str]]:
    """``{sdplan name: (ggml name, endpoint)}`` for every RPC device added in this process,
    sdplan names ``RPC0``, ``RPC1``... in the order added across servers."""
    if not native().rpc_available():
        return {}
    out: dict[str, tuple[str, str]] = {}
    for endpoint, ggml_names in native().rpc_servers():
        for ggml_name in ggml_names:
            out[f"RPC{len(out)}"] = (ggml_name, endpoint)
    return out


def to_ggml_name(name: str) -> str:
    """The ggml device name of the sdplan device ``name`` (differs only for RPC devices)."""
    entry = rpc_device_map().get(name)
    return entry[0] if entry else name


# --------------------------------------------------------------------------- inventory


def _mem_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _refine_free(typ: str, free: int, total: int) -> int:
    """ggml's CPU device reports free == total; the system memory really free is
    /proc/meminfo's MemAvailable (Linux), so CPU devices use it where it exists."""
    if typ == "cpu" and free >= total:
        avail = _mem_available()
        if avail is not None:
            return min(avail, total)
    return free


def _device_from_record(rec: dict[str, Any], rpc_names: dict[str, tuple[str, str]]) -> Device:
    name, description, typ = rec["name"], rec["description"], rec["type"]
    free, total = int(rec["free"]), int(rec["total"])
    for sd_name, (ggml_name, endpoint) in rpc_names.items():
        if ggml_name == name:
            name, description, typ = sd_name, endpoint, "gpu"
            break
    free = _refine_free(typ, free, total)
    return Device(name=name, description=description, type=typ, registry=rec["registry"],
                  free=free, total=total, device_id=rec["device_id"], caps=dict(rec["caps"]))


def live_inventory(rpc_servers: Sequence[str] = ()) -> Inventory:
    """The devices of this process's ggml, after adding ``rpc_servers`` (``host:port``
    entries, each may be comma-separated), in ggml's enumeration order (RPC last).

    Memory is in bytes; ``free`` of CPU devices is MemAvailable where /proc/meminfo exists.
    ggml's virtual ``meta`` devices are left out. Raises :class:`RpcError` as
    :func:`add_rpc_servers` does.
    """
    add_rpc_servers(rpc_servers)
    rpc_names = rpc_device_map()
    devices = []
    for rec in native().list_devices():
        if rec["type"] not in DEVICE_TYPES:
            log.debug("skipping ggml device %s of type %s", rec["name"], rec["type"])
            continue
        devices.append(_device_from_record(rec, rpc_names))
    return Inventory.from_devices(devices)


def device_memory(name: str) -> tuple[int, int]:
    """``(free, total)`` bytes of the device with sdplan name ``name``, asked of ggml now
    (cheap for local devices, one round trip for RPC ones); CPU devices' ``free`` is
    MemAvailable as in :func:`live_inventory`. Raises :class:`InventoryError` for an
    unknown device."""
    ng = native()
    ggml_name = to_ggml_name(name)
    try:
        free, total = ng.device_memory(ggml_name)
        typ = str(ng.device_type(ggml_name))
    except ValueError:
        raise InventoryError(f"no device named {name!r}") from None
    return _refine_free(typ, int(free), int(total)), int(total)


# --------------------------------------------------------------------------- features


def _host_cpu_flags() -> set[str]:
    """The host CPU's flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def missing_cpu_features_advice(missing: Sequence[str]) -> str:
    """One line naming ggml CPU features (``AVX2``...) this CPU has but the loaded ggml lacks,
    and the CMake switch of each (:data:`_X86_FAST_PATHS`) to add to libggml-python's source
    build; never ``GGML_NATIVE=ON``, which measured slower (see :data:`_SUGGESTED_FAST_PATHS`).
    Raises ``ValueError`` for a feature without a known switch."""
    unknown = [f for f in missing if f not in _X86_FAST_PATHS]
    if unknown or not missing:
        raise ValueError(f"no ggml CMake switch known for CPU features {unknown or list(missing)}")
    switches = " ".join(f"-C cmake.define.{_X86_FAST_PATHS[f][1]}=ON" for f in missing)
    return (f"ggml's CPU backend was built without {', '.join(missing)}, which this CPU has "
            f"(libggml-python builds with GGML_NATIVE=OFF); add {switches} to the install "
            "command's libggml-python switches and reinstall it")


def features() -> dict[str, Any]:
    """What the loaded ggml can do, with warnings when a fast path is missing.

    Returns ``{"ggml_version": str, "rpc": bool, "llamafile": bool,
    "cpu_features": {name: value}, "registries": [str], "cpu_threads": {"default": int,
    "usable_cpus": int, "reason": str}, "bf16_kernel": str, "bf16_cpu_kernel": str,
    "fma_gemm": bool, "wino_kernel": str, "warnings": [str]}``; ``fma_gemm``: f16 linear weights
    and f16/f32 convolution kernels on the CPU are multiplied by sdplan's FMA product
    (``SDPLAN_FMA_GEMM``); ``wino_kernel`` is the build of sdplan's Winograd convolution (3x3
    f16/f32 kernels on wide images: ``avx512``, ``avx2`` or ``generic``);
    ``bf16_kernel`` is sdplan's CPU bf16 kernel in use (``amx``, ``avx512`` or ``off``; see
    ``SDPLAN_BF16_KERNEL``): the modules measured faster with it run their products in bf16
    (``cpu_bf16_kernels`` of their model class; the choice is
    :func:`sdplan.core.runtime.kernels.current`'s, ``kernel_sources`` says where each came from); the CPU features come from the
    CPU registry's ``ggml_backend_get_features`` proc address; ``cpu_threads`` is the default
    before other programs' load is measured (``generate`` measures it and may use fewer).
    """
    ng = native()
    try:
        cpu = dict(ng.backend_features("CPU"))
    except ValueError:
        cpu = {}
    rpc = bool(ng.rpc_available())
    llamafile = cpu.get("LLAMAFILE", "0") not in ("", "0")
    warnings = []
    if not rpc:
        warnings.append(f"ggml lacks the RPC backend (no RPC devices); get it with: "
                        f"{RPC_INSTALL_COMMAND}")
    if not llamafile:
        warnings.append("ggml lacks llamafile's sgemm kernels (CPU sampling about 1.8x "
                        f"slower); get them with: {RPC_INSTALL_COMMAND}")
    if _machine().lower() in ("x86_64", "amd64"):
        host = _host_cpu_flags()
        missing = [f for f, (flag, _) in _X86_FAST_PATHS.items()
                   if flag in host and f not in cpu and f in _SUGGESTED_FAST_PATHS]
        if missing:
            warnings.append(missing_cpu_features_advice(missing))
    from sdplan.core.runtime.kernels import running

    chosen = running(ng)
    if chosen.bf16 == "off" and chosen.cpu_bf16 == "amx":
        warnings.append(BF16_ADVICE)
    threads = choose_threads(0, measure=False)
    return {
        "ggml_version": str(ng.ggml_version()),
        "rpc": rpc,
        "llamafile": llamafile,
        "cpu_features": cpu,
        "registries": [r for r in ng.registry_names() if not r.startswith("RPC[")],
        "cpu_threads": {"default": threads.threads, "usable_cpus": threads.cpus,
                        "reason": threads.reason},
        "bf16_kernel": chosen.bf16,
        "bf16_cpu_kernel": chosen.cpu_bf16,
        "fma_gemm": chosen.fma_gemm,
        "wino_kernel": chosen.wino,
        "kernel_sources": dict(chosen.why),
        "warnings": warnings,
    }


# --------------------------------------------------------------------------- backends


class BackendManager:
    """One shared ggml backend per device (spec section 10), released by :meth:`close`.

    Devices are named as in the inventory (``CPU``, ``CUDA0``, ``RPC0``...). Use as a
    context manager to close on exit. ``native`` is the underlying
    ``sdplan._ggml.BackendManager`` for native code that takes one.
    """

    def __init__(self, cpu_threads: int | None = None) -> None:
        """``cpu_threads``: threads of CPU-like backends; None means the CPUs this process
        may use (its affinity mask, :func:`sdplan.core.runtime.threads.usable_cpus`)."""
        self.native = native().BackendManager(self._check_threads(
            len(usable_cpus()) if cpu_threads is None else cpu_threads))

    @staticmethod
    def _check_threads(n: object) -> int:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"cpu_threads must be an int >= 0 (0: ggml's default), got {n!r}")
        return n

    @property
    def cpu_threads(self) -> int:
        """Threads of CPU-like backends; setting it applies to open backends too."""
        return int(self.native.cpu_threads)

    @cpu_threads.setter
    def cpu_threads(self, n: int) -> None:
        self.native.cpu_threads = self._check_threads(n)

    def get(self, device: str) -> Any:
        """The shared ``sdplan._ggml.Backend`` of ``device`` (sdplan name), created on first
        use. Raises :class:`InventoryError` for an unknown device and RuntimeError once
        closed."""
        try:
            return self.native.get(to_ggml_name(device))
        except ValueError:
            raise InventoryError(f"no device named {device!r}") from None

    def open_devices(self) -> list[str]:
        """sdplan names of the devices with an open backend, in opening order."""
        back = {ggml: sd for sd, (ggml, _) in rpc_device_map().items()}
        return [back.get(n, n) for n in self.native.open_devices()]

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return bool(self.native.closed)

    def close(self) -> None:
        """Free every backend (idempotent); holders of one see it closed."""
        self.native.close()

    def __enter__(self) -> BackendManager:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _machine() -> str:
    """The machine's architecture name (``x86_64``, ``aarch64``; ``platform.machine()``,
    without loading the platform module where ``os.uname`` gives it)."""
    if hasattr(os, "uname"):
        return os.uname().machine
    import platform

    return platform.machine()


def is_loopback_host(host: str) -> bool:
    """True when ``host`` (IP literal or name) only means this machine: a loopback
    address, or a name all of whose addresses are loopback."""
    import ipaddress
    import socket

    value = host.strip().strip("[]")
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(value, None)
    except OSError:
        return False
    addrs = {str(info[4][0]) for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def fallback_inventory() -> Inventory:
    """Just the CPU, sized from ``/proc/meminfo`` (bytes; zeros when unreadable)."""
    free = total = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            info = {k: v for k, v in (line.split(":", 1) for line in fh if ":" in line)}
        total = int(info.get("MemTotal", "0 kB").split()[0]) * 1024
        free = int(info.get("MemAvailable", "0 kB").split()[0]) * 1024
    except (OSError, ValueError):
        log.debug("cannot read /proc/meminfo", exc_info=True)
    cpu = Device("CPU", f"CPU ({len(usable_cpus())} threads)", "cpu", "CPU", free, total)
    return Inventory((cpu,))


def local_inventory(rpc_servers: Sequence[str] = ()) -> tuple[Inventory, str | None]:
    """This machine's devices (after adding ``rpc_servers``) and None; or, when the native
    module is missing, :func:`fallback_inventory` and the reason.

    Raises:
        RpcError: an RPC server is unreachable or ggml lacks RPC.
    """
    try:
        return live_inventory(rpc_servers=list(rpc_servers)), None
    except NativeUnavailable as exc:
        log.debug("live inventory unavailable: %s", exc)
        return fallback_inventory(), str(exc)
