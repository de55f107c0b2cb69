-- Threads, their transcript, and their runs: the SQLite schema (0001 and 0002) in
-- PostgreSQL types. Keys compare bytewise (COLLATE "C"), as in SQLite, so listings and
-- their cursors order the same on both backends.
CREATE TABLE threads (
    id          TEXT COLLATE "C" PRIMARY KEY,  -- the key in its owner's namespace
    agent       TEXT COLLATE "C" NOT NULL,
    session_id  TEXT,
    title       TEXT,
    created_at  BIGINT NOT NULL,    -- ms since the Unix epoch
    updated_at  BIGINT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'idle',  -- idle | running | suspended
    metadata    TEXT,               -- JSON object, agent-specific
    owner       TEXT COLLATE "C" NOT NULL DEFAULT ''
);
CREATE INDEX threads_by_activity ON threads (updated_at DESC, id DESC);
CREATE INDEX threads_by_agent ON threads (agent, updated_at DESC, id DESC);
CREATE INDEX threads_by_owner ON threads (owner, updated_at DESC, id DESC);

CREATE TABLE messages (
    thread_id   TEXT COLLATE "C" NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    id          TEXT NOT NULL,
    role        TEXT NOT NULL,
    body        TEXT NOT NULL,      -- the AG-UI Message as JSON
    PRIMARY KEY (thread_id, seq),
    UNIQUE (thread_id, id)
);

CREATE TABLE runs (
    thread_id   TEXT COLLATE "C" NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id          TEXT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    segments    BIGINT NOT NULL DEFAULT 1,
    outcome     TEXT,               -- finished | cancelled | error | interrupted; NULL while live
    ord         BIGSERIAL NOT NULL, -- insertion order: the tiebreak of a thread's last run
    PRIMARY KEY (thread_id, id)
);
CREATE INDEX runs_by_thread ON runs (thread_id, started_at DESC, ord DESC);

-- The cluster: its nodes, which node owns which thread (a lease, fenced by its epoch),
-- and secrets the nodes share. Lease times are the database's clock, agui_now_ms().
CREATE TABLE nodes (
    id           TEXT PRIMARY KEY,
    address      TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
CREATE TABLE leases (
    thread_key  TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
CREATE TABLE secrets (
    name        TEXT PRIMARY KEY,
    value       BYTEA NOT NULL
);
CREATE FUNCTION agui_now_ms() RETURNS BIGINT LANGUAGE SQL VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;
