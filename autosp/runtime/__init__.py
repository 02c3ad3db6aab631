"""Runtime support for emitted graphs: named process groups and collectives."""
from autosp.runtime.collectives import (
                                        all_gather,
                                        all_reduce,
                                        all_to_all,
                                        group_rank,
                                        group_size,
                                        reduce_scatter,
                                        register_group,
                                        shard,
                                        unregister_group,
)
from autosp.runtime.context import RuntimeContext

__all__ = ["RuntimeContext", "all_gather", "all_reduce", "all_to_all", "group_rank", "group_size",
           "reduce_scatter", "register_group", "shard", "unregister_group"]
