-- Tenancy and erasure.
--
-- 1. The identity of a memory becomes (organization_id, user_id) in every key, index and view.
--    Customers choose their user ids and they collide: before this, org B's "alice" landed in
--    org A's "alice". Existing rows keep the organization_id they carry; the tables that had
--    none (consolidated_events, user_credits) take it from the rows that do.
-- 2. One audited erase path: `erase_memory` (a whole memory) and `erase_fact` (one fact)
--    set a transaction-local flag the append-only triggers let through; an ordinary UPDATE or
--    DELETE of a log stays rejected. Every erasure is a row of `erasure_audit`, which holds
--    no content and no ids of the memory: a keyed digest (`subject`) finds it again.
-- 3. Replay cut-offs: a forgotten memory's events recorded on Kafka before its tombstone are
--    ignored by every consumer, also a new group reading the topic from offset 0.

-- -- the event log ---------------------------------------------------------------------------

DROP VIEW context_events_status;

-- An event id is the producer's idempotency key within one memory. Unique across all tenants,
-- another organization could publish an event under someone else's id and have it dropped as
-- a duplicate (or consumed in its place).
ALTER TABLE context_events DROP CONSTRAINT context_events_event_id_key;
ALTER TABLE context_events
    ADD CONSTRAINT context_events_memory_event UNIQUE (organization_id, user_id, event_id);
DROP INDEX context_events_user_seq;
DROP INDEX context_events_user_occurred;
CREATE INDEX context_events_memory_seq ON context_events (organization_id, user_id, seq);
CREATE INDEX context_events_memory_occurred
    ON context_events (organization_id, user_id, occurred_at);

ALTER TABLE consolidated_events ADD COLUMN organization_id text;
UPDATE consolidated_events c SET organization_id = r.organization_id
    FROM consolidation_runs r WHERE r.run_id = c.run_id;
UPDATE consolidated_events c SET organization_id = e.organization_id
    FROM context_events e
    WHERE c.organization_id IS NULL AND e.event_id = c.event_id AND e.user_id = c.user_id;
-- A consumed event with neither its run nor its log row left cannot be placed; '' is no
-- organization (identifiers are never empty), so it can never be taken for another's.
UPDATE consolidated_events SET organization_id = '' WHERE organization_id IS NULL;
ALTER TABLE consolidated_events ALTER COLUMN organization_id SET NOT NULL;
ALTER TABLE consolidated_events DROP CONSTRAINT consolidated_events_pkey;
ALTER TABLE consolidated_events ADD PRIMARY KEY (organization_id, user_id, event_id);

CREATE VIEW context_events_status AS
SELECT e.*, c.run_id, (c.event_id IS NOT NULL) AS processed
FROM context_events e
LEFT JOIN consolidated_events c USING (organization_id, user_id, event_id);

-- -- memory --------------------------------------------------------------------------------

ALTER TABLE user_memory DROP CONSTRAINT user_memory_pkey;
ALTER TABLE user_memory ADD PRIMARY KEY (organization_id, user_id);
-- Changes whenever memory is rewritten outside a run (a fact erased) or created anew (after
-- a forget): a cached injection is current only for the same generation and version.
ALTER TABLE user_memory ADD COLUMN generation uuid NOT NULL DEFAULT gen_random_uuid();

ALTER TABLE connections DROP CONSTRAINT connections_pkey;
ALTER TABLE connections ADD PRIMARY KEY (organization_id, user_id, connection_id);

DROP INDEX consolidation_runs_user;
CREATE INDEX consolidation_runs_memory ON consolidation_runs (organization_id, user_id, seq);

DROP INDEX memory_facts_user_status;
DROP INDEX memory_facts_user_pinned;
CREATE INDEX memory_facts_memory_status ON memory_facts (organization_id, user_id, status);
CREATE INDEX memory_facts_memory_pinned ON memory_facts (organization_id, user_id) WHERE pinned;

ALTER TABLE context_logs ALTER COLUMN organization_id DROP NOT NULL;
UPDATE context_logs l SET organization_id = m.organization_id
    FROM user_memory m WHERE l.organization_id IS NULL AND m.user_id = l.user_id;
UPDATE context_logs SET organization_id = '' WHERE organization_id IS NULL;
ALTER TABLE context_logs ALTER COLUMN organization_id SET NOT NULL;
DROP INDEX context_logs_user;
CREATE INDEX context_logs_memory ON context_logs (organization_id, user_id, created_at);

-- -- cost ----------------------------------------------------------------------------------

