-- Fewer B-trees written by every run's commits: the threads table keyed by its id itself
-- (WITHOUT ROWID: no separate index for the primary key), and no index by agent (a listing
-- by agent reads its owner's or everyone's threads in order of activity and filters; no
-- query used it). Runs with foreign keys off (see `prepare`): dropping the old table must
-- not cascade to the messages and runs that refer to it by name.
CREATE TABLE threads_lean (
    id          TEXT NOT NULL PRIMARY KEY,
    agent       TEXT NOT NULL,
    session_id  TEXT,
    title       TEXT,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    status      TEXT NOT NULL DEFAULT 'idle',
    metadata    TEXT,
    owner       TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;
INSERT INTO threads_lean (id, agent, session_id, title, created_at, updated_at, status, metadata, owner)
    SELECT id, agent, session_id, title, created_at, updated_at, status, metadata, owner
    FROM threads WHERE id IS NOT NULL;
DROP TABLE threads;
ALTER TABLE threads_lean RENAME TO threads;
CREATE INDEX threads_by_activity ON threads (updated_at DESC, id DESC);
CREATE INDEX threads_by_owner ON threads (owner, updated_at DESC, id DESC);
