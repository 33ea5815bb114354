"""What builds a ``DMPCollection``: the call forms, the construction steps, the
process-group contexts and their references, the resources a model holds, and its replica
consistency (align, sync, cadence, repair from a replica)."""
