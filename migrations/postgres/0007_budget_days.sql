-- What each principal spent per day (UTC, days since the Unix epoch), for the daily budget.
CREATE TABLE budget_days (
    owner         TEXT COLLATE "C" NOT NULL,
    day           BIGINT NOT NULL,
    tokens        BIGINT NOT NULL DEFAULT 0,
    wall_time_ms  BIGINT NOT NULL DEFAULT 0,
    tool_calls    BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day)
);
