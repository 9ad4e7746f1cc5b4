"""The embedded runner's store: one run's conversations in memory, written in batches.

`buffered` holds the run and its conversations (`BufferedStore`); `buffered_run` the
run's row as kept in memory; `flush_batch` what one flush writes, as plain data;
`flush_writes` writing it to the database (store/sql). Callers go through the store's
face (`agenttest_worker.store`).
"""
