-- Schedules: a cron expression, its time zone, and the messages each of its firings sends,
-- to one thread or to a new thread each time; kept per principal. `next_fire` is claimed
-- by compare-and-set, so each occurrence fires once.
CREATE TABLE schedules (
    id             TEXT PRIMARY KEY,
    owner          TEXT NOT NULL,        -- the principal ('' the operator)
    name           TEXT,
    agent          TEXT NOT NULL,
    cron           TEXT NOT NULL,
    timezone       TEXT NOT NULL,
    thread_id      TEXT,                 -- the owner's thread id; NULL: a new thread each firing
    messages       TEXT NOT NULL,        -- JSON array: the messages each firing sends
    created_at     INTEGER NOT NULL,     -- ms since the Unix epoch
    next_fire      INTEGER NOT NULL,     -- the next occurrence not yet claimed
    last_fire      INTEGER,              -- when the last firing was claimed
    last_run_id    TEXT,
    last_thread_id TEXT,
    last_status    TEXT,                 -- starting | started | skipped | failed
    last_error     TEXT,
    missed_count   INTEGER NOT NULL DEFAULT 0,  -- occurrences no node ran in time
    missed_first   INTEGER,
    missed_last    INTEGER
);
CREATE INDEX schedules_by_owner ON schedules (owner, created_at);
CREATE INDEX schedules_by_due ON schedules (next_fire);
