-- 0024 made every pattern of a fact erasure also match each non-ASCII character's escapes,
-- and every text paid for them: the escapes make the regular expression several times larger.
-- An escape starts with a backslash and "u", "x" or "U", so in a text without such a pair the
-- escapes find nothing, and the pattern without them (0021's) finds the very same matches:
-- neither pattern has a non-greedy part, so each takes the longest match at the first place
-- one starts, and the places and lengths open to both are the same. An erasure now builds
-- each pattern both ways and matches a text with the escapes only where it holds such a pair
-- (`_pattern_for`; in a JSON value, each string and key by itself). Same rows found, same text
-- written as 0024.
-- The pattern builders take `p_escapes` (true, as before, unless told). `erase_fact` is 0021's
-- re-created, each pattern now a pair (`_fact_patterns`) applied by `_matches`,
-- `_redact_matching` and the pair's overloads of `_redact_jsonb_matching` and
-- `_redact_job_errors`.
-- Measured (C locale, a shared 2-core machine, rows of ~1,100 characters without escapes): a
-- 62-character Cyrillic fact over 5,000 runs' raw answers 14-16 s with 0024, 3.7-5.4 s now
-- (0021: 3.4 s), answers all holding "\n" 11.7 s against 3.6 s, over 5,000 events 0.24-0.33 s
-- against 0.14-0.20 s; a 600-character mixed-script fact with 4 versions 17 ms a raw answer
-- against 6-9 ms (0021: 5 ms). A text holding an escape costs what it did.

-- 0024's, its escapes only if `p_escapes` (without them: 0021's).
DROP FUNCTION _fold_unit_pattern(text);
CREATE FUNCTION _fold_unit_pattern(p_unit text, p_escapes boolean DEFAULT true) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_others text[] := ARRAY(SELECT ch FROM case_folds WHERE folded = p_unit ORDER BY ch);
    v_escapes text := '';
BEGIN
    IF length(p_unit) > 1 THEN
        RETURN '(?:' || (SELECT string_agg(_fold_unit_pattern(c, p_escapes), '' ORDER BY i)
                         FROM regexp_split_to_table(p_unit, '') WITH ORDINALITY AS u(c, i))
            || (SELECT string_agg('|' || _regex_literal(o)
                                  || CASE WHEN p_escapes THEN _escape_alternatives(o) ELSE '' END,
                                  '')
                FROM unnest(v_others) AS o)
            || ')';
    END IF;
    IF p_escapes THEN
        v_escapes := _escape_alternatives(p_unit)
            || (SELECT coalesce(string_agg(_escape_alternatives(o), '' ORDER BY o), '')
                FROM unnest(v_others) AS o);
    END IF;
    IF v_others = '{}' THEN
        IF v_escapes = '' THEN
            RETURN _regex_literal(p_unit);
        END IF;
        RETURN '(?:' || _regex_literal(p_unit) || v_escapes || ')';
    END IF;
    -- Letters only, in the brackets: none needs escaping there.
    IF v_escapes = '' THEN
        RETURN '[' || p_unit || array_to_string(v_others, '') || ']';
    END IF;
    RETURN '(?:[' || p_unit || array_to_string(v_others, '') || ']' || v_escapes || ')';
END $$;

-- 0021's, its units' escapes only if `p_escapes`; the strings some character folds to tried
-- only where the text goes on as one of them begins: their loop was most of its time, and an
-- erasure now builds its patterns twice.
DROP FUNCTION _fold_units(text);
CREATE FUNCTION _fold_units(p_text text, p_escapes boolean DEFAULT true) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_folded text;
    v_unit text;
    v_at int := 1;
    v_units text[] := '{}';
    -- The strings some character folds to, the longest first.
    v_longs text[] := ARRAY(SELECT s FROM (SELECT DISTINCT folded FROM case_folds) AS f(s)
                            WHERE length(s) > 1 ORDER BY length(s) DESC, s);
    v_long text;
    -- Their first two characters (each is of two or more).
    v_starts text[] := ARRAY(SELECT DISTINCT left(s, 2) FROM unnest(v_longs) AS s);
BEGIN
    SELECT string_agg(coalesce(f.folded, x.c), '' ORDER BY x.i) INTO v_folded
        FROM regexp_split_to_table(p_text, '') WITH ORDINALITY AS x(c, i)
        LEFT JOIN case_folds f ON f.ch = x.c;
    WHILE v_at <= coalesce(length(v_folded), 0) LOOP
        v_unit := substr(v_folded, v_at, 1);
        IF substr(v_folded, v_at, 2) = ANY (v_starts) THEN
            FOREACH v_long IN ARRAY v_longs LOOP
                IF substr(v_folded, v_at, length(v_long)) = v_long THEN
                    v_unit := v_long;
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        v_units := v_units || _fold_unit_pattern(v_unit, p_escapes);
        v_at := v_at + length(v_unit);
    END LOOP;
    RETURN v_units;
