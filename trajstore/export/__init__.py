"""Exports: a store's episodes written as datasets of other tools (Minari, LeRobot-style chunked Parquet)."""
