"""Sync engines: *which values* a replica sync averages (the policy decides when and how).

``base`` is the engine interface and its ``Payload``; ``dense`` sends every row;
``sparse`` only the rows some replica touched since the last sync (``touched`` stamps the
lookups, ``rows`` packs the selected rows); ``auto`` picks dense or touched rows per sync
from measured costs (``cost``: the link constants and model; ``choice``: the decision).
"""
