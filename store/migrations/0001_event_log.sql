-- The append-only event log and what consumed it.

CREATE TABLE context_events (
    seq             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    schema_version  smallint    NOT NULL,
    user_id         text        NOT NULL,
    organization_id text        NOT NULL,
    event_type      text        NOT NULL CHECK (event_type IN (
                        'fact', 'preference', 'project_details', 'correction',
                        'scaffold_update', 'learned_fact', 'tool_output', 'connection_update')),
    content         text        NOT NULL,
    scaffold_key    text,
    source          text        NOT NULL CHECK (source IN ('interactive', 'autonomous', 'tool')),
    session_id      text,
    connection_id   text,
    tool_id         text,
    message_id      text,
    attachment_id   text,
    filename        text,
    occurred_at     timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    kafka_topic     text,
    kafka_partition integer,
    kafka_offset    bigint
);
CREATE INDEX context_events_user_seq ON context_events (user_id, seq);
CREATE INDEX context_events_user_occurred ON context_events (user_id, occurred_at);

-- Erasure is the one way rows leave the log; it is audited here.
CREATE TABLE erasure_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id     text        NOT NULL,
    actor       text        NOT NULL,
    reason      text        NOT NULL,
    rows_erased bigint      NOT NULL,
    erased_at   timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION reject_log_mutation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('memoryd.erasure', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % rejected', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER context_events_append_only
    BEFORE UPDATE OR DELETE ON context_events
    FOR EACH ROW EXECUTE FUNCTION reject_log_mutation();
CREATE TRIGGER context_events_no_truncate
    BEFORE TRUNCATE ON context_events
    FOR EACH STATEMENT EXECUTE FUNCTION reject_log_mutation();

CREATE FUNCTION erase_user_events(p_user_id text, p_actor text, p_reason text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF coalesce(p_reason, '') = '' OR coalesce(p_actor, '') = '' THEN
        RAISE EXCEPTION 'erasure needs an actor and a reason';
    END IF;
    PERFORM set_config('memoryd.erasure', 'on', true);
    DELETE FROM context_events WHERE user_id = p_user_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('memoryd.erasure', 'off', true);
    INSERT INTO erasure_audit (user_id, actor, reason, rows_erased)
        VALUES (p_user_id, p_actor, p_reason, n);
    RETURN n;
END $$;

-- Written in the same transaction as the memory update: an event listed here has had its
-- effect, so a redelivered copy is dropped. Not a foreign key: the processor may consolidate
-- an event before the log writer (another consumer group) has stored it.
CREATE TABLE consolidated_events (
    event_id        uuid        PRIMARY KEY,
    run_id          uuid        NOT NULL,
    user_id         text        NOT NULL,
    consolidated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consolidated_events_run ON consolidated_events (run_id);

CREATE VIEW context_events_status AS
SELECT e.*, c.run_id, (c.event_id IS NOT NULL) AS processed
FROM context_events e
LEFT JOIN consolidated_events c USING (event_id);
