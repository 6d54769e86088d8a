-- pgfence schema, version 9: the steady state of a fence coupled to a lease is an expression too.
--
-- Applied by `pgfence init` after 0008 (src/fence/install.rs), in one transaction.
--
-- Version 6 made the steady-state guard of a fence without a lease an inlined expression that
-- trusts a recorded count (version 5) instead of re-reading the fence row. A fence with a
-- lease still called pgfence.guard_slow (PL/pgSQL) in every transaction, which reads the
-- fence row and looks the lease trigger up in pg_trigger: about three times what the
-- expression costs. This version gives such fences the same steady state:
--
-- * The count now also moves when a fence row's lease_epoch, lease_table or lease_row
--   changes, not only its hwm or name: every value the lease path decides on. Such a change
--   takes the fence's lock exclusive first (a second count trigger, pgfence_fence_changed_lease,
--   and pgfence.lease_grant and pgfence.lease_revoke before they update the row, so that they
--   take the lock and then the row, as a takeover does), so it waits for the transactions
--   past the guard, as a takeover does: a revocation (lease row deleted, renamed away,
--   truncated) now waits for them too. The lease functions also count explicitly, as the full
--   guard's bump does: a lease trigger enabled ALWAYS fires under session_replication_role =
--   replica, where the fence row's triggers do not.
-- * pgfence.guard_slow (version 5's guard), on a lease-coupled pass, records the count it
--   read under the lock, before the row, in pgfence.lease_checked, beside the marker
--   pgfence.lease_passed ("<epoch> <keep HWM> <length of lease table>:<lease table> <fence>",
--   which no two different calls share). As for the fences without a lease, not in a
--   transaction that holds the fence's lock exclusive: one that changed the fence row itself.
--   Only when not recorded already: a caller of pgfence.guard (a pgfence older than this
--   schema) still comes here in every transaction, and the pg_locks check is not free.
-- * pgfence.guard_lease(fence, epoch, lease table, keep HWM, trigger in place) is the
--   steady state: for the marker's call, at read committed, it takes the fence's lock shared
--   and returns if the count is the recorded one; anything else calls pgfence.guard_slow.
--   A disabled or dropped lease trigger changes no fence row, so the count cannot show it:
--   the caller passes whether pg_trigger holds it enabled, an EXISTS the proxy writes into
--   its guard statement (a subquery would keep Postgres from inlining the function). Without
--   it, the slow path decides, and raises PF005 as before.
-- * A call that names no lease for a fence registered with one (a proxy configured without
--   the lease) no longer leaves the marker of the path without a lease, which checks the HWM
--   alone: after the first pass it missed a revoked lease. Each such call now goes to
--   pgfence.guard_full, which checks the registered lease (version 8).
--
-- Like the markers of version 5, both settings are the session's own: a session that sets
-- them by hand skips the check for its own writes (fencing is not access control;
-- docs/FENCING.md).

-- A second trigger beside version 5's (which counts changes of hwm and name): CREATE TRIGGER
-- lets guards read pgfence.fence meanwhile, where DROP TRIGGER would lock them out until init
-- commits.
CREATE TRIGGER pgfence_fence_changed_lease AFTER UPDATE ON pgfence.fence
    FOR EACH ROW WHEN (OLD.hwm IS NOT DISTINCT FROM NEW.hwm AND OLD.name IS NOT DISTINCT FROM NEW.name
                       AND (OLD.lease_epoch IS DISTINCT FROM NEW.lease_epoch
                            OR OLD.lease_table IS DISTINCT FROM NEW.lease_table
                            OR OLD.lease_row IS DISTINCT FROM NEW.lease_row))
    EXECUTE FUNCTION pgfence.fence_changed();

-- Version 1's lease_revoke, taking each fence's lock (in name order) before its row.
CREATE OR REPLACE FUNCTION pgfence.lease_revoke(p_table text, p_row text) RETURNS void
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
    SELECT pg_advisory_xact_lock(pgfence.lock_key(f.name)) FROM pgfence.fence f
     WHERE f.lease_table = p_table AND (p_row IS NULL OR f.lease_row = p_row) AND f.lease_epoch <> 0
     ORDER BY f.name;
    -- Counted here too (the trigger counts it as well): a lease trigger enabled ALWAYS fires
    -- where the fence row's triggers do not (session_replication_role = replica).
    WITH revoked AS (
        UPDATE pgfence.fence SET lease_epoch = 0
         WHERE lease_table = p_table AND (p_row IS NULL OR lease_row = p_row) AND lease_epoch <> 0
        RETURNING 1)
    SELECT pgfence.count_change() WHERE EXISTS (SELECT FROM revoked);
$$;

-- Version 1's lease_grant, taking the fence's lock before a change of lease_epoch alone too.
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
    FOR v_f IN SELECT f.name, greatest(f.hwm, f.lease_epoch) AS current
                 FROM pgfence.fence f WHERE f.lease_table = p_table AND f.lease_row = p_row LOOP
        IF p_lowering AND v_epoch < v_f.current THEN
            RAISE EXCEPTION 'pgfence: lease row "%" in % cannot go down to epoch %: fence "%" is at epoch % and epochs never go down',
                    p_row, p_table, v_epoch, v_f.name, v_f.current
                USING ERRCODE = 'PF001',
                      HINT = 'A lease epoch only goes up (epoch = epoch + 1 on takeover).';
        END IF;
        v_epoch := greatest(v_epoch, v_f.current);
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

-- The marker of one lease-coupled call: "<epoch> <keep HWM> <length>:<lease table> <fence>".
-- The length makes it one call's alone: names may hold spaces.
CREATE FUNCTION pgfence.lease_marker(p_fence text, p_epoch bigint, p_lease_table text, p_keep_hwm boolean)
    RETURNS text
    LANGUAGE sql IMMUTABLE
AS $$
SELECT p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) CASE WHEN p_keep_hwm THEN ' t ' ELSE ' f ' END
       OPERATOR(pg_catalog.||) pg_catalog.length(p_lease_table)::pg_catalog.text OPERATOR(pg_catalog.||) ':'
       OPERATOR(pg_catalog.||) p_lease_table OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_fence
