"""Train a small Mixture-of-Experts language model on the Python standard library.

Reproducible and offline: the corpus is the running interpreter's standard library
(`specter_bench.training.corpus`), the tokenizer is byte-level BPE trained on its training
split (`specter_bench.training.tokenizer`), and the model is transformers' own DeepSeek-V2,
Qwen2-MoE or PhiMoE (`specter_bench.training.architectures`). The output folder is a Hugging
Face checkpoint (fp16 safetensors, config, tokenizer) with a model card and the JSON-lines
training log. ``specter train`` is the command line over `train`.

The step count is ``steps``, or else ``epochs`` over the training tokens shortened to fit the
``max_minutes`` wall-clock budget; that choice is made from timed steps inside the warm-up,
before the schedule depends on it, so rerunning with the logged ``--steps`` repeats the run.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import tokenizers
import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from specter_bench.training.architectures import SpecialTokens, get_preset
from specter_bench.training.config import (
    CALIBRATION_STEPS,
    FINALIZE_RESERVE_S,
    MAX_POSITIONS,
    RunSettings,
    TrainConfig,
    resolve_settings,
)
from specter_bench.training.corpus import Corpus, load_stdlib_corpus
from specter_bench.training.experts import choose_experts_implementation
from specter_bench.training.model_card import write_model_card
from specter_bench.training.router_stats import RouterMonitor, find_moe_routers
from specter_bench.training.steps import (
    TrainingLog,
    autocast_for,
    evaluate,
    heldout_windows,
    learning_rate_at,
    make_optimizer,
    parameter_counts,
    sample_batch,
    token_losses,
)
from specter_bench.training.tokenizer import (
    END_OF_TEXT,
    encode_stream,
    tokenizer_sha256,
    train_bpe_tokenizer,
)

__all__ = ["prepare_output", "reproduce_command", "train"]

GENERATION_PROMPTS = (
    "def fibonacci(n):",
    "import os\n\ndef ",
    "class Stack:\n    def __init__(self",
)


def say(message: str) -> None:
    print(f"[specter train] {message}", flush=True)


def train(
    config: TrainConfig, out: str | Path, *, overwrite: bool = False, argv: Sequence[str] = ()
) -> int:
    """Trains, saves, reloads and checks one model into ``out``; returns the exit status
    (0 when every self-check passed, 1 otherwise).

    Args:
        config: the run.
        out: output folder (the checkpoint, its model card and ``training_log.jsonl``).
        overwrite: replace the files of a non-empty ``out``.
        argv: the ``specter train`` arguments, logged and turned into the reproduce command.

    Raises:
        ValueError: a bad setting or output folder, before anything is trained.
    """
    start = time.perf_counter()
    settings = resolve_settings(config)
    out = Path(out)
    prepare_output(out, overwrite)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    transformers.utils.logging.disable_progress_bar()
    return _run(settings, out, start, list(argv))


def reproduce_command(argv: Sequence[str], total_steps: int) -> str:
    """This run's command line with the chosen --steps pinned and --out left to the user."""
    kept, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        if arg in ("--steps", "--out"):
            skip_next = True
            continue
        if arg.startswith(("--steps=", "--out=")) or arg == "--overwrite":
            continue
        kept.append(shlex.quote(arg))
    return " ".join(["specter train", *kept, f"--steps {total_steps} --out OUT"])


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prepare_output(out: Path, overwrite: bool) -> None:
    """Creates the output folder, refusing to mix a new run into an old one.

    Raises:
        ValueError: If out is a file, or a non-empty folder without --overwrite.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a folder path.")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(
                f"--out {out} is not empty; pass --overwrite to replace it or choose a new folder."
            )
        for child in out.iterdir():
            if child.is_dir():
                raise ValueError(f"--out {out} holds a folder {child.name}; remove it by hand.")
            child.unlink()
    out.mkdir(parents=True, exist_ok=True)


def load_tokenizer(settings: RunSettings, corpus: Corpus):
    """Trains the tokenizer on the training split, or loads --tokenizer."""
    if settings.tokenizer_dir is None:
        return train_bpe_tokenizer(
            [f.text for f in corpus.train], settings.vocab_size, MAX_POSITIONS
        )
    tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer_dir)
    if tokenizer.convert_tokens_to_ids(END_OF_TEXT) is None or tokenizer.eos_token != END_OF_TEXT:
        raise ValueError(
            f"--tokenizer {settings.tokenizer_dir} has no {END_OF_TEXT} EOS token; pass a folder "
            "written by `specter train`."
        )
    return tokenizer


@torch.no_grad()
def generation_check(model: nn.Module, tokenizer, device: str, max_new_tokens: int) -> list[dict]:
    """Greedy completions of a few code prompts with plain transformers `generate`."""
    samples = []
    for prompt in GENERATION_PROMPTS:
        encoded = tokenizer(prompt, return_tensors="pt").to(device)
        output = model.generate(
            **encoded,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        new_tokens = output[0, encoded["input_ids"].shape[1] :]
        completion = tokenizer.decode(new_tokens, skip_special_tokens=True)
        samples.append({"prompt": prompt, "completion": completion, "tokens": len(new_tokens)})
        say(f"generation: {prompt!r} -> {completion!r}")
    return samples


def _run(settings: RunSettings, out: Path, start: float, argv: list[str]) -> int:
    """Trains, saves, reloads and checks one model. Returns the process exit code."""
    preset = get_preset(settings.arch)
    device = settings.device
    log = TrainingLog(out / "training_log.jsonl", start)
    transformers.set_seed(settings.seed)
    if device.startswith("cuda"):
        torch.set_float32_matmul_precision("high")
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
    log.write(
        "config",
        settings=asdict(settings),
        argv=argv,
        python=sys.version.split()[0],
        torch=torch.__version__,
        transformers=transformers.__version__,
        tokenizers=tokenizers.__version__,
        device_name=device_name,
    )
    say(f"{settings.arch} on {device_name}, seed {settings.seed}, out {out}")

    corpus = load_stdlib_corpus(settings.heldout_fraction, settings.max_files)
    corpus_facts = corpus.describe()
    log.write("corpus", **corpus_facts)
    say(
        f"corpus: Python {corpus.python_version}, {len(corpus.train)} train / "
        f"{len(corpus.heldout)} held-out files, sha256 {corpus.sha256[:16]}"
    )

    tokenizer = load_tokenizer(settings, corpus)
    sample_text = corpus.heldout[0].text[:2000]  # well under model_max_length tokens
    roundtrip = tokenizer.decode(tokenizer(sample_text)["input_ids"], skip_special_tokens=True)
    if roundtrip != sample_text:
        raise RuntimeError("the tokenizer does not round-trip held-out code; refusing to train.")
    train_np = encode_stream(tokenizer, [f.text for f in corpus.train])
    heldout_np = encode_stream(tokenizer, [f.text for f in corpus.heldout])
    vocab_size = len(tokenizer)
    log.write(
        "tokenizer",
        vocab_size=vocab_size,
        sha256=tokenizer_sha256(tokenizer),
        trained=settings.tokenizer_dir is None,
        train_tokens=int(train_np.size),
        heldout_tokens=int(heldout_np.size),
        train_bytes_per_token=round(corpus_facts["train_bytes"] / max(train_np.size, 1), 3),
        stream_dtype=str(train_np.dtype),
    )
    say(
        f"tokenizer: vocab {vocab_size}; tokens: {train_np.size:,} train, "
        f"{heldout_np.size:,} held out"
    )
    # int32 on the device: 4 bytes a token is a few MB here, and every indexing op supports it.
    train_stream = torch.from_numpy(train_np.astype(np.int32)).to(device)
    heldout_stream = torch.from_numpy(heldout_np.astype(np.int32)).to(device)
    if train_stream.numel() <= settings.seq_len + 1:
        raise ValueError(
            f"the training split has {train_stream.numel()} tokens, too few for --seq-len "
            f"{settings.seq_len}; use more files or a shorter sequence."
        )
    eval_windows = heldout_windows(heldout_stream, settings.seq_len, settings.eval_windows)

    eot = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    config = preset.build_config(vocab_size, SpecialTokens(eot, eot), MAX_POSITIONS)
    model = AutoModelForCausalLM.from_config(config)  # seeded init, on the CPU
    model.to(device)
    routers = find_moe_routers(model)
    monitor = RouterMonitor(routers)
    params = parameter_counts(model, routers)
    log.write("model", config=config.to_dict(), **params)
    say(
        f"model: {type(model).__name__}, {params['parameters']:,} params "
        f"({params['active_parameters_per_token']:,} active), "
        f"~{params['fp16_bytes_estimate'] / 1e6:.1f} MB in fp16"
    )
    if preset.size_limit_bytes and params["fp16_bytes_estimate"] > preset.size_limit_bytes:
        raise ValueError(
            f"{settings.arch} would save ~{params['fp16_bytes_estimate']:,} bytes, over its limit "
            f"{preset.size_limit_bytes:,}; lower --vocab-size."
        )

    generator = torch.Generator(device=device).manual_seed(settings.seed)
    probe_windows = eval_windows[: min(4, eval_windows.shape[0])]

    def probe_loss(probe_model: nn.Module) -> torch.Tensor:
        with autocast_for(device):
            return token_losses(probe_model, probe_windows).mean()

    with torch.random.fork_rng(devices=[torch.device(device)] if device.startswith("cuda") else []):
        experts_choice = choose_experts_implementation(
            model, probe_loss, settings.experts_impl, say
        )
    monitor.clear()
    log.write("experts_implementation", **experts_choice)

    optimizer = make_optimizer(model, settings)
    tokens_per_step = settings.batch_size * settings.seq_len
    planned_by_epochs = max(1, math.ceil(settings.epochs * train_stream.numel() / tokens_per_step))
    total_steps = settings.steps
    eval_every = max(1, total_steps // settings.evals) if total_steps else None

    eval_start = time.perf_counter()
    initial_eval = evaluate(model, eval_windows, settings.batch_size, device, monitor)
    eval_seconds = time.perf_counter() - eval_start
    log.write("eval", step=0, **initial_eval, eval_seconds=round(eval_seconds, 3))
    say(
        f"step 0: held-out loss {initial_eval['heldout_loss']:.4f}, perplexity "
        f"{initial_eval['heldout_ppl']:.2f}"
    )
    train_deadline = start + settings.max_minutes * 60.0 - FINALIZE_RESERVE_S - 2 * eval_seconds

    best_loss, best_step, best_state = initial_eval["heldout_loss"], 0, None
    last_eval_step, last_eval = 0, initial_eval
    logged_losses: list[float] = []
    loss_sum = torch.zeros((), device=device)
    balance_sum = torch.zeros((), device=device)
    interval_steps, interval_start = 0, time.perf_counter()
    calibration_start = None
    stopped_by_budget = False
    model.train()
    step = 0
    while total_steps is None or step < total_steps:
        if total_steps is None and step == CALIBRATION_STEPS[0]:
            if device.startswith("cuda"):
                torch.cuda.synchronize()  # host sync: timing the calibration window
            calibration_start = time.perf_counter()
        if total_steps is None and step == CALIBRATION_STEPS[1]:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            now = time.perf_counter()
            seconds_per_step = (now - calibration_start) / (
                CALIBRATION_STEPS[1] - CALIBRATION_STEPS[0]
            )
            budget = train_deadline - now - settings.evals * eval_seconds
            affordable = step + max(0, int(budget / seconds_per_step))
            total_steps = min(planned_by_epochs, affordable)
            if total_steps > 100:
                total_steps -= total_steps % 10
            total_steps = max(total_steps, settings.warmup_steps + 1, step + 1)
            eval_every = max(1, total_steps // settings.evals)
            log.write(
                "schedule",
                seconds_per_step=round(seconds_per_step, 5),
                planned_by_epochs=planned_by_epochs,
                affordable_by_time=affordable,
                steps=total_steps,
                eval_every=eval_every,
            )
            say(
                f"schedule: {total_steps} steps ({planned_by_epochs} by epochs, {affordable} fit "
                f"the budget at {seconds_per_step * 1000:.1f} ms/step); "
                f"rerun with --steps {total_steps}"
            )

        lr = learning_rate_at(step, settings, total_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(train_stream, settings.batch_size, settings.seq_len, generator)
        monitor.collect_logits = settings.balance_coef > 0
        with autocast_for(device):
            lm_loss = token_losses(model, batch).mean()
            balance = monitor.balance_loss() if monitor.collect_logits else None
            loss = lm_loss if balance is None else lm_loss + settings.balance_coef * balance
        monitor.collect_logits = False
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        loss_sum += lm_loss.detach()
        if balance is not None:
            balance_sum += balance.detach()
        interval_steps += 1

        # Step 1 is always logged: the self-check compares later losses with it.
        if step == 1 or step % settings.log_every == 0 or step == total_steps:
            mean_loss = float(loss_sum) / interval_steps  # host sync: once per log interval
            now = time.perf_counter()
            record = log.write(
                "train",
                step=step,
                loss=round(mean_loss, 5),
                balance=round(float(balance_sum) / interval_steps, 5),
                grad_norm=round(float(grad_norm), 4),
                lr=lr,
                tokens_per_s=round(interval_steps * tokens_per_step / (now - interval_start)),
            )
            if not math.isfinite(mean_loss):
                raise RuntimeError(
                    f"training loss became {mean_loss} by step {step}; lower --lr or --grad-clip."
                )
            logged_losses.append(mean_loss)
            say(
                f"step {step}/{total_steps or '?'}: loss {mean_loss:.4f}, lr {lr:.2e}, "
                f"{record['tokens_per_s']:,} tok/s"
            )
            loss_sum.zero_()
            balance_sum.zero_()
            interval_steps, interval_start = 0, now
            if now > train_deadline:
                stopped_by_budget = True
                say(f"wall-clock budget reached at step {step}; stopping early")
                break

        if eval_every and (step % eval_every == 0 or step == total_steps):
            last_eval = evaluate(model, eval_windows, settings.batch_size, device, monitor)
            last_eval_step = step
            log.write("eval", step=step, **last_eval)
            entropies = [u["entropy"] for u in last_eval["expert_usage"]]
            say(
                f"step {step}: held-out loss {last_eval['heldout_loss']:.4f}, perplexity "
                f"{last_eval['heldout_ppl']:.2f}, expert-usage "
                f"entropy per layer {entropies}"
            )
            if last_eval["heldout_loss"] < best_loss:
                best_loss, best_step = last_eval["heldout_loss"], step
                if settings.keep_best:
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            interval_start = time.perf_counter()  # evaluation time is not training throughput

    steps_run = step
    if last_eval_step != steps_run:
        last_eval = evaluate(model, eval_windows, settings.batch_size, device, monitor)
        log.write("eval", step=steps_run, **last_eval)
        if last_eval["heldout_loss"] < best_loss:
            best_loss, best_step, best_state = last_eval["heldout_loss"], steps_run, None
    saved_step = steps_run
    if settings.keep_best and best_state is not None and best_step != steps_run:
        model.load_state_dict(best_state)
        saved_step = best_step
    del best_state
    monitor.remove()

    # Save in fp16 with the default experts implementation (nothing training-only persists).
    model.eval()
    model.set_experts_implementation("eager")
    model.to(torch.float16)
    nonfinite = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if nonfinite:
        raise RuntimeError(f"fp16 weights overflowed in {nonfinite[:5]}; train with a lower --lr.")
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = eot
    model.generation_config.pad_token_id = eot
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model, optimizer
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    # Reload from disk exactly as a user would, and measure what was saved.
    saved_dtype = torch.float16 if device.startswith("cuda") else torch.float32
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=saved_dtype).to(device)
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out)
    reloaded.eval()
    saved_monitor = RouterMonitor(find_moe_routers(reloaded))
    try:
        saved_eval = evaluate(
            reloaded, eval_windows, settings.batch_size, device, saved_monitor, autocast=False
        )
        saved_experts = reloaded.config._experts_implementation
    except RuntimeError as error:
        # The checkpoint is already on disk; measure it with the portable loop instead.
        say(f"reloaded model failed with its default experts implementation ({error}); eager")
        reloaded.set_experts_implementation("eager")
        saved_eval = evaluate(
            reloaded, eval_windows, settings.batch_size, device, saved_monitor, autocast=False
        )
        saved_experts = "eager (default failed)"
    saved_monitor.remove()
    log.write(
        "saved_eval",
        step=saved_step,
        dtype=str(saved_dtype),
        experts_implementation=saved_experts,
        **saved_eval,
    )
    say(
        f"saved checkpoint (step {saved_step}): held-out loss {saved_eval['heldout_loss']:.4f}, "
        f"perplexity {saved_eval['heldout_ppl']:.2f}"
    )
    generations = generation_check(reloaded, reloaded_tokenizer, device, settings.max_new_tokens)
    log.write("generation", samples=generations)

    wall_s = time.perf_counter() - start
    reproduce = reproduce_command(argv, total_steps)
    facts = {
        "name": out.name,
        "description": preset.description,
        "settings": asdict(settings),
        "corpus": corpus_facts,
        "model_config": json.loads((out / "config.json").read_text()),
        "config_keys": [
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "first_k_dense_replace",
            "intermediate_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "n_routed_experts",
            "num_experts",
            "num_local_experts",
            "num_experts_per_tok",
            "n_shared_experts",
            "routed_scaling_factor",
            "topk_method",
            "norm_topk_prob",
            "num_attention_heads",
            "num_key_value_heads",
            "kv_lora_rank",
            "q_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "tie_word_embeddings",
        ],
        "params": params,
        "vocab_size": vocab_size,
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "train_tokens": int(train_np.size),
        "heldout_tokens": int(heldout_np.size),
        "steps_run": steps_run,
        "steps_note": (
            f" of a {total_steps}-step schedule (the wall-clock budget stopped it)"
            if stopped_by_budget
            else ""
        ),
        "saved_step": saved_step,
        "tokens_seen": steps_run * tokens_per_step,
        "epochs_seen": steps_run * tokens_per_step / train_np.size,
        "device_name": device_name,
        "precision": "bf16 autocast, fp32 weights" if device.startswith("cuda") else "fp32",
        "saved_precision": str(saved_dtype).replace("torch.", ""),
        "experts_implementation": experts_choice["experts_implementation"],
        "wall_s": wall_s,
        "initial_eval": initial_eval,
        "saved_eval": saved_eval,
        "generations": generations,
        "reproduce": reproduce,
    }
    write_model_card(out, facts)

    trained_loss = last_eval["heldout_loss"] if saved_step == steps_run else best_loss
    checks = {
        "train_loss_decreased": len(logged_losses) >= 2 and logged_losses[-1] < logged_losses[0],
        "heldout_loss_decreased": saved_eval["heldout_loss"] < initial_eval["heldout_loss"],
        "reloaded_class": type(reloaded).__name__ == config.architectures[0]
        if config.architectures
        else True,
        "tokenizer_roundtrip": reloaded_tokenizer.decode(
            reloaded_tokenizer(sample_text)["input_ids"], skip_special_tokens=True
        )
        == sample_text,
        # fp16 storage moves the loss by rounding only; a large gap means the save broke.
        "saved_matches_trained": abs(saved_eval["heldout_loss"] - trained_loss) < 0.05,
    }
    size = folder_bytes(out) + 4096  # room for the summary line written below
    if preset.size_limit_bytes:
        checks["under_size_limit"] = size <= preset.size_limit_bytes
    summary = log.write(
        "summary",
        steps=steps_run,
        schedule_steps=total_steps,
        saved_step=saved_step,
        stopped_by_budget=stopped_by_budget,
        tokens_seen=facts["tokens_seen"],
        epochs_seen=round(facts["epochs_seen"], 2),
        initial_heldout_loss=initial_eval["heldout_loss"],
        best_heldout_loss=best_loss,
        final_step_heldout_loss=last_eval["heldout_loss"],
        saved_heldout_loss=saved_eval["heldout_loss"],
        saved_heldout_ppl=saved_eval["heldout_ppl"],
        folder_bytes=size,
        size_limit_bytes=preset.size_limit_bytes,
        wall_s=round(wall_s, 1),
        checks=checks,
        reproduce=reproduce,
    )
    log.close()
    say(f"summary: {json.dumps({k: v for k, v in summary.items() if k != 'event'})}")
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        say(f"SELF-CHECK FAILED: {failed}")
        return 1
    say(f"self-checks passed; checkpoint in {out} ({size / 1e6:.2f} MB)")
    return 0