END $$;

-- 0021's, its units' escapes only if `p_escapes`.
DROP FUNCTION _quote_pattern(text);
CREATE FUNCTION _quote_pattern(p_text text, p_escapes boolean DEFAULT true) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT _whole_words(p_text, string_agg(
        CASE WHEN j = w THEN array_to_string(_fold_units(w, p_escapes), '')
             ELSE '(?:' || array_to_string(_fold_units(w, p_escapes), '') || '|'
                  || array_to_string(_fold_units(j, p_escapes), '') || ')' END,
        '(?:\s|\\[nrt])+' ORDER BY i))
    FROM regexp_split_to_table(regexp_replace(p_text, '^\s+|\s+$', '', 'g'), '\s+')
        WITH ORDINALITY AS words(w, i),
        LATERAL (SELECT substr(to_jsonb(w)::text, 2, length(to_jsonb(w)::text) - 2)) AS js(j)
    WHERE w <> ''
$$;

-- 0021's, its units' escapes only if `p_escapes`.
DROP FUNCTION _cut_quote_pattern(text);
CREATE FUNCTION _cut_quote_pattern(p_text text, p_escapes boolean DEFAULT true) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_units text[];
    v_head text := '';
    v_tail text := '';
    n int;
BEGIN
    v_units := _fold_units(regexp_replace(regexp_replace(p_text, '^\s+|\s+$', '', 'g'),
                                          '\s+', ' ', 'g'), p_escapes);
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