DROP VIEW user_balances;
DROP INDEX credit_ledger_user;
CREATE INDEX credit_ledger_memory ON credit_ledger (organization_id, user_id, seq);

ALTER TABLE user_credits ADD COLUMN organization_id text;
UPDATE user_credits c SET organization_id = m.organization_id
    FROM user_memory m WHERE m.user_id = c.user_id;
UPDATE user_credits c SET organization_id = (
    SELECT l.organization_id FROM credit_ledger l WHERE l.user_id = c.user_id ORDER BY l.seq
    LIMIT 1) WHERE c.organization_id IS NULL;
UPDATE user_credits c SET organization_id = (
    SELECT e.organization_id FROM context_events e WHERE e.user_id = c.user_id ORDER BY e.seq
    LIMIT 1) WHERE c.organization_id IS NULL;
UPDATE user_credits SET organization_id = '' WHERE organization_id IS NULL;
ALTER TABLE user_credits ALTER COLUMN organization_id SET NOT NULL;
ALTER TABLE user_credits DROP CONSTRAINT user_credits_pkey;
ALTER TABLE user_credits ADD PRIMARY KEY (organization_id, user_id);

CREATE VIEW user_balances AS
SELECT u.organization_id, u.user_id,
       coalesce(c.credit_micro_usd, 0) AS credit_micro_usd,
       coalesce(l.spent, 0) AS spent_micro_usd,
       coalesce(c.credit_micro_usd, 0) - coalesce(l.spent, 0) AS balance_micro_usd
FROM (SELECT organization_id, user_id FROM user_credits
      UNION SELECT organization_id, user_id FROM credit_ledger) u
LEFT JOIN user_credits c USING (organization_id, user_id)
LEFT JOIN (SELECT organization_id, user_id, sum(cost_micro_usd) AS spent
           FROM credit_ledger GROUP BY organization_id, user_id) l
    USING (organization_id, user_id);

-- -- erasure -------------------------------------------------------------------------------

-- The erasure audit: what was removed where, never what it said nor whose it was.
ALTER TABLE erasure_audit
    ADD COLUMN erasure_id       uuid,
    ADD COLUMN subject          text,
    ADD COLUMN scope            text,
    ADD COLUMN status           text,
    ADD COLUMN tombstone_topic  text,
    ADD COLUMN tombstone_partition integer,
    ADD COLUMN tombstone_offset bigint,
    ADD COLUMN removed          jsonb,
    ADD COLUMN digest           text,
    ADD COLUMN requested_at     timestamptz;
-- Rows of the old event-log-only erasure: their user id becomes an unkeyed sha256 (the key
-- the new rows use is not in the database), their count the event rows they removed.
UPDATE erasure_audit SET
    erasure_id = gen_random_uuid(),
    subject = 'sha256:' || encode(sha256(convert_to(user_id, 'UTF8')), 'hex'),
    scope = 'events',
    status = 'completed',
    removed = jsonb_build_object('postgres', jsonb_build_object('context_events', rows_erased)),
    requested_at = erased_at;
ALTER TABLE erasure_audit DROP COLUMN user_id, DROP COLUMN rows_erased;
ALTER TABLE erasure_audit
    ALTER COLUMN erasure_id SET NOT NULL,
    ALTER COLUMN subject SET NOT NULL,
    ALTER COLUMN scope SET NOT NULL,
    ALTER COLUMN status SET NOT NULL,
    ALTER COLUMN removed SET DEFAULT '{}'::jsonb,
    ALTER COLUMN removed SET NOT NULL,
    ALTER COLUMN requested_at SET DEFAULT now(),
    ALTER COLUMN requested_at SET NOT NULL,
    ALTER COLUMN erased_at DROP NOT NULL,
    ALTER COLUMN erased_at DROP DEFAULT,
    ADD CONSTRAINT erasure_audit_erasure UNIQUE (erasure_id),
    ADD CONSTRAINT erasure_audit_scope CHECK (scope IN ('memory', 'fact', 'events')),
    ADD CONSTRAINT erasure_audit_status
        CHECK (status IN ('started', 'tombstoned', 'postgres_erased', 'completed'));
CREATE INDEX erasure_audit_subject ON erasure_audit (subject, id);

-- Whose erasure is under way. The only place an erasure keeps the memory's ids, and only
-- until it completes, so an interrupted erasure can be resumed without asking again.
CREATE TABLE erasure_pending (
    erasure_id      uuid PRIMARY KEY REFERENCES erasure_audit (erasure_id),
    organization_id text NOT NULL,
    user_id         text NOT NULL,
    fact_id         uuid
);

