-- The webhook outbox: one row per event and endpoint, written in the same transaction as
-- the fact the event reports (a run's end, a park, a thread's creation or deletion), and
-- kept a day after its delivery. `seq` is the writing order; rows of one thread go out
-- to an endpoint in that order (see src/store/outbox.rs).
CREATE TABLE webhook_outbox (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL,           -- the event id (agui-event-id)
    endpoint        TEXT NOT NULL,           -- the endpoint's name
    thread          TEXT NOT NULL,           -- the thread's key: its events go in order
    kind            TEXT NOT NULL,           -- run.finished, thread.created, ...
    body            TEXT NOT NULL,           -- the JSON payload, exactly as sent
    created_at      INTEGER NOT NULL,        -- ms since the Unix epoch
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_at         INTEGER NOT NULL DEFAULT 0,  -- no attempt before this
    last_attempt_at INTEGER,
    last_error      TEXT,
    delivered_at    INTEGER,                 -- NULL until a 2xx answer
    claimed_by      TEXT,                    -- the process attempting it now
    claim_until     INTEGER,
    UNIQUE (id, endpoint)
);
-- The undelivered rows, by endpoint and thread in order: a thread's head is one lookup.
CREATE INDEX webhook_outbox_pending ON webhook_outbox (endpoint, thread, seq)
    WHERE delivered_at IS NULL;
