"""``recformer serve EXPORT_DIR``: an exported ranker behind an HTTP server (LitServe)."""
