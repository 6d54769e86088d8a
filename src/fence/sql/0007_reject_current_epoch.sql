-- pgfence schema, version 7: refusals the proxy decides name the fence's current epoch.
--
-- Applied by `pgfence init` after 0006 (src/fence/install.rs), in one transaction.
--
-- PF002 (no epoch) and PF004 (cannot be analysed) are decided by the proxy and raised by
-- pgfence.reject(code, message, hint), which the proxy gave the fence's name only inside the
-- message, and whose messages so lacked the fence's current epoch, which the contract asks of
-- every refusal (only the database knows it). This version adds pgfence.reject(code,
-- message, hint, fences): it appends the current epoch of each fence named (the HWM, which the
-- lease epoch never exceeds; 0 for a fence no epoch has written yet) and raises as the
-- three-argument form does. It reads without locking: the number is informational, the
-- refusal does not depend on it. Like the guard it reads the fence rows with the installer's
-- rights (SECURITY DEFINER), whatever a role was left of PUBLIC's SELECT on pgfence.fence: a
-- refusal must not turn into a permission error. The three-argument form stays for proxies
-- of version 6.

CREATE FUNCTION pgfence.reject(p_code text, p_message text, p_hint text, p_fences text[])
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_current text;
BEGIN
    IF cardinality(p_fences) = 1 THEN
        SELECT coalesce(max(f.hwm), 0)::text INTO v_current FROM pgfence.fence f WHERE f.name = p_fences[1];
        v_current := ' (current epoch ' || v_current || ')';
    ELSIF cardinality(p_fences) > 1 THEN
        SELECT ' (current epochs: ' || string_agg(format('"%s" %s', n.name, coalesce(f.hwm, 0)), ', ' ORDER BY n.ord) || ')'
          INTO v_current
          FROM unnest(p_fences) WITH ORDINALITY AS n(name, ord)
          LEFT JOIN pgfence.fence f ON f.name = n.name;
    END IF;
    PERFORM pgfence.reject(p_code, coalesce(p_message, 'pgfence: rejected') || coalesce(v_current, ''), p_hint);
END
$$;

COMMENT ON FUNCTION pgfence.reject(text, text, text, text[]) IS
    'pgfence: raises a refusal the proxy decided (PF002, PF004), naming each fence''s current epoch';

REVOKE ALL ON FUNCTION pgfence.reject(text, text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.reject(text, text, text, text[]) TO PUBLIC;
