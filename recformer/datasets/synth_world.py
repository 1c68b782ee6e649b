"""The latent world behind ``recformer data synth`` and the rows it draws (``synth.py`` writes them).

Generative model
----------------
The point is a dataset where model capacity matters in a controlled way: ``--factors`` (K),
``--order`` and ``--noise`` set how much a bigger ranker can gain over a small one.

The world (seeded, built once; memory grows with --users and --items, never with --rows):

- Items have Zipf popularity (exponent ``ZIPF_EXPONENT`` = 1.1) over a random permutation of ids, and
  a cluster (``n_clusters(items)`` balanced clusters, written as ``item_cluster``).
- Latent factors: users ``u`` (U x K), items ``v = sqrt(0.6) * centre[cluster] + sqrt(0.4) * noise``
  (I x K), entries scaled by K**-1/4 so that ``<u, v>`` has unit variance whatever K is.
- Each user has favourite clusters: the ``TOP_CLUSTERS`` clusters with the highest
  ``<u, centre>``; a user's segment (``user_segment``) is the argmax of ``u`` through a random
  K x 8 map, a preferred device, and an activity level (log-normal events per day,
  ``user_activity``) that sets how often the user is sampled and how long their history is.
- Content embeddings carry the item factors through noise, so a model can recover ``v`` from them:
  ``content = v @ P_v + 0.5 * P_c[cluster] + 0.5 * noise`` with random projections ``P_v`` (K x D)
  and ``P_c`` (clusters x D), i.e. ``[v, one_hot(cluster)] @ P + noise``; stored as float16.

Each impression (row), fully vectorised per chunk:

- user: drawn in proportion to activity; timestamp: evenly spread over the split's time window
  (train spans ``TRAIN_SPAN_S`` seconds, val and test follow at the same rate); ``hour`` from the
  timestamp, ``device`` the user's preferred one 70 % of the time.
- history: length log-normal around max_len / 2, scaled by activity, clipped to [0, --max-len]
  (3 % cold-start rows have none). Each event is a *taste* draw with probability ``P_TASTE``
  (one of the user's favourite clusters, weighted ``TOP_CLUSTER_WEIGHTS``, then an item of that
  cluster by within-cluster Zipf popularity) or else a *popularity* draw (global Zipf), so histories
  reveal ``u``. Favourite-cluster draws stand in for "items with high <u, v>" without a U x I
  product. The action (0=view, 1=click, 2=like) is likelier to be a click or like for taste events,
  and more so for the user's top cluster; gaps (whole seconds before the impression) are a reversed
  cumulative sum of exponential inter-event times with the user's mean gap (most recent event
  last, smallest gap).
- dense features: ``user_activity`` (events per day) and ``item_age`` (days since the item's
  release; every item is released before the train window, so items age through val and test and
  their positive rate sits about one point below train's).
- target item: a taste draw with probability ``P_TARGET_TASTE``, else a popularity draw.
- label ~ Bernoulli(sigmoid(logit)), with

      logit = bias + user_bias + item_bias (popularity) + item-age effect
              + hour, device and segment effects                          (every order)
              + W_DOT * <u, v_t> + W_HIST * target_attention(v_t, history) (order >= 2)
              + W_TRIPLE * sum_k u_k v_k c_k                              (order >= 3)
              + W_QUAD * sqrt(K) * sum_k p_a(k) p_b(k), p = u * v_t        (order 4)
              + --noise * N(0, 1)

  ``target_attention`` is DIN-style target attention (Zhou et al. 2018, "Deep Interest Network"):
  over the ``HIST_ATTN_EVENTS`` most recent events, softmax over ``HIST_ATTN_BETA * cos(v_t, v_h) +
  log(action weight) - gap / HIST_RECENCY_S`` of the cosine similarities, so clicked, liked and
  recent items count most and the nonlinearity needs more than a dot product to fit. ``c`` is a
  context vector of (hour, device); ``p_a(k) = p[pi(k)]`` and ``p_b(k) = p[pi(k - 1)]`` for a random
  cyclic order ``pi`` of the factor dims, so order 4 is a sum of K degree-4 products. ``bias`` is
  solved by bisection on a seeded calibration sample so that the positive rate is
  ``TARGET_POSITIVE_RATE`` (0.4).

At order 1 only biases and context matter and a small model saturates; at order 3-4, with many
factors and low noise, the label needs three- and four-way interactions and capacity pays.
``bench/complexity.py`` measures it (200k rows, K=16, noise 0.5; one config at width 64 against 16):
the wider ranker gains AUC +0.0033 [+0.0017, +0.0050] at order 1 and +0.0473 [+0.0419, +0.0527]
at order 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from recformer.data.schema import required

# Constants of the generative model (documented in the module docstring).
CHUNK_ROWS = 16384
"""Rows generated per chunk; each chunk has its own seeded generator."""
ZIPF_EXPONENT = 1.1
TARGET_POSITIVE_RATE = 0.4
CALIBRATION_ROWS = 16384
N_HOURS, N_DEVICES, N_SEGMENTS, N_ACTIONS = 24, 4, 8, 3
TOP_CLUSTERS = 4
TOP_CLUSTER_WEIGHTS = np.array([0.4, 0.3, 0.2, 0.1])
P_TASTE = 0.7
P_TARGET_TASTE = 0.5
P_PREFERRED_DEVICE = 0.7
P_COLD_START = 0.03
# Action probabilities (view, click, like) per event source: taste draws from the user's 1st..4th
# favourite cluster, then popularity draws (last row). Engagement follows affinity.
ACTION_PROBS = np.array(
    [[0.35, 0.40, 0.25], [0.45, 0.37, 0.18], [0.55, 0.32, 0.13], [0.65, 0.27, 0.08], [0.80, 0.16, 0.04]]
)
ACTION_WEIGHTS = np.array([0.3, 0.7, 1.0], dtype=np.float32)
"""How much a viewed / clicked / liked history event counts in the target attention."""
HIST_ATTN_EVENTS = 20
HIST_ATTN_BETA = np.float32(4.0)
HIST_RECENCY_S = np.float32(2 * 86400.0)
ATTN_BLOCK_ROWS = 8192
W_DOT, W_HIST, W_TRIPLE, W_QUAD = 1.0, 1.5, 0.8, 0.8
TRAIN_START_S = 1_700_006_400  # 2023-11-15 00:00 UTC
TRAIN_SPAN_S = 28 * 86400
MEAN_ITEM_AGE_DAYS = 180.0
MEDIAN_ACTIVITY = 20.0
"""Median user activity, events per day (log-normal, sigma 1)."""
CONTENT_CLUSTER_SCALE, CONTENT_NOISE = 0.5, 0.5

# Generator streams: (seed, stream, index) seeds one numpy generator.
_WORLD, _CALIBRATION, _ITEMS_TABLE = 0, 4, 5
_SPLIT_STREAM = {"train": 1, "val": 2, "test": 3}

SCHEMA = required(
    pa.schema(
        [
            ("user_id", pa.int64()),
            ("item_id", pa.int32()),
            ("timestamp", pa.int64()),
            ("label", pa.int8()),
            ("hour", pa.int8()),
            ("device", pa.int8()),
            ("user_segment", pa.int8()),
            ("user_activity", pa.float32()),
            ("item_age", pa.float32()),
            ("hist_item_ids", pa.list_(pa.int32())),
            ("hist_actions", pa.list_(pa.int8())),
            ("hist_gaps", pa.list_(pa.float32())),
        ]
    )
)
COMPRESSIONS = ("zstd", "lz4", "snappy", "none")
"""Codecs ``--compression`` takes (the pyarrow wheels ship all four)."""
DENSE_COLUMNS = ("user_activity", "item_age")
"""Dense columns, both heavy-tailed, normalised after log1p."""


def n_clusters(items: int) -> int:
    """Number of item clusters: about sqrt(items) / 4, between 2 and 256 (never more than items)."""
    return int(min(items, max(2, min(256, round(math.sqrt(items) / 4)))))


def _rng(seed: int, stream: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream, index)))


def _zipf_rank(u: np.ndarray, scale: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Zipf ranks in [0, n) from float32 uniforms ``u``: the inverse CDF of the continuous power law
    x**-s on [1, n + 1), floored; O(1) per draw, unlike a search in a CDF table.
    ``scale`` = (n + 1)**(1 - s) - 1, precomputed per population (``_zipf_scale``)."""
    x = np.exp(np.log1p(u * scale) * np.float32(1.0 / (1.0 - ZIPF_EXPONENT)))
    return np.minimum(x.astype(np.intp) - 1, n - 1)


