"""Pasted sd-cli commands: every option of sd-cli's table splits as sd-cli splits it, the
shells' quoting rules (POSIX, cmd.exe, PowerShell, one argument per line) are honoured, and
the written command keeps every argument of the pasted one.

``tests/cases/upstream_doc_commands.jsonl`` holds every sd-cli command of
stable-diffusion.cpp's ``docs/*.md`` at the commit named on its first line.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from sdplan.core.errors import PlanError
from sdplan.core.planning.cmdline import command_dialect, split_command_line, split_windows
from sdplan.core.planning.sdcli import (
    import_sdcli_command,
    merge_flags,
    parse_sdcli_args,
    sdcli_command_line,
)
from sdplan.core.planning.sdcli_table import SDCLI_OPTIONS, option

DOCS = Path(__file__).parent / "cases" / "upstream_doc_commands.jsonl"


def _doc_commands() -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in DOCS.read_text(encoding="utf-8").splitlines() if x.strip()]
    return lines[0], lines[1:]


HEADER, COMMANDS = _doc_commands()


def written(imp) -> str:  # noqa: ANN001 - ImportedCommand
    return sdcli_command_line(imp.placement, imp.model_files, imp.generation,
                              extra=imp.extra_args(), raw=imp.generation_text)


def non_placement(imp) -> Counter:  # noqa: ANN001
    return Counter((a.flag, a.values) for a in imp.arguments if a.kind != "placement")


def test_doc_list_names_its_snapshot() -> None:
    assert HEADER["commit"] == "97d2990807fe6d558e395f8764198d7c7e7b411c"
    assert len(COMMANDS) >= 100
    assert {c["doc"] for c in COMMANDS} >= {"docs/flux.md", "docs/backend.md", "docs/rpc.md"}


@pytest.mark.parametrize("case", COMMANDS, ids=[f"{c['doc']}:{c['line']}" for c in COMMANDS])
def test_every_doc_command_imports_and_survives_writing(case: dict) -> None:
    imp = import_sdcli_command(case["command"])
    line = written(imp)
    again = import_sdcli_command(line)
    # every argument that is not a placement flag comes back unchanged (flag and values)
    assert non_placement(again) == non_placement(imp)
    # the placement means the same
    assert again.placement.to_strings() == imp.placement.to_strings()
    assert again.placement.split_mode_text() == imp.placement.split_mode_text()
    assert (again.placement.auto_fit, again.placement.stream_layers) == \
        (imp.placement.auto_fit, imp.placement.stream_layers)
    # and writing is stable: the written command writes itself
    assert written(again) == line


def test_doc_commands_keep_their_paths_and_prompts() -> None:
    by_key = {(c["doc"], c["line"]): c["command"] for c in COMMANDS}
    flux = next(v for (d, _), v in by_key.items() if d == "docs/flux.md" and "schnell" in v)
    imp = import_sdcli_command(flux)
    assert imp.program == r".\bin\Release\sd-cli.exe"
    assert imp.model_files["diffusion_model"] == r"..\models\flux1-schnell-q8_0.gguf"
    assert imp.model_files["t5xxl"] == r"..\models\t5xxl_fp16.safetensors"
    assert imp.generation["prompt"] == "a lovely cat holding a sign says 'flux.cpp'"
    assert imp.generation["steps"] == 4 and imp.placement.deprecated == ("--clip-on-cpu",)
    assert imp.kept == ["-v"] and imp.unknown == []
    # PowerShell single quotes around a JSON prompt full of double quotes
    ideo = next(v for (d, _), v in by_key.items() if d == "docs/ideogram4.md" and "-p '" in v)
    prompt = import_sdcli_command(ideo).generation["prompt"]
    assert isinstance(prompt, str) and json.loads(prompt)["style_description"]
    # a prompt whose quotes span two lines
    hidream = next(v for (d, _), v in by_key.items() if d == "docs/hidream_o1_image.md")
    assert import_sdcli_command(hidream).generation["prompt"].endswith("\n'hidream o1 cpp'")


def test_table_has_every_option_once() -> None:
    longs = [o.long for o in SDCLI_OPTIONS]
    assert len(longs) == len(set(longs)) >= 150
    shorts = [o.short for o in SDCLI_OPTIONS if o.short]
    assert len(shorts) == len(set(shorts))
    assert option("-M").long == "--mode" and option("--fa").values == 0
    assert option("--split-mode").repeat == "join" and option("--ref-image").repeat == "append"
    assert option("--prompt=x") is None and option("--PROMPT") is None


def test_arity_comes_from_the_table() -> None:
    args = parse_sdcli_args(["--max-vram", "-1", "--diffusion-fa", "-s", "-5", "--sigmas",
                             "-1,2", "--cache-mode", "easycache", "-i", "in.png", "--foo",
                             "bar", "--baz", "-v"])
    assert [(a.flag, a.values, a.kind) for a in args] == [
        ("--max-vram", ("-1",), "placement"), ("--diffusion-fa", (), "kept"),
        ("--seed", ("-5",), "generation"), ("--sigmas", ("-1,2",), "generation"),
        ("--cache-mode", ("easycache",), "kept"), ("--init-img", ("in.png",), "generation"),
        ("--foo", ("bar",), "unknown"), ("--baz", (), "unknown"), ("--verbose", (), "kept")]


def test_windows_command_from_the_issue() -> None:
    imp = import_sdcli_command(r'.\bin\Release\sd.exe -m ..\..\models\v1-5.safetensors '
                               r'--lora-model-dir ..\Lora\ -p "a cat"')
    assert imp.program == r".\bin\Release\sd.exe"
    assert imp.model_files == {"model": r"..\..\models\v1-5.safetensors"}
    assert imp.kept == []
    assert imp.generation == {"lora_model_dir": "..\\Lora\\", "prompt": "a cat"}


def test_windows_quoting_rules() -> None:
    # backslashes are literal except before a quote (2n -> n and a toggle, 2n+1 -> n and ")
    assert split_windows(r'a\\b "c d" e\"f "g\\" h') == [r"a\\b", "c d", 'e"f', "g\\", "h"]
    assert split_windows('"say ""hi""" x') == ['say "hi"', "x"]
    assert split_windows('C:\\sd\\sd-cli.exe -p ""') == ["C:\\sd\\sd-cli.exe", "-p", ""]
    with pytest.raises(PlanError, match="quote"):
        split_windows('-p "open')


