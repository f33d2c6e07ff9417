"""Markdown tables of benchmark records, in one namespace.

The tables live in five modules: :mod:`~specter_bench.table_format` (cells, rows, run and
source labels), :mod:`~specter_bench.tpot_tables` (TPOT per system, latency per phase),
:mod:`~specter_bench.target_tables` (target ratios),
:mod:`~specter_bench.experiment_tables` (memory, hot sets, routing, policies, sweeps,
kernels) and :mod:`~specter_bench.user_tables` (time to first token, load time, memory
against the budget). This module re-exports their public names.
"""

from __future__ import annotations

from specter_bench.experiment_tables import (
    agreement_table,
    depth_sweep_table,
    hot_experts_table,
    hot_sweep_table,
    kernel_table,
    memory_table,
    policy_table,
    working_set_table,
)
from specter_bench.table_format import (
    format_value,
    markdown_table,
    run_label,
    source_label,
    system_order,
)
from specter_bench.target_tables import TARGETS, Target, evaluate_targets, targets_table
from specter_bench.tpot_tables import SystemSummary, phase_table, summarize_tpot, tpot_table
from specter_bench.user_tables import load_table, memory_use_table, ttft_table

__all__ = [
    "TARGETS",
    "SystemSummary",
    "Target",
    "agreement_table",
    "depth_sweep_table",
    "evaluate_targets",
    "format_value",
    "hot_experts_table",
    "hot_sweep_table",
    "kernel_table",
    "load_table",
    "markdown_table",
    "memory_table",
    "memory_use_table",
    "phase_table",
    "policy_table",
    "run_label",
    "source_label",
    "summarize_tpot",
    "system_order",
    "targets_table",
    "tpot_table",
    "ttft_table",
    "working_set_table",
]
