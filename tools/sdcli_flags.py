"""List sd-cli's options from a stable-diffusion.cpp checkout, to compare with (or refresh)
``core/planning/sdcli_table.py`` when upstream adds flags.

Usage: ``python tools/sdcli_flags.py REPO [COMMIT]`` (a git repository of
stable-diffusion.cpp; default commit ``HEAD``). Prints one line per option, in sd-cli's help
order: group (cli, context, generation), kind (string, int, float, bool, manual), short and
long spelling; then the options the table lacks and those it has but upstream dropped.

It reads the option tables of ``examples/cli/main.cpp`` and ``examples/common/common.cpp``
(``options.<kind>_options = { {"-s", "--long", ...}, ... }``); arities and repeat rules
(``join``/``append``) still need a look at the option's callback when a new one appears.
"""

from __future__ import annotations

import re
import subprocess
import sys


def _show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], capture_output=True,
                          text=True, check=True).stdout


def _block_end(text: str, i: int) -> int:
    depth = 1
    while depth:
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        i += 1
    return i


def upstream_options(repo: str, commit: str = "HEAD") -> list[tuple[str, str, str, str]]:
    """``(group, kind, short, long)`` for every sd-cli option at ``commit``."""
    out = []
    for path, groups in (("examples/cli/main.cpp", ["cli"]),
                         ("examples/common/common.cpp", ["context", "generation"])):
        src = _show(repo, commit, path)
        starts = [m.start() for m in re.finditer(r"ArgOptions (\w+::)?get_options\(\)", src)]
        for gi, start in enumerate(starts):
            body = src[start:starts[gi + 1] if gi + 1 < len(starts) else len(src)]
            group = groups[gi] if len(groups) > 1 else groups[0]
            for bm in re.finditer(r"options\.(\w+)_options\s*=\s*\{", body):
                block = body[bm.end():_block_end(body, bm.end()) - 1]
                for em in re.finditer(r'\{\s*"(-[A-Za-z]?)?"\s*,\s*"(--[\w-]+)"', block):
                    out.append((group, bm.group(1), em.group(1) or "", em.group(2)))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    repo, commit = argv[0], argv[1] if len(argv) > 1 else "HEAD"
    from sdplan.core.planning.sdcli_table import SDCLI_OPTIONS

    found = upstream_options(repo, commit)
    for group, kind, short, long in found:
        print(f"{group:10} {kind:6} {short:3} {long}")
    ours = {o.long for o in SDCLI_OPTIONS}
    theirs = {row[3] for row in found}
    print("missing from the table:", " ".join(sorted(theirs - ours)) or "none")
    print("no longer upstream:", " ".join(sorted(ours - theirs)) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
