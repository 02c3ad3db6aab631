"""Planning a job before (and as) it runs: what it costs, and what to do about it.

- :mod:`~autosp.planning.memory`: the counters (saved tensors, live-bytes peak) shared by
  measurements and the model.
- :mod:`~autosp.planning.estimate`: the memory model: a compiled program's training step on
  meta tensors as one simulated rank (``estimate_memory``, ``max_context``).
- :mod:`~autosp.planning.planner`: the cheapest plan that fits ``memory_budget``.
- :mod:`~autosp.planning.fake_cuda`: a step on CUDA's kernels without a GPU, and its checks.

The package depends on :mod:`autosp.driver` (it compiles through it), never on
:mod:`autosp.api`. The pure cost models it prices with (the mesh, the recurrence method,
:class:`~autosp.cost.plan.MemoryPlan`) are :mod:`autosp.cost`, below the driver.
"""
