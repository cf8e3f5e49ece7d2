"""Build ``resources/qwen_vocab/`` and the tokenizer test fixtures from the llama-cpp-python
source distribution.

The MIT-licensed sdist vendors llama.cpp, whose ``models/ggml-vocab-qwen2.gguf`` is a GGUF
file holding only Qwen2's tokenizer (151936 tokens: 151643 byte-level BPE tokens, three
control tokens, padding) with ``models/ggml-vocab-qwen2.gguf.inp`` / ``.out``, the inputs and
expected token ids of llama.cpp's ``test-tokenizer-0``. This script

* reads the file's tokens and merges with sdplan's bounded GGUF reader, checks that tokens
  0..255 are the byte alphabet and that token ``256 + i`` is merge ``i`` joined (so the merges
  alone rebuild ids 0..151642) and that ids 151643..151645 are the first three Qwen added
  tokens;
* writes ``resources/qwen_vocab/merges.txt.gz`` (one merge per line, rank order, gzip with a
  zero timestamp so reruns are byte-identical), llama.cpp's MIT licence as ``LICENSE`` and
  the Apache-2.0 text of Qwen's vocabulary as ``LICENSE.Apache-2.0`` (``--apache``: a copy of
  the licence text);
* copies the ``.inp`` / ``.out`` pair to ``tests/fixtures/qwen2_vocab_test.inp`` / ``.out``.

Usage::

    pip download --no-deps --no-binary :all: llama-cpp-python -d /tmp/lcpp
    python tools/make_qwen_vocab.py /tmp/lcpp/llama_cpp_python-*.tar.gz --apache LICENSE.APACHE2
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "resources" / "qwen_vocab"
FIX = REPO / "tests" / "fixtures"
MEMBER = "vendor/llama.cpp/models/ggml-vocab-qwen2.gguf"


def _member(tar: tarfile.TarFile, suffix: str) -> bytes:
    for m in tar.getmembers():
        if m.name.endswith(suffix):
            fh = tar.extractfile(m)
            if fh is not None:
                return fh.read()
    raise SystemExit(f"{suffix} not found in the sdist")


def main(argv: list[str] | None = None) -> int:
    from sdplan.core.modelfiles.readers import read_gguf_arrays
    from sdplan.core.text.bpe_tokenizer import QWEN_ADDED_TOKENS, byte_alphabet

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sdist", type=Path)
    p.add_argument("--apache", type=Path, required=True, help="a copy of the Apache-2.0 licence text")
    args = p.parse_args(argv)
    with tarfile.open(args.sdist) as tar:
        gguf_bytes = _member(tar, MEMBER)
        inp = _member(tar, MEMBER + ".inp")
        out = _member(tar, MEMBER + ".out")
        licence = _member(tar, "vendor/llama.cpp/LICENSE")
    with tempfile.NamedTemporaryFile(suffix=".gguf") as tmp:
        tmp.write(gguf_bytes)
        tmp.flush()
        arrays = read_gguf_arrays(tmp.name, ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    tokens, merges = arrays["tokenizer.ggml.tokens"], arrays["tokenizer.ggml.merges"]
    n = 256 + len(merges)
    if tokens[:256] != byte_alphabet():
        raise SystemExit("tokens 0..255 are not the byte alphabet")
    bad = [i for i, m in enumerate(merges) if tokens[256 + i] != m.replace(" ", "", 1)]
    if bad:
        raise SystemExit(f"{len(bad)} merged tokens differ from their merges (first: {bad[0]})")
    if tuple(tokens[n:n + 3]) != QWEN_ADDED_TOKENS[:3]:
        raise SystemExit(f"ids {n}.. are {tokens[n:n + 3]}, not {QWEN_ADDED_TOKENS[:3]}")
    OUT.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(("\n".join(merges) + "\n").encode("utf-8"))
    (OUT / "merges.txt.gz").write_bytes(buf.getvalue())
    (OUT / "LICENSE").write_bytes(licence)
    (OUT / "LICENSE.Apache-2.0").write_bytes(args.apache.read_bytes())
    (FIX / "qwen2_vocab_test.inp").write_bytes(inp)
    (FIX / "qwen2_vocab_test.out").write_bytes(out)
    print(f"{len(merges)} merges, {n} BPE tokens; wrote {OUT} and the test pair in {FIX}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
