"""The experts each forward needs, per MoE layer, counted on the device.

Decoding ``B`` sequences together makes a layer's working set (the distinct experts its
rows route to) the union of the sequences' sets: more experts per forward than one
sequence's, far fewer than ``B`` times as many when sequences share experts. This module
measures it without a host sync: each ``SpecterExperts`` forward marks the experts of its
rows in a boolean ``[L, E]`` device table of the role that runs (target or draft); at the
end of the forward the table's row sums, the distinct experts per layer, are added to a
device total and the table is cleared. The host reads the totals once, when it asks for
the statistics.
"""

from __future__ import annotations

import torch

from specter_models.experts_runtime import ExpertsMode

__all__ = ["WorkingSet"]


class WorkingSet:
    """Distinct experts per MoE layer per forward, for the target and the draft.

    Args:
        num_layers: MoE layers ``L``.
        num_experts: routed experts per layer ``E``.
        device: where the tables live (the model's device).

    Attributes:
        forwards: forwards counted per role (host ints).
        last: the ``[L, E]`` bool table of each role's last counted forward (a device
            tensor: which experts it needed).
    """

    def __init__(self, num_layers: int, num_experts: int, device: torch.device | str):
        self.num_layers, self.num_experts = num_layers, num_experts
        self._marks = {
            mode: torch.zeros(num_layers, num_experts + 1, dtype=torch.bool, device=device)
            for mode in ExpertsMode
        }
        self._totals = {
            mode: torch.zeros(num_layers, dtype=torch.int64, device=device) for mode in ExpertsMode
        }
        self.forwards = dict.fromkeys(ExpertsMode, 0)
        self.last: dict[ExpertsMode, torch.Tensor] = {}

    def observe(self, layer: int, mode: ExpertsMode, ids: torch.Tensor) -> None:
        """Mark the experts of ``ids`` (``[T, k]``, -1 for none) in ``layer`` (a device-side
        write)."""
        flat = ids.reshape(-1).long()
        flat = torch.where(flat < 0, self.num_experts, flat)  # -1: the spare column
        self._marks[mode][layer].index_fill_(0, flat, True)

    def end_forward(self, mode: ExpertsMode) -> None:
        """Count the forward that just ran in ``mode`` and clear its marks."""
        marks = self._marks[mode][:, : self.num_experts]
        self.last[mode] = marks.clone()
        self._totals[mode] += marks.sum(dim=1)
        self._marks[mode].zero_()
        self.forwards[mode] += 1

    def reset(self) -> None:
        """Forget every count."""
        for mode in ExpertsMode:
            self._totals[mode].zero_()
            self._marks[mode].zero_()
            self.forwards[mode] = 0
        self.last.clear()

    def mean_per_layer(self, mode: ExpertsMode) -> list[float] | None:
        """Mean distinct experts per layer over the counted forwards of ``mode`` (one host
        read), or None before any."""
        count = self.forwards[mode]
        if not count:
            return None
        return [total / count for total in self._totals[mode].tolist()]

    def as_dict(self) -> dict[str, object]:
        """Per role: forwards counted, mean distinct experts per layer and over layers."""
        out: dict[str, object] = {}
        for mode in ExpertsMode:
            means = self.mean_per_layer(mode)
            out[mode.value] = {
                "forwards": self.forwards[mode],
                "per_layer": means,
                "mean": sum(means) / len(means) if means else None,
            }
        out["num_experts"] = self.num_experts
        return out
