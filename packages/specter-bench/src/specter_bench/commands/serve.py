"""``specter serve``: an OpenAI-compatible HTTP server over one loaded model.

``specter serve`` loads the model (the built-in demo by default) and answers
``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health`` and
``/metrics`` on 127.0.0.1:8000. ``--measure`` instead decodes prompts directly and
through the server, alternately, and prints what the server adds to the time to first
token and the time per output token.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

__all__ = ["load_engine", "register", "run"]

DEFAULT_MAX_SEQ_LEN = 2048
"""The KV cache's positions when neither --max-seq-len nor the model says fewer (the
engine's default)."""


def _positive_float(text: str) -> float | None:
    if text.lower() in ("none", "0"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0 or none, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve`` and its options to the ``specter`` parser."""
    from specter_bench.commands.args import (
        DEFAULT_MODEL,
        add_model_args,
        add_prompt_source_args,
        non_negative_int,
        parse_budget,
        parse_depth,
        positive_int,
    )

    p = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (completions, chat, streaming, /metrics)",
        description="Serve one model over an OpenAI-compatible HTTP API: POST "
        "/v1/completions and /v1/chat/completions (stream true or false), GET /v1/models, "
        "/health and /metrics (Prometheus). Requests queue first in, first out, and run one "
        "at a time or, with --max-batch N, N at once (continuous batching); the server "
        "listens on 127.0.0.1 unless --host says otherwise.",
    )
    add_model_args(p, default=DEFAULT_MODEL, weights_seed_flag="--weights-seed")
    p.add_argument(
        "--gpu-memory-gb",
        type=parse_budget,
        default=None,
        help="GPU memory budget in GB (default unlimited: every expert resident)",
    )
    p.add_argument(
        "--slots-per-layer", type=positive_int, help="expert slots per layer (instead of a budget)"
    )
    p.add_argument(
        "--depth",
        type=parse_depth,
        default=None,
        help="depth K or auto, as for generate (default: auto; the built-in demo model without "
        "memory options: 4)",
    )
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        help="positions the KV cache holds: the longest prompt plus max_tokens a request may "
        "have (default: the model's positions, at most 2048; with --measure: what the "
        "longest measured prompt and --max-new-tokens need, as generate sizes it)",
    )
    p.add_argument(
        "--hot-experts",
        metavar="FILE|auto|none",
        default=None,
        help="the hot set pinned under --gpu-memory-gb, as for generate; auto chooses it on "
        "the routing of --calibration-prompt (default: auto when speculating under a budget)",
    )
    p.add_argument(
        "--calibration-prompt",
        default=None,
        metavar="TEXT",
        help="the prompt whose routing chooses the hot set and from which an adaptive depth "
        "warms up (default: a code prompt; with --measure: the first measured prompt)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every "
        "interface, best with --api-key)",
    )
    p.add_argument(
        "--port", type=non_negative_int, default=8000, help="TCP port (default 8000; 0: any)"
    )
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument(
        "--api-key-file", default=None, help="read the API key from this file (first line)"
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients send (default: the preset's name or the checkpoint "
        "folder's name)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template for /v1/chat/completions, where the checkpoint's "
        "tokenizer has none (or to replace its own)",
    )
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=1,
        help="the most requests generated at once (default 1: one at a time, in arrival "
        "order); N > 1 batches continuously: waiting requests join the running batch at step "
        "boundaries, up to N, and finished ones leave (the KV cache holds N sequences of "
        "--max-seq-len positions)",
    )
    p.add_argument(
        "--max-queue",
        type=non_negative_int,
        default=32,
        help="requests that may wait while --max-batch generate; more get 429 with "
        "Retry-After (default 32)",
    )
    p.add_argument(
        "--queue-timeout",
        type=_positive_float,
        default=600.0,
        metavar="SECONDS",
        help="the most a request waits for the engine before a 503 (default 600; none: no limit)",
    )
    p.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=600.0,
        metavar="SECONDS",
        help="the most a generation runs; then it stops and answers what it has, with "
        "finish_reason length (default 600; none: no limit)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=1 << 20,
        help="the largest request body accepted (default 1048576; 413 beyond)",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="do not serve: decode the prompts of --prompts directly and through the server "
        "on 127.0.0.1, alternately, and print what the server adds to TTFT and TPOT",
    )
    add_prompt_source_args(p)
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=128,
        help="with --measure: tokens per generation (default 128)",
    )
    p.add_argument("--out", default=None, help="with --measure: write the figures as JSON here")
    # generate's engine options that serve leaves at their defaults
    p.set_defaults(
        run=run,
        keep_draft=False,
        depth_warmup=None,
        trial_tokens=None,
        no_depth_memory=False,
        hot_set_tokens=32,
        draft_pruned="auto",
        stream_fills=None,
        stream_staging=0,
    )


def _serve_config(args: argparse.Namespace) -> object:
    from specter_bench.model_loading import model_name
    from specter_bench.serve.config import ServeConfig

    api_key = args.api_key
    if args.api_key_file is not None:
        if api_key is not None:
            raise ValueError("give --api-key or --api-key-file, not both.")
        path = Path(args.api_key_file)
        if not path.is_file():
            raise FileNotFoundError(f"--api-key-file {path}: no such file.")
        lines = path.read_text(encoding="utf-8").splitlines()
        api_key = lines[0].strip() if lines else ""
        if not api_key:
            raise ValueError(f"--api-key-file {path}: the file's first line is empty.")
    if api_key == "":
        raise ValueError("--api-key is empty; give a key or leave the option out.")
    template = None
    if args.chat_template is not None:
        path = Path(args.chat_template)
        if not path.is_file():
            raise FileNotFoundError(f"--chat-template {path}: no such file.")
        template = path.read_text(encoding="utf-8")
    return ServeConfig(
        model_name=args.served_model_name or model_name(args.model),
        host=args.host,
        port=args.port,
        api_key=api_key,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        queue_timeout_s=args.queue_timeout,
        request_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        chat_template=template,
    )


def load_engine(
    args: argparse.Namespace, *, calibration_prompt: str, max_seq_len: int | None, log
) -> object:
    """``Engine.from_config`` of ``specter serve``'s options (generate's demo defaults
    applied; the KV cache holds ``max_batch`` sequences of ``max_seq_len`` positions).

    Raises:
        CommandError: the model's KV cache cannot hold ``max_seq_len`` positions, or the
            budget cannot hold the INT4 draft.
    """
    from specter_bench.commands.args import CommandError, resolve_device
    from specter_bench.commands.generate import (
        MAX_AUTO_DEPTH,
        apply_demo_defaults,
        engine_config_from_args,
    )
    from specter_models import DraftDoesNotFitError, Engine
    from specter_models.engine.model_source import model_config, num_experts_of

    device = resolve_device(args.device)
    config = model_config(args.model)
    num_experts = num_experts_of(config)
    if apply_demo_defaults(args, num_experts):
        log(
            f"demo settings: depth {args.depth}, {args.slots_per_layer} of {num_experts} expert "
            "slots per layer (choose --depth, --slots-per-layer or --gpu-memory-gb to change)"
        )
    limit = getattr(config, "max_position_embeddings", None)
    positions = max_seq_len or min(limit or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
    if limit is not None and positions > limit:
        raise CommandError(f"--max-seq-len {positions}: {args.model} has {limit} positions.")
    reserve = (MAX_AUTO_DEPTH if args.depth == "auto" else args.depth) + 2
    if positions <= reserve:
        raise CommandError(f"--max-seq-len {positions} leaves no room past one verification.")
    # generate sizes the KV cache to its request: one of positions - reserve new tokens.
    sized = argparse.Namespace(**vars(args))
    sized.max_positions = positions
    sized.max_new_tokens = positions - reserve
    # --max-batch N: one KV slot per request of the running batch (BatchConfig.max_batch).
    engine_config = engine_config_from_args(sized, device=device, prompt_tokens=0)
    try:
        return Engine.from_config(engine_config, calibration_prompt=calibration_prompt, log=log)
    except DraftDoesNotFitError as exc:
        raise CommandError(
            f"{exc.__cause__} Without the INT4 draft it fits: --depth 0 decodes plainly with "
            f"{exc.plain.slots_per_layer} FP16 expert slots per layer."
        ) from exc


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (or, with ``--measure``, measure and exit)."""
    from specter_bench.commands.args import DEFAULT_PROMPT, CommandError
    from specter_bench.serve.server import run_server

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    missing = [
        name
        for name in ("fastapi", "uvicorn", "prometheus_client")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise CommandError(
            f"specter serve needs {', '.join(missing)} (specter-bench's dependencies): "
            "pip install fastapi uvicorn prometheus-client, or on a machine without internet "
            "access carry the wheels of scripts/fetch-wheels.sh."
        )
    config = _serve_config(args)
    if args.slots_per_layer is not None and args.gpu_memory_gb is not None:
        raise ValueError("give --gpu-memory-gb or --slots-per-layer, not both.")
    try:
        if args.measure:
            return _measure(args, config, log)
        calibration = args.calibration_prompt or DEFAULT_PROMPT

        def load() -> object:
            return load_engine(
                args, calibration_prompt=calibration, max_seq_len=args.max_seq_len, log=log
            )

        return run_server(config, load, log)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise CommandError(f"{exc}; choose another --port or --host.") from None


def _measure(args: argparse.Namespace, config, log) -> int:
    import dataclasses

    from specter_bench.commands.args import prompt_source_config
    from specter_bench.commands.generate import MAX_AUTO_DEPTH
    from specter_bench.prompt_sources import load_prompts
    from specter_bench.serve.measure import measure_overhead
    from specter_bench.serve.server import start_background
    from specter_models.engine.model_source import load_tokenizer, model_config

    prompts = [p.text for p in load_prompts(prompt_source_config(args, default_limit=8))]
    if not prompts:
        raise ValueError("--measure found no prompts in the prompt source.")
    max_seq_len = args.max_seq_len
    if max_seq_len is None:  # as generate sizes its cache for the longest prompt
        hf = model_config(args.model)
        tokenizer = load_tokenizer(args.model, int(hf.vocab_size))
        longest = max(len(tokenizer.encode(p)) for p in prompts)
        need = longest + args.max_new_tokens + MAX_AUTO_DEPTH + 2
        limit = getattr(hf, "max_position_embeddings", None) or need
        max_seq_len = min(limit, -(-need // 64) * 64)
        room = max_seq_len - args.max_new_tokens - MAX_AUTO_DEPTH - 2
        fitting = [p for p in prompts if len(tokenizer.encode(p)) <= room]
        if len(fitting) < len(prompts):
            log(
                f"--measure skips {len(prompts) - len(fitting)} prompt(s) longer than the "
                f"{room} tokens that fit {args.model}'s {max_seq_len} positions with "
                f"--max-new-tokens {args.max_new_tokens}"
            )
        if not fitting:
            raise ValueError(
                f"no prompt fits {args.model}'s {max_seq_len} positions with --max-new-tokens "
                f"{args.max_new_tokens}: lower --max-new-tokens or use shorter prompts."
            )
        prompts = fitting
    calibration = args.calibration_prompt or prompts[0]

    def load() -> object:
        return load_engine(args, calibration_prompt=calibration, max_seq_len=max_seq_len, log=log)

    config = dataclasses.replace(config, host="127.0.0.1", port=0)
    server = start_background(config, load)
    try:
        server.wait_ready()
        result = measure_overhead(
            server, config.model_name, prompts, args.max_new_tokens, api_key=config.api_key,
            log=log,
        )  # fmt: skip
    finally:
        server.stop()
    direct, served = result["direct"], result["server"]
    print(f"{len(prompts)} prompts x {args.max_new_tokens} new tokens, greedy")
    print(f"{'':8} {'TTFT ms (mean / median)':>26} {'TPOT ms (mean / median)':>26}")
    for name, arm in (("direct", direct), ("server", served)):
        print(
            f"{name:8} {arm.ttft_ms_mean:12.2f} / {arm.ttft_ms_median:<11.2f}"
            f"{arm.tpot_ms_mean:12.3f} / {arm.tpot_ms_median:<11.3f}"
        )
    print(
        f"the server adds {result['ttft_overhead_ms']:+.2f} ms to TTFT and "
        f"{result['tpot_overhead_pct']:+.2f}% to TPOT (means; medians: "
        f"{result['ttft_overhead_ms_median']:+.2f} ms and "
        f"{result['tpot_overhead_pct_median']:+.2f}%); same text: {result['same_text']}"
    )
    if args.out:
        record = dict(result, direct=dataclasses.asdict(direct), server=dataclasses.asdict(served))
        record["command"] = getattr(args, "invocation", None)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0
