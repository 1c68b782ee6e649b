"""The feature spec: what each Parquet column means (DESIGN section 3), loaded from a data folder's
``spec.yaml``; and ``FeatureDims``, the sizes the model needs, derived from it by the data layer and
linked into the model through LightningCLI, so no number is copied into two YAML files. Plain
dataclasses, no torch; validation in ``__post_init__`` says what to change."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

# ----------------------------------------------------------------------------------------------
# Feature spec: the Parquet log contract
# ----------------------------------------------------------------------------------------------

VOCAB_DIGEST = "vocab "
"""How ``FeatureDims.encoding`` starts a vocabulary's digest (a list's or a file's)."""

OOV_ROW = 0
"""Row 0 of every id table is the reserved out-of-vocabulary (and padding) row; id ``i`` maps to
row ``i + 1``. Unknown ids are counted by the reader, never dropped."""


@dataclass
class CategoricalField:
    """One categorical column: an int id in ``[0, vocab_size)`` or a string from ``vocab``."""

    name: str
    """Parquet column name (for sequence features: a list column aligned with the item ids)."""
    vocab_size: int = 0
    """Number of known ids for an integer column; ids outside ``[0, vocab_size)`` go to the OOV row
    (negative ids are an error). Ignored when ``vocab`` is given."""
    vocab: list[str] | None = None
    """Known values of a string column, in id order; anything else goes to the OOV row."""
    vocab_file: str | None = None
    """Parquet file (relative to the spec) whose ``value`` column holds the known raw values, string
    or integer (any range), in id order; written by ``recformer data vocab`` from the train split,
    which also sets ``vocab_size``. Anything else goes to the OOV row."""
    max_values: int = 1
    """Values per row: 1, a single id; more, a list column of up to this many ids (an item side
    feature such as its genres, or a ``bags`` field); the rest of a longer list is not used, and
    counted."""

    def __post_init__(self) -> None:
        if self.max_values < 1:
            raise ValueError(f"categorical field {self.name!r}: max_values={self.max_values} must be >= 1")
        if self.vocab is not None and self.vocab_file is not None:
            raise ValueError(f"categorical field {self.name!r}: give vocab or vocab_file, not both")
        if self.vocab_file is not None and self.vocab_size <= 0:
            raise ValueError(
                f"categorical field {self.name!r}: vocab_file={self.vocab_file!r} with vocab_size="
                f"{self.vocab_size}; run `recformer data vocab DIR`, which fits the file and sets the size"
            )
        if self.vocab is not None:
            if len(set(self.vocab)) != len(self.vocab):
                raise ValueError(f"categorical field {self.name!r}: vocab has duplicate values")
            self.vocab_size = len(self.vocab)
        if self.vocab_size <= 0:
            raise ValueError(
                f"categorical field {self.name!r}: vocab_size={self.vocab_size}; give vocab_size > 0 "
                "(integer ids) or a vocab list (string values)"
            )

    @property
    def rows(self) -> int:
        """Embedding rows this field needs, OOV row included."""
        return self.vocab_size + 1


BagPooling = Literal["mean", "sum", "tokens"]


