-- A fact erasure redacted the cluster jobs' errors (`maintenance_runs.error`,
-- `scheduled_jobs.last_error`, every tenant's) with every version of the fact's text, however
-- short: a fact "ok" erased made "broker" "br[erased]er" in all of them. And its receipt
-- counted the rows it changed there, which told the caller whether some cluster error (maybe
-- quoting another tenant's row) holds its text. It now redacts there only the texts of 8
-- characters or more, as `erase_memory` does (`_redact_quotes`), and its id; the receipt no
-- longer counts those rows. The function is 0016's otherwise.
-- `erase_memory` (a forget of a whole memory) counted them too, as its receipt's `redacted`
-- (its only redacted rows): a user's events are the caller's to write, so the count was the
-- same probe of the other tenants' errors. It redacts them as before and no longer counts
-- them; its receipt has no `redacted` any more. The function is 0016's otherwise.

CREATE OR REPLACE FUNCTION erase_fact(
    p_erasure_id uuid, p_org text, p_user text, p_fact_id uuid, p_extra jsonb
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_removed jsonb := '{}'::jsonb;
    v_redacted jsonb := '{}'::jsonb;
    v_content text;
    v_version bigint;
    v_requeued bigint;
    v_sources uuid[];
    v_pattern text;  -- every version's text, as `_quote_pattern` finds it
    v_job_pattern text;  -- the versions' of 8 characters or more; NULL if none is
    v_subject text;
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'fact');
    SELECT content INTO v_content FROM memory_facts
        WHERE fact_id = p_fact_id AND organization_id = p_org AND user_id = p_user;
    IF FOUND THEN
        -- Every version's text: the same fact (its id is of the normalized text) may have
        -- been written in other case or spacing.
        -- The cluster jobs' errors are every tenant's: there, a text under 8 characters
        -- ("ok", "yes") would cut words out of them while quoting nobody (the guard of
        -- `_redact_quotes`), so `v_job_pattern` leaves those out.
        SELECT string_agg('(?:' || p || ')', '|'),
               string_agg('(?:' || p || ')', '|') FILTER (WHERE long)
            INTO v_pattern, v_job_pattern FROM (
            SELECT _quote_pattern(t) AS p, bool_or(length(t) >= 8) AS long FROM (
                SELECT v_content AS t
                UNION
                SELECT v.doc ->> 'content'
                FROM fact_history h, LATERAL (VALUES (h.before), (h.after)) AS v(doc)
                WHERE h.fact_id = p_fact_id
            ) AS texts GROUP BY 1
        ) AS patterns WHERE p IS NOT NULL;
        -- A text of no words has no pattern: one that matches nothing, not NULL (which
        -- regexp_replace would write over W, the runs' answers and errors).
        v_pattern := coalesce(v_pattern, '(?!)');
        -- Every fact row written below, locked first and in id order, as the indexer's marks
        -- and the runs' upserts lock theirs (store.fact_rows.lock_in_id_order). The
        -- erased row's delete strengthens its lock later, in this transaction alone.
        PERFORM 1 FROM memory_facts WHERE fact_id IN (
                SELECT p_fact_id
                UNION ALL
                SELECT fact_id FROM memory_facts WHERE superseded_by = p_fact_id
                UNION ALL
                SELECT fact_id FROM memory_facts
                    WHERE organization_id = p_org AND user_id = p_user
                      AND content ~* v_pattern)
            ORDER BY fact_id FOR NO KEY UPDATE;
        -- Read now that the row is locked: the sources of the row that goes.
        -- Its versions booked: the last one only once indexed.
        SELECT source_event_ids, version - (indexed_at IS NULL)::int INTO v_sources, v_version
            FROM memory_facts WHERE fact_id = p_fact_id;
        -- Every version's sources, before the history goes.
        SELECT array_agg(DISTINCT s) INTO v_sources FROM (
            SELECT unnest(v_sources) AS s
            UNION
            SELECT (jsonb_array_elements_text(v.doc -> 'source_event_ids'))::uuid
            FROM fact_history h, LATERAL (VALUES (h.before), (h.after)) AS v(doc)
            WHERE h.fact_id = p_fact_id AND v.doc IS NOT NULL
        ) AS sources;
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
            output = CASE WHEN output IS NULL THEN NULL ELSE _redact_jsonb_matching(
                CASE WHEN output ? 'applied' THEN jsonb_set(output, '{applied,facts}',
                    coalesce((SELECT jsonb_agg(c) FROM jsonb_array_elements(
                        output #> '{applied,facts}') AS c
                        WHERE c #>> '{after,fact_id}' IS DISTINCT FROM p_fact_id::text),
                        '[]'::jsonb))
                ELSE output END, v_pattern) END,
            raw_response = regexp_replace(raw_response, v_pattern, '[erased]', 'gi'),
            error = replace(regexp_replace(error, v_pattern, '[erased]', 'gi'),
                            p_fact_id::text, '[erased]')
            WHERE organization_id = p_org AND user_id = p_user
              AND (strpos(output::text, p_fact_id::text) > 0
                   OR output::text ~* v_pattern
                   OR raw_response ~* v_pattern
                   OR error ~* v_pattern
                   OR strpos(error, p_fact_id::text) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('consolidation_runs', n);
        UPDATE context_events SET content = CASE
                WHEN event_type = 'scaffold_update' THEN '"[erased]"' ELSE '[erased]' END
            WHERE organization_id = p_org AND user_id = p_user
              AND (event_id = ANY (v_sources) OR content ~* v_pattern);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('context_events', n);
        -- Another fact that quotes this one loses the text too, as its entries in the runs'
        -- outputs just did (else the fold of the runs no longer gives the live row), and goes
        -- back to the index queue so that its vector and document are of the redacted text.
        -- Those indexed already are embedded and booked again (those pending are booked once).
        SELECT count(*) INTO v_requeued FROM memory_facts
            WHERE organization_id = p_org AND user_id = p_user AND content ~* v_pattern
              AND indexed_at IS NOT NULL;
        UPDATE memory_facts SET content = regexp_replace(content, v_pattern, '[erased]', 'gi'),
                indexed_at = NULL
            WHERE organization_id = p_org AND user_id = p_user AND content ~* v_pattern;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('memory_facts', n);
        UPDATE fact_history SET before = _redact_jsonb_matching(before, v_pattern),
                after = _redact_jsonb_matching(after, v_pattern)
            WHERE fact_id IN (SELECT fact_id FROM memory_facts
                              WHERE organization_id = p_org AND user_id = p_user)
              AND (before::text ~* v_pattern OR after::text ~* v_pattern);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('fact_history', n);
        -- The read audit: a turn's query quoting the fact, and the fact's id (a digest of its
        -- content) among what the turn was shown.
        UPDATE context_logs SET
            query = regexp_replace(query, v_pattern, '[erased]', 'gi'),
            rewritten_query = regexp_replace(rewritten_query, v_pattern, '[erased]', 'gi'),
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
              AND (query ~* v_pattern
                   OR coalesce(rewritten_query, '') ~* v_pattern
                   OR strpos(retrieved::text, p_fact_id::text) > 0
                   OR strpos(injected::text, p_fact_id::text) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('context_logs', n);
        UPDATE user_memory SET
            working_memory = regexp_replace(working_memory, v_pattern, '[erased]', 'gi'),
            information_scaffold = _redact_jsonb_matching(information_scaffold, v_pattern),
            persistent_learned_info = _redact_jsonb_matching(persistent_learned_info, v_pattern),
            generation = gen_random_uuid(),
            erased_fact_versions = erased_fact_versions + v_version + v_requeued
            WHERE organization_id = p_org AND user_id = p_user;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('user_memory', n);
        UPDATE connections SET
            persistent_learned_info = _redact_jsonb_matching(persistent_learned_info, v_pattern)
            WHERE organization_id = p_org AND user_id = p_user
              AND persistent_learned_info::text ~* v_pattern;
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('connections', n);
        -- Not counted in the receipt: whether some cluster error quoted the text is no
        -- business of the caller's (it may be another tenant's row).
        PERFORM _redact_job_errors(ARRAY[p_fact_id::text], v_job_pattern);
        PERFORM set_config('memoryd.erasure', 'off', true);
    END IF;
    v_removed := jsonb_build_object('postgres', v_removed, 'redacted', v_redacted) || p_extra;
    UPDATE erasure_audit SET status = 'postgres_erased', removed = v_removed
        WHERE erasure_id = p_erasure_id;
    RETURN v_removed;
END $$;

CREATE OR REPLACE FUNCTION erase_memory(
    p_erasure_id uuid, p_org text, p_user text, p_subject text, p_pseudonym text,
    p_log_lock bigint, p_extra jsonb
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_removed jsonb := '{}'::jsonb;
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
    -- Not counted in the receipt: the rows are every tenant's, and a count would tell the
    -- caller whether another tenant's error holds a text the caller's own events chose.
    PERFORM _redact_job_errors(coalesce(v_quotes, '{}'));

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
        'anonymised', jsonb_build_object('credit_ledger', n)) || p_extra;
    UPDATE erasure_audit SET status = 'postgres_erased', removed = v_removed
        WHERE erasure_id = p_erasure_id;
    RETURN v_removed;
END $$;