-- The patterns an erasure of a fact finds its text by (0021's, from `erase_fact`), with or
-- without escapes: `quote`, every version's text (`_quote_pattern`); `error`, for the free
-- texts that can be cut short, also what a quote cut short keeps of them
-- (`_cut_quote_pattern`); `job`, for the cluster jobs' errors, both of the versions of 8
-- characters or more, NULL if none is. Read before the fact's history goes.
CREATE FUNCTION _fact_patterns(
    p_fact_id uuid, p_content text, p_escapes boolean, OUT quote text, OUT error text,
    OUT job text
) LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_cut text;
BEGIN
    -- Every version's text: the same fact (its id is of the normalized text) may have been
    -- written in other case or spacing.
    -- The cluster jobs' errors are every tenant's: there, a text under 8 characters ("ok",
    -- "yes") would cut words out of them while quoting nobody (the guard of `_redact_quotes`),
    -- so `job` leaves those out.
    SELECT string_agg('(?:' || p || ')', '|'),
           string_agg('(?:' || p || ')', '|') FILTER (WHERE long),
           string_agg('(?:' || c || ')', '|')
        INTO quote, job, v_cut FROM (
        SELECT _quote_pattern(t, p_escapes) AS p, _cut_quote_pattern(t, p_escapes) AS c,
               bool_or(length(t) >= 8) AS long FROM (
            SELECT p_content AS t
            UNION
            SELECT v.doc ->> 'content'
            FROM fact_history h, LATERAL (VALUES (h.before), (h.after)) AS v(doc)
            WHERE h.fact_id = p_fact_id
        ) AS texts GROUP BY 1, 2
    ) AS patterns WHERE p IS NOT NULL;
    -- A text of no words has no pattern: one that matches nothing, not NULL (which
    -- regexp_replace would write over W, the runs' answers and errors).
    quote := coalesce(quote, '(?!)');
    error := quote || coalesce('|' || v_cut, '');
    -- A cut piece is of a text over 8 characters: the cluster jobs' guard holds.
    job := job || coalesce('|' || v_cut, '');
END $$;

-- Of a pattern pair (with escapes, without), the one to match `p_text` with. Each escape
-- (`_escape_alternatives`) is a backslash and "u", "x" or "U", which the 'i' flag also takes
-- in the other case: where no backslash is followed by one of those, the pattern without
-- escapes finds the same. So a JSON text whose backslashes escape only quotes and line
-- breaks, as a model's answer, is matched without them too.
CREATE FUNCTION _pattern_for(p_text text, p_patterns text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_patterns[CASE WHEN strpos(p_text, E'\\') > 0 AND p_text ~ '\\[uUxX]' THEN 1
                           ELSE 2 END]
$$;

-- Whether `p_text` holds what the pair finds, in any case.
CREATE FUNCTION _matches(p_text text, p_patterns text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_text ~* _pattern_for(p_text, p_patterns)
$$;

-- `p_text` with what the pair finds, in any case, replaced.
CREATE FUNCTION _redact_matching(p_text text, p_patterns text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT regexp_replace(p_text, _pattern_for(p_text, p_patterns), '[erased]', 'gi')
$$;

-- 0016's, with a pattern pair: each string and key matched with the one `_pattern_for` picks.
CREATE FUNCTION _redact_jsonb_matching(j jsonb, p_patterns text[]) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    CASE jsonb_typeof(j)
    WHEN 'string' THEN
        RETURN to_jsonb(_redact_matching(j #>> '{}', p_patterns));
    WHEN 'array' THEN
        RETURN coalesce((SELECT jsonb_agg(_redact_jsonb_matching(e, p_patterns) ORDER BY i)
                         FROM jsonb_array_elements(j) WITH ORDINALITY AS a(e, i)), '[]'::jsonb);
    WHEN 'object' THEN
        RETURN coalesce((SELECT jsonb_object_agg(_redact_matching(k, p_patterns),
                                                 _redact_jsonb_matching(v, p_patterns))
                         FROM jsonb_each(j) AS o(k, v)), '{}'::jsonb);
    ELSE
        RETURN j;
    END CASE;
END $$;

-- 0016's, with a pattern pair (NULL: the quotes only).
CREATE FUNCTION _redact_job_errors(p_quotes text[], p_patterns text[]) RETURNS jsonb
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
        IF p_patterns IS NOT NULL THEN
            v_redacted := _redact_matching(v_redacted, p_patterns);
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
    -- `_fact_patterns`, each a pair: with escapes, without.
    v_pattern text[];
    v_error_pattern text[];
    v_job_pattern text[];  -- NULL if no version is of 8 characters or more
    v_subject text;
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'fact');
    SELECT content INTO v_content FROM memory_facts
        WHERE fact_id = p_fact_id AND organization_id = p_org AND user_id = p_user;
    IF FOUND THEN
        SELECT ARRAY[e.quote, p.quote], ARRAY[e.error, p.error],
               CASE WHEN e.job IS NOT NULL THEN ARRAY[e.job, p.job] END
            INTO v_pattern, v_error_pattern, v_job_pattern
            FROM _fact_patterns(p_fact_id, v_content, true) AS e,
                 _fact_patterns(p_fact_id, v_content, false) AS p;
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
                      AND _matches(content, v_pattern))
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
            raw_response = _redact_matching(raw_response, v_error_pattern),
            error = replace(_redact_matching(error, v_error_pattern), p_fact_id::text,
                            '[erased]')
            WHERE organization_id = p_org AND user_id = p_user
              AND (strpos(output::text, p_fact_id::text) > 0
                   OR _matches(output::text, v_pattern)
                   OR _matches(raw_response, v_error_pattern)
                   OR _matches(error, v_error_pattern)
                   OR strpos(error, p_fact_id::text) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('consolidation_runs', n);
        UPDATE context_events SET content = CASE
                WHEN event_type = 'scaffold_update' THEN '"[erased]"' ELSE '[erased]' END
            WHERE organization_id = p_org AND user_id = p_user
              AND (event_id = ANY (v_sources) OR _matches(content, v_pattern));
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('context_events', n);
        -- Another fact that quotes this one loses the text too, as its entries in the runs'
        -- outputs just did (else the fold of the runs no longer gives the live row), and goes
        -- back to the index queue so that its vector and document are of the redacted text.
        -- Those indexed already are embedded and booked again (those pending are booked once).
        SELECT count(*) INTO v_requeued FROM memory_facts
            WHERE organization_id = p_org AND user_id = p_user AND _matches(content, v_pattern)
              AND indexed_at IS NOT NULL;
        UPDATE memory_facts SET content = _redact_matching(content, v_pattern),
                indexed_at = NULL
            WHERE organization_id = p_org AND user_id = p_user AND _matches(content, v_pattern);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('memory_facts', n);
        UPDATE fact_history SET before = _redact_jsonb_matching(before, v_pattern),
                after = _redact_jsonb_matching(after, v_pattern)
            WHERE fact_id IN (SELECT fact_id FROM memory_facts
                              WHERE organization_id = p_org AND user_id = p_user)
              AND (_matches(before::text, v_pattern) OR _matches(after::text, v_pattern));
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('fact_history', n);
        -- The read audit: a turn's query quoting the fact, and the fact's id (a digest of its
        -- content) among what the turn was shown.
        UPDATE context_logs SET
            query = _redact_matching(query, v_pattern),
            rewritten_query = _redact_matching(rewritten_query, v_pattern),
            degraded_reason = _redact_matching(degraded_reason, v_error_pattern),
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
              AND (_matches(query, v_pattern)
                   OR _matches(coalesce(rewritten_query, ''), v_pattern)
                   OR _matches(coalesce(degraded_reason, ''), v_error_pattern)
                   OR strpos(retrieved::text, p_fact_id::text) > 0
                   OR strpos(injected::text, p_fact_id::text) > 0);
        GET DIAGNOSTICS n = ROW_COUNT;
        v_redacted := v_redacted || jsonb_build_object('context_logs', n);
        UPDATE user_memory SET
            working_memory = _redact_matching(working_memory, v_pattern),
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
              AND _matches(persistent_learned_info::text, v_pattern);
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
