-- A thread its owner archived: left out of the listing unless asked for.
ALTER TABLE threads ADD COLUMN archived BOOLEAN NOT NULL DEFAULT FALSE;
