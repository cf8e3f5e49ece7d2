"""Build ``resources/mistral_vocab/`` from the mistral-common wheel's Tekken vocabulary.

Mistral-Small-3.2 (FLUX.2 dev's text encoder) uses Mistral's Tekken tokenizer: 1000 special
tokens (ids 0..999) and 130072 byte-level BPE tokens (ids 1000..131071) whose order is their
BPE rank, the first 256 being the single bytes 0..255. Its ``tekken.json`` lists every token's
bytes and rank (tiktoken's ``mergeable_ranks``), not the merges. This script

* reads ``mistral_common/data/tekken_240911.json`` from a ``mistral-common`` wheel (Apache-2.0,
  Mistral AI), keeps the first ``default_vocab_size - default_num_special_tokens`` ranks and
  checks that ranks 0..255 are the single bytes in byte order;
* derives each longer token's merge as tiktoken's BPE forms it: the token's bytes merged by
  the ranks below its own until two parts remain (the conversion transformers' ``TikToken``
  converter applies), and checks that every merge's parts are earlier tokens;
* writes ``resources/mistral_vocab/merges.txt.gz``: one merge per line in rank order, the
  parts in the GPT-2 byte alphabet, gzip with a zero timestamp (reruns are byte-identical).

sdplan rebuilds the vocabulary from it (``BPETokenizer.mistral``): the 1000 special tokens of
stable-diffusion.cpp's ``mistral_tokenizer.cpp`` (``<unk>``, ``<s>``, ``</s>``, ``[INST]`` ...
``[TOOL_CONTENT]``, then ``<SPECIAL_20>`` ... ``<SPECIAL_999>``), the 256 bytes, one token per
merge.

Usage::

    pip download --no-deps mistral-common==1.13.1 -d /tmp/mc
    python tools/make_mistral_vocab.py /tmp/mc/mistral_common-1.13.1-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import base64
import gzip
import io
import json
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "resources" / "mistral_vocab"
MEMBER = "mistral_common/data/tekken_240911.json"


def _alphabet() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode`` (byte -> symbol)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _split(token: bytes, ranks: dict[bytes, int], limit: int) -> tuple[bytes, bytes]:
    """The last merge tiktoken makes for ``token``: its bytes merged by ranks below ``limit``."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise SystemExit(f"token {token!r} (rank {limit}) does not reduce to one merge: {parts}")
    return parts[0], parts[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path, help="mistral_common-*.whl")
    args = ap.parse_args(argv)
    with zipfile.ZipFile(args.wheel) as zf:
        data = json.loads(zf.read(MEMBER))
    cfg = data["config"]
    n = int(cfg["default_vocab_size"]) - int(cfg["default_num_special_tokens"])
    vocab = sorted(data["vocab"], key=lambda e: e["rank"])[:n]
    tokens = [base64.b64decode(e["token_bytes"]) for e in vocab]
    if [e["rank"] for e in vocab] != list(range(n)) or tokens[:256] != [bytes([b]) for b in range(256)]:
        raise SystemExit("ranks are not 0..N-1 with the 256 single bytes first")
    ranks = {t: i for i, t in enumerate(tokens)}
    sym = _alphabet()
    lines = []
    for r in range(256, n):
        left, right = _split(tokens[r], ranks, r)
        if ranks[left] >= r or ranks[right] >= r:
            raise SystemExit(f"merge of rank {r} uses a later token")
        lines.append("".join(sym[b] for b in left) + " " + "".join(sym[b] for b in right))
    OUT.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
        gz.write(("\n".join(lines) + "\n").encode("utf-8"))
    (OUT / "merges.txt.gz").write_bytes(buf.getvalue())
    print(f"{len(lines)} merges, pattern {cfg['pattern']!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
