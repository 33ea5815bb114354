"""The training application built on the sparse2d library.

``python -m sparse2d.train`` (or ``sparse2d train``) runs ``main.main``: a YAML config
(the ``config`` package: one module per section) describes TorchRec's DLRM (``model``), its data
(``data/``: planted-signal synthetic or Criteo TSV) and the 2D layout; ``loop.Loop`` trains,
syncs, evaluates and checkpoints it; ``metrics`` computes loss, AUC and NE. The library
(``sparse2d`` outside this package) never imports from here.
"""
