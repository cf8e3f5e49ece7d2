"""Every golden case of ``../shared/cases/assignment_cases.jsonl`` and of
``tests/cases/split_mode_cases.jsonl`` (``--split-mode``, spec section 12, in the same
format, using the shared inventories and profiles) through ``sdplan plan``.

The files are read at collection time, so new cases run unchanged; each case calls the real
command function ``sdplan.core.cli.main`` with ``--devices``, ``--profile`` and ``--json``.
Besides the shared format, a module's expectation may name ``split_mode`` (the mode in
effect), ``row_shares`` (bytes per device in row mode) and ``ranges``; the case may name
the canonical ``split_mode`` string.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sdplan.core import cli

CASES_FILE = Path(__file__).resolve().parent.parent.parent / "shared" / "cases" / \
    "assignment_cases.jsonl"
SPLIT_MODE_FILE = Path(__file__).resolve().parent / "cases" / "split_mode_cases.jsonl"


def _cases() -> list[dict]:
    out = []
    if not CASES_FILE.is_file():
        out.append({"id": "no-shared-cases"})
    else:
        out += [json.loads(line) for line in CASES_FILE.read_text(encoding="utf-8").splitlines()
                if line.strip()]
    out += [json.loads(line) for line in SPLIT_MODE_FILE.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return out


CASES = _cases()


@pytest.mark.shared
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_golden_case(case: dict, shared_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = shared_dir / "cases"
    argv = ["plan", "--devices", str(cases / "devices" / f"{case['devices']}.json")]
    if case.get("profile"):
        argv += ["--profile", str(cases / "profiles" / f"{case['profile']}.json")]
    argv += [*case["args"], "--json"]
    code = cli.main(argv)
    out = json.loads(capsys.readouterr().out)
    expect = case["expect"]
    if "error" in expect:
        assert code == 2, out
        assert out["ok"] is False
        assert out["error"]["code"] == expect["error"], out["error"]
        span = out["error"]["span"]
        if span is not None:
            assert 0 <= span[0] <= span[1]
        return
    assert code == 0, out
    assert out["ok"] is True
    for module, want in expect.get("modules", {}).items():
        got = out["modules"][module]
        if "devices" in want:
            assert got["devices"] == want["devices"], (module, got)
        if "params" in want:
            assert got["params"] == want["params"], (module, got)
        for key in ("split_mode", "row_shares", "ranges"):
            if key in want:
                assert got.get(key) == want[key], (module, key, got)
    if "split_mode" in expect:
        assert out["split_mode"] == expect["split_mode"]
    for device, want_bytes in expect.get("budgets", {}).items():
        assert out["budgets"][device] == want_bytes, device
    codes = [w["code"] for w in out["warnings"]]
    for code_ in expect.get("warnings", []):
        assert code_ in codes, (code_, out["warnings"])
    for module, want_ranges in expect.get("ranges", {}).items():
        got = [{k: r[k] for k in ("device", "first_block", "last_block")}
               for r in out["modules"][module]["ranges"]]
        assert got == want_ranges, module
