"""How a replica sync's averages travel: the replica channel (in-world group or torchft's
managed group), the coalesced collectives, and transfers that may land later.

``channel`` picks the process group, ``collectives`` holds the plain average/broadcast
used by sync, alignment and repair, and ``transfer`` a started average (``Pending``) that
lands with delta correction, which is what makes delayed optimizer state exact. What is sent
is the engines' business (``sync.engines``), when it is sent the policy's.
"""
