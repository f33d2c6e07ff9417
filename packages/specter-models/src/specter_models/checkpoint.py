"""Reading a Hugging Face checkpoint folder: shards, keys, non-expert weights, expert sources.

A folder holds ``config.json`` and either ``model.safetensors`` or shards
``model-0000x-of-0000y.safetensors`` listed in ``model.safetensors.index.json``. Tensors are
read through specter-cache's memory-mapped ``SafetensorsFile`` straight into their
destination (a device parameter, a pinned expert record), and the mapped pages are dropped
after each copy, so no weight sits twice in host memory.

Routed experts are never read here: ``expert_sources`` only tells specter-cache's
``ExpertStore`` where each one is, in the original per-expert names that ``save_pretrained``
writes (gate and up joined along dim 0 into ``gate_up [2I, H]``), or in transformers'
stacked layout (``gate_up_proj [E, 2I, H]``) when a tool saved that instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch

from specter_cache.expert_store import TensorSlice
from specter_cache.safetensors_file import SafetensorsFile
from specter_models.architecture import Architecture, MoeLayer

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Keys older checkpoints carry that transformers 5.17 recomputes instead of loading.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointFiles:
    """The safetensors files of a checkpoint folder and the file of every key.

    Args:
        folder: the checkpoint folder.

    Raises:
        FileNotFoundError: no safetensors weights in the folder.
        ValueError: the shard index names a file that is missing or a key not in its file.
    """

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder)
        self._files: dict[Path, SafetensorsFile] = {}
        self._where: dict[str, Path] = {}
        index = self.folder / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index} has no 'weight_map'; is this a safetensors index?")
            for key, name in weight_map.items():
                path = self.folder / name
                if not path.is_file():
                    raise ValueError(
                        f"{index} maps {key!r} to {name}, which is not in {self.folder}"
                    )
                self._where[key] = path
            for path in set(self._where.values()):
                stored = set(self._file(path).keys())
                listed = [k for k, p in self._where.items() if p == path and k not in stored]
                if listed:
                    raise ValueError(f"{index} lists {listed[:3]} in {path.name}, which lacks them")
        else:
            shards = (
                [self.folder / SINGLE_FILE]
                if (self.folder / SINGLE_FILE).is_file()
                else sorted(self.folder.glob("*.safetensors"))
            )
            if not shards:
                raise FileNotFoundError(
                    f"no safetensors weights in {self.folder}: expected {SINGLE_FILE} or shards "
                    f"listed in {INDEX_FILE} (save the model with save_pretrained)"
                )
            for path in shards:
                for key in self._file(path).keys():  # noqa: SIM118 (a list, not a dict)
                    self._where[key] = path

    def _file(self, path: Path) -> SafetensorsFile:
        if path not in self._files:
            self._files[path] = SafetensorsFile(path)
        return self._files[path]

    def names(self) -> list[str]:
        """Every tensor key of the checkpoint."""
        return list(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def path(self, key: str) -> Path:
        """The file holding ``key``.

        Raises:
            KeyError: ``key`` is not in the checkpoint.
        """
        try:
            return self._where[key]
        except KeyError:
            raise KeyError(f"{self.folder}: the checkpoint has no tensor {key!r}") from None

    def shape(self, key: str) -> tuple[int, ...]:
        """Shape of ``key``."""
        return self._file(self.path(key)).entry(key).shape

    def dtype(self, key: str) -> torch.dtype:
        """Stored dtype of ``key``."""
        return self._file(self.path(key)).entry(key).dtype

    def read_into(self, key: str, out: torch.Tensor, index: int | None = None) -> None:
        """Copy ``key`` (or its row ``index``) into ``out`` (any device), converting dtype."""
        self._file(self.path(key)).read_into(key, out, index)

    def read(self, key: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """``key`` as a new tensor of its stored dtype on ``device``."""
        out = torch.empty(self.shape(key), dtype=self.dtype(key), device=device)
        self.read_into(key, out)
        return out

    def close(self) -> None:
        """Unmap every file."""
        for f in self._files.values():
            f.close()


def load_non_expert_weights(
    model: torch.nn.Module,
    files: CheckpointFiles,
    arch: Architecture,
    skip: Sequence[str] = (),
) -> list[str]:
    """Copy every non-expert tensor of the checkpoint into the model's parameters.

    Args:
        model: the materialised model (routed experts already swapped out).
        files: the checkpoint.
        arch: its architecture (key renames).
        skip: parameter names not expected in the checkpoint (a tied LM head).

    Returns:
        The parameter names loaded.

    Raises:
        ValueError: a checkpoint tensor that matches no parameter, a parameter the
            checkpoint lacks, or a shape mismatch.
    """
    params = dict(model.named_parameters())
    loaded: list[str] = []
    unexpected: list[str] = []
    for key in files.names():
        if arch.is_expert_key(key) or key.endswith(IGNORED_SUFFIXES):
            continue
        name = arch.model_key(key)
        param = params.get(name)
        if param is None:
            unexpected.append(key)
            continue
        if files.shape(key) != tuple(param.shape):
            raise ValueError(
                f"{files.folder}: {key!r} has shape {files.shape(key)}, but the model's "
                f"{name!r} is {tuple(param.shape)}; the checkpoint does not match config.json"
            )
        with torch.no_grad():
            files.read_into(key, param.data)
        loaded.append(name)
    if unexpected:
        raise ValueError(
            f"{files.folder}: {len(unexpected)} checkpoint tensors match no parameter of "
            f"{type(model).__name__}, e.g. {unexpected[:5]}; is config.json's model_type right?"
        )
    missing = sorted(set(params) - set(loaded) - set(skip))
    if missing:
        raise ValueError(
            f"{files.folder}: the checkpoint lacks {len(missing)} parameters, e.g. {missing[:5]}"
        )
    return loaded


def expert_sources(
    files: CheckpointFiles, arch: Architecture, moe_layers: Sequence[MoeLayer]
) -> dict[tuple[int, int, str], TensorSlice | list[TensorSlice]]:
    """Where each routed expert's ``gate_up`` and ``down`` live, for ``ExpertStore``.

    Args:
        files: the checkpoint.
        arch: its architecture (expert key names).
        moe_layers: the model's MoE layers.

    Returns:
        ``(moe layer, expert, "gate_up" | "down") -> source``: per-expert keys (gate then up,
        joined along dim 0) or rows of transformers' stacked tensors.

    Raises:
        ValueError: an expert is in neither layout.
    """
    sources: dict[tuple[int, int, str], TensorSlice | list[TensorSlice]] = {}
    for layer in moe_layers:
        fused = arch.fused_expert_keys(layer.decoder_layer)
        stacked = all(k in files for k in fused.values())
        for e in range(layer.num_experts):
            keys = arch.expert_keys(layer.decoder_layer, e)
            if all(k in files for k in keys.values()):
                sources[(layer.index, e, "gate_up")] = [
                    TensorSlice(files.path(keys["gate"]), keys["gate"]),
                    TensorSlice(files.path(keys["up"]), keys["up"]),
                ]
                sources[(layer.index, e, "down")] = TensorSlice(
                    files.path(keys["down"]), keys["down"]
                )
            elif stacked:
                for name, key in fused.items():
                    sources[(layer.index, e, name)] = TensorSlice(files.path(key), key, index=e)
            else:
                missing = [k for k in keys.values() if k not in files]
                raise ValueError(
                    f"{files.folder}: routed expert {e} of decoder layer {layer.decoder_layer} "
                    f"is missing ({missing[0]!r} not found, nor the stacked "
                    f"{fused['gate_up']!r}); the checkpoint does not match config.json"
                )
    return sources


def read_json(path: Path) -> Mapping[str, object]:
    """A JSON object from ``path``.

    Raises:
        ValueError: the file is not a JSON object.
    """
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def iter_decoder_expert_keys(
    arch: Architecture, moe_layers: Sequence[MoeLayer]
) -> Iterator[tuple[MoeLayer, int, dict[str, str]]]:
    """``(layer, expert, {"gate","up","down"} -> key)`` for every routed expert."""
    for layer in moe_layers:
        for e in range(layer.num_experts):
            yield layer, e, arch.expert_keys(layer.decoder_layer, e)
