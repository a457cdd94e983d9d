"""The live stream of a job (docs/live-stream.md, ``GET /jobs/{id}/stream``).

Every record a client can see (a metric step, a rollout sample, a log line, a JobEvent, a status
change, a checkpoint change) takes the next number of its job's sequence (``Job.stream_seq``) in
the transaction that stores it, and keeps it in a ``stream_seq`` column. The number comes from an
``UPDATE ... RETURNING`` on the job row, so numbers are handed out in commit order and a client
that has seen number *n* has seen everything committed before it.

- ``records``: hand out numbers, turn rows into stream records, read them back from the
  database (replay, and filling gaps);
- ``fanout``: publish records after commit on Redis pub/sub, and the per-process hub that
  shares one Redis subscription among all the clients of a server process;
- ``views``: the async Server-Sent Events view.
"""
