-- When a fact was observed (the occurred_at of its events, not the consolidation's clock), the
-- date its own words name once resolved ("yesterday" said on 8 May 2023 → 2023-05-07), and who
-- it is about when that is not the user (the speaker of a transcript line). All nullable: facts
-- written before this migration have none of them.

ALTER TABLE memory_facts
    ADD COLUMN observed_at timestamptz,
    ADD COLUMN event_date  date,
    ADD COLUMN subject     text;
