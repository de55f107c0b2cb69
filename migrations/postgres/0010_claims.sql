-- A token's `budget` claim, stored with what it governs: a schedule's firings and a queued
-- item's run count against the claim of the token that made them (JSON, NULL: none).
ALTER TABLE schedules ADD COLUMN budget TEXT;
ALTER TABLE run_queue ADD COLUMN budget TEXT;
