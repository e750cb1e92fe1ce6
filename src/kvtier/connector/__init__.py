"""The connector's two halves, and the values between them.

* ``scheduler_half.ConnectorScheduler`` -- pure Python, no torch: per request and per
  step, which blocks to look up, load and store; emits ``kvtier.jobs.TransferJob``.
* ``worker_half.ConnectorWorker`` -- torch: submits those jobs to the handlers and
  reports ``kvtier.jobs.TransferResult``; ``worker_process.WorkerProcess`` runs it in a
  child process.

Only those values cross between the halves (``docs/connector.md``). This package's
``__init__`` imports nothing, so ``import kvtier.connector.scheduler_half`` stays
torch-free.
"""
