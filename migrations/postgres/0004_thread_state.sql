-- The thread's shared state document (JSON) as its last run left it: what the agent set
-- (mode, usage totals, files, ...) outlives a restart and a move to another node.
ALTER TABLE threads ADD COLUMN state TEXT;
