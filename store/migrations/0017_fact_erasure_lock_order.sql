-- A fact erasure could deadlock with the indexer. It locked the erased fact's row first, then
-- wrote the rows that quote the fact and the rows it superseded in the order of the scans,
-- while the indexer's marks (and a run's upserts) lock the rows of a memory in fact id order:
-- a mark holding a quoting row and waiting for the erased one, while the erasure held the
-- erased one and waited for the quoting row, had Postgres abort one of them. The erasure now
-- locks every fact row it writes first, in id order. The function is 0016's otherwise.
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
    SELECT content INTO v_content FROM memory_facts
        WHERE fact_id = p_fact_id AND organization_id = p_org AND user_id = p_user;
    IF FOUND THEN
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
                      AND strpos(content, v_content) > 0)
            ORDER BY fact_id FOR NO KEY UPDATE;
        -- Read again now that the row is locked: the text and sources of the row that goes.
        SELECT content, source_event_ids INTO v_content, v_sources FROM memory_facts
            WHERE fact_id = p_fact_id;
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
