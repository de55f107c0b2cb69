-- The webhook outbox (the SQLite schema's 0007 in PostgreSQL types): one row per event and
-- endpoint, written in the same transaction as the fact the event reports, kept a day
-- after its delivery. Nodes share it: a claim (claimed_by, claim_until on the database's
-- clock, agui_now_ms()) is taken with FOR UPDATE SKIP LOCKED, so each row is attempted by
-- one node at a time; a dead node's claims lapse (see src/store/outbox.rs).
CREATE TABLE webhook_outbox (
    seq             BIGSERIAL PRIMARY KEY,
    id              TEXT COLLATE "C" NOT NULL,
    endpoint        TEXT COLLATE "C" NOT NULL,
    thread          TEXT COLLATE "C" NOT NULL,
    kind            TEXT NOT NULL,
    body            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_at         BIGINT NOT NULL DEFAULT 0,
    last_attempt_at BIGINT,
    last_error      TEXT,
    delivered_at    BIGINT,
    claimed_by      TEXT,
    claim_until     BIGINT,
    UNIQUE (id, endpoint)
);
CREATE INDEX webhook_outbox_pending ON webhook_outbox (endpoint, thread, seq)
    WHERE delivered_at IS NULL;