def _zipf_scale(n: np.ndarray) -> np.ndarray:
    return ((n.astype(np.float64) + 1.0) ** (1.0 - ZIPF_EXPONENT) - 1.0).astype(np.float32)


@dataclass
class SynthParams:
    """Everything that determines the generated files (with the seed)."""

    rows: int
    """Training rows."""
    val_rows: int | None = None
    """Validation rows; None = rows // 10. 0 writes no val split."""
    test_rows: int | None = None
    """Test rows; None = rows // 10. 0 writes no test split."""
    seed: int = 0
    """Seed of every random draw."""
    users: int = 100_000
    """Number of users (user_id in [0, users))."""
    items: int = 20_000
    """Number of items (item_id in [0, items))."""
    max_len: int = 100
    """Longest history per row (histories vary in length from 0 to max_len)."""
    factors: int = 16
    """Latent factor dimension K of users and items."""
    order: int = 2
    """Highest interaction order in the label logit: 1 biases only, 2 adds <u, v> and target
    attention over the history, 3 adds a context-modulated 3-way term, 4 adds a 4-way term."""
    noise: float = 1.0
    """Standard deviation of the Gaussian noise added to the logit."""
    content_dim: int = 64
    """Length of the item content embedding."""
    rows_per_file: int = 1_000_000
    """Rows per Parquet file (the last file of a split is shorter)."""
    row_group_size: int = 16384
    """Rows per Parquet row group (the last one of a file is shorter)."""
    compression: str = "zstd"
    """Codec of the log files (``COMPRESSIONS``): zstd for the smallest files, lz4 for the fastest
    read (see the module docstring)."""
    split_rows: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        positive = {
            "--rows": self.rows,
            "--users": self.users,
            "--max-len": self.max_len,
            "--factors": self.factors,
            "--content-dim": self.content_dim,
            "--rows-per-file": self.rows_per_file,
            "--row-group-size": self.row_group_size,
        }
        for flag, value in positive.items():
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{flag}={value!r}: expected an integer > 0")
        if self.items < 2:
            raise ValueError(f"--items={self.items}: expected at least 2 items")
        if self.items >= 2**31:
            raise ValueError(f"--items={self.items}: item ids are int32; expected fewer than 2**31 items")
        self.val_rows = self.rows // 10 if self.val_rows is None else self.val_rows
        self.test_rows = self.rows // 10 if self.test_rows is None else self.test_rows
        for flag, value in (("--val-rows", self.val_rows), ("--test-rows", self.test_rows)):
            if value < 0:
                raise ValueError(f"{flag}={value}: expected an integer >= 0 (0 writes no such split)")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"--compression={self.compression!r}: expected one of {', '.join(COMPRESSIONS)}")
        if self.order not in (1, 2, 3, 4):
            raise ValueError(f"--order={self.order}: expected 1, 2, 3 or 4")
        if not (self.noise >= 0 and math.isfinite(self.noise)):
            raise ValueError(f"--noise={self.noise}: expected a finite number >= 0")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"--seed={self.seed}: expected an integer in [0, 2**63)")
        self.split_rows = {"train": self.rows, "val": self.val_rows, "test": self.test_rows}


