-- What each principal spent per day (UTC, days since the Unix epoch), for the daily budget.
CREATE TABLE budget_days (
    owner         TEXT NOT NULL,
    day           INTEGER NOT NULL,
    tokens        INTEGER NOT NULL DEFAULT 0,
    wall_time_ms  INTEGER NOT NULL DEFAULT 0,
    tool_calls    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day)
);
