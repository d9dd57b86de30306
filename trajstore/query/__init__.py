"""Reading one committed version: :mod:`~trajstore.query.engine` (what every read shares: the table, DuckDB, the
caches of one version), :mod:`~trajstore.query.sql` (every SQL string), :mod:`~trajstore.query.filters` (typed
episode filters, the filter keywords, the run check), :mod:`~trajstore.query.groups` (files grouped by how they are
stored), :mod:`~trajstore.query.foreign` (files another tool wrote: checked, put in order),
:mod:`~trajstore.query.snapshot` (DuckDB views over one committed version), :mod:`~trajstore.query.spark_sql` (the
decoding as a Spark SQL view), :mod:`~trajstore.query.picture_sql`
(image bytes as values in SQL), :mod:`~trajstore.query.pictures` (which observation leaves are pictures, as PNG),
:mod:`~trajstore.query.summarized` (a version's episodes from its files' summaries),
:mod:`~trajstore.query.episodes` (episodes and their steps, as rows), :mod:`~trajstore.query.stats` (episode
statistics), :mod:`~trajstore.query.scan` (steps straight from the files), :mod:`~trajstore.query.returns` (exact
discounted returns), :mod:`~trajstore.query.curves` (learning curves, binned), :mod:`~trajstore.query.metrics`
(what ``metric=`` measures of an episode), :mod:`~trajstore.query.condition` (a condition over episodes given as
text, parsed and rendered by trajstore), :mod:`~trajstore.query.compare` (groups of runs compared as rliable
does, with bootstrap intervals), :mod:`~trajstore.query.budget` (what one computation may take),
:mod:`~trajstore.query.follow` (each new commit, as it lands), :mod:`~trajstore.query.batches` (fixed-size
training batches from a stream),
:mod:`~trajstore.query.sandbox` (untrusted SQL, bounded) and :mod:`~trajstore.query.sql_worker` (the processes it
runs in, and the comparisons' bootstraps for the service)."""
