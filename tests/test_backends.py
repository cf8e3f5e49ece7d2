"""The backend manager: one shared backend per device, all released by close()."""

from __future__ import annotations

import threading

import pytest
import sdplan._ggml as native
from sdplan.core.errors import InventoryError
from sdplan.core.runtime.devices import BackendManager


def test_same_device_same_instance() -> None:
    with BackendManager(cpu_threads=1) as m:
        a = m.get("CPU")
        assert m.get("CPU") is a
        assert a.device_name == "CPU" and not a.closed
        assert m.open_devices() == ["CPU"]
    assert a.closed


def test_separate_managers_own_separate_backends() -> None:
    with BackendManager(1) as m1, BackendManager(1) as m2:
        a, b = m1.get("CPU"), m2.get("CPU")
        assert a is not b
        m1.close()
        assert a.closed and not b.closed


def test_close_releases_and_refuses_further_use() -> None:
    m = BackendManager(cpu_threads=1)
    b = m.get("CPU")
    m.close()
    assert m.closed and b.closed and m.open_devices() == []
    with pytest.raises(RuntimeError, match="closed"):
        m.get("CPU")
    with pytest.raises(RuntimeError, match="closed"):
        _ = b.name  # a freed backend is never used
    m.close()  # idempotent


def test_concurrent_gets_share_one_instance() -> None:
    with BackendManager(cpu_threads=1) as m:
        got: list[object] = []
        threads = [threading.Thread(target=lambda: got.append(m.get("CPU"))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 8 and all(g is got[0] for g in got)


def test_cpu_threads_setting() -> None:
    with BackendManager(cpu_threads=2) as m:
        assert m.cpu_threads == 2
        b = m.get("CPU")
        m.cpu_threads = 1
        assert m.cpu_threads == 1
        assert b.set_n_threads(2) is True  # the CPU registry has a thread setting
        for bad in (-1, 1.5, "4", True):
            with pytest.raises(ValueError, match="cpu_threads"):
                m.cpu_threads = bad  # type: ignore[assignment]
    with pytest.raises(ValueError, match="cpu_threads"):
        BackendManager(cpu_threads=-3)


def test_unknown_device_is_named() -> None:
    with BackendManager(1) as m, pytest.raises(InventoryError, match="'NoSuchDevice'"):
        m.get("NoSuchDevice")
    with pytest.raises(ValueError, match="NoSuchDevice"):
        native.init_backend("NoSuchDevice")


def test_init_backend_is_uncached() -> None:
    a, b = native.init_backend("CPU"), native.init_backend("CPU")
    assert a is not b and a.name == b.name == "CPU"
    a.close()
    assert a.closed and not b.closed
