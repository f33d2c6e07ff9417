"""The tuned tile files the config modules read, and their writer.

A tuned file holds the tiles measured best on one GPU model (``specter tune ...
--write-config`` measures them)::

    {"device": "NVIDIA H200", "torch": "...", "triton": "...", "source": "how it was measured",
     "configs": [{<key fields>, <tile fields>, <measured times>}, ...]}

Each config module names its key fields (the invariant kernels' ``N``, ``K``, ``dtype``; the
W4A16 layer's ``H``, ``I``, ``top_k``) and reads its tile fields; other fields (the times) are
for the reader. The file is named after the GPU model (:func:`device_slug`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import triton

__all__ = ["device_slug", "read_tuned_entries", "write_tuned_file"]


def device_slug(device_name: str) -> str:
    """A GPU model's name as tuned files spell it: ``"NVIDIA H200"`` -> ``nvidia_h200``."""
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


def read_tuned_entries(path: Path) -> list[dict[str, Any]]:
    """The ``configs`` list of a tuned file; empty when there is no file.

    Raises:
        ValueError: the file is not JSON or has no ``configs`` list.
    """
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())["configs"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not a tuned tile file ({type(error).__name__}: {error}); expected a "
            "JSON object with a 'configs' list; fix it or delete it and tune again"
        ) from error
    if not isinstance(entries, list):
        raise ValueError(f"{path}: 'configs' is a {type(entries).__name__}, expected a list")
    return entries


def write_tuned_file(
    path: Path,
    device_name: str,
    entries: Sequence[dict[str, Any]],
    *,
    key_fields: Sequence[str],
    source: str,
) -> list[dict[str, Any]]:
    """Write ``entries`` to the tuned file at ``path``, keeping the entries the file already
    holds for keys ``entries`` does not cover (a tuning of one model's shapes leaves the
    others' tiles in place).

    Args:
        path: the file (its folder is made when missing).
        device_name: the GPU model the tiles were measured on (``torch.cuda.get_device_name``).
        entries: one dict per key, holding every field of ``key_fields``.
        key_fields: the fields that name a shape (an entry of an equal key replaces the old).
        source: how the tiles were measured (the command), stored with them.

    Returns:
        The entries written: ``entries`` then the kept ones.
    """
    for entry in entries:
        missing = [f for f in key_fields if f not in entry]
        if missing:
            raise ValueError(f"tuned entry {entry} lacks the key fields {missing}")

    def key(entry: dict[str, Any]) -> tuple:
        return tuple(entry.get(f) for f in key_fields)

    covered = {key(e) for e in entries}
    kept = [e for e in read_tuned_entries(path) if key(e) not in covered]
    written = [*entries, *kept]
    table = {
        "device": device_name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "source": source,
        "configs": written,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return written
