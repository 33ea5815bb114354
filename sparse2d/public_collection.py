"""The public ``sparse2d.DMPCollection``: the core model, with ``sharding_group_size="auto"``.

``"auto"`` is the advisor's choice (``sparse2d.pick_group_size``: the cost model's pick and
shortlist, then a short trial of the embedding part, ``sparse2d.advisor.embedding_trial``),
made here, above the core, in step 2 of the core's construction line (``_choose_group_size``,
between validate and layout): the core (``sparse2d.core.collection``) never imports the
advisor, and the advisor's trials build core models with an ``int``. Everything else is the core class's (its docstring lists the arguments), and an
instance is still TorchRec's ``DMPCollection`` (its train pipelines sync it).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from sparse2d.advisor.auto_pick import AUTO
from sparse2d.advisor.embedding_trial import check_auto_options, choose_group_size
from sparse2d.advisor.trial import TrialReport
from sparse2d.core import collection as core
from sparse2d.core.call_forms import parse_call
from sparse2d.core.collection_setup import Setup


class DMPCollection(core.DMPCollection):
    """TorchRec's ``DMPCollection`` over groups of ``sharding_group_size`` ranks, replicated.

    The arguments are ``sparse2d.core.collection.DMPCollection``'s (both call forms), and:

    Args:
        sharding_group_size: ranks per sharding group ``L``, a divisor of the world size; or
            ``"auto"``: the group-size advisor picks (``sparse2d plan`` shows its table) and
            times its shortlist on the module's embedding part (``model.trial_report``).
        auto_options: ``TrialOptions`` of the ``"auto"`` trial (``candidates=0``: the
            model's pick, no trial); refused beside an explicit ``L``.

    ``model.trial_report`` (``TrialReport``): for ``"auto"``, how ``L`` was chosen
    (``method`` ``"measured"`` or ``"model"``, each candidate's step); ``None`` otherwise.
    """

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        options = kwargs.pop("auto_options", None)
        if options is not None:  # refused beside an explicit L, before anything else
            check_auto_options(options, parse_call(args, kwargs).sharding_group_size)
        self._auto_options = check_auto_options(options)
        self.trial_report: TrialReport | None = None
        super().__init__(module, *args, **kwargs)

    def _choose_group_size(self, module: nn.Module, setup: Setup) -> int:
        """Step 2's ``L``: for ``"auto"`` the advisor's choice (``pick_group_size``: advice,
        then the trial building core models), kept in ``trial_report``; else the call's."""
        if setup.sharding_group_size != AUTO:
            return super()._choose_group_size(module, setup)
        self.trial_report = choose_group_size(module, setup, self._auto_options, core.DMPCollection)
        return self.trial_report.chosen
