-- Schema of the compose stack's `app` database, run once by the postgres image on first start
-- (/docker-entrypoint-initdb.d). `pgfence init --config` runs after it (service pgfence-init).

-- The lease of the seed design: one row per singleton job; `epoch` is the fencing token.
CREATE TABLE leader_lease (
    name       text PRIMARY KEY,
    holder     text,
    epoch      bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO leader_lease (name) VALUES ('invoice-sweeper');

-- The sweeper's own state: which replica swept last, at which epoch.
CREATE TABLE sweep_state (
    id         int PRIMARY KEY,
    note       text,
    last_epoch bigint
);
INSERT INTO sweep_state VALUES (1, 'not swept yet', 0);

-- The work: invoices the sweeper moves from 'due' to 'sent', exactly once.
CREATE TABLE invoices (
    id         bigserial PRIMARY KEY,
    customer   text NOT NULL,
    amount     numeric(12, 2) NOT NULL,
    status     text NOT NULL DEFAULT 'due' CHECK (status IN ('due', 'sent')),
    sent_epoch bigint
);
INSERT INTO invoices (customer, amount)
SELECT 'customer-' || n, (n * 7 % 500) + 0.99 FROM generate_series(1, 200) AS n;
