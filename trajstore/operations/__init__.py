"""Operations that change a store after reading it, each taking the parts it needs: rows that remote writers cut
appended once (:mod:`~trajstore.operations.ingest`, checked to continue their episodes by
:mod:`~trajstore.operations.continuity`), many writers' requests and files committed together, at most one commit per
interval (:mod:`~trajstore.operations.group_commit`; files writers wrote themselves handed to it by
:mod:`~trajstore.operations.handoff`), small files merged (:mod:`~trajstore.operations.compact`, the one
compaction, and :mod:`~trajstore.operations.upkeep`, what writers do after their commits), what is committed
verified (:mod:`~trajstore.operations.check`), episodes deleted (:mod:`~trajstore.operations.delete`), derived
columns written (:mod:`~trajstore.operations.add_column`), files no version needs removed
(:mod:`~trajstore.operations.vacuum`) and how long the logs keep each version, shown and set
(:mod:`~trajstore.operations.retention`)."""
