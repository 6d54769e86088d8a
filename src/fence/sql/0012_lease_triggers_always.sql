-- pgfence schema, version 12: a lease table's triggers count only as `init` installs them, both
-- of them, enabled ALWAYS.
--
-- Applied by `pgfence init` after 0011 (src/fence/install.rs), in one transaction.
--
-- Until this version the guard took the lease trigger as in place when pgfence_lease alone was
-- enabled in either way, ALWAYS ('A') or ORIGIN ('O'). Two holes:
-- * ORIGIN is what `ALTER TABLE ... ENABLE TRIGGER ALL` (and so a restore with
--   --disable-triggers) leaves. Such a trigger does not fire under
--   session_replication_role = replica (a logical replication apply worker, a superuser's
--   session): a takeover made there left the fence at the old epoch, and the old leader wrote on
--   while the new one got PF003. `init` installs and checks the triggers as ALWAYS for that
--   reason; the guard now asks the same.
-- * pgfence_lease_truncate disabled or dropped went unnoticed: TRUNCATE of the lease table then
--   revoked nothing, and the old leader wrote on with no lease row.
-- Now both triggers must be there, calling pgfence's functions, enabled ALWAYS
-- (pgfence.lease_triggers_on); otherwise the guard raises PF005 and `pgfence init --config`
-- puts them back (and brings the fence up to the lease row, lifting a row granting a stale
-- epoch). The proxy's guard statement asks pg_trigger the same in each transaction.
--
-- Not detected, as before: a takeover while the trigger was disabled (or on the table under
-- another name), with the trigger enabled ALWAYS again by hand afterwards. Run `init --config`
-- after any change made to a lease table while pgfence's triggers were off (docs/FENCING.md).

-- Whether the lease table p_table has both of pgfence's triggers, calling its functions and
-- enabled ALWAYS. Looked up by name when called: a table dropped or renamed has none.
CREATE FUNCTION pgfence.lease_triggers_on(p_table text) RETURNS boolean
    LANGUAGE sql STABLE
AS $$
SELECT EXISTS (SELECT FROM pg_catalog.pg_trigger t
                WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(p_table)
                  AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_lease'
                  AND t.tgfoid OPERATOR(pg_catalog.=) 'pgfence.lease_trigger()'::pg_catalog.regprocedure
                  AND t.tgenabled OPERATOR(pg_catalog.=) 'A')
   AND EXISTS (SELECT FROM pg_catalog.pg_trigger t
                WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(p_table)
                  AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_lease_truncate'
                  AND t.tgfoid OPERATOR(pg_catalog.=) 'pgfence.lease_truncate_trigger()'::pg_catalog.regprocedure
                  AND t.tgenabled OPERATOR(pg_catalog.=) 'A')
$$;
REVOKE ALL ON FUNCTION pgfence.lease_triggers_on(text) FROM PUBLIC;

