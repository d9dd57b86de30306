"""A store over HTTP: :mod:`~trajstore.remote.client` (the service's Python client),
:mod:`~trajstore.remote.loader` (training batches from the service's loader streams, resumable),
:mod:`~trajstore.remote.writer` (a Writer whose commits go to the service), :mod:`~trajstore.remote.stream`
(batches from a stream as it arrives) and :mod:`~trajstore.remote.wire` (Arrow IPC and JSON rows)."""