-- Per forgotten memory and partition: the first offset that is not forgotten. On the
-- tombstone's partition it is the tombstone's offset; on the others the end of the partition
-- when the tombstone was written (events published before the key included the organization
-- sit there).
CREATE TABLE memory_cutoffs (
    subject    text    NOT NULL,
    topic      text    NOT NULL,
    partition  integer NOT NULL,
    cutoff     bigint  NOT NULL,
    erasure_id uuid    NOT NULL,
    PRIMARY KEY (subject, topic, partition)
);

-- The append-only triggers let the erase path through. An UPDATE must keep the new row
-- (returning OLD would silently undo it: the ledger's anonymisation is an UPDATE).
CREATE OR REPLACE FUNCTION reject_log_mutation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('memoryd.erasure', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% is append-only: % rejected', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

DROP FUNCTION erase_user_events(text, text, text);

-- Every string in a JSON value with `needle` replaced: a run's output without a fact's text.
CREATE FUNCTION redact_jsonb(j jsonb, needle text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    CASE jsonb_typeof(j)
    WHEN 'string' THEN
        RETURN to_jsonb(replace(j #>> '{}', needle, '[erased]'));
    WHEN 'array' THEN
        RETURN coalesce((SELECT jsonb_agg(redact_jsonb(e, needle) ORDER BY i)
                         FROM jsonb_array_elements(j) WITH ORDINALITY AS a(e, i)), '[]'::jsonb);
    WHEN 'object' THEN
        RETURN coalesce((SELECT jsonb_object_agg(replace(k, needle, '[erased]'),
                                                 redact_jsonb(v, needle))
                         FROM jsonb_each(j) AS o(k, v)), '{}'::jsonb);
    ELSE
        RETURN j;
    END CASE;
END $$;

CREATE FUNCTION _erasure_opened(p_erasure_id uuid, p_scope text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM erasure_audit
        WHERE erasure_id = p_erasure_id AND scope = p_scope
          AND status IN ('started', 'tombstoned') FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no open % erasure %: an erasure is audited before it runs',
            p_scope, p_erasure_id;
    END IF;
END $$;

-- A whole memory, in one transaction: every row of (organization, user) in every table.
-- The ledger keeps its amounts under a pseudonym: the organization's spend must still add up
-- for billing, and an amount says nothing about the person.
-- Events at or after the memory's cut-offs stay: they came after the tombstone and belong
-- to the memory that starts afresh.
CREATE FUNCTION erase_memory(
    p_erasure_id uuid, p_org text, p_user text, p_subject text, p_pseudonym text,
    p_log_lock bigint, p_extra jsonb
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_removed jsonb := '{}'::jsonb;
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'memory');
    -- The log writer takes this lock shared for every memory of a batch it inserts: once it
    -- is ours, no insert of this memory is in flight, and the next sees the cut-offs.
    PERFORM pg_advisory_xact_lock(p_log_lock);
    PERFORM set_config('memoryd.erasure', 'on', true);

    DELETE FROM context_logs WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT; v_removed := v_removed || jsonb_build_object('context_logs', n);
    DELETE FROM fact_history WHERE fact_id IN (
        SELECT fact_id FROM memory_facts WHERE organization_id = p_org AND user_id = p_user);
    GET DIAGNOSTICS n = ROW_COUNT; v_removed := v_removed || jsonb_build_object('fact_history', n);
    UPDATE memory_facts SET superseded_by = NULL
        WHERE NOT (organization_id = p_org AND user_id = p_user) AND superseded_by IN (
            SELECT fact_id FROM memory_facts WHERE organization_id = p_org AND user_id = p_user);
    DELETE FROM memory_facts WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT; v_removed := v_removed || jsonb_build_object('memory_facts', n);
    DELETE FROM consolidation_runs WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT;
    v_removed := v_removed || jsonb_build_object('consolidation_runs', n);
    DELETE FROM consolidated_events WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT;
    v_removed := v_removed || jsonb_build_object('consolidated_events', n);
    DELETE FROM context_events e WHERE e.organization_id = p_org AND e.user_id = p_user
        AND NOT EXISTS (SELECT 1 FROM memory_cutoffs c WHERE c.subject = p_subject
            AND c.topic = e.kafka_topic AND c.partition = e.kafka_partition
            AND e.kafka_offset >= c.cutoff);
    GET DIAGNOSTICS n = ROW_COUNT; v_removed := v_removed || jsonb_build_object('context_events', n);
    DELETE FROM connections WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT; v_removed := v_removed || jsonb_build_object('connections', n);
    DELETE FROM user_memory WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT; v_removed := v_removed || jsonb_build_object('user_memory', n);
    DELETE FROM user_credits WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT; v_removed := v_removed || jsonb_build_object('user_credits', n);
    UPDATE credit_ledger SET user_id = p_pseudonym, run_id = NULL
        WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT;

    PERFORM set_config('memoryd.erasure', 'off', true);
    v_removed := jsonb_build_object(
        'postgres', v_removed,
        'anonymised', jsonb_build_object('credit_ledger', n)) || p_extra;
    UPDATE erasure_audit SET status = 'postgres_erased', removed = v_removed
        WHERE erasure_id = p_erasure_id;
    RETURN v_removed;
END $$;

-- One fact, in one transaction: its row, history and every copy of its text in the memory's
-- runs, W, S and learned info, and the observations it was drawn from. Rows stay (the runs
-- still fold, redelivered events are still known as consumed); the text does not.
CREATE FUNCTION erase_fact(
    p_erasure_id uuid, p_org text, p_user text, p_fact_id uuid, p_extra jsonb
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_removed jsonb := '{}'::jsonb;
    v_redacted jsonb := '{}'::jsonb;
    v_content text;
    v_sources uuid[];
    v_escaped text;  -- the text as it appears inside a JSON string
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'fact');
    SELECT content, source_event_ids INTO v_content, v_sources FROM memory_facts
        WHERE fact_id = p_fact_id AND organization_id = p_org AND user_id = p_user FOR UPDATE;
    IF FOUND THEN
        v_escaped := substr(to_jsonb(v_content)::text, 2, length(to_jsonb(v_content)::text) - 2);
        PERFORM set_config('memoryd.erasure', 'on', true);
        DELETE FROM fact_history WHERE fact_id = p_fact_id;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_removed := v_removed || jsonb_build_object('fact_history', n);
        UPDATE memory_facts SET superseded_by = NULL WHERE superseded_by = p_fact_id;
        DELETE FROM memory_facts WHERE fact_id = p_fact_id;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_removed := v_removed || jsonb_build_object('memory_facts', n);

        UPDATE consolidation_runs SET
            output = CASE WHEN output IS NULL THEN NULL ELSE redact_jsonb(
                CASE WHEN output ? 'applied' THEN jsonb_set(output, '{applied,facts}',
                    coalesce((SELECT jsonb_agg(c) FROM jsonb_array_elements(
                        output #> '{applied,facts}') AS c
                        WHERE c #>> '{after,fact_id}' IS DISTINCT FROM p_fact_id::text),
                        '[]'::jsonb))
                ELSE output END, v_content) END,
            raw_response = replace(replace(raw_response, v_content, '[erased]'), v_escaped,
                '[erased]')
            WHERE organization_id = p_org AND user_id = p_user
              AND (strpos(output::text, p_fact_id::text) > 0
                   OR strpos(output::text, v_escaped) > 0
                   OR strpos(raw_response, v_content) > 0
                   OR strpos(raw_response, v_escaped) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('consolidation_runs', n);
        UPDATE context_events SET content = CASE
                WHEN event_type = 'scaffold_update' THEN '"[erased]"' ELSE '[erased]' END
            WHERE organization_id = p_org AND user_id = p_user
              AND (event_id = ANY (v_sources) OR strpos(content, v_content) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('context_events', n);
        UPDATE user_memory SET
            working_memory = replace(working_memory, v_content, '[erased]'),
            information_scaffold = redact_jsonb(information_scaffold, v_content),
            persistent_learned_info = redact_jsonb(persistent_learned_info, v_content),
            generation = gen_random_uuid()
            WHERE organization_id = p_org AND user_id = p_user;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('user_memory', n);
        UPDATE connections SET
            persistent_learned_info = redact_jsonb(persistent_learned_info, v_content)
            WHERE organization_id = p_org AND user_id = p_user
              AND strpos(persistent_learned_info::text, v_escaped) > 0;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('connections', n);
        PERFORM set_config('memoryd.erasure', 'off', true);
    END IF;
    v_removed := jsonb_build_object('postgres', v_removed, 'redacted', v_redacted) || p_extra;
    UPDATE erasure_audit SET status = 'postgres_erased', removed = v_removed
        WHERE erasure_id = p_erasure_id;
    RETURN v_removed;
END $$;
