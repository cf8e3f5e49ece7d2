"""RPC servers and the tensor-name length: sdplan tells which GGML_MAX_NAME a server speaks
(asked over the wire), refuses one that differs from its ggml in one line instead of
crashing, says what it speaks itself, and its native module agrees with the ggml library."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fake_rpc import fake_rpc_server
from sdplan.core import cli
from sdplan.core.runtime import native as native_mod
from sdplan.core.runtime.devices import RpcError, check_rpc_server, local_rpc_speaks
from sdplan.core.runtime.rpc_wire import probe_server, server_name_length, tensor_record_size

G = pytest.importorskip("sdplan._ggml")


def test_record_size_follows_the_name_length() -> None:
    assert tensor_record_size(64) == 296 and tensor_record_size(160) == 392
    assert tensor_record_size(64) % 8 == 0 and tensor_record_size(160) % 8 == 0


@pytest.mark.parametrize("max_name", [64, 160, 256])
def test_the_wire_probe_finds_a_servers_name_length(max_name: int) -> None:
    with fake_rpc_server(max_name) as ep:
        assert server_name_length(ep) == max_name
        info = probe_server(ep)
        assert info.protocol == (5, 0, 0) and info.max_name == max_name
        assert info.describe() == f"ggml RPC 5.0.0, tensor names of {max_name} bytes"


def test_a_server_of_another_name_length_is_refused_in_one_line(capsys) -> None:
    protocol, local = local_rpc_speaks()
    other = 160 if local != 160 else 64
    with fake_rpc_server(other) as ep:
        with pytest.raises(RpcError) as err:
            check_rpc_server(ep)
        msg = str(err.value)
        assert "\n" not in msg and ep in msg
        assert f"tensor names of {other} bytes" in msg and f"uses {local}" in msg
        # the command line: one line, exit 2, no ggml abort
        if G.rpc_available():
            code = cli.main(["devices", "--rpc-servers", ep])
            err_text = capsys.readouterr().err.strip()
            assert code == 2 and err_text.count("\n") == 0 and f"{other} bytes" in err_text
    with fake_rpc_server(local, protocol=(protocol[0] + 1, 0, 0)) as ep, \
            pytest.raises(RpcError, match="speaks ggml RPC"):
        check_rpc_server(ep)
    with fake_rpc_server(local) as ep:
        check_rpc_server(ep)  # the same length and protocol pass


@pytest.mark.rpc
def test_sdplan_rpc_server_says_what_it_speaks(capsys) -> None:
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    protocol, local = local_rpc_speaks()
    with rpc_servers(1) as servers:
        srv = servers[0]
        assert server_name_length(srv.endpoint) == local
        assert f"tensor names of {local} bytes" in srv.output()
        # `sdplan devices` in a child process (a registered server must not outlive us)
        out = subprocess.run([sys.executable, "-m", "sdplan.core.cli", "devices",
                              "--rpc-servers", srv.endpoint, "--json"], capture_output=True,
                             text=True, timeout=120, env={**os.environ})
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        assert data["rpc_servers"] == [{"endpoint": srv.endpoint, "protocol": list(protocol),
                                        "max_name": local,
                                        "speaks": f"ggml RPC {'.'.join(map(str, protocol))}, "
                                                  f"tensor names of {local} bytes"}]


def test_module_and_library_agree_and_a_mismatch_is_one_line(monkeypatch) -> None:
    assert G.ggml_max_name() == G.library_max_name()

    class Fake:
        def ggml_max_name(self) -> int:
            return 160

        def library_max_name(self) -> int:
            return 64

    with pytest.raises(native_mod.NativeUnavailable) as err:
        native_mod.check_tensor_layout(Fake())  # type: ignore[arg-type]
    assert "built for tensor names of 160 bytes but the ggml library uses 64" in str(err.value)


def test_ci_builds_ggml_with_stable_diffusion_cpps_name_length() -> None:
    """The README's install command builds ggml with GGML_MAX_NAME=160, as
    stable-diffusion.cpp does; CI (SDPLAN_REQUIRE_RPC=1) installs exactly that."""
    if G.library_max_name() != 160:
        from conftest import require_or_skip

        require_or_skip(f"this ggml was built with GGML_MAX_NAME={G.library_max_name()}, not "
                        "160 (an install from before the README's current command)",
                        "SDPLAN_REQUIRE_RPC")
    assert G.ggml_max_name() == 160