@dataclass
class Chunk:
    """One generated chunk: the Arrow table plus what the writer accumulates."""

    table: pa.Table
    positives: int
    dense_sum: np.ndarray
    """Per dense column: [sum, sum of squares] of log1p(value), float64."""


@dataclass
class _History:
    """The history events of one chunk, flat: row ``i`` owns events ``offsets[i]:offsets[i + 1]``,
    oldest first."""

    length: np.ndarray
    """Events per row, int64."""
    offsets: np.ndarray
    """Row starts in the flat arrays, int64, one more than rows."""
    item: np.ndarray
    """Item id of each event, int32."""
    action: np.ndarray
    """0 view, 1 click, 2 like, int8."""
    gap: np.ndarray
    """Whole seconds from the event to the impression, float32."""


class SynthWorld:
    """The seeded latent model (users, items, context), independent of the number of rows.

    ``SynthWorld(params)`` is deterministic: tests rebuild it to recompute ``<u, v>`` of written rows.
    """

    def __init__(self, params: SynthParams):
        self.p = params
        self.n_clusters = n_clusters(params.items)
        self.top = min(TOP_CLUSTERS, self.n_clusters)
        # K**-1/4 per entry: <u, v> has unit variance for any K.
        scale = params.factors**-0.25
        centres = self._init_items(scale)
        self._init_users(scale, centres)
        self._init_context()
        self._init_timeline()
        self.bias = 0.0
        self.bias = self._calibrate()

    def _init_items(self, scale: float) -> np.ndarray:
        """Item popularity, clusters, factors, draw populations and release times, from the world's
        item stream; returns the cluster centres (clusters x K) the users' tastes are measured on."""
        p, k, c = self.p, self.p.factors, self.n_clusters
        rng = _rng(p.seed, _WORLD, 0)
        self.pop_order = rng.permutation(p.items).astype(np.int32)
        """Item id of each popularity rank (rank 0 = most popular)."""
        rank = np.empty(p.items, dtype=np.int64)
        rank[self.pop_order] = np.arange(p.items)
        self.cluster = (rng.permutation(p.items) % c).astype(np.int16)
        centres = rng.standard_normal((c, k)).astype(np.float32)
        noise = rng.standard_normal((p.items, k)).astype(np.float32)
        self.v = (scale * (np.sqrt(0.6) * centres[self.cluster] + np.sqrt(0.4) * noise)).astype(np.float32)
        self.v_unit = self.v / np.linalg.norm(self.v, axis=1, keepdims=True).clip(1e-6)
        # Items of each cluster, most popular first, as one flat array with per-cluster offsets.
        by_cluster = np.lexsort((rank, self.cluster)).astype(np.int32)
        sizes = np.bincount(self.cluster, minlength=c)
        # Populations to draw from: clusters 0..c-1 (their items, most popular first) and c = all items
        # by popularity; one flat id array with per-population start, size and Zipf scale.
        self.pop_items = np.concatenate([by_cluster, self.pop_order])
        self.pop_size = np.append(sizes, p.items).astype(np.intp)
        self.pop_start = np.concatenate([[0], np.cumsum(self.pop_size)[:-1]]).astype(np.intp)
        self.pop_scale = _zipf_scale(self.pop_size)
        log_pop = -np.log1p(rank).astype(np.float32)
        self.item_bias = (0.3 * (log_pop - log_pop.mean()) / max(float(log_pop.std()), 1e-6)).astype(
            np.float32
        )
        self.item_release = (
            TRAIN_START_S - rng.exponential(MEAN_ITEM_AGE_DAYS * 86400, p.items) - 3600
        ).astype(np.int64)
        return centres

    def _init_users(self, scale: float, centres: np.ndarray) -> None:
        """User factors, activity, preferred device, bias, segment and favourite clusters, from the
        world's user stream."""
        p, k = self.p, self.p.factors
        rng = _rng(p.seed, _WORLD, 1)
        self.u = (scale * rng.standard_normal((p.users, k))).astype(np.float32)
        self.activity_z = rng.standard_normal(p.users).astype(np.float32)
        self.activity = np.exp(np.log(MEDIAN_ACTIVITY) + self.activity_z).astype(np.float32)
        """Events per day, log-normal."""
        cdf = np.cumsum(self.activity, dtype=np.float64)
        self.user_cdf = cdf / cdf[-1]
        self.user_cdf[-1] = 1.0
        self.mean_gap = (86400.0 / self.activity).astype(np.float32)
        self.device = rng.integers(0, N_DEVICES, p.users).astype(np.int8)
        self.user_bias = (0.3 * self.activity_z + rng.normal(0, 0.3, p.users)).astype(np.float32)
        segment_map = rng.standard_normal((k, N_SEGMENTS)).astype(np.float32)
        self._init_tastes(segment_map, centres)

    def _init_tastes(self, segment_map: np.ndarray, centres: np.ndarray) -> None:
        """Each user's segment (argmax of ``u`` through ``segment_map``) and ``top`` favourite clusters
        (highest ``<u, centre>`` first)."""
        users = self.p.users
        self.segment = np.empty(users, dtype=np.int8)
        self.top_clusters = np.empty((users, self.top), dtype=np.int16)
        for a in range(0, users, CHUNK_ROWS):  # blocks keep the U x clusters product small
            ub = self.u[a : a + CHUNK_ROWS]
            self.segment[a : a + len(ub)] = np.argmax(ub @ segment_map, axis=1)
            aff = ub @ centres.T
            top = np.argpartition(-aff, self.top - 1, axis=1)[:, : self.top]
            order = np.argsort(-np.take_along_axis(aff, top, axis=1), axis=1)
            self.top_clusters[a : a + len(ub)] = np.take_along_axis(top, order, axis=1)

    def _init_context(self) -> None:
        """Hour, device and segment effects, the context vectors of the order-3 term, the factor
        pairing of the order-4 term and the action thresholds, from the world's context stream."""
        k = self.p.factors
        rng = _rng(self.p.seed, _WORLD, 2)
        self.hour_effect = (0.3 * np.sin(2 * np.pi * (np.arange(N_HOURS) - 14) / 24)).astype(np.float32)
        self.device_effect = rng.normal(0, 0.2, N_DEVICES).astype(np.float32)
        self.segment_effect = rng.normal(0, 0.2, N_SEGMENTS).astype(np.float32)
        self.hour_vec = rng.standard_normal((N_HOURS, k)).astype(np.float32)
        self.device_vec = rng.standard_normal((N_DEVICES, k)).astype(np.float32)
        perm = rng.permutation(k)
        self.quad_a, self.quad_b = perm, np.roll(perm, 1)
        self.view_cut, self.click_cut = np.cumsum(ACTION_PROBS, axis=1)[:, :2].T.astype(np.float32).copy()
        self.log_action_weight = np.log(ACTION_WEIGHTS)

    def _init_timeline(self) -> None:
        """Impression spacing and the start of each split: val and test follow train at its rate."""
        p = self.p
        train = max(p.rows, 1)
        self.spacing = TRAIN_SPAN_S / train
        """Seconds between impressions, the same in every split."""
        self.split_start = {
            "train": float(TRAIN_START_S),
            "val": TRAIN_START_S + p.rows * self.spacing,
            "test": TRAIN_START_S + (p.rows + p.val_rows) * self.spacing,
        }

    # -- public helpers ------------------------------------------------------------------------
    def affinity(self, user_id: np.ndarray, item_id: np.ndarray) -> np.ndarray:
        """The true <u, v> of (user, item) pairs: the order-2 term of the label logit."""
        return np.einsum("nk,nk->n", self.u[np.asarray(user_id)], self.v[np.asarray(item_id)])

    def item_table(self, start: int, stop: int) -> pa.Table:
        """Rows [start, stop) of the item side table (item_id, content_emb, item_cluster)."""
        p = self.p
        ids = np.arange(start, stop)
        rng = _rng(p.seed, _ITEMS_TABLE, start // CHUNK_ROWS)
        wrng = _rng(p.seed, _WORLD, 3)  # the projections: the same for every block
        proj_v = (wrng.standard_normal((p.factors, p.content_dim)) * p.factors**-0.25).astype(np.float32)
        proj_c = wrng.standard_normal((self.n_clusters, p.content_dim)).astype(np.float32)
        content = self.v[ids] @ proj_v + CONTENT_CLUSTER_SCALE * proj_c[self.cluster[ids]]
        content += CONTENT_NOISE * rng.standard_normal(content.shape, dtype=np.float32)
        flat = pa.array(content.astype(np.float16).ravel())
        return pa.table(
            {
                "item_id": pa.array(ids.astype(np.int32)),
                "content_emb": pa.FixedSizeListArray.from_arrays(flat, p.content_dim),
                "item_cluster": pa.array(self.cluster[ids]),
            }
        )

    # -- generation ----------------------------------------------------------------------------
    def chunk(self, split: str, index: int, n: int) -> Chunk:
        """Chunk ``index`` (rows ``index * CHUNK_ROWS`` onwards, ``n`` of them) of ``split``."""
        rng = _rng(self.p.seed, _SPLIT_STREAM[split], index)
        row = index * CHUNK_ROWS + np.arange(n)
        ts = (self.split_start[split] + (row + rng.random(n)) * self.spacing).astype(np.int64)
        cols, logit = self._rows(rng, ts)
        label = (rng.random(n) < _sigmoid(logit + self.bias)).astype(np.int8)
        cols["label"] = pa.array(label)
        table = pa.Table.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)
        logs = [np.log1p(table.column(name).to_numpy().astype(np.float64)) for name in DENSE_COLUMNS]
        return Chunk(table, int(label.sum()), np.array([[x.sum(), np.square(x).sum()] for x in logs]))

    def _calibrate(self) -> float:
        """Bias that puts the mean click probability at TARGET_POSITIVE_RATE on a seeded sample."""
        rng = _rng(self.p.seed, _CALIBRATION, 0)
        ts = np.sort(TRAIN_START_S + rng.random(CALIBRATION_ROWS) * TRAIN_SPAN_S).astype(np.int64)
        _, logit = self._rows(rng, ts)
        lo, hi = -30.0, 30.0
        for _ in range(60):  # mean sigmoid is increasing in the bias: bisection
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if _sigmoid(logit + mid).mean() < TARGET_POSITIVE_RATE else (lo, mid)
        return 0.5 * (lo + hi)

    def _sample_items(
        self, rng: np.random.Generator, user: np.ndarray, p_taste: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """One item per entry of ``user``: with probability ``p_taste`` a taste draw (a favourite
        cluster of the user, then Zipf within it), else a popularity draw (Zipf over all items).
        Also returns the source: favourite-cluster rank, or ``TOP_CLUSTERS`` for a popularity draw."""
        m, top = len(user), self.top
        cdf = np.append(p_taste * np.cumsum(TOP_CLUSTER_WEIGHTS[:top]) / TOP_CLUSTER_WEIGHTS[:top].sum(), 1.0)
        draw = rng.random(m, dtype=np.float32)
        source = np.zeros(m, dtype=np.int8)
        for c in cdf[:-1].astype(np.float32):  # top compares: far faster than searchsorted here
            source += draw >= c
        popular = source == top
        fav = self.top_clusters.ravel()[user * top + np.minimum(source, top - 1)]
        population = np.where(popular, self.n_clusters, fav).astype(np.intp)
        rank = _zipf_rank(
            rng.random(m, dtype=np.float32), self.pop_scale[population], self.pop_size[population]
        )
        item = self.pop_items[self.pop_start[population] + rank]
        return item, np.where(popular, TOP_CLUSTERS, source).astype(np.intp)

    def _rows(self, rng: np.random.Generator, ts: np.ndarray) -> tuple[dict[str, pa.Array], np.ndarray]:
        """Columns (without the label) and the label logit without the calibrated bias."""
        p, n = self.p, len(ts)
        user = np.searchsorted(self.user_cdf, rng.random(n), side="right").clip(max=p.users - 1)
        hour = ((ts // 3600) % N_HOURS).astype(np.int8)
        device = np.where(
            rng.random(n) < P_PREFERRED_DEVICE, self.device[user], rng.integers(0, N_DEVICES, n)
        ).astype(np.int8)
        segment = self.segment[user]
        hist = self._history(rng, user)
        item, _ = self._sample_items(rng, user, P_TARGET_TASTE)
        age_days = ((ts - self.item_release[item]) / 86400.0).astype(np.float32)
        logit = self._logit(user, item, hour, device, segment, age_days, hist)
        logit = logit + p.noise * rng.standard_normal(n)

        cols = {
            "user_id": pa.array(user.astype(np.int64)),
            "item_id": pa.array(item),  # int32, like the id tables
            "timestamp": pa.array(ts),
            "hour": pa.array(hour),
            "device": pa.array(device),
            "user_segment": pa.array(segment),
            "user_activity": pa.array(self.activity[user]),
            "item_age": pa.array(age_days),
        }
        off32 = pa.array(hist.offsets.astype(np.int32))
        cols["hist_item_ids"] = pa.ListArray.from_arrays(off32, pa.array(hist.item))
        cols["hist_actions"] = pa.ListArray.from_arrays(off32, pa.array(hist.action))
        cols["hist_gaps"] = pa.ListArray.from_arrays(off32, pa.array(hist.gap))
        return cols, logit.astype(np.float64)

    def _history(self, rng: np.random.Generator, user: np.ndarray) -> _History:
        """The histories of one chunk's rows: lengths, then every event in one flat array (row-major,
        oldest first) with its item, action and gap."""
        p, n = self.p, len(user)
        length = np.floor(
            0.5 * p.max_len * np.exp(0.8 * rng.standard_normal(n) + 0.3 * self.activity_z[user])
        )
        length = np.where(rng.random(n) < P_COLD_START, 0, length.clip(0, p.max_len)).astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(length, out=offsets[1:])
        ev_row = np.repeat(np.arange(n), length)  # intp: gathers with int32 indices are slower
        ev_user = user[ev_row]
        hist_item, source = self._sample_items(rng, ev_user, P_TASTE)
        draw = rng.random(len(ev_row), dtype=np.float32)
        action = (draw > self.view_cut[source]).view(np.int8) + (draw > self.click_cut[source]).view(np.int8)
        inter = rng.standard_exponential(len(ev_row), dtype=np.float32) * self.mean_gap[ev_user]
        # gap of event j = sum of the inter-event times from j to the row's end (the impression):
        # one reversed cumulative sum over the chunk, minus what lies beyond the row's end.
        after = np.zeros(len(ev_row) + 1, dtype=np.float64)
        np.cumsum(inter[::-1], dtype=np.float64, out=after[-2::-1])
        # Whole seconds, like the timestamps they come from (and whole numbers compress better).
        gap = np.floor(np.maximum(after[:-1] - after[offsets[1:]][ev_row], 0)).astype(np.float32)
        return _History(length, offsets, hist_item, action, gap)

    def _logit(
        self,
        user: np.ndarray,
        item: np.ndarray,
        hour: np.ndarray,
        device: np.ndarray,
        segment: np.ndarray,
        age_days: np.ndarray,
        hist: _History,
    ) -> np.ndarray:
        """The label logit without noise and calibrated bias: the terms up to ``--order`` (module
        docstring)."""
        p = self.p
        logit = (
            self.user_bias[user]
            + self.item_bias[item]
            - 0.3 * (np.log1p(age_days) - np.log1p(MEAN_ITEM_AGE_DAYS))
            + self.hour_effect[hour]
            + self.device_effect[device]
            + self.segment_effect[segment]
        )
        u, v = self.u[user], self.v[item]
        if p.order >= 2:
            logit += W_DOT * np.einsum("nk,nk->n", u, v)
            logit += W_HIST * self._target_attention(item, hist)
        if p.order >= 3:
            ctx = (self.hour_vec[hour] + self.device_vec[device]) / np.sqrt(2.0)
            logit += W_TRIPLE * np.einsum("nk,nk,nk->n", u, v, ctx)
        if p.order >= 4:
            uv = u * v
            logit += (
                W_QUAD * np.sqrt(p.factors) * np.einsum("nk,nk->n", uv[:, self.quad_a], uv[:, self.quad_b])
            )
        return logit

    def _target_attention(self, item: np.ndarray, hist: _History) -> np.ndarray:
        """DIN-style attention of the target over the most recent events: sum_j a_j cos(v_t, v_j)."""
        n, r = len(item), min(self.p.max_len, HIST_ATTN_EVENTS)
        out = np.zeros(n, dtype=np.float32)
        if len(hist.item) == 0:
            return out
        back = np.arange(r)  # 0 = most recent event
        valid_nr = hist.length[:, None] > back
        pos_nr = np.where(valid_nr, hist.offsets[1:, None] - 1 - back, 0)
        for a in range(0, n, ATTN_BLOCK_ROWS):  # blocks bound the rows x r x K gather
            b = slice(a, a + ATTN_BLOCK_ROWS)
            pos = pos_nr[b]
            sim = np.einsum("nrk,nk->nr", self.v_unit[hist.item[pos]], self.v_unit[item[b]])
            score = (
                HIST_ATTN_BETA * sim
                + self.log_action_weight[hist.action[pos]]
                - hist.gap[pos] / HIST_RECENCY_S
            )
            score = np.where(valid_nr[b], score, -np.inf)
            top = score.max(axis=1, keepdims=True)
            e = np.exp(score - np.where(np.isfinite(top), top, 0))  # rows without history: all zeros
            out[b] = (e * sim).sum(axis=1) / np.maximum(e.sum(axis=1), 1e-30)
        return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))
