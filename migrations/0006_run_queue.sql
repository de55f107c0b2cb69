-- Input sent while a thread's run was live, with the enqueue strategy: each item becomes a
-- run of its own, in order (seq), when the run before it ends. Removed when it starts, is
-- cancelled, or its thread is deleted.
CREATE TABLE run_queue (
    thread_id   TEXT NOT NULL,      -- the thread's key
    id          TEXT NOT NULL,      -- the item's id (its run id)
    seq         INTEGER NOT NULL,   -- order within the thread
    capped      INTEGER NOT NULL,   -- the principal that sent it has a run cap
    input       TEXT NOT NULL,      -- the RunAgentInput as JSON
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (thread_id, id)
);
