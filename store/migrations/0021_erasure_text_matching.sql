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
-- The functions are 0016's otherwise; `erase_fact` and `erase_memory` need no change.

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

