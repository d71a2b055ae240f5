-- Memory state (W, S, learned info), facts, runs, cost, read audit.

CREATE TABLE user_memory (
    user_id                 text        PRIMARY KEY,
    organization_id         text        NOT NULL,
    working_memory          text        NOT NULL DEFAULT '',
    information_scaffold    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    persistent_learned_info jsonb       NOT NULL DEFAULT '[]'::jsonb,
    version                 bigint      NOT NULL DEFAULT 0,
    updated_at              timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE connections (
    user_id                 text        NOT NULL,
    connection_id           text        NOT NULL,
    organization_id         text        NOT NULL,
    persistent_learned_info jsonb       NOT NULL DEFAULT '[]'::jsonb,
    tool_context            jsonb,
    tool_context_expires_at timestamptz,
    updated_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, connection_id)
);

CREATE TABLE consolidation_runs (
    seq               bigint GENERATED ALWAYS AS IDENTITY,
    run_id            uuid        PRIMARY KEY,
    user_id           text        NOT NULL,
    organization_id   text        NOT NULL,
    input_event_ids   uuid[]      NOT NULL,
    backend           text        NOT NULL,
    model             text        NOT NULL,
    prompt_version    text        NOT NULL,
    status            text        NOT NULL CHECK (status IN ('succeeded', 'failed', 'deferred')),
    attempt           integer     NOT NULL DEFAULT 0,
    base_version      bigint      NOT NULL,
    output            jsonb,
    raw_response      text,
    gate              jsonb       NOT NULL DEFAULT '{}'::jsonb,
    prompt_tokens     integer     NOT NULL DEFAULT 0,
    completion_tokens integer     NOT NULL DEFAULT 0,
    cost_micro_usd    bigint      NOT NULL DEFAULT 0,
    duration_ms       integer     NOT NULL,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz NOT NULL DEFAULT now(),
    error             text
);
CREATE UNIQUE INDEX consolidation_runs_seq ON consolidation_runs (seq);
CREATE INDEX consolidation_runs_user ON consolidation_runs (user_id, seq);
CREATE TRIGGER consolidation_runs_append_only
    BEFORE UPDATE OR DELETE ON consolidation_runs
    FOR EACH ROW EXECUTE FUNCTION reject_log_mutation();

CREATE TABLE memory_facts (
    fact_id            uuid        PRIMARY KEY,
    user_id            text        NOT NULL,
    organization_id    text        NOT NULL,
    content            text        NOT NULL,
    content_tsv        tsvector    GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    context_type       text        NOT NULL,
    source             text        NOT NULL,
    connection_id      text,
    tool_id            text,
    message_id         text,
    attachment_id      text,
    filename           text,
    source_event_ids   uuid[]      NOT NULL DEFAULT '{}',
    fact_type          text        NOT NULL CHECK (fact_type IN (
                           'profile', 'preference', 'episodic', 'open_loop', 'lore',
                           'protocol', 'reflection')),
    surface            text        NOT NULL CHECK (surface IN (
                           'speak', 'adapt', 'avoid', 'continue', 'factcheck')),
    status             text        NOT NULL CHECK (status IN (
                           'active', 'held', 'stale', 'contradicted', 'archived')),
    pinned             boolean     NOT NULL DEFAULT false,
    confidence         real        NOT NULL CHECK (confidence BETWEEN 0 AND 1),
    salience           real        NOT NULL CHECK (salience BETWEEN 0 AND 1),
    reinforce_count    integer     NOT NULL DEFAULT 0,
    last_reinforced_at timestamptz,
    recall_count       integer     NOT NULL DEFAULT 0,
    last_recalled_at   timestamptz,
    superseded_by      uuid        REFERENCES memory_facts (fact_id),
    created_by_run     uuid        NOT NULL,
    updated_by_run     uuid,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    indexed_at         timestamptz,
    version            integer     NOT NULL DEFAULT 1
);
CREATE INDEX memory_facts_user_status ON memory_facts (user_id, status);
CREATE INDEX memory_facts_pending_index ON memory_facts (updated_at) WHERE indexed_at IS NULL;
CREATE INDEX memory_facts_tsv ON memory_facts USING gin (content_tsv);

-- Every change a run makes to a fact, so an update in place keeps its history.
CREATE TABLE fact_history (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    fact_id    uuid        NOT NULL,
    run_id     uuid        NOT NULL,
    operation  text        NOT NULL,
    before     jsonb,
    after      jsonb       NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (fact_id, run_id, operation)
);

CREATE TABLE credit_ledger (
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    entry_id        uuid        PRIMARY KEY,
    user_id         text        NOT NULL,
    organization_id text        NOT NULL,
    run_id          uuid,
    operation       text        NOT NULL CHECK (operation IN ('llm', 'embedding')),
    model           text        NOT NULL,
    units           integer     NOT NULL CHECK (units >= 0),
    cost_micro_usd  bigint      NOT NULL CHECK (cost_micro_usd >= 0),
    occurred_at     timestamptz NOT NULL
);
CREATE INDEX credit_ledger_user ON credit_ledger (user_id, seq);
CREATE TRIGGER credit_ledger_append_only
    BEFORE UPDATE OR DELETE ON credit_ledger
    FOR EACH ROW EXECUTE FUNCTION reject_log_mutation();

CREATE TABLE user_credits (
    user_id        text        PRIMARY KEY,
    credit_micro_usd bigint    NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE VIEW user_balances AS
SELECT u.user_id,
       coalesce(c.credit_micro_usd, 0) AS credit_micro_usd,
       coalesce(l.spent, 0) AS spent_micro_usd,
       coalesce(c.credit_micro_usd, 0) - coalesce(l.spent, 0) AS balance_micro_usd
FROM (SELECT user_id FROM user_credits UNION SELECT user_id FROM credit_ledger) u
LEFT JOIN user_credits c USING (user_id)
LEFT JOIN (SELECT user_id, sum(cost_micro_usd) AS spent FROM credit_ledger GROUP BY user_id) l
    USING (user_id);

CREATE TABLE context_logs (
    log_id          uuid        PRIMARY KEY,
    user_id         text        NOT NULL,
    organization_id text,
    query           text        NOT NULL,
    memory_version  bigint      NOT NULL,
    injected        jsonb       NOT NULL,
    retrieved       jsonb       NOT NULL,
    latency_ms      real        NOT NULL,
    degraded        boolean     NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX context_logs_user ON context_logs (user_id, created_at);
