"""The streamed-miss protocol: forwards that read missing experts in place from host memory.

A consumer may skip ``acquire`` and read the experts without a slot from the pinned store
(specter-kernels' ``StreamedExperts``), and every other one through the device map, with no
wave to protect it. ``ExpertCache.streaming`` makes the cache's loads safe for such a reader
(see ``copy_pipeline``); ``StreamedMisses`` (the cache's ``streamed``) is the rest of the
protocol, one streamed forward at a time:

1. ``prepare_fills`` (with fills): each layer's candidate slots for experts the forward
   will write into slots as it streams them.
2. ``stream_guard`` and, per layer, ``wait_for_landing``: the compute stream waits for the
   map's invalidations and for the layer's loads in flight.
3. After launching the forward: ``commit_fills`` (its fills onto the device map) and
   ``mark_streamed_use`` (later loads overwrite no slot before it is done).
4. Once its record reaches the host (at once, or queued with ``ExpertCache.count_later``):
   ``record_streamed`` per layer counts hits and streamed misses and adopts the fills.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch

from specter_cache.copy_pipeline import CopyPipeline
from specter_cache.expert_store import ExpertStore
from specter_cache.residency import Residency


class StreamedMisses:
    """The cache's side of streamed forwards (``ExpertCache.streamed``).

    Args:
        residency: the cache's residency (slots, policy, statistics).
        copies: the cache's copy pipeline (last streamed use, landing markers).
        store: the host store the forwards read from.
    """

    def __init__(self, residency: Residency, copies: CopyPipeline, store: ExpertStore):
        self._residency = residency
        self._copies = copies
        self._store = store
        # Per layer, slot -> expert it held, of the last prepare_fills not yet counted.
        self._fill_candidates: list[dict[int, int]] = [{} for _ in residency.pools]
        self._map_columns: torch.Tensor | None = None  # [L, E] column ids (commit_fills)

    def host_tensors(self, layer: int, name: str) -> list[torch.Tensor]:
        """Tensor ``name`` of every expert of ``layer`` in the host store (views into its
        pinned memory, read from their sources first where needed), by expert id: what a
        kernel on the streamed miss path reads for experts without a slot.

        Raises:
            ValueError: a bad layer or a name the layout does not have.
        """
        res = self._residency
        layer = res.check_layer(layer)
        if name not in res.pools[layer].names:
            raise ValueError(
                f"layer {layer}'s experts have tensors {list(res.pools[layer].names)}, not {name!r}"
            )
        return [self._store.get(layer, e)[name] for e in range(res.num_experts)]

    def stream_guard(self, *, settle: bool = True) -> None:
        """Make the current (compute) stream wait until every slot's map entry is safe to
        read: each expert taken off the map by a load issued so far is off it. Call it
        before a streamed forward; slots still loading keep their ``-1`` until their copies
        land, so the forward streams those experts instead. With the copy stream's data
        copies left running, this waits for a few tiny copies only. ``settle=False`` leaves
        the queued counts queued (a pipelined plain step: counts issue no loads, so the
        invalidations waited for are the same)."""
        if settle:
            self._residency.settle()
        self._copies.guard_invalidations()

    def wait_for_landing(self, layer: int) -> None:
        """Make the current (compute) stream wait until every load of ``layer`` issued so
        far on the streamed path has landed, its map entry included, so that a streamed
        forward reads those experts from their slots instead of streaming them while their
        copies still cross the link (each would cross twice).

        The host does not block. Each batch of a layer's loads moves one reusable marker
        (``CopyEngine.landing_marker``), so a CUDA graph captures this wait once, as a wait
        on an external event, and every replay waits for the loads issued before it was
        launched; a layer with no loads since waits for nothing new. Copies that
        ``prefetch(lead=)`` holds are not issued yet and are not waited for. On the CPU the
        deferred engine runs its queue up to the layer's last load; the immediate engine has
        nothing to wait for.

        Issue no load that must wait for a streamed forward (every load after its
        ``mark_streamed_use``) while that forward may still be waiting here: the wait
        covers the loads issued before its launch (a CUDA test checks it), and should CUDA
        resolve it to a later batch instead, the two would wait on each other. A decode
        loop that reads each verification's tokens before planning the next prefetch never
        does; the held copies ``release_copies`` issues after a launch wait for the forward
        before it only.

        Raises:
            ValueError: a layer outside ``[0, num_layers)``.
        """
        self._copies.wait_for_landing(self._residency.check_layer(layer))

    def mark_streamed_use(self) -> None:
        """A streamed forward has been enqueued on the current stream: later loads
        overwrite no slot before it is done (it may have read any of them)."""
        self._copies.mark_streamed_use()

    def fill_candidates(self) -> list[dict[int, int]]:
        """Per layer, the candidates of the last :meth:`prepare_fills` not yet counted by
        ``record_streamed`` (slot -> the expert it held, -1: empty); copies."""
        return [dict(c) for c in self._fill_candidates]

    def prepare_fills(
        self,
        spares_per_layer: int,
        *,
        exclude: Sequence[Collection[int]] | None = None,
        settle: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Before a streamed forward with fills: each layer's candidate slots.

        A *fill* (specter-kernels' ``streamed_fills``) writes an expert the forward streams
        into a slot as it reads it, so the expert is resident afterwards with no load. Each
        layer offers up to ``spares_per_layer`` candidates, the first to take first: its
        empty slots, then the slots of the experts the policy would evict first among those
        neither protected (pinned, claimed), prefetched and not yet used (the draft's
        predictions for this verification) nor still loading. Nothing is evicted here: the
        forward evicts a candidate's expert only to fill its slot, and only where the layer
        does not route to that expert (``assign_fill_slots``).

        Pipelined (``settle=False``, with ``exclude``): the counts still queued are left
        queued, so the host's slots are those before the forwards they count; the slots
        those forwards were offered (``exclude``, one collection per layer) are the only
        ones those forwards may have changed, and are not offered. Their candidates then go
        to ``record_streamed(candidates=)``, since a later call replaces the ones kept here.

        Args:
            spares_per_layer: the most candidates per layer (>= 1).
            exclude: per layer, slots not to offer (the pending forwards' candidates).
            settle: run the queued counts first (the default).

        Returns:
            ``(spare_slots, spare_experts, claimed)``: CPU int32 ``[L, F]`` candidate slots
            per layer (-1 after the last; ``F = spares_per_layer``), ``[L, F]`` the expert
            each holds (-1: empty), and ``[L, E]`` the host's slot of each expert, loads in
            flight included (-1: none; only those experts may be filled, since one still
            loading holds a slot already). Hand them to the forward, then its fills to
            ``commit_fills`` and ``record_streamed``.

        Raises:
            ValueError: ``spares_per_layer`` is not an int >= 1, or ``exclude`` has not one
                entry per layer.
        """
        res = self._residency
        self._copies.release_held()
        if settle:
            res.settle()
        if exclude is not None and len(exclude) != res.num_layers:
            raise ValueError(
                f"exclude needs one collection of slots per layer ({res.num_layers}), got "
                f"{len(exclude)}"
            )
        if (
            not isinstance(spares_per_layer, int)
            or isinstance(spares_per_layer, bool)
            or spares_per_layer < 1
        ):
            raise ValueError(
                f"spares_per_layer must be an int >= 1 (candidate slots per layer for "
                f"streamed fills), got {spares_per_layer!r}"
            )
        E, F = res.num_experts, spares_per_layer
        slots_out: list[list[int]] = []
        experts_out: list[list[int]] = []
        claimed: list[list[int]] = []
        for layer, pool in enumerate(res.pools):
            skip = exclude[layer] if exclude is not None else ()
            order = [s for s in pool.empty[::-1] if s not in skip][:F]  # as pop() hands out
            holders = [-1] * len(order)
            if len(order) < F:
                candidates = [
                    e
                    for s, e in enumerate(pool.slot_expert)
                    if e >= 0 and pool.protect[s] == 0 and e not in pool.prefetched
                    and s not in skip and pool.landed(s)
                ]  # fmt: skip
                for victim in res.policy.choose_victims(layer, candidates, F - len(order)):
                    order.append(pool.expert_slot[victim])
                    holders.append(victim)
            self._fill_candidates[layer] = dict(zip(order, holders, strict=True))
            pad = [-1] * (F - len(order))
            slots_out.append(order + pad)
            experts_out.append(holders + pad)
            row = [-1] * E
            for e, slot in pool.expert_slot.items():
                row[e] = slot
            claimed.append(row)
        # Built as lists, one tensor each: no per-element tensor writes on the host.
        return (
            torch.tensor(slots_out, dtype=torch.int32),
            torch.tensor(experts_out, dtype=torch.int32),
            torch.tensor(claimed, dtype=torch.int32),
        )

    def commit_fills(self, fills: torch.Tensor) -> None:
        """Put the experts a streamed forward filled on the device map, on the current
        stream after it (no host sync): ``map[l, e] = fills[l, e]`` where that is a slot.

        Only those entries are written (a scatter, no read-modify-write of the others),
        since the copy stream may be changing other entries meanwhile. Call
        ``record_streamed(..., filled=)`` with the same fills once they are on the host.

        Args:
            fills: int32 ``[L, E]`` on the cache's device: each layer's fill slots
                (``assign_fill_slots``), -1 where nothing was filled.

        Raises:
            TypeError: a wrong dtype, shape or device.
        """
        maps = self._residency.maps
        L, E = self._residency.num_layers, self._residency.num_experts
        if (
            fills.dtype != torch.int32
            or tuple(fills.shape) != (L, E)
            or fills.device != maps.device
        ):
            raise TypeError(
                f"fills must be int32 [L={L}, E={E}] on {maps.device}, got {fills.dtype} "
                f"{tuple(fills.shape)} on {fills.device}"
            )
        filled = fills >= 0
        if self._map_columns is None:
            self._map_columns = torch.arange(E, device=maps.device).expand(L, E)
        target = torch.where(filled, self._map_columns, E)  # the others aim at the spare column
        maps.scatter_(1, target, torch.where(filled, fills, -1))

    def record_streamed(
        self,
        layer: int,
        needed: object,
        streamed: object,
        filled: Mapping[int, int] | None = None,
        candidates: Mapping[int, int] | None = None,
    ) -> None:
        """Count a streamed forward of ``layer``: ``needed`` (the experts it routed to) hit
        where they held a slot, and ``streamed`` (those it read from host memory) missed.

        Updates what an acquire would have: hits, misses (``streamed_reads`` and their bytes
        in ``bytes_moved``), prefetches used, the policy's recency and the window of needed
        experts (``take_needed``). Nothing is loaded.

        ``filled`` (expert -> slot): streamed experts the forward also wrote into candidate
        slots of ``prepare_fills`` (``commit_fills`` put them on the device map). They now
        hold those slots, ready once the forward is done, and the experts the slots held are
        evicted (``streamed_fills``). ``candidates`` (slot -> the expert it held, -1:
        empty): this forward's candidates of the layer, where a later ``prepare_fills`` has
        replaced the ones kept here (pipelined steps).

        Raises:
            ValueError: bad layer or expert ids, a streamed expert that was not needed, or a
                fill that is not a streamed expert into a spare slot.
        """
        res = self._residency
        layer = res.check_layer(layer)
        pool = res.pools[layer]
        st = res.stats.layers[layer]
        needed_ids = res.expert_ids(needed, f"record_streamed(layer={layer})")
        streamed_ids = set(res.expert_ids(streamed, f"record_streamed(layer={layer})"))
        if not streamed_ids <= set(needed_ids):
            raise ValueError(
                f"record_streamed(layer={layer}): streamed experts {sorted(streamed_ids)} must "
                f"be among the needed ones {needed_ids}"
            )
        if candidates is None:
            candidates, self._fill_candidates[layer] = self._fill_candidates[layer], {}
        for e, slot in (filled or {}).items():
            if (
                e not in streamed_ids
                or e in pool.expert_slot
                or slot not in candidates
                or candidates[slot] != pool.slot_expert[slot]
            ):
                raise ValueError(
                    f"record_streamed(layer={layer}): fill of expert {e} into slot {slot} "
                    "must be a streamed expert holding no slot, into a candidate slot of "
                    "the last prepare_fills"
                )
            if pool.slot_expert[slot] < 0:
                pool.empty.remove(slot)
            # The forward took the old expert off the device map and wrote this one.
            res.assign(layer, e, slot)
            self._copies.adopt_fill(pool, slot)
            st.streamed_fills += 1
        nbytes = res.expert_bytes[layer]
        st.acquires += 1
        st.misses += len(streamed_ids)
        st.hits += len(needed_ids) - len(streamed_ids)
        st.streamed_reads += len(streamed_ids)
        st.streamed_histogram[len(streamed_ids)] = (
            st.streamed_histogram.get(len(streamed_ids), 0) + 1
        )
        st.streamed_bytes += len(streamed_ids) * nbytes
        st.bytes_moved += len(streamed_ids) * nbytes
        for e in needed_ids:
            if e in streamed_ids:
                continue  # read from the host (a prefetch still in flight stays pending)
            if e in pool.prefetched:
                pool.prefetched.discard(e)
                st.prefetch_used += 1
            if e in pool.expert_slot:
                res.policy.on_access(layer, e)
        pool.needed_window.update(needed_ids)
