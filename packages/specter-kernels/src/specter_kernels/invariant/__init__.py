"""Batch invariance: matmuls, GEMVs, reductions and attention whose per-row results do not
depend on the row count, and ``BatchInvariantMode``, which routes torch calls to them."""