-- Version 8's full guard, asking pgfence.lease_triggers_on.
CREATE OR REPLACE FUNCTION pgfence.guard_full(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
                                   p_keep_hwm boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
DECLARE
    v_hwm     bigint;
    v_lease   bigint;
    v_reg     text;
    v_trigger boolean;
    v_locked  boolean := false;
    v_rc      boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    IF p_fence IS NULL OR p_epoch IS NULL OR p_epoch < 1 THEN
        RAISE EXCEPTION 'pgfence: epoch % is not valid for fence "%": epochs are integers from 1 to 9223372036854775807',
                coalesce(p_epoch::text, 'NULL'), p_fence
            USING ERRCODE = 'PF003', HINT = 'SET pgfence.epoch to the epoch your lease acquisition returned.';
    END IF;

    IF p_lease_table IS NULL THEN
        -- The fence's registered lease applies whoever calls: a caller that names no lease
        -- (any role may call the guard) must not take the lease-less path, where a new
        -- epoch raises the HWM, past what the lease granted.
        SELECT f.lease_table INTO p_lease_table FROM pgfence.fence f WHERE f.name = p_fence;
    END IF;

    IF p_lease_table IS NOT NULL THEN
        -- With a lease the guard never raises the HWM (the lease trigger does, and a granted
        -- epoch is never above it), so it takes the shared lock straight away and reads once.
        -- Lock calls are plain assignments: plpgsql evaluates those without a query.
        v_locked := pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL;
        IF v_rc THEN
            SELECT f.hwm, f.lease_epoch, f.lease_table INTO v_hwm, v_lease, v_reg
              FROM pgfence.fence f WHERE f.name = p_fence;
        ELSE
            -- The transaction's snapshot may predate a committed takeover: FOR SHARE turns
            -- that into 40001 instead of a stale pass.
            SELECT f.hwm, f.lease_epoch, f.lease_table INTO v_hwm, v_lease, v_reg
              FROM pgfence.fence f WHERE f.name = p_fence FOR SHARE;
        END IF;
        v_trigger := pgfence.lease_triggers_on(p_lease_table);
        -- PF005 unless `pgfence init --config` registered this lease table and its trigger is in place.
        IF v_reg IS NULL OR NOT v_trigger OR NOT (v_reg = p_lease_table OR to_regclass(v_reg) = to_regclass(p_lease_table)) THEN
            RAISE EXCEPTION 'pgfence: lease trigger for fence "%" on table % is missing: run pgfence init --config in database "%"',
                    p_fence, p_lease_table, current_database()
                USING ERRCODE = 'PF005',
                      HINT = 'pgfence init --database-url postgres://.../' || current_database()
                             || ' --config pgfence.toml registers the fence with its lease table and installs the trigger.';
        END IF;
        IF p_epoch > v_lease THEN
            RAISE EXCEPTION 'pgfence: epoch % is above the epoch the lease granted for fence "%" (current epoch %)',
                    p_epoch, p_fence,
                    greatest(v_hwm, v_lease)
                    || CASE WHEN v_lease = 0 THEN '; the lease grants no epoch: its row is missing or its epoch is 0' ELSE '' END
                USING ERRCODE = 'PF003',
                      HINT = 'Acquire the lease and declare the epoch the acquisition returned; '
                             'an epoch the lease did not grant cannot write.';
        END IF;
        IF p_keep_hwm AND p_epoch < greatest(v_hwm, v_lease) THEN
            RAISE EXCEPTION 'pgfence: epoch % is stale for fence "%" (current epoch %)',
                    p_epoch, p_fence, greatest(v_hwm, v_lease)
                USING ERRCODE = 'PF001',
                      HINT = 'Another leader took over; stop writing and re-acquire the lease.';
        END IF;
        RETURN;
    END IF;

    IF NOT p_keep_hwm THEN
        RETURN;  -- rewrite mode without a lease: the rows carry the epochs
    END IF;

    -- Without a lease the first write of a new epoch raises the HWM. A plain read first: it
    -- fails fast and chooses the lock mode (no shared -> exclusive upgrade, which could deadlock
    -- two writers of the new epoch).
    SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence;
    IF NOT FOUND THEN
        INSERT INTO pgfence.fence (name) VALUES (p_fence) ON CONFLICT (name) DO NOTHING;
        v_hwm := 0;
    END IF;

    -- Twice: on the plain read (fail fast, without waiting), then on the value read under the lock.
    LOOP
        IF p_epoch < v_hwm THEN
            RAISE EXCEPTION 'pgfence: epoch % is stale for fence "%" (current epoch %)', p_epoch, p_fence, v_hwm
                USING ERRCODE = 'PF001',
                      HINT = 'Another leader took over; stop writing and re-acquire the lease.';
        END IF;
        EXIT WHEN v_locked;
        IF p_epoch > v_hwm THEN
            -- Bump: wait for every transaction already past the guard, then re-read.
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(p_fence));
            v_locked := true;
            SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence FOR UPDATE;
        ELSE
            -- Same epoch: share the lock with the other writers of this epoch; a waiting
            -- bump queues ahead of later requests, so writers cannot starve it.
            PERFORM pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence));
            v_locked := true;
            IF v_rc THEN
                -- A new snapshot: sees any bump we waited behind.
                SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence;
            ELSE
                SELECT f.hwm INTO v_hwm FROM pgfence.fence f WHERE f.name = p_fence FOR SHARE;
            END IF;
        END IF;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pgfence: fence "%" disappeared from pgfence.fence during the guard', p_fence
                USING ERRCODE = 'PF005', HINT = 'Run pgfence init again.';
        END IF;
    END LOOP;

    IF p_epoch > v_hwm THEN
        -- Only on the bump path: a HWM never goes down, so the shared path re-reads a HWM
        -- at least as high as the one that chose it.
        UPDATE pgfence.fence SET hwm = p_epoch WHERE name = p_fence;
        -- Counted here too (the trigger counts it as well): a bump must be counted even in a
        -- session whose triggers do not fire.
        PERFORM pgfence.count_change();
    END IF;
END
$$;

-- Version 9's guard_slow, asking pgfence.lease_triggers_on.
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
                   f.lease_table OPERATOR(pg_catalog.=) p_lease_table AND pgfence.lease_triggers_on(p_lease_table)
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
