-- Forgetting a memory keeps its ledger rows under a pseudonym, and kept their entry ids. Those
-- ids derive from the memory's identity (its runs' ids, its turns' audit ids), so a user who
-- comes back after being forgotten derives them again: the same turn id, or events re-sent
-- with their ids, and the new cost is taken for the anonymised row (ON CONFLICT DO NOTHING)
-- and never booked. The anonymised rows now get new ids. The function is 0004's otherwise.
CREATE OR REPLACE FUNCTION erase_memory(
    p_erasure_id uuid, p_org text, p_user text, p_subject text, p_pseudonym text,
    p_log_lock bigint, p_extra jsonb
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_removed jsonb := '{}'::jsonb;
    n bigint;
BEGIN
    PERFORM _erasure_opened(p_erasure_id, 'memory');
    -- The log writer takes this lock shared for every memory of a batch it inserts: once it
    -- is ours, no insert of this memory is in flight, and the next sees the cut-offs.
    PERFORM pg_advisory_xact_lock(p_log_lock);
    PERFORM set_config('memoryd.erasure', 'on', true);

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
