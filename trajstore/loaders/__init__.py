"""Training reads: the selected steps gathered from the data files' array copies, stitched together in memory maps
(:mod:`~trajstore.loaders.stitched`), or, where files have none, laid out once, episode-major, one file per column on
local disk, and memory-mapped by each iterator (:mod:`~trajstore.loaders.layout`), kept in the store for every
process and machine (:mod:`~trajstore.loaders.layout_store`), read from one pinned version
(:mod:`~trajstore.loaders.source`; a selection of agents laid out by each agent's own trajectory,
:mod:`~trajstore.loaders.agents`), visited in an order computed block by block (:mod:`~trajstore.loaders.order`)
by the iterator a loader returns (:mod:`~trajstore.loaders.loader`): windows inside episodes
(:mod:`~trajstore.loaders.sequences`) and n-step transitions (:mod:`~trajstore.loaders.transitions`), each batch
assembled in one compiled pass (:mod:`~trajstore.loaders.assemble`); and the same items drawn by priority
(:mod:`~trajstore.loaders.replay`: their slots and handles in :mod:`~trajstore.loaders.replay_items`, the sum and min
trees in :mod:`~trajstore.loaders.sumtree`, the priorities stored and committed by
:mod:`~trajstore.loaders.replay_priorities`)."""
