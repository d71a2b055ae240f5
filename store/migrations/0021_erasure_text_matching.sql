-- How an erasure finds the erased text in what it redacts:
-- - Whole words. A fact's text was cut out wherever it occurred, also inside a longer word:
--   erasing "database" wrote "[erased]s" for "databases", and a memory's "Python" made
--   "[erased]3" of "python3": rows that are not the fact's lost words, and what was left
--   ("[erased]s") still told what was erased. The text is now found only where it is not
--   part of a longer word: on a side where it starts (ends) with a word character, the
--   character before (after) it must not be one. A text that starts or ends with another
--   character ("(ok)", "C++") is found as before on that side. What the database's locale
--   does not take for a word character (in the C locale, every non-ASCII one) stands between
--   words: redacting too much there is harmless, redacting too little is not. A word right
--   after a JSON or Python escape (the "bar" of "foo\nbar", of "\u00e9bar") starts a word
--   although a letter precedes it. `_redact_quotes` (the cluster jobs' errors) follows the
--   same rule.
-- - Quotes cut short. An error quoting the text may hold only its start (pydantic shows a
--   long value as its first and last 24 characters around "...", a reason is cut to a
--   length, an answer stops at the token cap): no whole text to find. In the free texts
--   that can be cut so (the runs' errors and raw answers, the read audit's degraded reason,
--   the cluster jobs' errors) an erasure now also redacts a piece of the text of at least 8
--   characters that is cut where the quote is: its start (from a word's start) before
--   "...", "…" or the end of the column, its end (to a word's end) after "..." or "…"
--   (`_cut_quote_pattern`). 8 as in `_redact_quotes`:
--   a shorter piece is too common to be taken for a quote.
-- - The read audit's `degraded_reason` (an index error, which may quote the query) was not
--   redacted at all.
-- The functions are 0016's otherwise, `erase_fact` 0020's; `erase_memory` needs no change
-- (its `_redact_quotes` changes here).

-- Where a text starting (ending) with a word character may start (end): not next to another
-- one, except right after an escape. '' for a text that starts (ends) with another one.
CREATE FUNCTION _word_start(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_text ~ '^\s*[[:alnum:]_]'
                THEN '(?:(?<![[:alnum:]_])|(?<=\\[nrtbf])|(?<=\\u[[:xdigit:]]{4}))' ELSE '' END
$$;

CREATE FUNCTION _word_end(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_text ~ '[[:alnum:]_]\s*$' THEN '(?![[:alnum:]_])' ELSE '' END
$$;

-- `p_body`, a pattern of `p_text`, found as whole words only.
CREATE FUNCTION _whole_words(p_text text, p_body text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT _word_start(p_text) || p_body || _word_end(p_text)
$$;

-- 0016's, each quote found as whole words only.
CREATE OR REPLACE FUNCTION _redact_quotes(p_text text, p_quotes text[]) RETURNS text
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
        p_text := regexp_replace(p_text, _whole_words(q, _regex_literal(q)), '[erased]', 'g');
        p_text := regexp_replace(p_text, _whole_words(q, _regex_literal(v_json)), '[erased]',
                                 'g');
    END LOOP;
    RETURN p_text;
END $$;

-- 0016's, as whole words only.
CREATE OR REPLACE FUNCTION _quote_pattern(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT _whole_words(p_text, string_agg(
        CASE WHEN j = w THEN _regex_literal(w)
             ELSE '(?:' || _regex_literal(w) || '|' || _regex_literal(j) || ')' END,
        '(?:\s|\\[nrt])+' ORDER BY i))
    FROM regexp_split_to_table(regexp_replace(p_text, '^\s+|\s+$', '', 'g'), '\s+')
        WITH ORDINALITY AS words(w, i),
        LATERAL (SELECT substr(to_jsonb(w)::text, 2, length(to_jsonb(w)::text) - 2)) AS js(j)
    WHERE w <> ''
$$;

-- What is left of `p_text` in a quote cut short: a piece of at least 8 of its units (its
-- characters, a run of whitespace one), its start ending at a cut ("...", "…", the
-- end of the column) or its end starting at one ("..." or "…"). NULL for a text of 8 units
-- or fewer: its pieces are too short to be taken for a quote, and its whole is found by
-- `_quote_pattern`.
CREATE FUNCTION _cut_quote_pattern(p_text text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_units text[];
    v_head text := '';
    v_tail text := '';
    n int;
BEGIN
    SELECT array_agg(_regex_literal(c) ORDER BY i) INTO v_units
        FROM regexp_split_to_table(
            regexp_replace(regexp_replace(p_text, '^\s+|\s+$', '', 'g'), '\s+', ' ', 'g'), ''
        ) WITH ORDINALITY AS x(c, i);
    n := coalesce(array_length(v_units, 1), 0);
    IF n <= 8 THEN
        RETURN NULL;
    END IF;
    FOR i IN 1 .. n LOOP
        IF v_units[i] = ' ' THEN
            v_units[i] := '(?:\s|\\[nrt])+';
        END IF;
    END LOOP;
    -- The start, 8 units and as many more as the quote kept, each only after the one before.
    FOR i IN REVERSE n - 1 .. 9 LOOP
        v_head := '(?:' || v_units[i] || v_head || ')?';
    END LOOP;
    v_head := array_to_string(v_units[1:8], '') || v_head;
    -- The end, likewise from its last 8 units backwards.
    FOR i IN 2 .. n - 8 LOOP
        v_tail := '(?:' || v_tail || v_units[i] || ')?';
    END LOOP;
    v_tail := v_tail || array_to_string(v_units[n - 7:n], '');
    RETURN '(?:' || _word_start(p_text) || v_head || '(?=\.\.\.|…|$))'
        || '|(?:(?<=\.\.\.|…)' || v_tail || _word_end(p_text) || ')';
END $$;

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
    v_cut_pattern text;  -- what a quote cut short keeps of them (`_cut_quote_pattern`)
    v_error_pattern text;  -- for the free texts that can be cut short: both
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
               string_agg('(?:' || p || ')', '|') FILTER (WHERE long),
               string_agg('(?:' || c || ')', '|')
            INTO v_pattern, v_job_pattern, v_cut_pattern FROM (
            SELECT _quote_pattern(t) AS p, _cut_quote_pattern(t) AS c,
                   bool_or(length(t) >= 8) AS long FROM (
                SELECT v_content AS t
                UNION
                SELECT v.doc ->> 'content'
                FROM fact_history h, LATERAL (VALUES (h.before), (h.after)) AS v(doc)
                WHERE h.fact_id = p_fact_id
            ) AS texts GROUP BY 1, 2
        ) AS patterns WHERE p IS NOT NULL;
        -- A text of no words has no pattern: one that matches nothing, not NULL (which
        -- regexp_replace would write over W, the runs' answers and errors).
        v_pattern := coalesce(v_pattern, '(?!)');
        v_error_pattern := v_pattern || coalesce('|' || v_cut_pattern, '');
        -- A cut piece is of a text over 8 characters: the cluster jobs' guard holds.
        v_job_pattern := v_job_pattern || coalesce('|' || v_cut_pattern, '');
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
            raw_response = regexp_replace(raw_response, v_error_pattern, '[erased]', 'gi'),
            error = replace(regexp_replace(error, v_error_pattern, '[erased]', 'gi'),
                            p_fact_id::text, '[erased]')
            WHERE organization_id = p_org AND user_id = p_user
              AND (strpos(output::text, p_fact_id::text) > 0
                   OR output::text ~* v_pattern
                   OR raw_response ~* v_error_pattern
                   OR error ~* v_error_pattern
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
            degraded_reason = regexp_replace(degraded_reason, v_error_pattern, '[erased]', 'gi'),
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
                   OR coalesce(degraded_reason, '') ~* v_error_pattern
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
