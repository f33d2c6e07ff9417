"""``specter tune``'s library: measure the kernels' tiles on this GPU and write the tuned
files that specter-kernels' config modules read.

* :mod:`~specter_bench.tuning.trials`: the correctness gate, timing and choice of the best;
* :mod:`~specter_bench.tuning.linear_shapes`: a model's linear shapes;
* :mod:`~specter_bench.tuning.invariant_sweeps`: the invariant matmul's and GEMV's tiles;
* :mod:`~specter_bench.tuning.int4_sweep`: the W4A16 gemv path's tiles;
* :mod:`~specter_bench.tuning.model_tuning`: one kernel over a model's shapes, and the file.
"""
