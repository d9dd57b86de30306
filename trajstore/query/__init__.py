"""The read side of a store: :mod:`~trajstore.query.sql` (every SQL string), :mod:`~trajstore.query.filters`
(typed episode filters), :mod:`~trajstore.query.snapshot` (DuckDB views over one committed version),
:mod:`~trajstore.query.scan` (steps straight from the files), :mod:`~trajstore.query.returns` (exact
discounted returns), :mod:`~trajstore.query.curves` (learning curves, binned), :mod:`~trajstore.query.follow`
(each new commit, as it lands) and :mod:`~trajstore.query.sandbox` (untrusted SQL, bounded)."""