@dataclass
class BagField(CategoricalField):
    """A multi-valued categorical (a list column of ids: a user's interests, a query's terms): the
    values' embeddings pooled into one token (``mean``, ``sum``), or one token each (``tokens``)."""

    pooling: BagPooling = "mean"
    """``mean`` or ``sum`` of the values' embeddings into one token, or ``tokens``: one token per
    value (up to ``max_values``), absent values masked out of attention."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pooling not in ("mean", "sum", "tokens"):
            raise ValueError(
                f"bag field {self.name!r}: pooling={self.pooling!r}; expected mean, sum or tokens"
            )


@dataclass
class DenseField:
    """One float column, normalised as ``(f(x) - mean) / std`` with ``f`` = log1p or identity."""

    name: str
    """Parquet column name."""
    mean: float = 0.0
    """Mean of the transformed value (computed on the training split at preparation time)."""
    std: float = 1.0
    """Standard deviation of the transformed value; must be > 0."""
    log1p: bool = False
    """Apply ``sign(x) * log1p(|x|)`` before normalising (heavy-tailed counts)."""

    def __post_init__(self) -> None:
        if not self.std > 0:
            raise ValueError(f"dense field {self.name!r}: std={self.std} must be > 0")


@dataclass
class EmbeddingField:
    """A per-row fixed-size float vector column that becomes one projected token."""

    name: str
    """Parquet column name (fixed-size list or list of float)."""
    dim: int
    """Vector length; every row must have exactly this many values."""

    def __post_init__(self) -> None:
        if self.dim <= 0:
            raise ValueError(f"embedding field {self.name!r}: dim={self.dim} must be > 0")


@dataclass
class ItemSpec:
    """The item vocabulary shared by the target item and the history events."""

    column: str
    """Column of the target item id (int, ``[0, vocab_size)``; or raw values with ``vocab_file``)."""
    vocab_size: int
    """Number of item ids with an embedding row of their own (the items trained on); others go to
    the OOV row."""
    cold_items: int = 0
    """Item ids ``vocab_size .. vocab_size + cold_items - 1``: items the side table knows but the
    training split does not (new items). Their id embedding is the OOV row; their side features and
    content are their own, which is where content earns its keep."""
    vocab_file: str | None = None
    """Parquet file (relative to the spec) whose ``value`` column maps raw item ids (string or any
    integer) to ids, in id order: the trained items, then the cold ones; for the target, the
    history and the side table alike (``recformer data vocab`` writes it)."""
    side_table: str | None = None
    """Parquet file (relative to the spec file) mapping item id to content embedding and item
    features; stored once per item, looked up for history and target alike."""
    side_id_column: str = "item_id"
    """Item id column of the side table."""
    content_column: str | None = None
    """Side-table column with the item's content embedding (list of float/half)."""
    content_dim: int = 0
    """Length of the content embedding; 0 when there is none."""
    features: list[CategoricalField] = field(default_factory=list)
    """Categorical item features read from the side table (e.g. year bucket, first genre)."""

    def __post_init__(self) -> None:
        self.features = [_coerce(CategoricalField, f) for f in self.features]
        if self.vocab_size <= 0:
            raise ValueError(f"item.vocab_size={self.vocab_size} must be > 0")
        if self.cold_items < 0:
            raise ValueError(f"item.cold_items={self.cold_items} must be >= 0")
        if self.cold_items and self.side_table is None:
            raise ValueError(
                "item.cold_items needs item.side_table (cold items are known by their side rows)"
            )
        if (self.content_column is None) != (self.content_dim == 0):
            raise ValueError("item.content_column and item.content_dim must be given together")
        if (self.content_column or self.features) and self.side_table is None:
            raise ValueError("item.content_column / item.features need item.side_table")


@dataclass
class SequenceSpec:
    """User history: aligned list columns, most recent event last."""

    item_column: str
    """List column of history item ids (same vocabulary as ``item``)."""
    max_len: int = 50
    """Keep the most recent ``max_len`` events; shorter histories are left-padded and masked."""
    categorical: list[CategoricalField] = field(default_factory=list)
    """Per-event categorical list columns aligned with ``item_column`` (e.g. rating, action)."""
    time_gap_column: str | None = None
    """List column of seconds between each event and the impression (>= 0), bucketed on a log2
    scale into ``time_gap_buckets`` buckets."""
    time_gap_buckets: int = 24
    """Number of log2 time-gap buckets (bucket b covers gaps of about 2**b minutes)."""

    def __post_init__(self) -> None:
        self.categorical = [_coerce(CategoricalField, f) for f in self.categorical]
        if self.max_len <= 0:
            raise ValueError(f"sequence.max_len={self.max_len} must be > 0")
        if not 1 < self.time_gap_buckets <= 64:
            raise ValueError(f"sequence.time_gap_buckets={self.time_gap_buckets} must be in [2, 64]")


