-- churn: one idem_maintenance() sweep a second (expire, purge).
SELECT count(*) AS tasks FROM idempotency.idem_maintenance() \gset
\sleep 1 s
