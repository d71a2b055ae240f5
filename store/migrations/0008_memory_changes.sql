-- Every change of a memory's stamp (a run's new version, an erasure's new generation, a new or
-- removed memory) is announced on the channel `memoryd_memory` when its transaction commits,
-- with the memory's key as JSON: read processes keep the stamps they checked and drop one when
-- it is announced, so a turn needs no round trip to know its cached injection is current.
CREATE FUNCTION memoryd_announce_memory_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r user_memory;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := OLD;
    ELSE
        r := NEW;
    END IF;
    PERFORM pg_notify(
        'memoryd_memory', json_build_object('o', r.organization_id, 'u', r.user_id)::text
    );
    RETURN NULL;
END;
$$;

CREATE TRIGGER user_memory_announce_change
    AFTER INSERT OR DELETE OR UPDATE OF version, generation, organization_id, user_id
    ON user_memory FOR EACH ROW EXECUTE FUNCTION memoryd_announce_memory_change();
