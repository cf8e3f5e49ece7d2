"""Build ``resources/t5_tokenizer/`` from the stable-diffusion-cpp-python source distribution.

The MIT-licensed sdist vendors stable-diffusion.cpp, whose ``src/tokenizers/vocab/clip_t5.hpp``
embeds the T5 SentencePiece unigram vocabulary as a C byte array named
``t5_tokenizer_json_str`` (a ``tokenizers`` JSON). This script extracts that array, keeps the
Unigram model (pieces and log-probability scores, unk id) and writes a compact, gzip-compressed
``tokenizers`` JSON with sdplan's own pipeline: NFKC normalisation, whitespace runs collapsed,
Metaspace pre-tokenisation (``▁``, prefix space) and an EOS (``</s>``, id 1) appended.
It copies the MIT licence text beside it.

Usage::

    /work/venv/bin/pip download --no-deps --no-binary :all: stable-diffusion-cpp-python -d /tmp/sdcpp
    python tools/make_t5_tokenizer.py /tmp/sdcpp/stable_diffusion_cpp_python-*.tar.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tarfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "resources" / "t5_tokenizer"
ARRAY = "t5_tokenizer_json_str"


def extract_array(source: str, name: str) -> bytes:
    """The bytes of ``static const unsigned char NAME[] = {0x.., ...};`` in C ``source``."""
    start = source.find(f"{name}[]")
    if start < 0:
        raise SystemExit(f"array {name} not found")
    body = source[source.index("{", start) + 1: source.index("}", start)]
    return bytes(int(v, 16) for v in re.findall(r"0x([0-9a-fA-F]{1,2})", body))


def convert(data: dict) -> dict:
    """A ``tokenizers`` JSON with the Unigram model of ``data`` and sdplan's T5 pipeline."""
    model = data["model"]
    if model.get("type") != "Unigram":
        raise SystemExit(f"expected a Unigram model, got {model.get('type')!r}")
    vocab = [[p, float(s)] for p, s in model["vocab"]]
    pieces = {p: i for i, (p, _) in enumerate(vocab)}
    specials = [
        {"id": pieces[t["content"]], "content": t["content"], "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for t in data.get("added_tokens", []) if t["content"] in pieces
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        ]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                          "split": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [pieces["</s>"]], "tokens": ["</s>"]}},
        },
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "model": {"type": "Unigram", "unk_id": model.get("unk_id", pieces.get("<unk>")), "vocab": vocab,
                  "byte_fallback": False},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sdist", help="stable_diffusion_cpp_python-*.tar.gz")
    a = ap.parse_args(argv)
    with tarfile.open(a.sdist) as tar:
        members = {m.name: m for m in tar.getmembers()}
        hpp = next(n for n in members if n.endswith("src/tokenizers/vocab/clip_t5.hpp"))
        lic = next(n for n in members if n.endswith("vendor/stable-diffusion.cpp/LICENSE"))
        source = tar.extractfile(members[hpp]).read().decode("ascii")
        licence = tar.extractfile(members[lic]).read()
    raw = extract_array(source, ARRAY).rstrip(b"\0")
    out = convert(json.loads(raw.decode("utf-8")))
    OUT.mkdir(parents=True, exist_ok=True)
    blob = json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    with gzip.GzipFile(OUT / "tokenizer.json.gz", "wb", mtime=0) as f:
        f.write(blob)
    (OUT / "LICENSE").write_bytes(licence)
    (OUT / "README.md").write_text(
        "T5 SentencePiece unigram vocabulary (32100 pieces with scores) as a `tokenizers` JSON.\n\n"
        "Derived by `tools/make_t5_tokenizer.py` from the vocabulary published inside the\n"
        "stable-diffusion-cpp-python source distribution (vendored stable-diffusion.cpp,\n"
        "MIT licence, see LICENSE).\n")
    print(f"wrote {OUT} ({len(out['model']['vocab'])} pieces)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
