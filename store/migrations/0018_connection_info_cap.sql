-- A connection's learned info keeps its latest 200 lines (domain.model.MAX_LEARNED_INFO), as
-- the memory's own does: the store cuts a connection's lines when it appends to them, and the
-- fold of the runs keeps the latest 200. A connection over 200 before that cut, and not
-- appended to since, would differ from its fold in `replay verify` and the invariant check
-- until its next append: it is cut now.
UPDATE connections SET persistent_learned_info = (
        SELECT jsonb_agg(line ORDER BY n) FROM (
            SELECT line, n FROM jsonb_array_elements(persistent_learned_info)
                WITH ORDINALITY AS lines (line, n)
            ORDER BY n DESC LIMIT 200
        ) AS kept)
    WHERE jsonb_array_length(persistent_learned_info) > 200;
