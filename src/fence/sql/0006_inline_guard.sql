-- pgfence schema, version 6: the steady-state guard is an expression, not a PL/pgSQL call.
--
-- Applied by `pgfence init` after 0005 (src/fence/install.rs), in one transaction.
--
-- Once version 5 stopped re-reading an unchanged fence row, what was left of the short path's
-- cost was mostly the call itself: a PL/pgSQL function called once per transaction sets up its
-- evaluation state in every transaction, and a SECURITY DEFINER one also switches user. Its
-- work is a handful of function calls that need none of the installer's rights. Postgres
-- inlines a LANGUAGE sql function whose body is one SELECT of one expression into the query
-- that calls it (and pgfence prepares that query once per session), so in the steady state the
-- guard now costs its expression:
--
-- * pgfence.guard is now that expression. Without a lease, at READ COMMITTED, for an epoch
--   the session's marker says the full guard let through (pgfence.guard_passed), it takes the
--   fence's lock shared and reads the count; if the count is the one recorded in
--   pgfence.guard_checked, it returns. Rewrite-mode fences without a lease (p_keep_hwm false)
--   return at once, as before. Everything else calls pgfence.guard_slow.
-- * pgfence.guard_slow is version 5's pgfence.guard, renamed (same function, same rights,
--   same grants): it decides every other case, records the count on its read path, and hands
--   errors and new epochs to pgfence.guard_full. Statements prepared before this migration
--   name it by its OID and keep calling it, which is still correct.
-- * CASE evaluates its conditions in order, and only as far as needed; that is what puts the
--   lock before the count (the count must be read under the lock). Volatile calls are never
--   evaluated at planning. If the lock's result were ever NULL, the slow path would run.
-- * The expression runs with the caller's rights, so PUBLIC may now read the count
--   (SELECT on a sequence allows reading it, not advancing or setting it). The fence rows, the
--   HWM and every decision that can let a new epoch through stay with the SECURITY DEFINER
--   functions. Every name in the expression is schema-qualified, operators included, and it
--   uses no construct that looks an operator up by name (IS DISTINCT FROM, IN, BETWEEN): an
--   inlined body is parsed with the caller's search_path.
--
-- And the count no longer touches the session's lastval(). Version 5 counted with nextval()
-- in the changing session, which made lastval() there return pgfence's count (or fail with
-- "permission denied" for a role without rights on the sequence) after a new leader's first
-- write. setval() does not change lastval(); pgfence.count_change() raises the count by one
-- with it, under an advisory lock (key 1885824613, 2; the install lock is (1885824613, 1)), so
-- two counts never read the same value and the count never goes down. The lock is taken and
-- released inside a block that is rolled back on purpose: held to commit, it would make
-- takeovers of different fences wait for each other's commits, and deadlock with row locks
-- their transactions take later.

ALTER FUNCTION pgfence.guard(text, bigint, text, boolean) RENAME TO guard_slow;

CREATE FUNCTION pgfence.guard(p_fence text, p_epoch bigint, p_lease_table text DEFAULT NULL,
                              p_keep_hwm boolean DEFAULT true)
    RETURNS void
    LANGUAGE sql VOLATILE
AS $$
SELECT CASE
    WHEN NOT COALESCE(
             p_fence IS NOT NULL AND p_epoch OPERATOR(pg_catalog.>=) 1 AND p_lease_table IS NULL
             AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed',
             false)
        THEN pgfence.guard_slow(p_fence, p_epoch, p_lease_table, p_keep_hwm)
    WHEN NOT p_keep_hwm
        THEN NULL::pg_catalog.void  -- rewrite mode without a lease: the rows carry the epochs
    -- (Not IS DISTINCT FROM: it finds its = by the caller's search_path.)
    WHEN NOT COALESCE(pg_catalog.current_setting('pgfence.guard_passed', true) OPERATOR(pg_catalog.=)
             (p_epoch::pg_catalog.text OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) p_fence), false)
        THEN pgfence.guard_slow(p_fence, p_epoch, p_lease_table, p_keep_hwm)
    WHEN pg_catalog.pg_advisory_xact_lock_shared(pgfence.lock_key(p_fence)) IS NULL
        THEN pgfence.guard_slow(p_fence, p_epoch, p_lease_table, p_keep_hwm)
    -- Under the lock: no fence row changed since this session read HWM = epoch.
    WHEN pg_catalog.current_setting('pgfence.guard_checked', true) OPERATOR(pg_catalog.=)
             pg_catalog.pg_sequence_last_value('pgfence.hwm_changes'::pg_catalog.regclass)::pg_catalog.text
        THEN NULL::pg_catalog.void
    ELSE pgfence.guard_slow(p_fence, p_epoch, p_lease_table, p_keep_hwm)
END
$$;

COMMENT ON FUNCTION pgfence.guard(text, bigint, text, boolean) IS
    'pgfence: the fencing check; the steady state inline, everything else in pgfence.guard_slow';
REVOKE ALL ON FUNCTION pgfence.guard(text, bigint, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.guard(text, bigint, text, boolean) TO PUBLIC;
GRANT SELECT ON SEQUENCE pgfence.hwm_changes TO PUBLIC;

CREATE FUNCTION pgfence.count_change() RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
BEGIN
    BEGIN
        PERFORM pg_advisory_xact_lock(1885824613, 2);
        PERFORM setval('pgfence.hwm_changes', coalesce(pg_sequence_last_value('pgfence.hwm_changes'), 1) + 1, true);
        -- Roll the block back: that releases the lock (taken in it) but not the count (a
        -- sequence is never rolled back), so the count is not held to commit.
        RAISE SQLSTATE 'PF0CC';
    EXCEPTION WHEN SQLSTATE 'PF0CC' THEN
        NULL;
    END;
END
$$;
REVOKE ALL ON FUNCTION pgfence.count_change() FROM PUBLIC;

-- Version 5's trigger function, counting with pgfence.count_change().
CREATE OR REPLACE FUNCTION pgfence.fence_changed() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pgfence, pg_temp
AS $$
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        -- Wait for every transaction past the guard of the fences this row was and is.
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(OLD.name));
        END IF;
        IF TG_OP IN ('UPDATE', 'INSERT') THEN
            PERFORM pg_advisory_xact_lock(pgfence.lock_key(NEW.name));
        END IF;
    END IF;
    -- TRUNCATE takes no fence lock: a fence without a row has HWM 0, and a write passing at
    -- the old HWM meanwhile is above that.
    PERFORM pgfence.count_change();
    RETURN NULL;
END
$$;

-- Version 5's full guard, counting its bump with pgfence.count_change().
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
        v_trigger := EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                              WHERE t.tgrelid = to_regclass(p_lease_table) AND t.tgname = 'pgfence_lease'
                                AND t.tgfoid = 'pgfence.lease_trigger()'::regprocedure
                                AND t.tgenabled IN ('O', 'A'));
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

-- The count starts at the install's time in microseconds (or stays, if higher): a schema
-- dropped and installed again must not count from 1 again, where a live session may have
-- recorded the same number against the old schema's fence rows.
SELECT pg_catalog.setval('pgfence.hwm_changes',
                         GREATEST(pg_catalog.pg_sequence_last_value('pgfence.hwm_changes'),
                                  (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8),
                         true);

-- Version 5 left its trigger function to PUBLIC: only pgfence.fence's triggers use it.
REVOKE ALL ON FUNCTION pgfence.fence_changed() FROM PUBLIC;
