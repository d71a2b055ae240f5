-- Forgetting a memory, or one fact, left its text in free-text error columns. A failed run's
-- error can quote the model's answer (a schema error shows the values it refused), and the
-- cluster jobs record their last error (scheduled_jobs.last_error) and every failed
-- maintenance run's (maintenance_runs.error), which a driver error can fill with a row's
-- values. Those rows stay: they are the record of costs, counts and outages. Their error text
-- loses what it quotes of the erased memory instead, as the runs' raw answers did:
-- `erase_fact` redacts the fact's text in the memory's failed runs and in the cluster jobs'
-- errors; `erase_memory` (which deletes the memory's runs) redacts, in the cluster jobs'
-- errors, its facts' text and ids and the text of the events it removes.
-- A quote is found as it is written or as inside a JSON string. One cut short or escaped
-- otherwise (pydantic shortens a long value it shows, and shows it with Python's quoting)
-- is not found; neither are the dead letters' reasons, which are Kafka headers beside the
-- event itself and go with the topic's retention. The functions are 0012's and 0014's
-- otherwise.

-- `text` with each of `quotes` (and its form inside a JSON string) replaced by the marker,
-- the longest first: a quote inside a longer one must not break the longer one's match.
CREATE FUNCTION _redact_quotes(p_text text, p_quotes text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    q text;
    v_json text;
BEGIN
    IF p_text IS NULL THEN
        RETURN NULL;
    END IF;
    FOR q IN SELECT x FROM unnest(p_quotes) AS x WHERE x <> '' ORDER BY length(x) DESC LOOP
        v_json := to_jsonb(q)::text;
        p_text := replace(replace(p_text, q, '[erased]'),
                          substr(v_json, 2, length(v_json) - 2), '[erased]');
    END LOOP;
    RETURN p_text;
END $$;

-- The cluster jobs' errors without these quotes; returns how many rows of each table changed.
-- Worked per distinct error: a job failing every tick records the same one many times. The
-- caller has set `memoryd.erasure` (maintenance_runs is append-only).
CREATE FUNCTION _redact_job_errors(p_quotes text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_error text;
    v_redacted text;
    v_runs bigint := 0;
    v_jobs bigint := 0;
    n bigint;
BEGIN
    FOR v_error IN
        SELECT error FROM maintenance_runs WHERE error IS NOT NULL
        UNION
        SELECT last_error FROM scheduled_jobs WHERE last_error IS NOT NULL
    LOOP
        v_redacted := _redact_quotes(v_error, p_quotes);
        CONTINUE WHEN v_redacted = v_error;
        UPDATE maintenance_runs SET error = v_redacted WHERE error = v_error;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_runs := v_runs + n;
        UPDATE scheduled_jobs SET last_error = v_redacted WHERE last_error = v_error;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_jobs := v_jobs + n;
    END LOOP;
    RETURN jsonb_build_object('maintenance_runs', v_runs, 'scheduled_jobs', v_jobs);
END $$;

CREATE OR REPLACE FUNCTION erase_memory(
    p_erasure_id uuid, p_org text, p_user text, p_subject text, p_pseudonym text,
    p_log_lock bigint, p_extra jsonb
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_removed jsonb := '{}'::jsonb;
    v_redacted jsonb;
    v_quotes text[];
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'memory');
    -- The log writer takes this lock shared for every memory of a batch it inserts: once it
    -- is ours, no insert of this memory is in flight, and the next sees the cut-offs.
    PERFORM pg_advisory_xact_lock(p_log_lock);
    PERFORM set_config('memoryd.erasure', 'on', true);

    -- What the cluster jobs' errors may quote of the memory, read before its rows go: its
    -- facts' text (every version) and ids, and the text of the events this erasure removes.
    SELECT array_agg(q) INTO v_quotes FROM (
        SELECT content AS q FROM memory_facts WHERE organization_id = p_org AND user_id = p_user
        UNION
        SELECT fact_id::text FROM memory_facts WHERE organization_id = p_org AND user_id = p_user
        UNION
        SELECT v.doc ->> 'content' FROM fact_history h
            JOIN memory_facts f USING (fact_id),
            LATERAL (VALUES (h.before), (h.after)) AS v(doc)
            WHERE f.organization_id = p_org AND f.user_id = p_user
        UNION
        SELECT e.content FROM context_events e
            WHERE e.organization_id = p_org AND e.user_id = p_user
            AND NOT EXISTS (SELECT 1 FROM memory_cutoffs c WHERE c.subject = p_subject
                AND c.topic = e.kafka_topic AND c.partition = e.kafka_partition
                AND e.kafka_offset >= c.cutoff)
    ) AS quotes WHERE q IS NOT NULL AND q <> '';
    v_redacted := _redact_job_errors(coalesce(v_quotes, '{}'));

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
    -- New entry ids: the old ones derive from the memory's runs and turns, which a returning
    -- user's would derive again (the same turn ids, events re-sent), and be taken for them.
    UPDATE credit_ledger SET user_id = p_pseudonym, run_id = NULL, entry_id = gen_random_uuid()
        WHERE organization_id = p_org AND user_id = p_user;
    GET DIAGNOSTICS n = ROW_COUNT;

    PERFORM set_config('memoryd.erasure', 'off', true);
    v_removed := jsonb_build_object(
        'postgres', v_removed,
        'anonymised', jsonb_build_object('credit_ledger', n),
        'redacted', v_redacted) || p_extra;
    UPDATE erasure_audit SET status = 'postgres_erased', removed = v_removed
        WHERE erasure_id = p_erasure_id;
    RETURN v_removed;
END $$;

CREATE OR REPLACE FUNCTION erase_fact(
    p_erasure_id uuid, p_org text, p_user text, p_fact_id uuid, p_extra jsonb
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_removed jsonb := '{}'::jsonb;
    v_redacted jsonb := '{}'::jsonb;
    v_content text;
    v_sources uuid[];
    v_escaped text;  -- the text as it appears inside a JSON string
    v_subject text;
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'fact');
    SELECT content, source_event_ids INTO v_content, v_sources FROM memory_facts
        WHERE fact_id = p_fact_id AND organization_id = p_org AND user_id = p_user FOR UPDATE;
    IF FOUND THEN
        -- Every version's sources, before the history goes.
        SELECT array_agg(DISTINCT s) INTO v_sources FROM (
            SELECT unnest(v_sources) AS s
            UNION
            SELECT (jsonb_array_elements_text(v.doc -> 'source_event_ids'))::uuid
            FROM fact_history h, LATERAL (VALUES (h.before), (h.after)) AS v(doc)
            WHERE h.fact_id = p_fact_id AND v.doc IS NOT NULL
        ) AS sources;
        v_escaped := substr(to_jsonb(v_content)::text, 2, length(to_jsonb(v_content)::text) - 2);
        SELECT subject INTO v_subject FROM erasure_audit WHERE erasure_id = p_erasure_id;
        INSERT INTO redacted_events (subject, event_id, erasure_id)
            SELECT v_subject, s, p_erasure_id FROM unnest(v_sources) AS s WHERE s IS NOT NULL
            ON CONFLICT DO NOTHING;
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
            raw_response = _redact_quotes(raw_response, ARRAY[v_content]),
            error = _redact_quotes(error, ARRAY[v_content, p_fact_id::text])
            WHERE organization_id = p_org AND user_id = p_user
              AND (strpos(output::text, p_fact_id::text) > 0
                   OR strpos(output::text, v_escaped) > 0
                   OR strpos(raw_response, v_content) > 0
                   OR strpos(raw_response, v_escaped) > 0
                   OR strpos(error, v_content) > 0
                   OR strpos(error, v_escaped) > 0
                   OR strpos(error, p_fact_id::text) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('consolidation_runs', n);
        UPDATE context_events SET content = CASE
                WHEN event_type = 'scaffold_update' THEN '"[erased]"' ELSE '[erased]' END
            WHERE organization_id = p_org AND user_id = p_user
              AND (event_id = ANY (v_sources) OR strpos(content, v_content) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('context_events', n);
        -- Another fact that quotes this one loses the text too, as its entries in the runs'
        -- outputs just did (else the fold of the runs no longer gives the live row), and goes
        -- back to the index queue so that its vector and document are of the redacted text.
        UPDATE memory_facts SET content = replace(content, v_content, '[erased]'),
                indexed_at = NULL
            WHERE organization_id = p_org AND user_id = p_user AND strpos(content, v_content) > 0;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('memory_facts', n);
        UPDATE fact_history SET before = redact_jsonb(before, v_content),
                after = redact_jsonb(after, v_content)
            WHERE fact_id IN (SELECT fact_id FROM memory_facts
                              WHERE organization_id = p_org AND user_id = p_user)
              AND (strpos(before::text, v_escaped) > 0 OR strpos(after::text, v_escaped) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('fact_history', n);
        -- The read audit: a turn's query quoting the fact, and the fact's id (a digest of its
        -- content) among what the turn was shown.
        UPDATE context_logs SET
            query = replace(query, v_content, '[erased]'),
            rewritten_query = replace(rewritten_query, v_content, '[erased]'),
            retrieved = coalesce((SELECT jsonb_agg(CASE WHEN r ->> 'fact_id' = p_fact_id::text
                                  THEN r || '{"fact_id": "[erased]"}'::jsonb ELSE r END
                                  ORDER BY i)
                                  FROM jsonb_array_elements(retrieved) WITH ORDINALITY
                                  AS a(r, i)), '[]'::jsonb),
            injected = CASE WHEN injected ? 'pinned_fact_ids' THEN jsonb_set(injected,
                '{pinned_fact_ids}', coalesce((SELECT jsonb_agg(x ORDER BY i)
                    FROM jsonb_array_elements(injected -> 'pinned_fact_ids') WITH ORDINALITY
                    AS a(x, i) WHERE x #>> '{}' <> p_fact_id::text), '[]'::jsonb))
                ELSE injected END
            WHERE organization_id = p_org AND user_id = p_user
              AND (strpos(query, v_content) > 0
                   OR strpos(coalesce(rewritten_query, ''), v_content) > 0
                   OR strpos(retrieved::text, p_fact_id::text) > 0
                   OR strpos(injected::text, p_fact_id::text) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('context_logs', n);
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
        v_redacted := v_redacted || _redact_job_errors(ARRAY[v_content, p_fact_id::text]);
        PERFORM set_config('memoryd.erasure', 'off', true);
    END IF;
    v_removed := jsonb_build_object('postgres', v_removed, 'redacted', v_redacted) || p_extra;
    UPDATE erasure_audit SET status = 'postgres_erased', removed = v_removed
        WHERE erasure_id = p_erasure_id;
    RETURN v_removed;
END $$;
