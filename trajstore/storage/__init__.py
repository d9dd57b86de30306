"""The write side of a store, in the order rows move: a :class:`~trajstore.storage.writer.Writer` validates
time-major batches, :mod:`~trajstore.storage.segment` cuts them into episodes (ids from
:mod:`~trajstore.storage.episode_ids`), and a :class:`~trajstore.storage.sink.Sink` commits them: the
store's :class:`~trajstore.storage.table.StepsTable` (Parquet files made visible by Delta Lake commits).
:mod:`~trajstore.storage.ingest` appends rows that remote writers already cut; :mod:`~trajstore.storage.compact`
rewrites small files; :mod:`~trajstore.storage.check` verifies what is committed."""
