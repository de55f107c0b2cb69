-- Input sent while a thread's run was live, with the enqueue strategy: each item becomes a
-- run of its own, in order (seq), when the run before it ends. Removed when it starts, is
-- cancelled, or its thread is deleted.
CREATE TABLE run_queue (
    thread_id   TEXT COLLATE "C" NOT NULL REFERENCES threads (id) ON DELETE CASCADE,
    id          TEXT NOT NULL,      -- the item's id (its run id)
    seq         BIGINT NOT NULL,    -- order within the thread
    capped      BOOLEAN NOT NULL,   -- the principal that sent it has a run cap
    input       TEXT NOT NULL,      -- the RunAgentInput as JSON
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (thread_id, id)
);
