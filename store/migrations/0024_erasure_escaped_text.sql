-- Text written by Python may spell a non-ASCII character as an escape: JSON written with
-- `ensure_ascii` (json.dumps's default: "José" as "Jos\u00e9", a character beyond the BMP as
-- a surrogate pair), and `repr` or `ascii` ("\xe9", "\u200b", "\U0001f332"). memoryd writes
-- its own JSON text unescaped, and jsonb columns hold it decoded, but text columns keep what
-- others wrote as they wrote it: a client's scaffold update (its JSON as sent), a model's raw
-- answer, an error quoting either. An erasure found the text there only as written or as
-- Postgres writes it inside a JSON string, so the escaped copy stayed. Now every non-ASCII
-- character of a fact's pattern (and each of its case variants) also matches its escapes
-- (`_escape_alternatives`, through `_fold_unit_pattern`, which `_quote_pattern` and
-- `_cut_quote_pattern` build on), and a forget's quotes in the cluster jobs' errors are also
-- found as JSON with `ensure_ascii` spells them (`_redact_quotes`). The functions are 0021's
-- otherwise; `erase_fact` and `erase_memory` need no change.

-- The escapes Python may write for the character `p_char`, each as '|' and a regular
-- expression ('' for an ASCII character: its escapes are no one's default). Hex digits in
-- either case are found through the caller's 'i' flag.
CREATE FUNCTION _escape_alternatives(p_char text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN c < 128 THEN ''
        WHEN c < 256 THEN '|\\u' || lpad(to_hex(c), 4, '0') || '|\\x' || lpad(to_hex(c), 2, '0')
        WHEN c < 65536 THEN '|\\u' || lpad(to_hex(c), 4, '0')
        ELSE '|\\U' || lpad(to_hex(c), 8, '0')
             || '|\\u' || to_hex(55296 + ((c - 65536) >> 10))
             || '\\u' || to_hex(56320 + ((c - 65536) & 1023))
    END
    FROM (SELECT ascii(p_char) AS c) AS x
$$;

-- `p_text` as JSON with `ensure_ascii` writes it: every non-ASCII character as \uXXXX.
CREATE FUNCTION _ascii_escaped(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(string_agg(CASE
        WHEN ascii(c) < 128 THEN c
        WHEN ascii(c) < 65536 THEN '\u' || lpad(to_hex(ascii(c)), 4, '0')
        ELSE '\u' || to_hex(55296 + ((ascii(c) - 65536) >> 10))
             || '\u' || to_hex(56320 + ((ascii(c) - 65536) & 1023))
    END, '' ORDER BY i), '')
    FROM regexp_split_to_table(p_text, '') WITH ORDINALITY AS x(c, i)
$$;

-- 0021's, each character that is not ASCII also found as its escapes.
CREATE OR REPLACE FUNCTION _fold_unit_pattern(p_unit text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_others text[] := ARRAY(SELECT ch FROM case_folds WHERE folded = p_unit ORDER BY ch);
    v_escapes text;
BEGIN
    IF length(p_unit) > 1 THEN
        RETURN '(?:' || (SELECT string_agg(_fold_unit_pattern(c), '' ORDER BY i)
                         FROM regexp_split_to_table(p_unit, '') WITH ORDINALITY AS u(c, i))
            || (SELECT string_agg('|' || _regex_literal(o) || _escape_alternatives(o), '')
                FROM unnest(v_others) AS o)
            || ')';
    END IF;
    v_escapes := _escape_alternatives(p_unit)
        || (SELECT coalesce(string_agg(_escape_alternatives(o), '' ORDER BY o), '')
            FROM unnest(v_others) AS o);
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

-- 0021's, each quote also found as JSON with `ensure_ascii` spells it (as exactly as the other
-- two forms: a forget's quotes are the memory's texts, found as written).
CREATE OR REPLACE FUNCTION _redact_quotes(p_text text, p_quotes text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    q text;
    v_json text;
    v_ascii text;
BEGIN
    IF p_text IS NULL THEN
        RETURN NULL;
    END IF;
    FOR q IN SELECT x FROM unnest(p_quotes) AS x WHERE length(x) >= 8 ORDER BY length(x) DESC
    LOOP
        v_json := to_jsonb(q)::text;
        v_json := substr(v_json, 2, length(v_json) - 2);
        v_ascii := _ascii_escaped(v_json);
        CONTINUE WHEN strpos(p_text, q) = 0 AND strpos(p_text, v_json) = 0
                  AND strpos(p_text, v_ascii) = 0;
        p_text := regexp_replace(p_text, _whole_words(q, _regex_literal(q)), '[erased]', 'g');
        p_text := regexp_replace(p_text, _whole_words(q, _regex_literal(v_json)), '[erased]',
                                 'g');
        IF v_ascii <> v_json THEN  -- json.dumps writes lower-case hex digits, as to_hex
            p_text := regexp_replace(p_text, _whole_words(q, _regex_literal(v_ascii)),
                                     '[erased]', 'g');
        END IF;
    END LOOP;
    RETURN p_text;
END $$;
