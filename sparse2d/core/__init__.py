"""What builds a ``DMPCollection``: the call forms, the construction steps, the
process-group contexts and their references, the resources a model holds, its replica
consistency (align, sync, cadence, repair from a replica), sparse2d's own sharding strategy
FULLY_SHARDED (``fully_sharded/``) and the guard TorchRec's early-lookup pipelines run
(``pipeline_guard``)."""
