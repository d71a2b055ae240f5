-- Which fact an erasure removed, as a keyed digest (`domain.ids.SubjectHasher.fact`): the
-- audit keeps no ids, and `erasure_pending`, which holds the fact's id, loses its row when
-- the erasure completes. Two callers erasing one fact at once both saw it held; the one that
-- waited for the memory's lock then found neither the fact nor an erasure of it and was told
-- the fact did not exist. With the digest, an erasure of a fact that an erasure removed
-- answers that erasure's receipt. NULL for an erasure of a whole memory, and for the fact
-- erasures audited before this column.
ALTER TABLE erasure_audit ADD COLUMN target text;
CREATE INDEX erasure_audit_target ON erasure_audit (subject, target, id)
    WHERE target IS NOT NULL;
