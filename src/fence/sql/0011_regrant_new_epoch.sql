-- pgfence schema, version 11: a lease row that grants a fence again after a revocation starts
-- a new epoch.
--
-- Applied by `pgfence init` after 0010 (src/fence/install.rs), in one transaction.
--
-- Until this version pgfence.lease_grant lifted a lease row that would start below the
-- fence's current epoch (max of HWM and lease epoch) to that epoch, and no further. After a
-- revocation (the row deleted, renamed away, or the table truncated: lease_epoch 0, the HWM
-- kept) that is the last leader's epoch: a row re-created with the table's default epoch, or
-- with the old epoch itself, granted the old leader's epoch again, so the leader that had been
-- cut off wrote again beside the new holder, both declaring the same epoch.
--
-- Now a row that grants a fence with no live grant (lease_epoch 0) and a HWM of 1 or more
-- starts strictly above the HWM: at HWM + 1 if it asked for less. That is a takeover (the HWM
-- goes up), so it waits for the transactions past the guard, as one does. A fence that has a
-- live grant keeps the old rule (a row below its current epoch is lifted to it, and the fence
-- does not change): a BEFORE INSERT trigger fires for an INSERT ... ON CONFLICT before the
-- conflict is found, so an upsert that meets the live row must not move the fence.
--
-- Unchanged: lowering a row's epoch below the current one is refused (PF001); a renewal does
-- nothing; a row no fence uses is left alone.

CREATE OR REPLACE FUNCTION pgfence.lease_grant(p_table text, p_row text, p_epoch bigint, p_lowering boolean)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_epoch bigint := greatest(coalesce(p_epoch, 0), 0);
    v_any   boolean := false;
    v_f     record;
BEGIN
    FOR v_f IN SELECT f.name, f.hwm, f.lease_epoch, greatest(f.hwm, f.lease_epoch) AS current
                 FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row LOOP
        IF p_lowering AND v_epoch < v_f.current THEN
            RAISE EXCEPTION 'pgfence: lease row "%" in % cannot go down to epoch %: fence "%" is at epoch % and epochs never go down',
                    p_row, p_table, v_epoch, v_f.name, v_f.current
                USING ERRCODE = 'PF001',
                      HINT = 'A lease epoch only goes up (epoch = epoch + 1 on takeover).';
        END IF;
        IF v_f.lease_epoch = 0 AND v_f.hwm >= 1 THEN
            -- Granted again after a revocation: the epochs up to the HWM belong to leaders
            -- that were cut off.
            v_epoch := greatest(v_epoch, v_f.hwm + 1);
        ELSE
            v_epoch := greatest(v_epoch, v_f.current);
        END IF;
        v_any := true;
    END LOOP;
    IF NOT v_any THEN
        RETURN NULL;  -- no fence uses this row: leave it alone
    END IF;
    -- Lock in name order so that two fences sharing a lease row cannot deadlock.
    FOR v_f IN SELECT f.name, f.hwm, f.lease_epoch
                 FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row ORDER BY f.name LOOP
        IF v_epoch > v_f.hwm THEN
            -- A takeover: wait for every transaction past the guard, so that once this
            -- commits, no older epoch commits a fenced write.
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(v_f.name));
            UPDATE pgfence.fence SET lease_epoch = v_epoch, hwm = greatest(hwm, v_epoch) WHERE name = v_f.name;
            -- Counted here too (the trigger counts it as well): a lease trigger enabled ALWAYS
            -- fires where the fence row's triggers do not (session_replication_role = replica).
            PERFORM pgfence.count_change();
        ELSIF v_f.lease_epoch IS DISTINCT FROM v_epoch THEN
            -- The count trigger takes the lock too; first, so that the lock comes before the row.
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(v_f.name));
            UPDATE pgfence.fence SET lease_epoch = v_epoch WHERE name = v_f.name;
            PERFORM pgfence.count_change();
        END IF;
    END LOOP;
    RETURN v_epoch;
END
$$;