@dataclass
class FeatureSpec:
    """What every Parquet column means (DESIGN section 3)."""

    label: str
    """Label column: int/bool/float in [0, 1]."""
    item: ItemSpec
    """Target item and the shared item vocabulary."""
    weight: str | None = None
    """Optional per-sample loss weight column (float >= 0)."""
    group: str | None = None
    """Grouping key of GAUC (usually the user id); int or string."""
    keys: list[str] = field(default_factory=list)
    """Integer columns copied to predictions so scores can be joined back (e.g. user, item, time)."""
    categorical: list[CategoricalField] = field(default_factory=list)
    """Context categorical columns: one token each."""
    dense: list[DenseField] = field(default_factory=list)
    """Dense float columns: normalised, then projected into ``dense_tokens`` tokens by the model."""
    embedding: list[EmbeddingField] = field(default_factory=list)
    """Per-row vector columns: one projected token each."""
    bags: list[BagField] = field(default_factory=list)
    """Multi-valued categorical list columns: pooled into one token each, or a token per value."""
    sequence: SequenceSpec | None = None
    """User history; ``None`` for a model without history."""
    unused: dict[str, str] = field(default_factory=dict)
    """Columns the logs carry that no role above reads, each with what it holds, so the spec
    describes every column (e.g. the raw rating a label was made from, which must never be a
    feature). The loader never reads them."""
    path: str | None = None
    """Where the spec was loaded from (set by ``load``; side-table paths are relative to it)."""

    def __post_init__(self) -> None:
        self.item = _coerce(ItemSpec, self.item)
        self.categorical = [_coerce(CategoricalField, f) for f in self.categorical]
        self.dense = [_coerce(DenseField, f) for f in self.dense]
        self.embedding = [_coerce(EmbeddingField, f) for f in self.embedding]
        self.bags = [_coerce(BagField, f) for f in self.bags]
        if self.sequence is not None:
            self.sequence = _coerce(SequenceSpec, self.sequence)
        events = self.sequence.categorical if self.sequence is not None else []
        lists = [f.name for f in [*self.categorical, *events] if f.max_values != 1]
        if lists:
            raise ValueError(
                f"categorical fields {lists} have max_values != 1: a context list column is a bag "
                "(list it under bags); an event categorical is one id per event"
            )
        names = self.columns()
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"feature spec names these columns more than once: {dup}")
        if not isinstance(self.unused, dict):
            raise ValueError(
                f"unused must map column names to descriptions, found {type(self.unused).__name__}"
            )
        both = sorted(set(self.unused) & set(names))
        if both:
            raise ValueError(f"feature spec lists these columns as unused and also gives them a role: {both}")

    # -- derived -------------------------------------------------------------------------------
    def columns(self) -> list[str]:
        """Every column of the log files that the spec names (side table excluded)."""
        cols = [self.label, self.item.column]
        cols += [c for c in (self.weight, self.group) if c is not None]
        cols += [k for k in self.keys if k not in cols]
        # The GAUC group may also be a categorical feature (user id as both): one column, read once.
        cols += [f.name for f in self.categorical if f.name != self.group] + [f.name for f in self.dense]
        cols += [f.name for f in self.embedding] + [f.name for f in self.bags]
        if self.sequence is not None:
            s = self.sequence
            cols += [s.item_column] + [f.name for f in s.categorical]
            cols += [s.time_gap_column] if s.time_gap_column else []
        return cols

    def side_table_path(self) -> Path | None:
        if self.item.side_table is None:
            return None
        base = Path(self.path).parent if self.path else Path(".")
        return base / self.item.side_table

    def dims(self) -> FeatureDims:
        s = self.sequence
        return FeatureDims(
            cat_rows=[f.rows for f in self.categorical],
            n_dense=len(self.dense),
            emb_dims=[f.dim for f in self.embedding],
            item_rows=self.item.vocab_size + 1,
            item_side_rows=self.item.vocab_size + self.item.cold_items + 1,
            content_dim=self.item.content_dim,
            item_feat_rows=[f.rows for f in self.item.features],
            max_len=s.max_len if s else 0,
            hist_cat_rows=[f.rows for f in s.categorical] if s else [],
            time_gap_buckets=(s.time_gap_buckets + 1) if s and s.time_gap_column else 0,
            item_feat_values=[f.max_values for f in self.item.features],
            bag_rows=[f.rows for f in self.bags],
            bag_values=[f.max_values for f in self.bags],
            bag_pooling=[f.pooling for f in self.bags],
            columns=self.model_inputs(),
            encoding=self.encoding(),
        )

    def model_inputs(self) -> dict[str, list[str]]:
        """The columns behind each input of the model, in the model's order (``FeatureDims.columns``)."""
        s = self.sequence
        history = [s.item_column, *(f.name for f in s.categorical)] if s else []
        history += [s.time_gap_column] if s and s.time_gap_column else []
        return {
            "item": [self.item.column],
            "categorical": [f.name for f in self.categorical],
            "dense": [f.name for f in self.dense],
            "embedding": [f.name for f in self.embedding],
            "item_features": [f.name for f in self.item.features],
            "history": history,
            "bags": [f.name for f in self.bags],
        }

    def encoding(self) -> dict[str, str]:
        """How values become model inputs where a size does not say it: each dense column's
        normalisation and each string vocabulary's order (a digest), by column."""
        out = {f.name: f"mean={f.mean:.6g} std={f.std:.6g} log1p={f.log1p}" for f in self.dense}
        events = self.sequence.categorical if self.sequence else []
        for f in [*self.categorical, *self.item.features, *events, *self.bags]:
            if f.vocab is not None:
                text = "\n".join(str(v) for v in f.vocab)
                out[f.name] = VOCAB_DIGEST + hashlib.sha1(text.encode()).hexdigest()[:12]
        return out

    # -- YAML ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> FeatureSpec:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"feature spec {path} does not exist")
        try:
            with open(path) as fh:
                raw = yaml.safe_load(fh)
        except yaml.YAMLError as e:  # bad syntax, or a tag such as !!python/object (never loaded)
            mark = getattr(e, "problem_mark", None)
            at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ValueError(f"feature spec {path}: not a plain YAML mapping{at}: {problem}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"feature spec {path}: expected a YAML mapping, found {type(raw).__name__}")
        known = {f.name for f in fields(cls)} - {"path"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"feature spec {path}: unknown keys {unknown}; known keys are {sorted(known)}")
        try:
            spec = cls(**raw)
        except TypeError as e:  # a missing top-level key
            raise ValueError(f"feature spec {path}: {e}") from None
        except ValueError as e:
            raise ValueError(f"feature spec {path}: {e}") from None
        spec.path = str(path)
        return spec

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path")
        return d

    def save(self, path: str | Path) -> None:
        with open(path, "w") as fh:
            yaml.safe_dump(self.to_dict(), fh, sort_keys=False, width=100)


@dataclass
class FeatureDims:
    """Sizes the model's embedding tables and projections need; derived from a FeatureSpec."""

    cat_rows: list[int] = field(default_factory=list)
    """Rows per context categorical field (OOV row included)."""
    n_dense: int = 0
    """Number of dense features."""
    emb_dims: list[int] = field(default_factory=list)
    """Length of each per-row embedding column."""
    item_rows: int = 1
    """Rows of the item embedding table (OOV row included)."""
    item_side_rows: int = 0
    """Rows of the item side buffers (content, features): the embedded items, the cold ones and the
    OOV row; 0 in checkpoints from before cold items, meaning ``item_rows``."""
    content_dim: int = 0
    """Length of the item content embedding (0 = none)."""
    item_feat_rows: list[int] = field(default_factory=list)
    """Rows per item side feature (OOV row included)."""
    max_len: int = 0
    """History length (0 = no history)."""
    hist_cat_rows: list[int] = field(default_factory=list)
    """Rows per per-event categorical field (OOV/pad row included)."""
    time_gap_buckets: int = 0
    """Rows of the time-gap bucket table (pad row included); 0 = no time gaps."""
    item_feat_values: list[int] = field(default_factory=list)
    """Values per item side feature (1 = one id; more = a list, pooled into the item token)."""
    bag_rows: list[int] = field(default_factory=list)
    """Rows per bag field (OOV row included)."""
    bag_values: list[int] = field(default_factory=list)
    """Values kept per bag field (``max_values``)."""
    bag_pooling: list[str] = field(default_factory=list)
    """How each bag field becomes tokens (``BagField.pooling``)."""
    columns: dict[str, list[str]] = field(default_factory=dict)
    """The spec columns behind each input, in order (``FeatureSpec.model_inputs``): a checkpoint
    refuses data whose columns differ even where the sizes agree. Empty in checkpoints written
    before it was kept; only sizes are compared then."""
    encoding: dict[str, str] = field(default_factory=dict)
    """Dense normalisation and string-vocabulary digests by column (``FeatureSpec.encoding``): another
    vocabulary is refused (``mismatch``), another normalisation warned of (``encoding_changes``)."""

    def __post_init__(self) -> None:
        if not self.item_feat_values:  # checkpoints from before it was kept: one id per feature
            self.item_feat_values = [1] * len(self.item_feat_rows)
        self.item_side_rows = self.item_side_rows or self.item_rows

    def mismatch(self, ckpt: FeatureDims, mine: str = "data", theirs: str = "checkpoint") -> str | None:
        """What makes data of these dims unfit for a model built with ``ckpt``'s, or None."""
        diff = [
            f"{k}: {mine} {self.columns.get(k, [])} vs {theirs} {ckpt.columns.get(k, [])}"
            for k in sorted(set(self.columns) | set(ckpt.columns))
            if self.columns.get(k, []) != ckpt.columns.get(k, [])  # an input added since: [] in old ones
        ]
        if self.columns and ckpt.columns and diff:
            return "other columns feed the model (" + "; ".join(diff) + ")"
        # A string vocabulary in another order maps every value to another embedding row.
        vocabs = self._encoding_diffs(ckpt, mine, theirs, vocab=True)
        if vocabs:
            return (
                "other string vocabularies, whose values would read other embedding rows ("
                + "; ".join(vocabs)
                + ")"
            )
        ours, other = asdict(self), asdict(ckpt)
        sizes = [k for k in ours if k not in ("columns", "encoding") and ours[k] != other[k]]
        if sizes:
            said = "; ".join(f"{k}: {mine} {ours[k]} vs {theirs} {other[k]}" for k in sizes)
            return f"other sizes ({said})"
        return None

    def encoding_changes(
        self, ckpt: FeatureDims, mine: str = "data", theirs: str = "checkpoint"
    ) -> list[str]:
        """Dense columns whose values reach the model normalised otherwise than in training."""
        return self._encoding_diffs(ckpt, mine, theirs, vocab=False)

    def _encoding_diffs(self, ckpt: FeatureDims, mine: str, theirs: str, vocab: bool) -> list[str]:
        """Columns encoded in both whose encodings differ: string vocabularies or the others."""
        both = sorted(set(self.encoding) & set(ckpt.encoding))
        return [
            f"{k}: {mine} {self.encoding[k]} vs {theirs} {ckpt.encoding[k]}"
            for k in both
            if self.encoding[k] != ckpt.encoding[k] and ckpt.encoding[k].startswith(VOCAB_DIGEST) == vocab
        ]


def _coerce(cls: type, value: Any) -> Any:
    """Build a dataclass from a YAML mapping, naming the unknown keys if any."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping for {cls.__name__}, found {value!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {unknown}; known keys are {sorted(known)}")
    return cls(**value)
