"""Golden cases of the newest sd-cli (spec section 14) in ``tests/cases/newest_cases.jsonl``,
each written from the spec line it names (``source``), through ``sdplan plan --json``.

The format is the shared cases' (``../shared/cases/README.md``: ``devices``, ``profile``,
``args``, ``expect`` with ``error``, ``modules``, ``warnings``, ``ranges``), plus: an inline
``inventory`` instead of ``devices``; and under ``expect``: ``auto_fit`` (None, or the
``tiers`` each component's weights went to), ``sdcli_flags`` (the placement flags written
for the target's dialect), ``cfg`` (the parallel-CFG device object) and ``fit_devices``
(device -> figures of the memory estimate that must hold, in bytes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sdplan.core import cli

CASES_FILE = Path(__file__).resolve().parent / "cases" / "newest_cases.jsonl"
CASES = [json.loads(x) for x in CASES_FILE.read_text(encoding="utf-8").splitlines() if x.strip()]


def test_every_case_names_its_source() -> None:
    assert len(CASES) >= 15
    assert all(c["source"].startswith("spec 14") for c in CASES)
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.shared
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_newest_golden_case(case: dict, shared_dir: Path, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    cases = shared_dir / "cases"
    if "inventory" in case:
        devices = tmp_path / "inv.json"
        devices.write_text(json.dumps(case["inventory"]))
    else:
        devices = cases / "devices" / f"{case['devices']}.json"
    argv = ["plan", "--devices", str(devices)]
    if case.get("profile"):
        argv += ["--profile", str(cases / "profiles" / f"{case['profile']}.json")]
    code = cli.main([*argv, *case["args"], "--json"])
    out = json.loads(capsys.readouterr().out)
    expect = case["expect"]
    if "error" in expect:
        assert code == 2 and out["error"]["code"] == expect["error"], out
        return
    assert code == 0, out
    for module, want in expect.get("modules", {}).items():
        got = out["modules"][module]
        for key in ("devices", "params"):
            if key in want:
                assert got[key] == want[key], (module, key, got)
    for module, want in expect.get("ranges", {}).items():
        got = [{k: r[k] for k in ("device", "first_block", "last_block")}
               for r in out["modules"][module]["ranges"]]
        assert got == want, module
    codes = [w["code"] for w in out["warnings"]]
    for code_ in expect.get("warnings", []):
        assert code_ in codes, (code_, out["warnings"])
    if "auto_fit" in expect:
        if expect["auto_fit"] is None:
            assert "auto_fit" not in out
        else:
            assert out["auto_fit"]["tiers"] == expect["auto_fit"]["tiers"]
    if "sdcli_flags" in expect:
        assert out["sdcli"]["flags"] == expect["sdcli_flags"]
    if "cfg" in expect:
        assert out["cfg"] == expect["cfg"]
    for device, figures in expect.get("fit_devices", {}).items():
        for key, value in figures.items():
            assert out["fit"]["devices"][device][key] == value, (device, key)
