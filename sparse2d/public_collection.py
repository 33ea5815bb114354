"""The public ``sparse2d.DMPCollection``: the core model, with ``sharding_group_size="auto"``.

``"auto"`` is the cost model's pick (``sparse2d.pick_group_size``, in
``sparse2d.advisor.auto_pick``), made here, above the core, in step 2 of the core's
construction line (``_choose_group_size``, between validate and layout): the core
(``sparse2d.core.collection``) never imports the advisor. Everything else is the core class's
(its docstring lists the arguments), and an instance is still TorchRec's ``DMPCollection``
(its train pipelines sync it).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from sparse2d.advisor.auto_pick import AUTO, choose_group_size, refuse_retired
from sparse2d.core import collection as core
from sparse2d.core.collection_setup import Setup


class DMPCollection(core.DMPCollection):
    """TorchRec's ``DMPCollection`` over groups of ``sharding_group_size`` ranks, replicated.

    The arguments are ``sparse2d.core.collection.DMPCollection``'s (both call forms), and:

    Args:
        sharding_group_size: ranks per sharding group ``L``, a divisor of the world size; or
            ``"auto"``: the group-size advisor's cost model picks (``sparse2d plan`` shows
            its table; rank 0 logs the pick and the predicted step per ``L``).
    """

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        refuse_retired(kwargs)  # auto_options: before anything else
        super().__init__(module, *args, **kwargs)

    def _choose_group_size(self, module: nn.Module, setup: Setup) -> int:
        """Step 2's ``L``: for ``"auto"`` the cost model's pick (``pick_group_size``); else
        the call's."""
        if setup.sharding_group_size != AUTO:
            return super()._choose_group_size(module, setup)
        return choose_group_size(module, setup)
