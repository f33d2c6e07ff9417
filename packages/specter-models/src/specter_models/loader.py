"""``load_model``: a checkpoint or preset, ready for speculative decoding, every knob explicit.

This is the low-level builder under ``specter_models.load`` and ``specter_models.Engine``
(which take typed configs); tests and benchmarks that compare one switch use it directly.

Loading builds transformers' own model with its routed experts swapped out, puts every
non-expert weight on the device, streams the routed experts one at a time into
specter-cache's pinned host store (from the checkpoint's memory map, or generated from a
seed on the device), quantizes each one for the INT4 draft on the device as it passes (or
imports the draft from a GPTQ checkpoint), and sizes the FP16 expert slots from the budget.
No step holds all experts on the device, nor any expert twice in host memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

from specter_cache import (
    ExpertCache,
    ExpertLayout,
    ExpertStore,
    ReplacementPolicy,
    RoutingCounter,
    SpeculativePrefetcher,
)
from specter_kernels import StagingBuffer, observe_and_publish
from specter_models.absorbed_mla import install_absorbed_mla
from specter_models.architecture import Architecture, MoeLayer, architecture_for, find_moe_layers
from specter_models.checkpoint import (
    CheckpointFiles,
    expert_sources,
    load_non_expert_weights,
    read_json,
)
from specter_models.experts_runtime import ExpertsRuntime
from specter_models.fused_mlp import install_fused_gate_up
from specter_models.fused_norms import install_fused_rms_norm
from specter_models.fused_projections import install_fused_q_kv_a
from specter_models.fused_residuals import install_fused_residuals
from specter_models.fused_rotary import install_fused_rotary
from specter_models.fused_routers import install_fused_routers
from specter_models.gptq_checkpoint import load_gptq_draft
from specter_models.int4_draft import Int4LayerBuilder
from specter_models.invariant_scopes import install_batch_invariance
from specter_models.kv_slots import KVSlots
from specter_models.memory_meter import MemoryMeter
from specter_models.memory_plan import DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_VERIFY_ROWS, plan_memory
from specter_models.model_builder import build_on_meta, materialize, swap_routed_experts
from specter_models.presets import (
    DEMO_MODEL,
    PRESETS,
    demo_model_path,
    get_preset,
    looks_like_path,
    missing_checkpoint_message,
)
from specter_models.random_weights import init_non_expert_weights, random_expert
from specter_models.row_truncation import RowTruncation
from specter_models.shared_overlap import install_shared_expert_overlap
from specter_models.spec_adapters import SharedKV
from specter_models.specter_model import MemoryReport, SpecterModel
from specter_models.streamed_misses import (
    DEFAULT_STREAM_FILLS,
    DEFAULT_STREAM_STAGING,
    DEFAULT_STREAM_WAITS,
    check_miss_path,
    check_stream_fills,
    check_stream_staging,
    check_stream_waits,
)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_model(
    path_or_preset: str | os.PathLike[str],
    *,
    gpu_memory_gb: float | None = None,
    slots_per_layer: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float16,
    draft: str | os.PathLike[str] | None = "rtn",
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    policy: str | ReplacementPolicy = "lru",
    seed: int = 0,
    verification: str = "expert",
    draft_group_size: int | None = None,
    max_verify_rows: int = DEFAULT_MAX_VERIFY_ROWS,
    pin_memory: bool | None = None,
    batch_invariant: bool | None = None,
    invariant_draft_linears: bool | None = None,
    cuda_graphs: bool | None = None,
    piecewise_graphs: bool | None = None,
    fused_norms: bool = True,
    fused_rotary: bool = True,
    fused_routers: bool = True,
    absorbed_mla: bool = True,
    fused_mlp: bool = True,
    fused_projections: bool = True,
    shared_overlap: bool | None = None,
    fused_residuals: bool = True,
    row_truncation: bool | RowTruncation = False,
    hot_experts: Sequence[Sequence[int]] | None = None,
    draft_pruned_experts: Sequence[Sequence[int]] | None = None,
    miss_path: str = "load",
    stream_fills: int = DEFAULT_STREAM_FILLS,
    stream_staging: int = DEFAULT_STREAM_STAGING,
    stream_waits: bool = DEFAULT_STREAM_WAITS,
    max_batch: int = 1,
) -> SpecterModel:
    """Load a model for speculative decoding with offloaded experts and an INT4 draft.

    Args:
        path_or_preset: a Hugging Face checkpoint folder (``config.json`` and safetensors,
            original per-expert names), a preset name (``deepseek-v2-lite``, ``qwen1.5-moe``,
            ``phi-3.5-moe``, ``tiny-*``: seeded random weights) or ``specter-code-tiny`` (the
            trained demo checkpoint shipped with the package).
        gpu_memory_gb: GPU memory budget in GB; the FP16 expert slots get what the fixed
            state leaves. None (and no ``slots_per_layer``): every expert resident.
        slots_per_layer: a fixed slot count per MoE layer instead of a budget.
        device: default ``"cuda"`` when available, else ``"cpu"``.
        dtype: the model's dtype. float16 runs the fused kernels; float32/float64 run the
            plain-torch reference path (CPU tests).
        draft: ``"rtn"`` (quantize the experts on load, round-to-nearest), a GPTQ checkpoint
            folder of the same model, or None (target only: no INT4 experts, more slots).
        max_seq_len: positions the KV cache holds (prompt plus generation plus K).
        max_batch: sequences the KV cache holds at once (``KVSlots``, for batched decoding).
        policy: the expert cache's replacement policy (``"lru"``, ``"lfu"``,
            ``"predictive"`` or an instance).
        seed: the random-weight seed of a preset (ignored for checkpoints).
        verification: ``"expert"`` (waves per layer) or ``"token"`` (row by row).
        draft_group_size: force the INT4 RTN group size (default: 128, or 64/32 where a
            dimension needs it).
        max_verify_rows: most rows a decoding forward processes (sizes the workspace).
        pin_memory: pin the host expert store (default: when CUDA is available).
        batch_invariant: verify with batch-invariant arithmetic, so a row's logits do not
            depend on how many rows are verified together and speculative greedy output
            equals plain greedy output bit for bit (default: on for float16/bfloat16 on
            CUDA, where kernels pick tiles and reduction orders by row count; float32/64
            CPU models run the plain-torch path, where it is off unless asked for).
        invariant_draft_linears: run the draft's plain linears through the batch-invariant
            GEMM kernel too, instead of torch's (``ExpertsRuntime.invariant_draft_linears``;
            a speed choice). Default: on with ``batch_invariant`` on CUDA, where its
            one-row GEMV beats cuBLAS (the DeepSeek-V2-Lite draft step 2.11 -> 1.95 ms on the
            H200); off elsewhere (the CPU reference runs one row at a time).
        cuda_graphs: capture decode steps as CUDA graphs: the draft's one-row steps, and
            the target's steps while every expert is resident (default: on for CUDA; see
            ``SpecterModel.enable_step_graphs``).
        piecewise_graphs: with CUDA graphs, graph the target under a budget too, piecewise
            between its routed-expert calls (None, the default: whenever ``cuda_graphs``
            is on; False keeps budgeted target steps eager).
        fused_norms: RMSNorm modules as one fused kernel on CUDA (``fused_norms``).
        fused_rotary: DeepSeek-V2's rotary embedding fused on CUDA (``fused_rotary``).
        fused_routers: DeepSeek-V2's and Qwen2-MoE's routers fused on CUDA (``fused_routers``).
        absorbed_mla: DeepSeek-V2's attention in the absorbed MLA form (``absorbed_mla``).
        fused_mlp: run the dense and shared-expert SwiGLU MLPs as one gate/up GEMM and one
            ``silu_and_mul`` (``fused_mlp``); False keeps their two GEMMs and two kernels.
        fused_projections: run DeepSeek-V2's ``q_proj`` and ``kv_a_proj_with_mqa`` as one
            GEMM in the absorbed MLA form (``fused_projections``; needs ``absorbed_mla``).
        shared_overlap: run the shared experts of DeepSeek-V2's and Qwen2-MoE's MoE blocks on
            a side stream beside the router and the routed experts on CUDA
            (``shared_overlap``; the same bits, in fewer microseconds); False runs them in
            order; None (default): on. ``SpecterModel.shared_overlap`` holds the switch.
        fused_residuals: run DeepSeek-V2's and Qwen2-MoE's residual adds inside the kernels
            beside them on CUDA: the attention's add with the post-attention RMSNorm, the
            MoE block's branch add with the layer's (``fused_residuals``; the same bits in
            two fewer launches a layer; needs ``fused_norms``). False keeps the adds apart.
        row_truncation: miss-aware truncation of greedy expert-wise verification
            (``row_truncation``): True for the default policy, or a ``RowTruncation``;
            False (default) verifies every row. Greedy output is unchanged either way.
        hot_experts: a pinned hot set, ``hot_experts[layer]`` = the experts of each MoE
            layer (the same number in every layer) to keep in FP16 slots for good: the
            draft computes them from those slots and holds INT4 copies of the others only,
            and the memory that frees buys more slots (``plan_memory``'s
            ``hot_experts_per_layer``). ``choose_hot_experts`` picks them from a calibration
            routing. None (default): no pins, every expert has an INT4 copy.
        draft_pruned_experts: a pruned draft, ``draft_pruned_experts[layer]`` = experts of
            each MoE layer (the same number in every layer, none of them hot) the draft
            skips: no INT4 copy, and a pair the draft routes to one adds nothing to its
            output. The target computes them as always (greedy output is unchanged; only
            the draft's proposals, and so acceptance, can change), and the INT4 memory
            buys FP16 slots (``plan_memory``'s ``pruned_experts_per_layer``).
            ``coldest_experts`` picks the least routed of a calibration routing. Needs a
            draft. None (default): the draft skips nothing.
        miss_path: ``"load"`` (default: a verification acquires its missing experts, loaded
            into slots and computed in waves) or ``"stream"`` (the expert kernel reads them
            in place from the pinned host store, so a budgeted verification is one CUDA
            graph; ``streamed_misses``). Switchable later (``SpecterModel.miss_path``).
        stream_fills: on the streamed path, candidate slots per layer that a verification
            fills with the experts it streams (resident afterwards for no extra transfer,
            evicting the policy's coldest; ``streamed_misses``). 0 (default): none, and no
            fill launches; ``SpecterModel.stream_fills`` can lower it later, not raise it.
        stream_staging: on the streamed path, FP16 experts of a device staging buffer that
            every layer shares: a verification copies each layer's first missing experts
            into it with a wide kernel before the expert kernel reads them
            (``streamed_misses``). Fixed state in the memory plan. 0 (default): none;
            ``SpecterModel.stream_staging`` can lower it later, not raise it. float16 only.
        stream_waits: on the streamed path, a verification waits at each layer for that
            layer's prefetches still in flight and reads them from their slots, instead of
            streaming them meanwhile (``streamed_misses``). Default True;
            ``SpecterModel.stream_waits`` switches it later.

    Returns:
        A ``SpecterModel`` with ``.target``, ``.draft``, ``.cache``, ``.prefetcher``,
        ``.tokenizer``, ``.config`` and ``.memory``.

    Raises:
        ValueError: an unsupported model type (the message names deepseek_v2, qwen2_moe and
            phimoe), an unknown preset, conflicting or bad arguments, or a checkpoint that does
            not match its config.
        MemoryBudgetError: a budget too small for the fixed state (says how many GB and why).
        FileNotFoundError: a missing folder or weights.
        TypeError: an unsupported dtype.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be one of {SUPPORTED_DTYPES}, got {dtype!r}")
    if gpu_memory_gb is not None and slots_per_layer is not None:
        raise ValueError("give gpu_memory_gb or slots_per_layer, not both")
    device = _resolve_device(device)
    if cuda_graphs and device.type != "cuda":
        raise ValueError(
            f"cuda_graphs=True needs a CUDA device, got device={str(device)!r}; pass "
            "cuda_graphs=None or False on the CPU"
        )
    if cuda_graphs is None:
        cuda_graphs = device.type == "cuda"
    if piecewise_graphs and not cuda_graphs:
        raise ValueError(
            "piecewise_graphs=True needs CUDA graphs: a CUDA device and cuda_graphs not False"
        )
    if piecewise_graphs is None:
        piecewise_graphs = cuda_graphs
    check_miss_path(miss_path)  # before the load, which takes a while
    check_stream_fills(stream_fills)
    check_stream_staging(stream_staging)
    check_stream_waits(stream_waits)
    if stream_staging and dtype != torch.float16:
        raise ValueError(
            f"stream_staging={stream_staging} needs dtype=torch.float16 (the grouped FP16 "
            f"kernel reads the staged experts), got {dtype}; pass stream_staging=0"
        )
    folder, preset_name = _resolve_source(path_or_preset)
    config = _load_config(folder) if folder is not None else get_preset(preset_name).make_config()
    arch = architecture_for(config)
    arch.check_config(config, max_seq_len)
    hot = _check_expert_sets(hot_experts, "hot_experts")
    pruned = _check_expert_sets(draft_pruned_experts, "draft_pruned_experts")
    if pruned and draft is None:
        raise ValueError(
            "draft_pruned_experts needs a draft (draft='rtn' or a GPTQ folder): without one "
            "there are no INT4 experts to prune; drop draft_pruned_experts"
        )
    for i, (hot_of_layer, pruned_of_layer) in enumerate(zip(hot, pruned, strict=False)):
        if both := sorted(set(hot_of_layer) & set(pruned_of_layer)):
            raise ValueError(
                f"MoE layer {i}: experts {both} are both hot and pruned; a pinned hot expert "
                "is computed by the draft from its FP16 slot, so it cannot be pruned"
            )
    if draft is not None and draft != "rtn":
        draft = Path(draft)
        if not draft.is_dir():
            raise FileNotFoundError(
                f"draft={str(draft)!r} is neither 'rtn' nor a GPTQ checkpoint folder"
            )
    plan = plan_memory(
        config,
        gpu_memory_gb,
        slots_per_layer=slots_per_layer,
        dtype=dtype,
        max_seq_len=max_seq_len,
        max_verify_rows=max_verify_rows,
        draft_group_size=draft_group_size,
        with_draft=draft is not None,
        hot_experts_per_layer=len(hot[0]) if hot else 0,
        staging_slots=stream_staging,
        pruned_experts_per_layer=len(pruned[0]) if pruned else 0,
        max_batch=max_batch,
    )

    meter = MemoryMeter(device)
    meter.start()
    clock = _PhaseTimer()
    model = build_on_meta(arch, config, dtype)
    if batch_invariant is None:
        batch_invariant = device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
    runtime = ExpertsRuntime(  # the cache is attached below, once the store is filled
        cache=None,  # type: ignore[arg-type]
        verification=verification,
        batch_invariant=bool(batch_invariant),
        invariant_draft_linears=(
            bool(batch_invariant) and device.type == "cuda"
            if invariant_draft_linears is None
            else bool(invariant_draft_linears)
        ),
    )
    experts = swap_routed_experts(model, runtime)
    if fused_norms:
        install_fused_rms_norm(model)  # before the invariance scopes, which wrap it
    if absorbed_mla:
        install_absorbed_mla(model)  # before the rotary swap, which wraps it
    if fused_rotary:
        install_fused_rotary(model)
    if fused_routers:
        install_fused_routers(model)  # before the invariance scopes, which wrap it
    install_batch_invariance(model, runtime)  # inert until a batch-invariant target forward
    tied = materialize(model, device, sync_free_rotary=True)
    layers = find_moe_layers(model)
    for name, sets in (("hot_experts", hot), ("draft_pruned_experts", pruned)):
        if sets and len(sets) != len(layers):
            raise ValueError(
                f"{name} needs one list per MoE layer ({len(layers)} in this "
                f"{arch.model_type} model), got {len(sets)}"
            )
    files = CheckpointFiles(folder) if folder is not None else None
    std = float(getattr(config, "initializer_range", 0.02))
    if files is not None:
        load_non_expert_weights(model, files, arch, skip=tied)
    else:
        init_non_expert_weights(model, seed=seed, std=std)
    if fused_mlp:
        install_fused_gate_up(model, runtime)  # copies the loaded gate and up weights
    if fused_projections and absorbed_mla:
        install_fused_q_kv_a(model, runtime)  # copies the loaded q and kv_a weights
    shared_overlap = shared_overlap is None or bool(shared_overlap)
    overlap = install_shared_expert_overlap(model, runtime, enabled=shared_overlap)
    if shared_overlap:
        overlap.prepare(device)  # the side stream and its counters, before any capture
    if fused_residuals:
        install_fused_residuals(model)  # after the overlap, whose blocks take the residual
    clock.lap("non_expert")

    layouts = [
        ExpertLayout(
            {
                "gate_up": ((2 * layer.intermediate_size, layer.hidden_size), dtype),
                "down": ((layer.hidden_size, layer.intermediate_size), dtype),
            }
        )
        for layer in layers
    ]
    E = layers[0].num_experts
    if files is not None:
        store = ExpertStore.from_safetensors(
            len(layers), E, layouts, expert_sources(files, arch, layers), pin_memory=pin_memory
        )
    else:
        store = ExpertStore(len(layers), E, layouts, pin_memory=pin_memory)
    _fill_store_and_draft(
        store,
        layers,
        experts,
        draft,
        draft_group_size,
        device,
        dtype,
        arch,
        generate_seed=seed if files is None else None,
        std=std,
        hot=hot or [() for _ in layers],
        pruned=pruned or [() for _ in layers],
    )
    store.close()
    if files is not None:
        files.close()
    clock.lap("experts_and_draft")

    cache = ExpertCache(store, slots_per_layer=plan.slots_per_layer, device=device, policy=policy)
    runtime.cache = cache
    counter = RoutingCounter(len(layers), E, device)
    runtime.counter = counter if draft is not None else None
    if draft is not None and device.type == "cuda" and plan.slots_per_layer < E:
        # Each draft layer's counts reach the host as the draft runs (same launch as the
        # count), so the prefetcher plans each draft's final prefetch layer by layer while
        # the draft computes (DeepSeek-V2-Lite at 24 GB on one H200: 8.97-9.25 ms a token
        # against 10.76-10.93 with a final snapshot, one process each order).
        counter.publish(observe_and_publish)
    prefetcher = SpeculativePrefetcher(cache, counter, layerwise=counter.publishing)
    prefetcher.warm_up()  # the first draft's snapshot would pay its first use (66 ms on an H200)
    runtime.bandwidth = lambda: prefetcher.planner.bandwidth  # measured transfers
    if stream_staging:
        first = layers[0]
        runtime.staging = StagingBuffer.allocate(
            stream_staging, E, first.hidden_size, first.intermediate_size, device
        )
    if row_truncation:
        runtime.row_truncation = (
            row_truncation if isinstance(row_truncation, RowTruncation) else RowTruncation()
        )
    row_shape = arch.kv_row_shapes(config)
    kv_slots = KVSlots([row_shape] * len(model.model.layers), max_seq_len, max_batch, dtype, device)
    kv = SharedKV(kv_slots.cache(0))
    if plan.slots_per_layer == E:
        # No budget: every expert resident from the start (the all-resident configuration).
        cache.prefetch({layer: list(range(E)) for layer in range(len(layers))})
        cache.synchronize()
        cache.expire_prefetches()
        cache.reset_stats()
    if hot:
        for layer, experts_of_layer in enumerate(hot):
            cache.pin(layer, experts_of_layer)
        cache.synchronize()  # the draft reads the hot slots from its first step on
        cache.reset_stats()
    clock.lap("cache")
    peaks = meter.stop()
    tokenizer = _load_tokenizer(folder) if folder is not None else None
    source = str(folder) if folder is not None else f"preset:{preset_name}:seed={seed}"
    memory = MemoryReport(
        plan=plan,
        load=peaks,
        host_store_bytes=store.reserved_bytes,
        host_store_pinned=store.is_pinned,
        load_seconds=clock.laps,
    )
    loaded = SpecterModel(
        model=model,
        architecture=arch,
        runtime=runtime,
        experts=experts,
        kv=kv,
        kv_slots=kv_slots,
        counter=counter,
        prefetcher=prefetcher,
        has_draft=draft is not None,
        tokenizer=tokenizer,
        memory=memory,
        source=source,
        max_verify_rows=max_verify_rows,
        shared_overlap=overlap,
    )
    loaded.runtime.fill_width = stream_fills
    loaded.stream_fills = stream_fills
    loaded.stream_staging = stream_staging
    loaded.stream_waits = stream_waits
    if miss_path != "load":
        loaded.miss_path = miss_path
    if cuda_graphs:
        loaded.enable_step_graphs(piecewise=piecewise_graphs)
    return loaded


def _fill_store_and_draft(
    store: ExpertStore,
    layers: list[MoeLayer],
    experts: list,
    draft: str | Path | None,
    group_size: int | None,
    device: torch.device,
    dtype: torch.dtype,
    arch: Architecture,
    *,
    generate_seed: int | None,
    std: float,
    hot: Sequence[Sequence[int]],
    pruned: Sequence[Sequence[int]],
) -> None:
    """Stream every routed expert through the host store, quantizing it for the draft.

    With ``generate_seed`` (a preset) each expert is generated on the device and copied into
    the (pinned) store; otherwise it is read from the checkpoint's memory map into the store.
    With an RTN draft each expert that is neither hot (``hot[layer]``) nor pruned
    (``pruned[layer]``) is then quantized on the device before the next one, into the layer's
    INT4 entries in ascending id order.
    """
    for layer, module, hot_of_layer, pruned_of_layer in zip(
        layers, experts, hot, pruned, strict=True
    ):
        entry = _int4_entries(layer.num_experts, (*hot_of_layer, *pruned_of_layer))
        builder = (
            Int4LayerBuilder(
                len(entry), layer.hidden_size, layer.intermediate_size, device, group_size
            )
            if draft == "rtn"
            else None
        )
        for e in range(layer.num_experts):
            if generate_seed is not None:
                tensors = random_expert(
                    layer, e, seed=generate_seed, std=std, device=device, dtype=dtype
                )
                store.put(layer.index, e, tensors)
            else:
                tensors = store.get(layer.index, e)  # mmap -> pinned record, pages dropped
            if builder is not None and e in entry:
                builder.quantize(entry[e], tensors["gate_up"], tensors["down"])
        if builder is not None:
            module.set_draft_weights(
                *builder.finish(), hot_experts=hot_of_layer, pruned_experts=pruned_of_layer
            )
    if isinstance(draft, Path):
        for module, hot_of_layer, pruned_of_layer, (gate_up, down) in zip(
            experts, hot, pruned, load_gptq_draft(draft, arch, layers, device), strict=True
        ):
            if hot_of_layer or pruned_of_layer:
                skip = (*hot_of_layer, *pruned_of_layer)
                cold = list(_int4_entries(module.num_experts, skip))
                index = torch.tensor(cold, device=gate_up.qweight.device)
                gate_up, down = gate_up.experts(index), down.experts(index)
            module.set_draft_weights(
                gate_up, down, hot_experts=hot_of_layer, pruned_experts=pruned_of_layer
            )


def _int4_entries(num_experts: int, skip: Sequence[int]) -> dict[int, int]:
    """expert -> its INT4 entry: the experts not in ``skip`` (hot or pruned ones), in
    ascending id order."""
    skip = set(skip)
    return {e: i for i, e in enumerate(e for e in range(num_experts) if e not in skip)}


def _check_expert_sets(sets: Sequence[Sequence[int]] | None, name: str) -> list[tuple[int, ...]]:
    """Per-layer expert sets (``hot_experts``, ``draft_pruned_experts``: called ``name`` in
    errors) as tuples, checked for shape (ids are checked per layer later).

    Raises:
        ValueError: not one sequence of distinct ints per layer, or layers of different sizes.
    """
    if sets is None:
        return []
    try:
        checked = [tuple(int(e) for e in layer) for layer in sets]
    except TypeError as error:
        raise ValueError(
            f"{name} must be one sequence of expert ids per MoE layer "
            f"({name}[layer] = [ids]), got {sets!r}"
        ) from error
    sizes = {len(layer) for layer in checked}
    if len(sizes) > 1:
        raise ValueError(
            f"{name} must name the same number of experts in every layer, got sizes {sorted(sizes)}"
        )
    for i, layer in enumerate(checked):
        if len(set(layer)) != len(layer) or any(e < 0 for e in layer):
            raise ValueError(f"{name}[{i}] must be distinct expert ids >= 0, got {layer}")
    return checked


class _PhaseTimer:
    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._start = self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._last
        self.laps["total"] = now - self._start
        self._last = now


def _resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _resolve_source(source: str | os.PathLike[str]) -> tuple[Path | None, str | None]:
    """``(checkpoint folder, None)`` or ``(None, preset name)``."""
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"path_or_preset must be a folder path or a preset name, got {source!r}")
    text = os.fspath(source)
    if text == DEMO_MODEL:
        return demo_model_path(), None
    if Path(text).is_dir():
        return Path(text), None
    if text.lower() in PRESETS:
        return None, text.lower()
    if Path(text).exists():
        raise ValueError(
            f"{text!r} is a file, not a checkpoint folder; give the folder that holds "
            "config.json and *.safetensors, or a preset"
        )
    if looks_like_path(text):
        raise ValueError(missing_checkpoint_message(text))
    raise ValueError(
        f"{text!r} is neither a checkpoint folder nor a preset; presets: {sorted(PRESETS)} and "
        f"{DEMO_MODEL!r}"
    )


def _load_config(folder: Path) -> PretrainedConfig:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; is it a Hugging Face checkpoint?")
    architecture_for(str(read_json(config_path).get("model_type")))  # clear error first
    return AutoConfig.from_pretrained(folder)


def _load_tokenizer(folder: Path):
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    return AutoTokenizer.from_pretrained(folder)