def test_cmd_caret_and_powershell_backtick_continuations() -> None:
    cmd = ('C:\\sd\\sd-cli.exe -m "C:\\My Models\\flux.gguf" ^\r\n'
           '  --backend diffusion=CUDA0^&CUDA1 ^\n  -p "a ^ cat"')
    assert command_dialect(cmd) == "windows"
    assert split_command_line(cmd) == ["C:\\sd\\sd-cli.exe", "-m", "C:\\My Models\\flux.gguf",
                                       "--backend", "diffusion=CUDA0&CUDA1", "-p", "a ^ cat"]
    ps = ("& 'C:\\Program Files\\sd\\sd.exe' -m C:\\m\\v1.safetensors `\n"
          "  -p 'a \"quoted\" cat' `\n  --steps 4")
    imp = import_sdcli_command(ps)
    assert imp.program == "C:\\Program Files\\sd\\sd.exe"
    assert imp.model_files == {"model": "C:\\m\\v1.safetensors"}
    assert imp.generation == {"prompt": 'a "quoted" cat', "steps": 4}


def test_one_argument_per_line_as_logs_print_it() -> None:
    text = "sd-cli\n-m\n/models/my model.safetensors\n-p\na cat on a mat\n--steps\n4\n--fa\n"
    assert command_dialect(text) == "lines"
    imp = import_sdcli_command(text)
    assert imp.model_files == {"model": "/models/my model.safetensors"}
    assert imp.generation == {"prompt": "a cat on a mat", "steps": 4}
    assert imp.kept == ["--fa"]
    # one flag and its value per line (no continuation marks) is not one-per-line
    two = "sd-cli -m m.gguf\n-p 'a cat'\n--steps 4\n"
    assert command_dialect(two) == "posix"
    assert import_sdcli_command(two).generation == {"prompt": "a cat", "steps": 4}


def test_posix_comment_and_continuation() -> None:
    imp = import_sdcli_command("./sd-cli -m m.gguf \\\n  -p 'x' # a comment -W 9")
    assert imp.generation == {"prompt": "x"} and imp.unknown == []


def test_written_command_keeps_every_flag_in_a_stable_order() -> None:
    text = ("sd-cli --diffusion-fa -p 'a cat' --cfg-scale 7.0 --backend te=cpu --mmap "
            "--steps=20 --diffusion-model f.gguf --cache-mode easycache --auto-fit "
            "--split-mode diffusion=row --eager-load --vae-tiling --foo")
    imp = import_sdcli_command(text)
    line = written(imp)
    assert line == ("sd-cli --diffusion-model f.gguf --backend te=cpu --split-mode "
                    "diffusion=row --auto-fit --prompt 'a cat' --steps 20 --cfg-scale 7.0 "
                    "--diffusion-fa --mmap --cache-mode easycache --eager-load --vae-tiling "
                    "--foo")
    assert imp.unknown == ["--foo"]
    assert import_sdcli_command(line).extra_args() == imp.extra_args()


def test_alias_spellings_read_as_their_option() -> None:
    imp = import_sdcli_command("sd --tae t.safetensors --qwen2vl q.gguf -p x")
    assert imp.model_files == {"taesd": "t.safetensors", "llm": "q.gguf"}


def test_merge_flags_prefers_the_pasted_value() -> None:
    assert merge_flags(["--prediction", "eps", "-v"], ["--prediction", "v"]) == \
        ["--prediction", "eps", "-v"]
    assert merge_flags(["-v"], ["--prediction", "v"]) == ["-v", "--prediction", "v"]


def test_missing_value_names_the_flag() -> None:
    with pytest.raises(PlanError, match="--cache-mode needs a value"):
        import_sdcli_command("sd -p x --cache-mode")
