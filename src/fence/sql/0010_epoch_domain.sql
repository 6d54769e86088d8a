-- pgfence schema, version 10: the type rewrite mode writes its epochs as.
--
-- Applied by `pgfence init` after 0009 (src/fence/install.rs), in one transaction.
--
-- Rewrite mode keeps no HWM for a fence without a lease: the rows carry the epochs. Until this
-- version pgfence still ran one statement of its own in each such transaction, a look-up of
-- `pgfence.fence`, only so that a database without the schema refuses the write with PF005,
-- as the contract says. That statement cost as much server CPU as the rewrite saved.
--
-- Now each rewritten statement writes its epoch as `N::pgfence.epoch`. Postgres looks the
-- type up while it analyses the statement, before anything runs, so a database without the
-- schema (3F000) or with one older than this version (42704) refuses the statement itself,
-- and pgfence turns that error into PF005. Dropping the schema makes Postgres analyse every
-- prepared statement again, with the same result. The planner
-- folds the cast of a constant to a domain without constraints, so a write pays nothing for
-- it when it runs.
--
-- The domain has no constraint on purpose: pgfence checks epochs before it writes them, and a
-- constraint would be evaluated for every row. Types are usable by PUBLIC unless revoked;
-- the grant says so where the next reader looks.

CREATE DOMAIN pgfence.epoch AS pg_catalog.int8;

COMMENT ON DOMAIN pgfence.epoch IS
    'pgfence: the type of the epochs rewrite mode writes into statements (a database without it refuses them)';
GRANT USAGE ON DOMAIN pgfence.epoch TO PUBLIC;
