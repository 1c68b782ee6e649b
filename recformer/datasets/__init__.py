"""Dataset builders and tools: the ``recformer data ...`` commands that write and inspect the
Parquet folders that ``recformer/data/`` (the runtime loader) reads.

- ``movielens``: MovieLens ratings to temporally split logs, item table and spec.yaml
  (``recformer data movielens``).
- ``synth``: synthetic logs of any size from a seeded latent model, streamed in constant memory
  (``recformer data synth``).
- ``embed_items``: text embeddings of every MovieLens movie, the committed content table that
  ``movielens`` attaches (``recformer data embed-items``).
- ``checksum``: rewrites Parquet files that lack page checksums with them, data unchanged
  (``recformer data checksum``).
- ``summary``: files, row groups, rows, positive rate and list lengths of a prepared folder, checked
  as the loader checks it (``recformer data summary``).

These modules import the loader's contract (schema checks, ``CHECKSUMS``, ``required``,
``load_item_tables``); the loader never imports from here.
"""
