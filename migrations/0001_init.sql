-- Threads, their transcript, and their runs.
CREATE TABLE threads (
    id          TEXT PRIMARY KEY,
    agent       TEXT NOT NULL,
    session_id  TEXT,
    title       TEXT,
    created_at  INTEGER NOT NULL,   -- ms since the Unix epoch
    updated_at  INTEGER NOT NULL,
    status      TEXT NOT NULL DEFAULT 'idle',  -- idle | running | suspended
    metadata    TEXT                -- JSON object, agent-specific
);
CREATE INDEX threads_by_activity ON threads (updated_at DESC, id DESC);
CREATE INDEX threads_by_agent ON threads (agent, updated_at DESC, id DESC);

CREATE TABLE messages (
    thread_id   TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    id          TEXT NOT NULL,
    role        TEXT NOT NULL,
    body        TEXT NOT NULL,      -- the AG-UI Message as JSON
    PRIMARY KEY (thread_id, seq),
    UNIQUE (thread_id, id)
);

CREATE TABLE runs (
    thread_id   TEXT NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id          TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    segments    INTEGER NOT NULL DEFAULT 1,
    outcome     TEXT,               -- finished | cancelled | error | interrupted; NULL while live
    PRIMARY KEY (thread_id, id)
);
CREATE INDEX runs_by_thread ON runs (thread_id, started_at DESC);
