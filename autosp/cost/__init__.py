"""The pure cost models: which mesh (``strategy``), which way a recurrence runs
(``recurrence``), and the memory plan a budget buys (``plan``: :class:`MemoryPlan`).

Read by the passes, the driver and the planners; they import only the IR layer (plain
data: the sequence layout), never the driver, so the floors above them can use them
without running back up. The planners that compile to measure (:mod:`autosp.planning`)
sit above the driver.
"""
