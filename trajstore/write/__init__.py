"""The writer, in the order rows move: a :class:`~trajstore.write.writer.Writer` (:mod:`~trajstore.write.writer`)
validates time-major batches,
:mod:`~trajstore.write.segment` cuts them into episodes (ids from :mod:`~trajstore.write.episode_ids`),
:mod:`~trajstore.write.buffer` gathers and encodes the rows of one file (its arrays in Arrow's memory pool:
:mod:`~trajstore.write.memory`), and a :class:`~trajstore.write.sink.Sink`
commits them (:mod:`~trajstore.write.sink`): the store's :class:`~trajstore.storage.table.StepsTable`, or a served
store's remote sink. The rows of multi-agent episodes go through an
:class:`~trajstore.write.agents.AgentWriter` (:mod:`~trajstore.write.agents`), one writer per kind of agent."""
