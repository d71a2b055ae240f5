-- Forgetting a memory, or one fact, left its text where it should not be, and a fact erasure
-- was not in step with the rest of the store:
-- - Free-text error columns. A failed run's error can quote the model's answer (a schema
--   error shows the values it refused), and the cluster jobs record their last error
--   (scheduled_jobs.last_error) and every failed maintenance run's (maintenance_runs.error),
--   which a driver error can fill with a row's values. Those rows stay: they are the record
--   of costs, counts and outages. Their error text loses what it quotes instead, as the
--   runs' raw answers did: `erase_fact` redacts the fact's text in the memory's failed runs
--   and in the cluster jobs' errors; `erase_memory` (which deletes the memory's runs)
--   redacts, in the cluster jobs' errors, its facts' text and ids and the text of the events
--   it removes. A quote cut short or escaped otherwise (pydantic shortens a long value it
--   shows, and shows it with Python's quoting) is not found; neither are the dead letters'
--   reasons, which are Kafka headers beside the event and go with the topic's retention.
-- - Wording. A fact's id is of its normalized text (domain.ids.normalize_content: case and
--   runs of whitespace do not make another fact), yet the erasure found its text by the exact
--   wording. It now finds each version's text (the row's and its history's) whatever its case
--   and spacing, as written or inside a JSON string. (Postgres folds case as `lower` does,
--   where Python's `casefold` also folds a few letters such as ß.)
-- - Lock order. It locked the erased fact's row first, then the rows quoting it and the rows
--   it superseded in scan order, while the indexer's marks and a run's upserts lock a
--   memory's rows in fact id order: the two could deadlock. It now locks every fact row it
--   writes first, in id order.
-- - The invariant checker bounds a memory's embedding units by the versions of its facts. The
--   erased fact's versions were booked and its row is gone, and a fact quoting it is redacted
--   in place (same version), then embedded and booked again by the indexer. `erase_fact` adds
--   both to the memory's `erased_fact_versions`: the erased fact's versions booked, and one
--   per indexed fact it redacted.
-- The functions are 0012's and 0014's otherwise.

-- `text` with each of `quotes` (and its form inside a JSON string) replaced by the marker,
-- the longest first: a quote inside a longer one must not break the longer one's match.
-- Quotes under 8 characters are left: the errors are every tenant's, and a memory's "ok" or
-- "yes" would cut words out of them (and out of the marker) while quoting nobody.
CREATE FUNCTION _redact_quotes(p_text text, p_quotes text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    q text;
    v_json text;
BEGIN
    IF p_text IS NULL THEN
        RETURN NULL;
    END IF;
    FOR q IN SELECT x FROM unnest(p_quotes) AS x WHERE length(x) >= 8 ORDER BY length(x) DESC
    LOOP
        v_json := to_jsonb(q)::text;
        v_json := substr(v_json, 2, length(v_json) - 2);
        CONTINUE WHEN strpos(p_text, q) = 0 AND strpos(p_text, v_json) = 0;
        p_text := replace(replace(p_text, q, '[erased]'), v_json, '[erased]');
    END LOOP;
    RETURN p_text;
END $$;

-- `p_text` matching itself only, in a regular expression.
CREATE FUNCTION _regex_literal(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT regexp_replace(p_text, '([.^$*+?(){}|\[\]\\])', '\\\1', 'g')
$$;

-- A regular expression finding `p_text` whatever its case (the caller gives the 'i' flag)
-- and the whitespace between its words, as written or inside a JSON string; NULL for a text
-- of no words.
CREATE FUNCTION _quote_pattern(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(
        CASE WHEN j = w THEN _regex_literal(w)
             ELSE '(?:' || _regex_literal(w) || '|' || _regex_literal(j) || ')' END,
        '(?:\s|\\[nrt])+' ORDER BY i)
    FROM regexp_split_to_table(regexp_replace(p_text, '^\s+|\s+$', '', 'g'), '\s+')
        WITH ORDINALITY AS words(w, i),
        LATERAL (SELECT substr(to_jsonb(w)::text, 2, length(to_jsonb(w)::text) - 2)) AS js(j)
    WHERE w <> ''
$$;

-- Every string in a JSON value (keys too) with what `p_pattern` finds, in any case, replaced.
CREATE FUNCTION _redact_jsonb_matching(j jsonb, p_pattern text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    CASE jsonb_typeof(j)
    WHEN 'string' THEN
        RETURN to_jsonb(regexp_replace(j #>> '{}', p_pattern, '[erased]', 'gi'));
    WHEN 'array' THEN
        RETURN coalesce((SELECT jsonb_agg(_redact_jsonb_matching(e, p_pattern) ORDER BY i)
                         FROM jsonb_array_elements(j) WITH ORDINALITY AS a(e, i)), '[]'::jsonb);
    WHEN 'object' THEN
        RETURN coalesce((SELECT jsonb_object_agg(regexp_replace(k, p_pattern, '[erased]', 'gi'),
                                                 _redact_jsonb_matching(v, p_pattern))
                         FROM jsonb_each(j) AS o(k, v)), '{}'::jsonb);
    ELSE
        RETURN j;
    END CASE;
END $$;

-- The cluster jobs' errors without these quotes; returns how many rows of each table changed.
-- Worked per distinct error: a job failing every tick records the same one many times. The
-- caller has set `memoryd.erasure` (maintenance_runs is append-only).
CREATE FUNCTION _redact_job_errors(p_quotes text[], p_pattern text DEFAULT NULL) RETURNS jsonb
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
        IF p_pattern IS NOT NULL THEN
            v_redacted := regexp_replace(v_redacted, p_pattern, '[erased]', 'gi');
        END IF;
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

ALTER TABLE user_memory ADD COLUMN erased_fact_versions bigint NOT NULL DEFAULT 0;

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
    v_subject text;
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'fact');
    SELECT content INTO v_content FROM memory_facts
        WHERE fact_id = p_fact_id AND organization_id = p_org AND user_id = p_user;
    IF FOUND THEN
        -- Every version's text: the same fact (its id is of the normalized text) may have
        -- been written in other case or spacing.
        SELECT string_agg('(?:' || p || ')', '|') INTO v_pattern FROM (
            SELECT DISTINCT _quote_pattern(t) AS p FROM (
                SELECT v_content AS t
                UNION
                SELECT v.doc ->> 'content'
                FROM fact_history h, LATERAL (VALUES (h.before), (h.after)) AS v(doc)
                WHERE h.fact_id = p_fact_id
            ) AS texts
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
        v_redacted := v_redacted || _redact_job_errors(ARRAY[p_fact_id::text], v_pattern);
        PERFORM set_config('memoryd.erasure', 'off', true);
    END IF;
    v_removed := jsonb_build_object('postgres', v_removed, 'redacted', v_redacted) || p_extra;
    UPDATE erasure_audit SET status = 'postgres_erased', removed = v_removed
        WHERE erasure_id = p_erasure_id;
    RETURN v_removed;
END $$;
