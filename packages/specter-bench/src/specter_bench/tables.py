"""Markdown tables of benchmark records, in one namespace.

The tables live in four modules: :mod:`~specter_bench.table_format` (cells, rows, run and
source labels), :mod:`~specter_bench.tpot_tables` (TPOT per system, latency per phase),
:mod:`~specter_bench.target_tables` (target ratios) and
:mod:`~specter_bench.experiment_tables` (memory, hot sets, routing, policies, sweeps,
kernels). This module re-exports their public names.
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
    "markdown_table",
    "memory_table",
    "phase_table",
    "policy_table",
    "run_label",
    "source_label",
    "summarize_tpot",
    "system_order",
    "targets_table",
    "tpot_table",
    "working_set_table",
]
