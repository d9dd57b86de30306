"""The stored format and the log: where a store lives (:mod:`~trajstore.storage.location`), how a step is stored in a
file (:mod:`~trajstore.storage.encoding`, typed physical column names in :mod:`~trajstore.storage.names`) and read
back (:mod:`~trajstore.storage.decoding`, the decoding's rules described once), the files
of the ``steps`` table (:mod:`~trajstore.storage.table`), their loader copies as plain arrays
(:mod:`~trajstore.storage.arrays`) and their summaries (:mod:`~trajstore.storage.summaries`), kept by the one rule of
such caches (:mod:`~trajstore.storage.cache`, on this machine for an ``s3://`` store), its Delta log, the one
module that reads and writes it (:mod:`~trajstore.storage.log`), how long it keeps each version's entry
(:mod:`~trajstore.storage.retention`, Delta's own table properties), the Delta protocol it reads and the versions it
refuses (:mod:`~trajstore.storage.protocol`), whether a commit landed
(:mod:`~trajstore.storage.landing`), the versions a reader can ask for (:mod:`~trajstore.storage.history`) and what
describes each run (:mod:`~trajstore.storage.run_config`), one row per change in the store's ``runs`` table, whose log
:mod:`~trajstore.storage.runs_log` reads and writes; and the priorities replays commit, the ``priorities`` table whose
log :mod:`~trajstore.storage.priorities_log` reads and writes."""
