-- Schedules: a cron expression, its time zone, and the messages each of its firings sends,
-- to one thread or to a new thread each time; kept per principal. Every node's scheduler
-- claims an occurrence by compare-and-set on `next_fire`, so each fires on one node once.
CREATE TABLE schedules (
    id             TEXT COLLATE "C" PRIMARY KEY,
    owner          TEXT COLLATE "C" NOT NULL,  -- the principal ('' the operator)
    name           TEXT,
    agent          TEXT COLLATE "C" NOT NULL,
    cron           TEXT NOT NULL,
    timezone       TEXT NOT NULL,
    thread_id      TEXT COLLATE "C",           -- the owner's thread id; NULL: a new thread each firing
    messages       TEXT NOT NULL,              -- JSON array: the messages each firing sends
    created_at     BIGINT NOT NULL,            -- ms since the Unix epoch
    next_fire      BIGINT NOT NULL,            -- the next occurrence not yet claimed
    last_fire      BIGINT,                     -- when the last firing was claimed
    last_run_id    TEXT,
    last_thread_id TEXT,
    last_status    TEXT,                       -- starting | started | skipped | failed
    last_error     TEXT,
    missed_count   BIGINT NOT NULL DEFAULT 0,  -- occurrences no node ran in time
    missed_first   BIGINT,
    missed_last    BIGINT
);
CREATE INDEX schedules_by_owner ON schedules (owner, created_at);
CREATE INDEX schedules_by_due ON schedules (next_fire);