$$;
REVOKE ALL ON FUNCTION pgfence.lease_marker(text, bigint, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.lease_marker(text, bigint, text, boolean) TO PUBLIC;

-- Whether this session holds fence p_fence's lock exclusive: it changed the fence's row in
-- this transaction (version 5's check, shared by both of guard_slow's records).
CREATE FUNCTION pgfence.holds_fence_exclusive(p_fence text) RETURNS boolean
    LANGUAGE sql VOLATILE
AS $$
SELECT EXISTS (
    SELECT FROM pg_catalog.pg_locks l
     WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
       AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
       AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
       AND l.objsubid OPERATOR(pg_catalog.=) 1
       AND l.classid OPERATOR(pg_catalog.=)
           ((pgfence.lock_key(p_fence) OPERATOR(pg_catalog.>>) 32) OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.oid
       AND l.objid OPERATOR(pg_catalog.=)
           (pgfence.lock_key(p_fence) OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.oid)
$$;
REVOKE ALL ON FUNCTION pgfence.holds_fence_exclusive(text) FROM PUBLIC;

-- Version 5's guard (version 6's guard_slow), recording a lease-coupled pass, and leaving no
-- marker for a fence registered with a lease that the caller did not name.
CREATE OR REPLACE FUNCTION pgfence.guard_slow(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
                                   p_keep_hwm boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
AS $$
DECLARE
    v_hwm   bigint;
    v_lease bigint;
    v_count bigint;
    v_ok    boolean;
    v_marker pg_catalog.text;  -- qualified: this function has no search_path of its own
BEGIN
    IF p_fence IS NOT NULL AND p_epoch OPERATOR(pg_catalog.>=) 1
       AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed' THEN
        IF p_lease_table IS NOT NULL THEN
            -- Lock, then read: in read committed the SELECT's snapshot follows the lock, so it
            -- sees any takeover the lock waited for.
            v_ok := pg_catalog.pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL;
            -- After the lock, before the row: the count the row's values are known at.
            v_count := pg_catalog.pg_sequence_last_value('pgfence.hwm_changes'::pg_catalog.regclass);
            SELECT f.hwm, f.lease_epoch,
                   f.lease_table OPERATOR(pg_catalog.=) p_lease_table AND EXISTS (
                       SELECT FROM pg_catalog.pg_trigger t
                        WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(p_lease_table)
                          AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_lease'
                          AND t.tgfoid OPERATOR(pg_catalog.=) 'pgfence.lease_trigger()'::pg_catalog.regprocedure
                          AND t.tgenabled OPERATOR(pg_catalog.=) ANY ('{O,A}'::pg_catalog."char"[]))
              INTO v_hwm, v_lease, v_ok
              FROM pgfence.fence f WHERE f.name OPERATOR(pg_catalog.=) p_fence;
            IF v_ok AND p_epoch OPERATOR(pg_catalog.<=) v_lease
               AND (NOT p_keep_hwm OR p_epoch OPERATOR(pg_catalog.>=) GREATEST(v_hwm, v_lease)) THEN
                -- Recorded already (a caller without the trigger's answer, pgfence.guard, passes
                -- here every time), or values this transaction wrote itself (it may never
                -- commit): a writer of the fence row holds the fence's lock exclusive to its end.
                v_marker := pgfence.lease_marker(p_fence, p_epoch, p_lease_table, p_keep_hwm);
                IF v_count IS NOT NULL
                   AND NOT COALESCE(pg_catalog.current_setting('pgfence.lease_checked', true) OPERATOR(pg_catalog.=)
                                        v_count::pg_catalog.text
                                    AND pg_catalog.current_setting('pgfence.lease_passed', true) OPERATOR(pg_catalog.=)
                                        v_marker, false)
                   AND NOT pgfence.holds_fence_exclusive(p_fence) THEN
                    PERFORM pg_catalog.set_config('pgfence.lease_passed', v_marker, false);
                    PERFORM pg_catalog.set_config('pgfence.lease_checked', v_count::pg_catalog.text, false);
                END IF;
                RETURN;
            END IF;
        ELSIF NOT p_keep_hwm THEN
            RETURN;  -- rewrite mode without a lease: the rows carry the epochs
        ELSIF pg_catalog.current_setting('pgfence.guard_passed', true) OPERATOR(pg_catalog.=)
                  (p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_fence) THEN
            v_ok := pg_catalog.pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL;
            -- After the lock, before the row: the count the row's value is known at.
            v_count := pg_catalog.pg_sequence_last_value('pgfence.hwm_changes'::pg_catalog.regclass);
            IF pg_catalog.current_setting('pgfence.guard_checked', true) OPERATOR(pg_catalog.=)
                   v_count::pg_catalog.text THEN
                RETURN;  -- no fence row changed since this session read HWM = epoch
            END IF;
            SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name OPERATOR(pg_catalog.=) p_fence;
            IF p_epoch OPERATOR(pg_catalog.=) v_hwm THEN
                -- Not a HWM this transaction wrote itself (it may never commit): a writer of
                -- the fence row holds the fence's lock exclusive to its end.
                IF v_count IS NOT NULL AND NOT pgfence.holds_fence_exclusive(p_fence) THEN
                    PERFORM pg_catalog.set_config('pgfence.guard_checked', v_count::pg_catalog.text, false);
                END IF;
                RETURN;
            END IF;
        END IF;
    END IF;
    -- Anything else (a new epoch, a stale one, an error to raise, another isolation level):
    -- the full guard decides, under the same lock if the short path took it.
    PERFORM pgfence.guard_full(p_fence, p_epoch, p_lease_table, p_keep_hwm);
    -- Not for a fence registered with a lease, which guard_full checked against it although
    -- the caller named none (version 8): the path the marker opens checks the HWM alone.
    IF p_keep_hwm AND p_lease_table IS NULL
       AND NOT EXISTS (SELECT FROM pgfence.fence f
                        WHERE f.name OPERATOR(pg_catalog.=) p_fence AND f.lease_table IS NOT NULL) THEN
        -- It let the write through: the HWM is now at least p_epoch in this transaction. The
        -- recorded count spoke of the marker before; it is cleared with it.
        PERFORM pg_catalog.set_config('pgfence.guard_passed',
                                      p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_fence,
                                      false);
        PERFORM pg_catalog.set_config('pgfence.guard_checked', '', false);
    END IF;
END
$$;

-- The guard of a lease-coupled fence. p_trigger: whether pg_trigger holds the lease table's
-- trigger pgfence_lease, calling pgfence.lease_trigger(), enabled (the caller's EXISTS).
CREATE FUNCTION pgfence.guard_lease(p_fence text, p_epoch bigint, p_lease_table text, p_keep_hwm boolean,
                                    p_trigger boolean)
    RETURNS void
    LANGUAGE sql VOLATILE
AS $$
SELECT CASE
    WHEN NOT COALESCE(
             p_trigger AND p_fence IS NOT NULL AND p_epoch OPERATOR(pg_catalog.>=) 1
             AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
             AND pg_catalog.current_setting('pgfence.lease_passed', true) OPERATOR(pg_catalog.=)
                 pgfence.lease_marker(p_fence, p_epoch, p_lease_table, p_keep_hwm),
             false)
        THEN pgfence.guard_slow(p_fence, p_epoch, p_lease_table, p_keep_hwm)
    WHEN pg_catalog.pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL
        THEN pgfence.guard_slow(p_fence, p_epoch, p_lease_table, p_keep_hwm)
    -- Under the lock: no fence row changed since this session's last pass of this call.
    WHEN pg_catalog.current_setting('pgfence.lease_checked', true) OPERATOR(pg_catalog.=)
             pg_catalog.pg_sequence_last_value('pgfence.hwm_changes'::pg_catalog.regclass)::pg_catalog.text
        THEN NULL::pg_catalog.void
    ELSE pgfence.guard_slow(p_fence, p_epoch, p_lease_table, p_keep_hwm)
END
$$;

COMMENT ON FUNCTION pgfence.guard_lease(text, bigint, text, boolean, boolean) IS
    'pgfence: the fencing check of a lease-coupled fence; the steady state inline, everything else in pgfence.guard_slow';
REVOKE ALL ON FUNCTION pgfence.guard_lease(text, bigint, text, boolean, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.guard_lease(text, bigint, text, boolean, boolean) TO PUBLIC;
