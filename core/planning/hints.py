"""Typing help for the placement strings: what a person probably meant.

- :func:`comma_split_hints`: ``diffusion=CUDA0,CUDA1`` is valid (CUDA1 becomes the default
  device of every other module) but is how ComfyUI users write "both GPUs"; the hint offers
  the layer split ``diffusion=CUDA0&CUDA1`` (spec section 2: ``,`` separates entries, ``&``
  lists the devices of one module).
- :func:`device_suggestion`: a device written the way other tools name it (``cuda:1``,
  ``gpu1``, ``CUDA 1``) that no device here is called: the inventory's name for it.

Pure Python; nothing here changes what a string means.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sdplan.core.planning.assignment import normalize_module
from sdplan.core.planning.modules import SPLITTABLE

#: Registry words people write before a device index (``cuda:1``, ``vulkan1``, ``gpu 1``).
_INDEXED = re.compile(r"^\s*([a-z]+)\s*[:#_ -]?\s*(\d+)\s*$", re.IGNORECASE)


def comma_split_hints(backend: str) -> list[str]:
    """One line per ``module=DEVICE,DEVICE`` in a ``--backend`` value where the module can
    be split (the diffusion model, the text encoders) and the bare device after the comma
    becomes every other module's default: ``did you mean diffusion=CUDA0&CUDA1?``. Entries
    whose key is not a module, and lists already written with ``&``, give none."""
    parts = [p.strip() for p in backend.split(",")]
    out: list[str] = []
    for i, part in enumerate(parts[:-1]):
        key, eq, value = part.partition("=")
        module = normalize_module(key.strip()) if eq else None
        bare = parts[i + 1]
        if module not in SPLITTABLE or not value.strip() or not bare or "=" in bare:
            continue
        joined = f"{key.strip()}={value.strip()}&{bare}"
        out.append(f"{part},{bare} runs {module} on {value.strip()} alone and makes {bare} the "
                   f"default for every other module; did you mean {joined}? (& lists the "
                   "devices of one module, a comma starts the next entry)")
    return out


def device_suggestion(written: str, names: Iterable[str],
                      registries: Iterable[tuple[str, str, bool]] = ()) -> str | None:
    """The device name ``written`` most likely means, or None.

    Args:
        written: the device as typed (``cuda:1``, ``gpu1``, ``Cuda 0``).
        names: the inventory's device names (``CUDA0``, ``Vulkan1``, ``CPU``...).
        registries: ``(name, registry, is_gpu)`` per device, in inventory order: ``gpu1``
            is the second GPU, ``cuda:1`` the second CUDA device.

    A name equal to ``written`` once case, spaces and ``:``/``#``/``_``/``-`` are dropped
    wins; else ``REGISTRY INDEX`` counts the devices of that registry (``gpu``: every GPU)
    in inventory order.
    """
    names = list(names)
    squash = re.sub(r"[\s:#_-]", "", written).lower()
    for n in names:
        if n.lower() == squash and n != written:
            return n
    m = _INDEXED.match(written)
    if not m:
        return None
    word, index = m.group(1).lower(), int(m.group(2))
    matching = [n for n, reg, gpu in registries
                if (word == "gpu" and gpu) or reg.lower() == word]
    return matching[index] if index < len(matching) else None
