"""A store over HTTP: :mod:`~trajstore.remote.client` (the service's Python client),
:mod:`~trajstore.remote.loader` (training batches from the service's loader streams, resumable),
:mod:`~trajstore.remote.replay` (a prioritized replay the service holds open),
:mod:`~trajstore.remote.writer` (a Writer whose commits go to the service), :mod:`~trajstore.remote.stream`
(batches from a stream as it arrives), :mod:`~trajstore.remote.wire` (Arrow IPC and JSON rows) and
:mod:`~trajstore.remote.decoded_size` (what an Arrow IPC stream decodes to, from its metadata)."""
