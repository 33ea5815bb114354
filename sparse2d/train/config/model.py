"""The ``model`` section of the trainer config: DLRM architecture and embedding tables."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from sparse2d.train.config.io import bad, positive

SHARDING_TYPES = (
    "table_wise",
    "column_wise",
    "table_column_wise",
    "row_wise",
    "table_row_wise",
    "grid_shard",
)


# ---------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class TableConfig:
    """One embedding table (or ``count`` alike tables)."""

    name: str
    """Table name, unique. With ``count`` > 1 a prefix: tables ``NAME_0 .. NAME_{count-1}``."""
    rows: int | list[int]
    """Rows (hash size). With ``count`` > 1, a list gives one value per table."""
    dim: int
    """Embedding dimension. DLRM needs all tables to share it, equal to ``model.dense_arch[-1]``."""
    features: list[str] = field(default_factory=list)
    """Features looked up in this table (default ``[name]``); with ``count`` > 1 each gets ``_i``."""
    pooling: Literal["sum", "mean"] = "sum"
    """How a bag of ids is pooled."""
    count: int = 1
    """Expand into this many tables (e.g. the 26 Criteo tables from one entry)."""
    sharding: Literal[SHARDING_TYPES] | None = None  # type: ignore[valid-type]
    """Force one sharding type inside the group (``table_wise``, ``row_wise``, ...); null: planner picks."""

    def __post_init__(self) -> None:
        positive(self, "dim", "count")
        rows = self.rows if isinstance(self.rows, list) else [self.rows]
        if isinstance(self.rows, list) and len(self.rows) != self.count:
            raise bad("rows", self.rows, f"has {len(self.rows)} entries but count={self.count}")
        if any(r <= 0 for r in rows):
            raise bad("rows", self.rows, "must be > 0")

    def expand(self) -> list[TableSpec]:
        features = self.features or [self.name]
        if self.count == 1:
            rows = self.rows[0] if isinstance(self.rows, list) else self.rows
            return [
                TableSpec(self.name, rows, self.dim, list(features), self.pooling, self.sharding)
            ]
        rows = self.rows if isinstance(self.rows, list) else [self.rows] * self.count
        return [
            TableSpec(
                f"{self.name}_{i}",
                rows[i],
                self.dim,
                [f"{f}_{i}" for f in features],
                self.pooling,
                self.sharding,
            )
            for i in range(self.count)
        ]


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One concrete table after ``count`` expansion."""

    name: str
    rows: int
    dim: int
    features: list[str]
    pooling: str
    sharding: str | None


@dataclass(kw_only=True, slots=True)
class ManagedCollisionConfig:
    """TorchRec managed collision (MCH or MP-ZCH) in front of every table."""

    enabled: bool = False
    """Remap raw ids to rows by an identity table that evolves with the data (MC-EBC); the
    tables are then row-wise (TorchRec's MC sharders offer nothing else)."""
    raw_id_factor: int = 10
    """Raw id space of each table, in multiples of its rows (synthetic data draws from it)."""
    kind: Literal["mch", "zch"] = "mch"
    """``mch``: ``MCHManagedCollisionModule`` (sorted identity table, LFU/LRU eviction);
    ``zch``: ``HashZchManagedCollisionModule`` (TorchRec's MP-ZCH: hashed probe windows,
    TTL metadata)."""
    eviction: Literal["lfu", "lru", "distance_lfu"] = "lfu"
    """Eviction policy of the identity tables (``mch`` only)."""
    eviction_interval: int = 1
    """Steps between the identity tables' insert/evict rounds (``mch`` only)."""
    max_probe: int = 128
    """Probe window of each id (``zch`` only; TorchRec's default)."""
    ttl_hours: int = 1
    """Hours an unseen id keeps its slot before a new id may take it (``zch`` only)."""

    def __post_init__(self) -> None:
        positive(self, "raw_id_factor", "eviction_interval", "max_probe", "ttl_hours")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """TorchRec's DLRM over one ``EmbeddingBagCollection``."""

    arch: Literal["dlrm", "dlrm_dcn"] = "dlrm"
    """``dlrm`` (dot interactions) or ``dlrm_dcn`` (low-rank DCN cross network)."""
    tables: list[TableConfig] = field(default_factory=list)
    """Embedding tables; see the ``model.tables[]`` section."""
    dense_in_features: int = 13
    """Dense input features per sample (Criteo has 13)."""
    dense_arch: list[int] = field(default_factory=lambda: [512, 256, 64])
    """Bottom MLP layer sizes; the last must equal the tables' ``dim``."""
    over_arch: list[int] = field(default_factory=lambda: [512, 512, 256, 1])
    """Top MLP layer sizes; the last must be 1 (one logit)."""
    dcn_num_layers: int = 3
    """Cross layers (``dlrm_dcn`` only)."""
    dcn_low_rank_dim: int = 512
    """Low-rank dimension of each cross layer (``dlrm_dcn`` only)."""
    init_seed: int = 0
    """Seed of the dense layers' and tables' initialization (same on every rank)."""
    managed_collision: ManagedCollisionConfig = field(default_factory=ManagedCollisionConfig)
    """Managed collision in front of the tables (see ``docs/managed_collision.md``)."""

    def __post_init__(self) -> None:
        if not self.tables:
            raise bad("tables", self.tables, "must list at least one table")
        positive(self, "dense_in_features", "dcn_num_layers", "dcn_low_rank_dim")
        for key in ("dense_arch", "over_arch"):
            sizes = getattr(self, key)
            if not sizes or any(s <= 0 for s in sizes):
                raise bad(key, sizes, "must be a non-empty list of positive layer sizes")
        if self.over_arch[-1] != 1:
            raise bad("over_arch", self.over_arch, "must end in 1 (one logit per sample)")
        specs = self.specs()
        names, features = [t.name for t in specs], [f for t in specs for f in t.features]
        for label, items in (("table name", names), ("feature", features)):
            dup = sorted({x for x in items if items.count(x) > 1})
            if dup:
                raise bad("tables", dup, f"repeat a {label}; each must be unique")
        dims = sorted({t.dim for t in specs})
        if len(dims) > 1:
            raise bad("tables", dims, "mix embedding dims; DLRM needs one dim for all tables")
        if self.dense_arch[-1] != dims[0]:
            raise bad(
                "dense_arch",
                self.dense_arch,
                f"must end in the tables' dim {dims[0]} (DLRM interacts them by dot product)",
            )

    def specs(self) -> list[TableSpec]:
        return [spec for table in self.tables for spec in table.expand()]

    def data_specs(self) -> list[TableSpec]:
        """The tables as the data sees them: raw id spaces ``raw_id_factor`` times the rows
        when managed collision is on."""
        mc = self.managed_collision
        if not mc.enabled:
            return self.specs()
        return [replace(t, rows=t.rows * mc.raw_id_factor) for t in self.specs()]

    @property
    def feature_names(self) -> list[str]:
        return [f for t in self.specs() for f in t.features]
