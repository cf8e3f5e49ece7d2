"""Every golden case of ``../shared/cases/assignment_cases.jsonl`` through ``sdplan plan``.

The file is read at collection time, so new cases run unchanged; each case calls the real
command function ``sdplan.core.cli.main`` with ``--devices``, ``--profile`` and ``--json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sdplan.core import cli

CASES_FILE = Path(__file__).resolve().parent.parent.parent / "shared" / "cases" / \
    "assignment_cases.jsonl"


def _cases() -> list[dict]:
    if not CASES_FILE.is_file():
        return [{"id": "no-shared-cases"}]
    lines = CASES_FILE.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


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
    for device, want_bytes in expect.get("budgets", {}).items():
        assert out["budgets"][device] == want_bytes, device
    codes = [w["code"] for w in out["warnings"]]
    for code_ in expect.get("warnings", []):
        assert code_ in codes, (code_, out["warnings"])
    for module, want_ranges in expect.get("ranges", {}).items():
        got = [{k: r[k] for k in ("device", "first_block", "last_block")}
               for r in out["modules"][module]["ranges"]]
        assert got == want_ranges, module
