"""SQL: the tables, the engine, the job state rules, what jobs leave behind, the metric store."""
