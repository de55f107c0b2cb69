-- Threads belong to a principal. `id` is the thread's key in its owner's namespace (the
-- client's thread id itself for the operator's namespace, `''`); `owner` names the
-- namespace so that one principal's threads are listed without reading anyone else's.
ALTER TABLE threads ADD COLUMN owner TEXT NOT NULL DEFAULT '';
CREATE INDEX threads_by_owner ON threads (owner, updated_at DESC, id DESC);
