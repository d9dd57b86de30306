"""Training reads: the selected steps copied once into episode-major memory maps on local disk
(:mod:`~trajstore.loaders.maps`), kept in the store for every process and machine (:mod:`~trajstore.loaders.map_store`),
visited in an order computed block by block (:mod:`~trajstore.loaders.order`) by the iterator a loader returns
(:mod:`~trajstore.loaders.loader`): windows inside episodes (:mod:`~trajstore.loaders.sequences`) and n-step
transitions (:mod:`~trajstore.loaders.transitions`)."""
